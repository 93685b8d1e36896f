"""Attention kernels on the clock: naive attention against the fused (flash) kernels, by sequence length.

The FlashAttention paper's figure 3 and its repository's `benchmarks/benchmark_flash_attention.py`, for the
kernels this stack ships. `mechanisms.attention` predicts; this module measures the same shapes:

* Prefill, causal, batch x length held constant (`tokens`, 16k by default: batch = tokens // N), heads =
  hidden / head_dim (hidden 2048), head dims 64 and 128. Naive attention writes S = QK^T and P = softmax(S)
  to memory (2 B H N^2 elements), so its time grows like N^2 in bytes, its memory like N^2 until it runs
  out (marked 'oom'), and it is memory-bound at any long N. The fused kernels keep S and P on chip: memory
  O(N), compute-bound, TFLOP/s near the tensor-core peak once tiles are full.
* Decode, one query against N_k cached keys: no N x N matrix, both sides read K and V once; achieved
  bandwidth = bytes of K and V / time, against the GPU's HBM bandwidth. Small N_k is launch-bound (the
  events time the host's launch gaps too, as an engine without CUDA graphs sees them).

Kernels (`KERNELS`), each `fn(q, k, v, causal) -> out` on (batch, heads, seq, head_dim) tensors:
`naive` (S and P held in the input dtype: torch's softmax reduces in fp32 and writes the input dtype, so
its extra memory is `naive_traffic(...).extra_bytes` plus the output and, when causal, the N x N bool mask);
`sdpa_math|efficient|flash|cudnn`, SDPA with exactly that one backend enabled (`sdpa_kernel([SDPBackend.X])`:
if it cannot run the shape, torch raises and the row says why); `flex` (flex_attention with a causal
BlockMask; torch.compile'd on CUDA; eager on the CPU by default, where it is correct but unfused, since
compiling it there takes ~40 s on a 2-core machine: `flex_compile=True`); `vllm_fa3`, vLLM 0.26's bundled
FA3 (`vllm.vllm_flash_attn.flash_attn_varlen_func(..., fa_version=3)`, varlen layout, imported only when
asked). Inputs live as (B, N, H, D), the layout FA kernels read; the SDPA kernels get the transposed views.

Timing: seeded inputs; one probe call (its time is `first_ms`: compiles and plans), `warmup` calls, one call
under `torch.cuda.reset_peak_memory_stats` (extra_mem_bytes = peak - memory allocated before the call: the
output, S and P, workspace; the inputs, flex's BlockMask and FA3's offsets are resident before it), then
`repeats` calls, each between two CUDA events after a 256 MiB write that flushes L2 (perf_counter on the CPU);
the median is reported with min and max. TFLOP/s = `attention_flops` (useful causal FLOPs) / median; % of
peak against the bf16 tensor peak (mechanisms.attention.H200 on an H200, else hardware.roofline's table,
else unknown), for bf16/fp16 runs only.

Correctness: every output is checked against a float64 reference computed from the same (rounded) inputs
on a slice: the first and the last (batch, head), `rows` (64) query rows spread from 0 to N-1, each against
all its keys. Exact at every N, and cheap (rows x N x d) where the full N x N reference at 32k is not. Pass
iff |out - ref| <= rtol x (|ref| + rms of that reference row) elementwise, rtol = `RTOL[dtype]` (16 unit
roundoffs for bf16/fp16: twice what naive attention in the dtype itself loses, as the FA repository's tests
allow twice a same-dtype PyTorch reference's error). Relative to each row's scale, because softmax averages
make long rows' outputs small: a zero output passes any fixed atol at 32k, never this rule.
"""
from __future__ import annotations

import argparse
import datetime
import contextlib
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..hardware.device import device_facts, library_versions
from ..hardware.oom import error_line, is_out_of_memory, oom_row
from ..hardware.roofline import lookup_gpu
from ..mechanisms.attention import H200, AttentionShape, attention_flops
from ..validate import choice, integer, integers, refuse

