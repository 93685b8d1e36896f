"""Out of memory as a result, not a crash: recognise it, keep its one line, give the memory back.

A sweep that walks towards the device's limit (attention at long N, a prefill of a long prompt) meets
out-of-memory errors by design: each is a row marked "oom" and the sweep goes on. CUDA raises
`torch.OutOfMemoryError`; the CPU allocator raises a plain RuntimeError that says so. The memory comes back
only after the `except` block ends: until then the exception's traceback holds the frames, and the frames
hold the tensors. So a caller keeps the reason inside the handler and calls `oom_row` after it.
"""
from __future__ import annotations

import gc

CPU_OOM_WORDS = ("not enough memory", "can't allocate memory", "out of memory")  # a RuntimeError saying it ran out


def is_out_of_memory(e: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or a RuntimeError whose text says an allocator ran out."""
    import torch  # deferred: lablib.hardware loads no torch at import

    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and any(
        s in str(e) for s in CPU_OOM_WORDS))


def error_line(e: BaseException, limit: int = 300) -> str:
    """"Type: first line of the message", the line cut at `limit` characters: what a row's reason keeps of an error."""
    return f"{type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0][:limit]


def free_memory(cuda: bool) -> None:
    """Collect what nothing references any more, then hand CUDA's cached blocks back to the driver."""
    gc.collect()
    if cuda:
        import torch  # deferred: lablib.hardware loads no torch at import

        torch.cuda.empty_cache()


def oom_row(reason: str, cuda: bool) -> dict[str, str]:
    """Free the memory and return a row's {"status": "oom", "reason": reason}; call it after the except block."""
    free_memory(cuda)
    return {"status": "oom", "reason": reason}
