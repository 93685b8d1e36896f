"""Lab 10's per-token latency prediction: lab 09's cost model, calibrated per batch on lab 06's recorded 8B runs.

The cost model (`lablib.mechanisms.parallel.decode_step`) bounds a decode step by its bytes at HBM peak, its FLOPs
and its all-reduces. A real step takes longer, and by how much depends on the batch: at batch 1 the 8B's bf16 step
on the H200 took 1.56x its bound (launches, sampling, kernels below peak bandwidth), at batch 256 2.40x (what a
large batch adds per sequence is not in the bytes). `predicted_tpot_ms` is the bound for the goal's model, GPU,
TP size and lengths plus what the recorded 8B step of the same weight scheme spent beyond its own bound at that
batch, log-interpolated between lab 06's batches 1, 8, 64 and 256 and held flat beyond them: exact on those runs,
an assumption for any other model, GPU or TP size, and labelled so wherever the advisor uses it.

Under load the decode steps also carry new requests' prompts: `loaded_tpot_ms` adds the prefill a step shares when
every finished request is replaced, each prompt token priced at the efficiency the 8B's recorded prefill reached
(`prefill_ms_per_token`; FP8 weights faster by what lab 06's recorded bursts measured, `fp8_prefill_speedup`);
`load.under_load` gives the percentiles.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from ... import validate
from ...mechanisms import parallel as tp
from ...results.reference import load_reference, reference_steps
from ..parallel.model import model_shape

GPUS = {"H200": tp.H200, "H100": tp.H100_SXM, "A100": tp.A100_80GB, "L40S": tp.L40S}
SCHEMES = ("bf16", "fp8", "w4a16")  # cheapest last
RECORDED = {"bf16": "quant-bf16", "fp8": "quant-fp8", "w4a16": "quant-gptq-w4a16"}  # lab 06's steps, -b{batch}
QUANT_BATCHES = (1, 8, 64, 256)
BLOCK = 16  # vLLM's KV block: a shared prefix shorter than one block is never reused
MODEL = "cost model (lablib.mechanisms.parallel) + the 8B's recorded step beyond it at that batch (lab 06's runs)"


def summary_of(step: str) -> dict[str, Any] | None:
    """A recorded run's summary with its label, or None where it is not shipped."""
    if step not in reference_steps():
        return None
    r = load_reference(step)[0]
    return {**r.summary, "label": r.label, "roofline": r.roofline}


def _bound_ms(model: str, scheme: str, t: int, batch: int, context: int, gpu: str, kv: str = "auto") -> float:
    shape = model_shape(model, scheme, 1 if kv == "fp8" else 2)
    return tp.decode_step(shape, batch, context, t, GPUS[gpu]).latency_s * 1e3


@lru_cache(maxsize=None)
def calibration(scheme: str) -> tuple[tuple[int, float], ...]:
    """(batch, ms the 8B's recorded TPOT spent beyond the cost model's bound) at lab 06's batches, for `scheme`."""
    points = []
    for b in QUANT_BATCHES:
        s = summary_of(f"{RECORDED[scheme]}-b{b}")
        if s:
            bound = _bound_ms("llama-3.1-8b", scheme, 1, b, round(s["roofline"]["context_len"]), "H200")
            points.append((b, max(0.0, s["tpot_s"]["p50"] * 1e3 - bound)))
    return tuple(points)


def beyond_bound_ms(scheme: str, batch: int) -> float:
    """`calibration`, log-interpolated in batch and held flat beyond its ends (0 where nothing is recorded)."""
    pts = calibration(scheme)
    if not pts:
        return 0.0
    if batch <= pts[0][0] or batch >= pts[-1][0]:
        return pts[0][1] if batch <= pts[0][0] else pts[-1][1]
    (b0, x0), (b1, x1) = next((p, q) for p, q in zip(pts, pts[1:]) if p[0] <= batch <= q[0])
    return x0 + (x1 - x0) * math.log(batch / b0) / math.log(b1 / b0)


def calibration_rows() -> list[dict[str, Any]]:
    """Per scheme and recorded batch: the 8B's measured TPOT, the cost model's bound, and what the bound misses."""
    rows = []
    for scheme in SCHEMES:
        for b, beyond in calibration(scheme):
            run = summary_of(f"{RECORDED[scheme]}-b{b}")
            measured = run["tpot_s"]["p50"] * 1e3
            rows.append({"scheme": scheme, "batch": b, "measured_ms": measured, "bound_ms": measured - beyond,
                         "beyond_bound_ms": beyond, "measured_over_bound": measured / (measured - beyond),
                         "provenance": run["label"]})
    return rows


def predicted_tpot_ms(goal: Any, scheme: str, t: int, batch: int, kv: str = "auto") -> float:
    """Per-token latency at `batch` (mean context: the prompt and half the output), TP=t: bound + beyond_bound."""
    context = goal.prompt_tokens + goal.output_tokens // 2
    return _bound_ms(goal.model, scheme, t, batch, context, goal.gpu, kv) + beyond_bound_ms(scheme, batch)


PREFILL_RUNS = tuple(f"prefix-off-shared-prefix-{n}-llama-3.1-8b" for n in (1024, 512))  # largest first
PREFILL = ("prefill: one prompt token's compute at the efficiency the 8B's recorded prefill reached on the H200 "
           "(lab 07, prefix caching off)")