KERNELS = ("naive", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "flex", "vllm_fa3")
TILED = ("sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "flex", "vllm_fa3")  # never build N x N: run past dense_max_len
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# 16 unit roundoffs u (bf16 2^-8, fp16 2^-11): measured on the CPU to N = 4096, the fused kernels' worst element is
# <= 2.2 u of its row's scale and naive's (S and P rounded to the dtype) <= 8.4 u. fp32: fp32 accumulation
# over N keys, ~40 u at N = 1024; 2^-13 (~1.2e-4) leaves room to 64k. TF32 is not fp32 here: it fails.
RTOL = {"bf16": 2**-4, "fp16": 2**-7, "fp32": 2**-13}
FIELDS = ("panel", "kernel", "N", "head_dim", "batch", "heads", "dtype", "causal", "median_ms", "min_ms", "max_ms",
          "first_ms", "tflops", "pct_of_peak", "extra_mem_bytes", "kv_bytes", "achieved_gbps", "pct_of_bandwidth",
          "status", "reason", "note", "max_abs_err", "within_tol")
_OWNER = "run_attention_bench"
_CPU_SDPA = "torch's CPU SDPA implements only the MATH and FLASH_ATTENTION backends"


class Unavailable(RuntimeError):
    """A kernel this machine cannot run (no CUDA, a missing package): the row's reason."""


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Algorithm 0: S = (q scale) k^T and P = softmax(S) materialised in the input dtype, then P v."""
    n, n_k = q.shape[-2], k.shape[-2]
    s = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))
    if causal:  # bottom-right aligned, as FA and vLLM: query i sees keys j <= i + n_k - n
        s.masked_fill_(torch.ones(n, n_k, dtype=torch.bool, device=q.device).triu_(n_k - n + 1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    del s
    return torch.matmul(p, v)


def _sdpa(backend: str) -> Callable[..., torch.Tensor]:
    from torch.nn.attention import SDPBackend, sdpa_kernel  # deferred: torch

    chosen = [getattr(SDPBackend, backend)]

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        with sdpa_kernel(chosen):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


class _Flex:
    """flex_attention with a causal BlockMask (built once per shape, outside the timed calls)."""

    def __init__(self, compile: bool) -> None:
        from torch.nn.attention.flex_attention import flex_attention  # deferred: torch

        self.compiled, self._masks = compile, {}
        self._fn = torch.compile(flex_attention, dynamic=False) if compile else flex_attention

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        from torch.nn.attention.flex_attention import create_block_mask  # deferred: torch

        n, n_k, mask = q.shape[-2], k.shape[-2], None
        if causal:
            key = (n, n_k, str(q.device))
            if key not in self._masks:
                off = n_k - n
                self._masks[key] = create_block_mask(lambda b, h, i, j: i + off >= j, None, None, n, n_k, device=q.device)
            mask = self._masks[key]
        if self.compiled:
            return self._fn(q, k, v, block_mask=mask)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return self._fn(q, k, v, block_mask=mask)


class _VllmFa3:
    """vLLM's FA3 through its varlen API: (B, N, H, D) storage viewed as (B N, H, D), cumulative offsets cached."""

    def __init__(self, device: str) -> None:
        try:  # importing vllm sets TORCHINDUCTOR_COMPILE_THREADS=1 (vllm/env_override.py): flex compiles slow down
            from vllm.vllm_flash_attn import fa_version_unsupported_reason, flash_attn_varlen_func  # deferred: vllm
        except Exception as e:  # ImportError without vLLM; vLLM raises its own without its CUDA extensions
            raise Unavailable(f"import vllm.vllm_flash_attn failed: {error_line(e)}") from None
        if device != "cuda":
            raise Unavailable("vllm_fa3 needs CUDA (FA3 runs on compute capability 9.x); this run is on the CPU")
        try:
            why = fa_version_unsupported_reason(3)
        except Exception as e:
            why = f"fa_version_unsupported_reason(3) raised {error_line(e)}"
        if why:
            raise Unavailable(f"vllm.vllm_flash_attn: {why}")
        self._fn, self._offsets = flash_attn_varlen_func, {}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        b, h, n, d = q.shape
        n_k, key = k.shape[-2], (b, q.shape[-2], k.shape[-2], str(q.device))
        if key not in self._offsets:
            self._offsets[key] = [torch.arange(0, (b + 1) * m, m, dtype=torch.int32, device=q.device) for m in (n, n_k)]
        cu_q, cu_k = self._offsets[key]
        flat = [x.transpose(1, 2).reshape(-1, x.shape[1], d) for x in (q, k, v)]  # views of (B, N, H, D) storage
        out = self._fn(*flat, max_seqlen_q=n, cu_seqlens_q=cu_q, max_seqlen_k=n_k, cu_seqlens_k=cu_k,
                       causal=causal, fa_version=3)
        return out.view(b, n, h, d).transpose(1, 2)


def kernel(name: str, *, device: str = "cpu", flex_compile: bool | None = None) -> Callable[..., torch.Tensor]:
    """The kernel `name` as fn(q, k, v, causal); raises Unavailable when this machine cannot provide it."""
    choice("kernel", "name", name, KERNELS)
    if name == "naive":
        return naive
    if name.startswith("sdpa_"):
        return _sdpa({"math": "MATH", "efficient": "EFFICIENT_ATTENTION", "flash": "FLASH_ATTENTION",
                      "cudnn": "CUDNN_ATTENTION"}[name[5:]])
    if name == "flex":
        return _Flex(device == "cuda" if flex_compile is None else flex_compile)
    return _VllmFa3(device)


def check_rows(n: int, count: int) -> list[int]:
    """Up to `count` query rows spread evenly from 0 to n - 1, both ends included."""
    return sorted({round(i * (n - 1) / max(count - 1, 1)) for i in range(min(count, n))})


def check_output(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dtype: str,
                 rows: int = 64) -> tuple[float, bool]:
    """(max |out - ref|, within tolerance) on the module docstring's slice, against a float64 reference."""
    b, h, n, _ = q.shape
    n_k, idx, worst, ok = k.shape[-2], check_rows(n, rows), 0.0, True
    sel = torch.tensor(idx, device=q.device)
    for bi, hi in {(0, 0), (b - 1, h - 1)}:
        s = (q[bi, hi, sel].double() @ k[bi, hi].double().T) * q.shape[-1] ** -0.5
        if causal:
            s.masked_fill_(torch.arange(n_k, device=q.device)[None, :] > sel[:, None] + (n_k - n), float("-inf"))
        ref = torch.softmax(s, dim=-1) @ v[bi, hi].double()
        err = (out[bi, hi, sel].double() - ref).abs()
        scale = ref.abs() + ref.pow(2).mean(dim=-1, keepdim=True).sqrt()
        worst, ok = max(worst, float(err.max())), ok and bool((err <= RTOL[dtype] * scale).all())
    return worst, ok


def _inputs(b: int, h: int, n: int, n_k: int, d: int, dtype: torch.dtype, device: str, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(b, m, h, d, generator=gen, device=device, dtype=dtype).transpose(1, 2) for m in (n, n_k, n_k)]


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _measure(fn: Callable[..., torch.Tensor], qkv: list[torch.Tensor], causal: bool, dtype: str, *, cuda: bool,
             warmup: int, repeats: int, rows: int, flush: torch.Tensor | None) -> dict[str, Any]:
    """Probe, warm up, measure memory once, check that output, time `repeats` calls (module docstring)."""
    q, k, v = qkv
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(q, k, v, causal)
            _sync(cuda)
        except Exception as e:
            if is_out_of_memory(e):
                raise
            said = list(dict.fromkeys(str(w.message).strip().replace("\n", " ") for w in caught))
            raise Unavailable(error_line(e) + ("; torch warned: " + " | ".join(said) if said else "")[:900]) from None
    got: dict[str, Any] = {"first_ms": (time.perf_counter() - t0) * 1e3}
    for _ in range(warmup):
        fn(q, k, v, causal)
    _sync(cuda)
    if cuda:
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    out = fn(q, k, v, causal)
    _sync(cuda)
    got["extra_mem_bytes"] = torch.cuda.max_memory_allocated() - base if cuda else None
    got["max_abs_err"], got["within_tol"] = check_output(out, q, k, v, causal, dtype, rows)
    del out
    times = []
    if cuda:
        marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in marks:
            if flush is not None:
                flush.zero_()
            start.record()
            fn(q, k, v, causal)
            end.record()
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in marks]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(q, k, v, causal)
            times.append((time.perf_counter() - t0) * 1e3)
    return got | {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}


