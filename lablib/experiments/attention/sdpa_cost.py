"""Why a fused-attention rung can lose to eager: PyTorch's SDPA backends one by one, each run twice on the same batch.

`torch.nn.functional.scaled_dot_product_attention` (transformers' "sdpa") picks a kernel per call, in
`torch._C._get_sdp_priority_order()` among those that take the inputs: FlashAttention, memory-efficient attention,
cuDNN's, or the plain math. A kernel that builds something per new shape (cuDNN compiles an execution graph per
shape it has not seen) pays it on the first call of each shape; decode makes a new key length every step, so a
run whose warm-up covered none of its shapes pays it on every step. Run twice, the second pass meets only shapes
the first one built: its gap to the first is that per-shape cost. Eager (a matmul, a softmax, a matmul) builds
nothing per shape.

On the H200 on 2026-12-03 lab 10's sdpa rung ran 15x slower than eager on the embedded model (43 against 650 tok/s,
TTFT 1,346 against 86 ms). `sdpa_backends` measures each backend's two passes so the cause is read from a run,
not guessed: on a GPU every backend; on a CPU FlashAttention's CPU kernel and the math one (the others are CUDA's).
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ... import validate
from ...bench.offline import prepare
from ...config import BenchConfig, HFConfig
from ...engines.hf import HFEngine
from ...hardware.device import torch_threads
from ...session import live_label, Shown
from ...workloads import load_workload

# "sdpa": PyTorch's choice, last: run before the forced kernels it would pay the per-shape cost of the kernel it
# picks, and that kernel's own first pass would then look free
BACKENDS = ("eager", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa")
_FORCED = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
           "sdpa-cudnn": "CUDNN_ATTENTION"}
CPU_BACKENDS = ("eager", "sdpa-math", "sdpa-flash", "sdpa")  # the others are CUDA kernels


def _kernel(backend: str) -> Any:
    """The context that forces `backend` (a torch.nn.attention.sdpa_kernel), or none for eager and PyTorch's choice."""
    if backend not in _FORCED:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel  # deferred: torch

    return sdpa_kernel([getattr(SDPBackend, _FORCED[backend])])


def _pass_row(backend: str, n: int, records: list[Any], wall: float) -> dict[str, Any]:
    tokens = sum(r.output_tokens for r in records)
    tpots = [(r.last_token - r.first_token) / (r.output_tokens - 1) for r in records if r.output_tokens > 1]
    return {"backend": backend, "pass": n, "status": "ok", "wall_s": wall, "output_tok_s": tokens / wall,
            "ttft_p50_s": statistics.median(r.first_token - r.start for r in records),
            "tpot_p50_s": statistics.median(tpots) if tpots else None, "output_ids": [r.output_ids for r in records]}