@lru_cache(maxsize=None)
def prefill_efficiency() -> tuple[float, str]:
    """(share of peak FLOP/s, the run's label): the 8B's prompt tokens' compute over TTFT p90 of a burst of 32 (all
    but the last few prompts prefilled by then: an estimate that errs slightly low), from the largest recorded
    prefill."""
    for step in PREFILL_RUNS:
        s = summary_of(step)
        if s:
            shape = model_shape("llama-3.1-8b")
            compute_s = 2 * tp.params_per_gpu(shape, 1) * s["prompt_tokens"] / tp.H200.peak_flops
            return compute_s / s["ttft_s"]["p90"], s["label"]
    raise validate.refuse("prefill_efficiency", "reference", None, f"one of the recorded runs {PREFILL_RUNS}",
                          "restore data/reference/ (lab 07's recordings).")


SERVE_STEP = "serve-rate-"  # lab 05's recorded 8B server (bf16, the journey) under Poisson load, one step per rate


@lru_cache(maxsize=None)
def server_overhead_ms() -> tuple[float, str]:
    """(ms, the run's label): what vLLM's OpenAI server adds to a request's TTFT beyond the queue and the prefill the
    model counts (HTTP, scheduling, streaming the first token back). From lab 05's recorded 8B server at its lowest
    rate, where little queues: TTFT p50 minus the mean prompt's prefill (bf16, `prefill_efficiency`) and half a
    decode step (the mean wait for the running step to end)."""
    rates = sorted((float(s[len(SERVE_STEP):]), s) for s in reference_steps()
                   if s.startswith(SERVE_STEP) and s[len(SERVE_STEP):] != "inf")
    if not rates:
        raise validate.refuse("server_overhead_ms", "reference", None, f"lab 05's recorded {SERVE_STEP}<rate> runs",
                              "restore data/reference/ (lab 05's recordings).")
    s = summary_of(rates[0][1])
    prompt = s["prompt_tokens"] / s["requests"]
    prefill_ms = 2 * tp.params_per_gpu(model_shape("llama-3.1-8b"), 1) * prompt / (
        tp.H200.peak_flops * prefill_efficiency()[0]) * 1e3
    return s["ttft_s"]["p50"] * 1e3 - prefill_ms - s["tpot_s"]["p50"] * 1e3 / 2, s["label"]


FP8_GPUS = ("H200", "H100", "L40S")  # compute capability 8.9 or 9.0: FP8 tensor cores for weights, KV and GEMMs
FP8_PREFILL_BATCHES = (256, 64)  # lab 06's bursts of 133-token prompts, largest first: prefill-bound TTFT


@lru_cache(maxsize=None)
def fp8_prefill_speedup() -> tuple[float, str]:
    """(how much faster FP8 weights prefill than bf16, the runs' label): TTFT p50 of lab 06's recorded 8B burst in
    bf16 over the same burst with FP8 weights. Not the 2x of FP8's peak: vLLM quantizes activations on the fly and the
    attention stays bf16 (1.43x on the H200's 256-prompt burst). Taken for any GPU with FP8 tensor cores."""
    for b in FP8_PREFILL_BATCHES:
        bf16, fp8 = summary_of(f"{RECORDED['bf16']}-b{b}"), summary_of(f"{RECORDED['fp8']}-b{b}")
        if bf16 and fp8:
            return bf16["ttft_s"]["p50"] / fp8["ttft_s"]["p50"], fp8["label"]
    raise validate.refuse("fp8_prefill_speedup", "reference", None,
                          f"lab 06's recorded bursts {RECORDED['bf16']}/{RECORDED['fp8']}-b{FP8_PREFILL_BATCHES}",
                          "restore data/reference/ (lab 06's recordings).")


def prefill_ms_per_token(goal: Any, scheme: str, t: int) -> float:
    """One prompt token's time (ms) on one engine of the goal: 2 x parameters per GPU / (peak x efficiency), the
    peak raised by `fp8_prefill_speedup` for FP8 weights on a GPU with FP8 tensor cores (W4A16 computes in bf16)."""
    gpu = GPUS[goal.gpu]
    peak = gpu.peak_flops * (fp8_prefill_speedup()[0] if scheme == "fp8" and goal.gpu in FP8_GPUS else 1)
    return 2 * tp.params_per_gpu(model_shape(goal.model, scheme), t) / (peak * prefill_efficiency()[0]) * 1e3


def loaded_tpot_ms(goal: Any, scheme: str, t: int, batch: int, kv: str = "auto") -> float:
    """Mean per-token latency with `batch` in flight and every finished request replaced by a new one: the decode
    step (`predicted_tpot_ms`) plus the prefill it shares. Each of a request's `output_tokens` steps then carries, on
    average, batch / output_tokens new prompts' uncached tokens (whole shared blocks are cached)."""
    uncached = goal.prompt_tokens - cached_tokens(goal)
    return (predicted_tpot_ms(goal, scheme, t, batch, kv)
            + batch / goal.output_tokens * uncached * prefill_ms_per_token(goal, scheme, t))


def cached_tokens(goal: Any) -> int:
    """Prompt tokens a request after the first finds in the prefix cache: whole shared blocks, never the block holding
    the prompt's last token (vLLM recomputes it to produce the first output token)."""
    return min(goal.shared_prefix_tokens // BLOCK * BLOCK, (goal.prompt_tokens - 1) // BLOCK * BLOCK)