def _peaks(gpu: str | None, peak_flops: float | None, bandwidth: float | None) -> dict[str, Any]:
    """The bf16 tensor peak and HBM bandwidth to score against: passed in, else H200's, else the table's, else None."""
    entry = lookup_gpu(gpu) if gpu else None
    if gpu and (entry is None and "H200" in gpu.upper() or entry is not None and entry.name == "H200"):
        flops, bw, source = H200.peak_flops, H200.hbm_bandwidth, "lablib.mechanisms.attention.H200"
    elif entry is not None:
        flops, bw, source = entry.bf16_flops, entry.peak_bw, f"lablib.hardware.roofline.GPU_PEAKS[{entry.name!r}]"
    else:
        flops, bw, source = None, None, "unknown (no GPU, or a GPU not in the peak table)"
    return {"peak_flops": flops if peak_flops is None else peak_flops,
            "hbm_bandwidth": bw if bandwidth is None else bandwidth,
            "peak_source": source if peak_flops is None and bandwidth is None else "passed in (missing ones: " + source + ")"}


def _recompile_room(needed: bool) -> contextlib.AbstractContextManager:
    """Room for one flex compile per shape: dynamo stops recompiling a function after 8 by default."""
    if not needed:
        return contextlib.nullcontext()
    cfg = torch._dynamo.config
    return cfg.patch(**{"recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit": 256})