def sdpa_backends(model: Any = "embedded", batch: int = 8, requests: int = 8, max_new_tokens: int = 32,
                  passes: int = 2, backends: Sequence[str] | None = None, device: str = "auto",
                  threads: int | None = 1) -> Shown[dict[str, Any]]:
    """Static batches of `batch` on the first `requests` journey requests, `passes` times per backend (`BACKENDS`;
    None: every one this device has), on one eager and one sdpa engine. A Shown of {"rows": one per backend and pass
    (wall, tok/s, TTFT p50, TPOT p50; status "not available: ..." where the backend refused these inputs),
    "priority": PyTorch's order of SDPA backends here, "cudnn_enabled", "identical": backend -> whether its greedy
    tokens equal eager's}. Each engine first runs one untimed request of another length, with the kernel left to
    PyTorch's math (the process's one-time costs: CUDA's context, cuBLAS's handles); then pass 1 of each backend is
    the first time it meets these shapes. Backends run in the order given (forced ones before PyTorch's choice)."""
    owner = "sdpa_backends"
    validate.integer(owner, "batch", batch, "a static batch size, e.g. 8.", 1, 64)
    validate.integer(owner, "requests", requests, "journey requests, e.g. 8.", 1, 64)
    validate.integer(owner, "max_new_tokens", max_new_tokens, "new tokens per request, e.g. 32.")
    validate.integer(owner, "passes", passes, "2: a first pass on new shapes, then the same again.", 1, 5)
    import torch  # deferred: torch

    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    chosen = list(backends) if backends is not None else list(BACKENDS if cuda else CPU_BACKENDS)
    for b in chosen:
        validate.choice(owner, "backends", b, BACKENDS)
    wl = load_workload("journey", limit=requests)
    rows: list[dict[str, Any]] = []
    engines: dict[str, HFEngine] = {}
    try:
        for backend in chosen:
            impl = "eager" if backend == "eager" else "sdpa"
            if impl not in engines:
                engines[impl] = HFEngine(model, HFConfig("static", batch, attn_implementation=impl,
                                                         device="cuda" if cuda else "cpu"))
                warm = prepare(load_workload("journey", limit=requests + 1), engines[impl],
                               BenchConfig(max_new_tokens=2, progress=False))[-1:]  # not one of the batch's prompts
                with torch_threads(threads), _kernel("sdpa-math" if impl == "sdpa" else "eager"):
                    engines[impl].generate(warm, progress=False)
            engine = engines[impl]
            reqs = prepare(wl, engine, BenchConfig(max_new_tokens=max_new_tokens, progress=False))
            for n in range(1, passes + 1):
                try:
                    with torch_threads(threads), _kernel(backend):
                        t0 = time.perf_counter()
                        records = engine.generate(reqs, progress=False)
                        wall = time.perf_counter() - t0
                except RuntimeError as e:  # "No available kernel": this backend does not take these inputs here
                    rows.append({"backend": backend, "pass": n, "status": f"not available: {str(e).splitlines()[0]}"})
                    break
                rows.append(_pass_row(backend, n, records, wall))
    finally:
        for engine in engines.values():
            engine.close()
    eager = next((r["output_ids"] for r in rows if r["backend"] == "eager" and r["status"] == "ok"), None)
    identical = {r["backend"]: r["output_ids"] == eager for r in rows if r["status"] == "ok" and r["pass"] == 1
                 and eager is not None}
    for r in rows:
        r.pop("output_ids", None)
    return Shown({"rows": rows, "priority": [str(torch.nn.attention.SDPBackend(i)).split(".")[-1]
                                             for i in torch._C._get_sdp_priority_order()],
                  "cudnn_enabled": torch.backends.cuda.cudnn_sdp_enabled(), "identical": identical,
                  "batch": batch, "requests": requests, "max_new_tokens": max_new_tokens}, True,
                 f"{live_label()}, {threads or 'all'} torch thread(s)")


def first_pass_cost(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per backend that ran twice: its first pass's wall time over its second's (1: no cost per new shape)."""
    walls: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["status"] == "ok":
            walls.setdefault(r["backend"], {})[r["pass"]] = r["wall_s"]
    return {b: w[1] / w[2] for b, w in walls.items() if 1 in w and 2 in w}


def sdpa_lines(shown: Shown[dict[str, Any]]) -> str:
    """What the passes say, every number from them: each backend's tok/s on both passes, and which backends pay
    on the first pass what the second does not."""
    v = shown.value
    ok = [r for r in v["rows"] if r["status"] == "ok"]
    cost = first_pass_cost(v["rows"])
    parts = []
    for b in dict.fromkeys(r["backend"] for r in v["rows"]):
        mine = [r for r in ok if r["backend"] == b]
        if not mine:
            why = next(r["status"] for r in v["rows"] if r["backend"] == b)
            parts.append(f"{b}: {why}")
            continue
        tok = " then ".join(f"{r['output_tok_s']:,.0f}" for r in mine)
        parts.append(f"{b}: {tok} tok/s" + (f" (first pass {cost[b]:.1f}x the second's time)" if b in cost else ""))
    slow = sorted(b for b, x in cost.items() if x > 2)
    tail = (f" Paid on first meeting a shape (over 2x): {', '.join(slow)}." if slow else
            " No backend's first pass took over twice its second's.")
    return (f"{shown.label}, batch {v['batch']}, {v['requests']} requests x {v['max_new_tokens']} tokens; PyTorch's "
            f"SDPA order here: {', '.join(v['priority'])} (cuDNN's {'on' if v['cudnn_enabled'] else 'off'}). "
            + "; ".join(parts) + "." + tail)
