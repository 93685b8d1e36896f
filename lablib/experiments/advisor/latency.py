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
(`prefill_ms_per_token`; FP8 weights faster by what lab 06's recorded bursts measured at that step's size,
`fp8_prefill_speedup`);
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
FP8_PREFILL_BATCHES = (8, 64, 256)  # lab 06's bursts of 133-token prompts whose TTFT is prefill: 1,063 to 34,026
# prompt tokens (a burst of one is mostly the step's fixed cost: its ratio says little about prefill)


@lru_cache(maxsize=None)
def fp8_prefill_points() -> tuple[tuple[tuple[int, float], ...], str]:
    """((tokens a prefill step carried, bf16 TTFT / FP8 TTFT), ...) from lab 06's recorded 8B bursts, smallest
    first, and their label. A burst's prompts are prefilled in steps of at most the engine's max_num_batched_tokens,
    so a burst of b prompts stands for steps of min(b x 133, that budget) tokens."""
    points, label = [], None
    for b in FP8_PREFILL_BATCHES:
        bf16, fp8 = (load_reference(f"{RECORDED[s]}-b{b}")[0] if f"{RECORDED[s]}-b{b}" in reference_steps() else None
                     for s in ("bf16", "fp8"))
        if bf16 and fp8:
            budget = fp8.engine_facts.get("max_num_batched_tokens") or fp8.summary["prompt_tokens"]
            points.append((min(fp8.summary["prompt_tokens"], budget),
                           bf16.summary["ttft_s"]["p50"] / fp8.summary["ttft_s"]["p50"]))
            label = fp8.label
    if not points:
        raise validate.refuse("fp8_prefill_speedup", "reference", None,
                              f"lab 06's recorded bursts {RECORDED['bf16']}/{RECORDED['fp8']}-b{FP8_PREFILL_BATCHES}",
                              "restore data/reference/ (lab 06's recordings).")
    return tuple(sorted(points)), label


def fp8_prefill_speedup(step_tokens: int | None = None) -> tuple[float, str]:
    """(how much faster FP8 weights prefill than bf16 in a step of `step_tokens` tokens, the runs' label): lab 06's
    bursts (`fp8_prefill_points`), log-interpolated in the step's tokens and held flat beyond the ends; None: the
    largest step's. Not the 2x of FP8's peak, and not one number: vLLM quantizes activations on the fly and the
    attention stays bf16, and a small step's GEMMs gain least (on the H200: x1.16 for a step of 1,063 prompt tokens,
    x1.41 at 8,507, x1.43 at the 16,384 budget). Taken for any GPU with FP8 tensor cores. Each point is a whole
    burst's TTFT ratio (its weight reads and fixed costs included) applied to the prefill compute alone: at the
    smallest burst part of FP8's gain is the weight bytes it halves, so there the price errs towards FP8."""
    points, label = fp8_prefill_points()
    if step_tokens is None or step_tokens >= points[-1][0]:
        return points[-1][1], label
    if step_tokens <= points[0][0]:
        return points[0][1], label
    (n0, x0), (n1, x1) = next((p, q) for p, q in zip(points, points[1:]) if p[0] <= step_tokens <= q[0])
    return x0 + (x1 - x0) * math.log(step_tokens / n0) / math.log(n1 / n0), label


def prefill_ms_per_token(goal: Any, scheme: str, t: int, step_tokens: int | None = None) -> float:
    """One prompt token's time (ms) on one engine of the goal, in a step carrying `step_tokens` tokens (None: a full
    step): 2 x parameters per GPU / (peak x efficiency), the peak raised by `fp8_prefill_speedup` at that step's size
    for FP8 weights on a GPU with FP8 tensor cores (W4A16 computes in bf16)."""
    gpu = GPUS[goal.gpu]
    fp8 = scheme == "fp8" and goal.gpu in FP8_GPUS
    peak = gpu.peak_flops * (fp8_prefill_speedup(step_tokens)[0] if fp8 else 1)
    return 2 * tp.params_per_gpu(model_shape(goal.model, scheme), t) / (peak * prefill_efficiency()[0]) * 1e3


def loaded_tpot_ms(goal: Any, scheme: str, t: int, batch: int, kv: str = "auto") -> float:
    """Mean per-token latency with `batch` in flight and every finished request replaced by a new one: the decode
    step (`predicted_tpot_ms`) plus the prefill it shares. Each of a request's `output_tokens` steps then carries, on
    average, batch / output_tokens new prompts' uncached tokens (whole shared blocks are cached)."""
    uncached = goal.prompt_tokens - cached_tokens(goal)
    return (predicted_tpot_ms(goal, scheme, t, batch, kv)  # a prompt's uncached part shares a step with the decodes
            + batch / goal.output_tokens * uncached * prefill_ms_per_token(goal, scheme, t, uncached + batch))


def cached_tokens(goal: Any) -> int:
    """Prompt tokens a request after the first finds in the prefix cache: whole shared blocks, never the block holding
    the prompt's last token (vLLM recomputes it to produce the first output token)."""
    return min(goal.shared_prefix_tokens // BLOCK * BLOCK, (goal.prompt_tokens - 1) // BLOCK * BLOCK)