def _pow2s(field: str, values: Sequence[int], fix: str) -> list[int]:
    vals = integers(_OWNER, field, values, fix, minimum=1)
    bad = [x for x in vals if x & (x - 1)]
    if bad:
        raise refuse(_OWNER, field, vals, f"powers of two >= 1 ({bad[0]} is not)", fix)
    return vals


QUICK_GPU = dict(seq_lens=(1024, 4096, 16384), head_dims=(128,), repeats=10, warmup=3,
                 decode_lens=(1024, 16384, 131072))
QUICK_CPU = dict(seq_lens=(64, 128, 256, 512), head_dims=(64,), tokens=1024, hidden=256, repeats=3, warmup=1,
                 decode_lens=(256, 1024, 4096))


def run_attention_bench(kernels: Sequence[str] | None = None, *, quick: bool = False, device: str | None = None,
                        dtype: str | None = None, seq_lens: Sequence[int] | None = None, dense_max_len: int = 32768,
                        head_dims: Sequence[int] | None = None, tokens: int | None = None, hidden: int | None = None,
                        causal: bool = True, repeats: int | None = None, warmup: int | None = None,
                        decode_kernels: Sequence[str] | None = None, decode_lens: Sequence[int] | None = None,
                        decode_batches: Sequence[int] = (1,), panels: Sequence[str] = ("prefill", "decode"),
                        peak_flops: float | None = None, hbm_bandwidth: float | None = None, rows: int = 64,
                        flex_compile: bool | None = None, flush_l2: bool = True,
                        seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the prefill sweep and the decode panel; return (rows, provenance), rows as plain dicts (`FIELDS`).

    Defaults: every kernel (decode: all but flex, which would compile once per KV length), lengths 256..65536
    (those above dense_max_len for TILED kernels only), head dims 64 and 128, tokens 16384, hidden 2048,
    30 repeats after 3 warm-ups, KV lengths 256..131072, bf16 on CUDA and fp32 on the CPU. quick=True sets the
    unset ones to QUICK_GPU (well under a minute on an H200) or, on the CPU, QUICK_CPU (seconds).
    Each point's status: 'ok', 'oom' (freed, the sweep goes on), 'unavailable' (reason: torch's words),
    'wrong' (timed, but outside tolerance). Arguments are refused before any work starts.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    choice(_OWNER, "device", device, ("cpu", "cuda"))
    if device == "cuda" and not torch.cuda.is_available():
        raise refuse(_OWNER, "device", device, "'cpu' here (torch sees no CUDA device)", "pass device='cpu' or None.")
    cuda = device == "cuda"
    preset = (QUICK_GPU if cuda else QUICK_CPU) if quick else {}
    pick = lambda value, name, default: value if value is not None else preset.get(name, default)  # noqa: E731
    dtype = choice(_OWNER, "dtype", pick(dtype, "dtype", "bf16" if cuda else "fp32"), tuple(DTYPES))
    kinds = [choice(_OWNER, "kernels", x, KERNELS) for x in (KERNELS if kernels is None else kernels)]
    dkinds = [choice(_OWNER, "decode_kernels", x, KERNELS)
              for x in ([x for x in kinds if x != "flex"] if decode_kernels is None else decode_kernels)]
    fix = "pass powers of two, e.g. [256, 1024, 4096]."
    lens = _pow2s("seq_lens", pick(seq_lens, "seq_lens", [2**i for i in range(8, 17)]), fix)
    dlens = _pow2s("decode_lens", pick(decode_lens, "decode_lens", [2**i for i in range(8, 18)]), fix)
    hid = integer(_OWNER, "hidden", pick(hidden, "hidden", 2048), "pass the model width, e.g. 2048.")
    dims = integers(_OWNER, "head_dims", pick(head_dims, "head_dims", (64, 128)), "pass e.g. [64, 128].")
    for d in dims:
        if d % 8 or d > 256 or hid % d:
            raise refuse(_OWNER, "head_dims", dims, f"multiples of 8 up to 256 that divide hidden={hid} ({d} is not)",
                         "FA2/FA3/cuDNN take head dims that are multiples of 8, at most 256; e.g. [64, 128].")
    n_tok = integer(_OWNER, "tokens", pick(tokens, "tokens", 16384), "pass batch x length, e.g. 16384.")
    reps = integer(_OWNER, "repeats", pick(repeats, "repeats", 30), "pass e.g. 30 (the median of that many calls).")
    warm = integer(_OWNER, "warmup", pick(warmup, "warmup", 3), "pass e.g. 3.", minimum=0)
    integer(_OWNER, "dense_max_len", dense_max_len, "pass e.g. 32768.")
    integers(_OWNER, "decode_batches", decode_batches, "pass e.g. [1, 8].")
    integer(_OWNER, "rows", rows, "pass e.g. 64 query rows to check.")
    for p in panels:
        choice(_OWNER, "panels", p, ("prefill", "decode"))
    if not isinstance(causal, bool):
        raise refuse(_OWNER, "causal", causal, "True or False", "pass causal=True for the FA paper's causal sweep.")

    hardware = device_facts(import_torch=True)
    gpu = torch.cuda.get_device_name() if cuda else None
    peaks = _peaks(gpu, peak_flops, hbm_bandwidth)
    scored = peaks["peak_flops"] if dtype in ("bf16", "fp16") else None  # the peak is bf16 tensor FLOP/s
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if cuda and flush_l2 else None
    made: dict[str, Any] = {}
    out: list[dict[str, Any]] = []

    def point(panel: str, name: str, n: int, d: int, b: int, h: int, qkv: list[torch.Tensor], is_causal: bool) -> None:
        q_len = n if panel == "prefill" else 1
        shape = AttentionShape(q_len, d, b, h, context_len=n, element_bytes=qkv[0].element_size(), causal=is_causal)
        row = dict.fromkeys(FIELDS) | {"panel": panel, "kernel": name, "N": n, "head_dim": d, "batch": b, "heads": h,
                                       "dtype": dtype, "causal": is_causal, "status": "ok"}
        if panel == "decode":
            row["kv_bytes"] = 2 * b * h * n * d * qkv[0].element_size()
        oom = None
        try:
            if name not in made:
                try:
                    made[name] = kernel(name, device=device, flex_compile=flex_compile)
                except Unavailable as e:
                    made[name] = e
            if isinstance(made[name], Unavailable):
                raise made[name]
            row |= _measure(made[name], qkv, is_causal, dtype, cuda=cuda, warmup=warm, repeats=reps, rows=rows,
                            flush=flush)
        except Unavailable as e:
            hint = f"; {_CPU_SDPA}" if not cuda and name in ("sdpa_efficient", "sdpa_cudnn") else ""
            row |= {"status": "unavailable", "reason": str(e) + hint}
        except Exception as e:  # OOM: freed below, outside the handler (its traceback holds the tensors)
            if is_out_of_memory(e):
                oom = error_line(e)
            else:
                row |= {"status": "unavailable", "reason": f"raised while measuring: {error_line(e)}"}
        if oom is not None:
            row |= oom_row(oom, cuda)
        if row["status"] == "ok":
            secs = row["median_ms"] / 1e3
            row["tflops"] = attention_flops(shape) / secs / 1e12
            row["pct_of_peak"] = 100 * row["tflops"] * 1e12 / scored if scored else None
            if panel == "decode":
                row["achieved_gbps"] = row["kv_bytes"] / secs / 1e9
                bw = peaks["hbm_bandwidth"] if cuda else None
                row["pct_of_bandwidth"] = 100 * row["kv_bytes"] / secs / bw if bw else None
            if not row["within_tol"]:
                row |= {"status": "wrong", "reason": f"max |out - ref| = {row['max_abs_err']:.3g} outside "
                        f"rtol x (|ref| + row rms), rtol = {RTOL[dtype]:.3g} ({dtype})"}
            if name == "flex" and not made[name].compiled:
                row["note"] = "eager flex_attention: unfused, materialises the scores (flex_compile=True compiles it)"
        out.append(row)

    with _recompile_room("flex" in kinds + dkinds):
        for d in dims:
            h = hid // d
            for n in lens if "prefill" in panels else ():
                b = max(1, n_tok // n)
                qkv = _inputs(b, h, n, n, d, DTYPES[dtype], device, seed + n)
                for name in kinds:
                    if n <= dense_max_len or name in TILED:
                        point("prefill", name, n, d, b, h, qkv, causal)
                del qkv
            for b in decode_batches if "decode" in panels else ():
                for n in dlens:
                    qkv = _inputs(b, h, 1, n, d, DTYPES[dtype], device, seed + n + 1)
                    for name in dkinds:  # one query sees every key; SDPA's is_causal is top-left aligned
                        point("decode", name, n, d, b, h, qkv, False)
                    del qkv
    del flush
    versions = library_versions()
    provenance = {
        "device": gpu or hardware.get("cpu"), "hardware": hardware, "torch": torch.__version__,
        "vllm": versions.get("vllm"), "versions": versions,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **peaks,
        "config": {"kernels": kinds, "decode_kernels": dkinds, "quick": quick, "device": device, "dtype": dtype,
                   "seq_lens": lens, "dense_max_len": dense_max_len, "head_dims": dims, "tokens": n_tok,
                   "hidden": hid, "causal": causal, "repeats": reps, "warmup": warm, "decode_lens": dlens,
                   "decode_batches": list(decode_batches), "panels": list(panels), "flush_l2": bool(flush_l2 and cuda),
                   "flex_compile": cuda if flex_compile is None else flex_compile, "seed": seed,
                   "torch_threads": torch.get_num_threads(),
                   "check": {"reference": "float64 from the same inputs, first and last (batch, head)",
                             "rows": rows, "rtol": RTOL[dtype], "rule": "|out-ref| <= rtol (|ref| + rms(ref row))"}}}
    return out, provenance


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of the rows (kernel, N, d, batch, ms, TFLOP/s, GB/s, extra MiB, status)."""
    head = f"{'panel':8}{'kernel':15}{'N':>7}{'d':>5}{'B':>4}{'ms':>10}{'TFLOP/s':>9}{'GB/s':>8}{'extraMiB':>10}  status"
    fmt = lambda x, w, p: "-".rjust(w) if x is None else f"{x:{w}.{p}f}"  # noqa: E731
    lines = [head] + [
        f"{r['panel']:8}{r['kernel']:15}{r['N']:>7}{r['head_dim']:>5}{r['batch']:>4}{fmt(r['median_ms'], 10, 3)}"
        f"{fmt(r['tflops'], 9, 2)}{fmt(r['achieved_gbps'], 8, 1)}"
        f"{fmt(None if r['extra_mem_bytes'] is None else r['extra_mem_bytes'] / 2**20, 10, 1)}  {r['status']}"
        + (f" ({r['reason'][:70]})" if r["reason"] else "") for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """`python -m lablib.bench.attention --quick [--out FILE]`: with --out, the JSON goes to FILE and the table to
    stdout; without, the table goes to stderr and the JSON document is stdout's last line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="QUICK_GPU on CUDA, QUICK_CPU on the CPU")
    ap.add_argument("--device", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", choices=tuple(DTYPES))
    ap.add_argument("--kernels", nargs="+", choices=KERNELS)
    ap.add_argument("--seq-lens", nargs="+", type=int)
    ap.add_argument("--head-dims", nargs="+", type=int)
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--panels", nargs="+", default=["prefill", "decode"], choices=("prefill", "decode"))
    ap.add_argument("--out", help="write the JSON document {rows, provenance} here")
    a = ap.parse_args(argv)
    rows, prov = run_attention_bench(a.kernels, quick=a.quick, device=a.device, dtype=a.dtype, seq_lens=a.seq_lens,
                                     head_dims=a.head_dims, repeats=a.repeats, panels=a.panels)
    doc = json.dumps({"rows": rows, "provenance": prov}, default=str)
    if a.out:
        with open(a.out, "w") as f:
            f.write(doc)
        print(format_table(rows))
        print(f"{prov['device']} · torch {prov['torch']} · vllm {prov['vllm']} · {prov['date']} -> {a.out}")
    else:
        print(format_table(rows), file=sys.stderr)
        print(doc)


if __name__ == "__main__":
    main()
