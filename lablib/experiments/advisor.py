"""Lab 10's tuning advisor: from what a deployment needs to vLLM's knobs, each setting resting on a measurement.

Labs 03-09 each measured one lever, on the synthetic Llama-3.1-8B on an H200 for speed and memory and on the
embedded trained models for quality. A deployment meets the levers in one order, and the advisor walks it:

1. fit (labs 06 and 09): the cheapest weight scheme the quality budget allows, and the fewest GPUs
   (`tensor_parallel_size`) whose memory holds those weights and the KV of every request in flight;
2. weights (lab 06): among the allowed schemes that fit, the fastest at this load, by the recorded decode
   speed at the batch nearest to it (the seed's "int4 is faster" is tested here, not assumed);
3. `max_num_seqs` (labs 01 and 04): the largest batch whose per-token latency meets the SLO, from lab 09's cost
   model calibrated on its TP=1 recording, and the replicas the rest of the load then needs;
4. `kv_cache_dtype` (lab 06): FP8 KV only when bf16 KV does not fit, since it costs speed and buys capacity;
5. `enable_prefix_caching` (lab 07): what the shared prefix buys, by the recorded on/off pair;
6. `speculative_config` (lab 08): whether a draft pays at this batch, by the recorded 8B pair run at the
   embedded pair's own acceptance.

Each row says what it rests on: a run recorded on the H200 (with its date and model), or the cost model
(`lablib.mechanisms.parallel`, spec-sheet peaks), labelled as such. A lever never measured for the goal's
case (a GPU other than the H200, multi-GPU speed) says so. This is advice: run the suggested configuration
under lab 05's load generator before trusting it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from .. import validate
from ..mechanisms import parallel as tp
from ..models.architecture import architectures
from ..results.reference import load_reference, reference_facts, reference_steps
from .parallel_model import calibrated_overhead, model_shape

GPUS = {"H200": tp.H200, "H100": tp.H100_SXM, "A100": tp.A100_80GB, "L40S": tp.L40S}
FP8_GPUS = ("H200", "H100", "L40S")  # compute capability 8.9 or 9.0: vLLM's FP8 weights and KV
SCHEMES = ("bf16", "fp8", "w4a16")  # cheapest last; Goal.lowest_precision allows those up to it
RECORDED = {"bf16": "quant-bf16", "fp8": "quant-fp8", "w4a16": "quant-gptq-w4a16"}  # lab 06's steps, -b{batch}
QUALITY_ROW = {"bf16": "bf16", "fp8": "fp8-dynamic", "w4a16": "gptq-w4a16"}  # facts["quantization_quality"] rows
QUANT_BATCHES = (1, 8, 64, 256)
SPEC_BATCHES = (1, 4, 16, 64)
PREFIX_PAIR = ("prefix-off-shared-prefix-512-llama-3.1-8b", "prefix-on-shared-prefix-512-llama-3.1-8b")
BLOCK = 16  # vLLM's KV block: a shared prefix shorter than one block is never reused
MODEL = "cost model (lablib.mechanisms.parallel, spec-sheet peaks, calibrated on the 8B's TP=1 recording)"


@dataclass(frozen=True)
class Goal:
    """What a deployment needs; the advisor turns it into vLLM settings."""

    model: str = "llama-3.1-8b"  # a shipped architecture (lablib.models.architecture.architectures())
    gpu: str = "H200"  # one of GPUS
    concurrency: int = 64  # requests in flight at peak
    prompt_tokens: int = 512  # a request's prompt
    output_tokens: int = 256  # a request's output
    shared_prefix_tokens: int = 0  # prompt tokens every request shares (a system prompt, a file header)
    tpot_slo_ms: float | None = None  # per-token latency each user must see at most (None: throughput only)
    lowest_precision: str = "fp8"  # the cheapest weights the quality budget allows: bf16, fp8 or w4a16
    max_gpus: int = 8  # GPUs of one host the deployment may use

    def __post_init__(self) -> None:
        archs = tuple(architectures())
        validate.choice("Goal", "model", self.model, archs, "one of the shipped shapes, e.g. 'llama-3.1-8b'.")
        validate.choice("Goal", "gpu", self.gpu, tuple(GPUS))
        for name in ("concurrency", "prompt_tokens", "output_tokens", "max_gpus"):
            validate.integer("Goal", name, getattr(self, name), "a whole number >= 1.")
        validate.integer("Goal", "shared_prefix_tokens", self.shared_prefix_tokens,
                         f"0 to {self.prompt_tokens} (at most the prompt).", 0, self.prompt_tokens)
        if self.tpot_slo_ms is not None:
            validate.number("Goal", "tpot_slo_ms", self.tpot_slo_ms, "milliseconds per token, e.g. 20, or None.",
                            0, low_open=True)
        validate.choice("Goal", "lowest_precision", self.lowest_precision, SCHEMES,
                        "bf16 (no quantization), fp8 or w4a16 (lab 06 measured each one's quality).")

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.output_tokens


def allowed_schemes(goal: Goal) -> list[str]:
    """The weight schemes the goal's quality budget and GPU allow, costliest first."""
    schemes = list(SCHEMES[:SCHEMES.index(goal.lowest_precision) + 1])
    return [s for s in schemes if s != "fp8" or goal.gpu in FP8_GPUS]


def fit(goal: Goal, scheme: str, kv: str = "auto") -> int | None:
    """The fewest GPUs (a TP size the model's heads allow, up to max_gpus) holding the weights and the KV of
    `concurrency` requests of full context (lab 09's memory model), or None when none does."""
    shape = model_shape(goal.model, scheme, 1 if kv == "fp8" else 2)
    sizes = tuple(t for t in tp.valid_tp_sizes(shape) if t <= goal.max_gpus)
    return tp.smallest_fitting_tp(shape, goal.concurrency, goal.context, GPUS[goal.gpu], sizes)


def _nearest(batch: int, batches: tuple[int, ...]) -> int:
    return min(batches, key=lambda b: abs(math.log(b) - math.log(batch)))


def _summary(step: str) -> dict[str, Any] | None:
    """A recorded run's summary with its label, or None where it is not shipped."""
    if step not in reference_steps():
        return None
    r = load_reference(step)[0]
    return {**r.summary, "label": r.label, "model": r.model.get("name")}


def predicted_tpot_ms(goal: Goal, scheme: str, t: int, batch: int, kv: str = "auto") -> float:
    """Per-token latency at `batch`, TP=t: the cost model's step plus the per-step cost it misses, measured as the
    8B's batch-1 TPOT on the H200 less the model's bound (`calibrated_overhead`; 1.3-1.7 ms)."""
    from .parallel import recorded_tp1_points

    gpu = replace(GPUS[goal.gpu], overhead_s=calibrated_overhead(recorded_tp1_points().value))
    shape = model_shape(goal.model, scheme, 1 if kv == "fp8" else 2)
    return tp.decode_step(shape, batch, goal.prompt_tokens + goal.output_tokens // 2, t, gpu).latency_s * 1e3


def _row(knob: str, setting: Any, why: str, evidence: str, source: str) -> dict[str, Any]:
    return {"knob": knob, "setting": setting, "why": why, "evidence": evidence, "source": source}


def _weights(goal: Goal) -> tuple[str, int, str, list[dict[str, Any]]]:
    """The weight scheme, TP size and KV dtype, with the rows that say why."""
    quality = {r["scheme"]: r for r in reference_facts().get("quantization_quality", {}).get("rows", [])}
    batch = _nearest(goal.concurrency, QUANT_BATCHES)
    fits = {s: fit(goal, s) for s in allowed_schemes(goal)}
    kv = "auto"
    if not any(fits.values()):  # nothing fits with bf16 KV: FP8 KV halves it, where the GPU has FP8
        kv = "fp8" if goal.gpu in FP8_GPUS else "auto"
        fits = {s: fit(goal, s, kv) for s in fits}
    if not any(fits.values()):
        raise ValueError(f"Goal: {goal.model} with {goal.concurrency} requests of {goal.context} tokens fits no "
                         f"{goal.max_gpus} {goal.gpu}s at {', '.join(fits)}. Fix: lower concurrency or the "
                         "context, allow lowest_precision='w4a16', raise max_gpus, or use more nodes (lab 09).")
    speed = {s: _summary(f"{RECORDED[s]}-b{batch}") for s in fits if fits[s]}
    t = min(v for v in fits.values() if v)
    fewest = [s for s in speed if fits[s] == t]  # the fewest GPUs first; then the fastest measured
    scheme = max(fewest, key=lambda s: speed[s]["output_tok_s"] if speed[s] else 0)
    measured = ", ".join(f"{s} {speed[s]['output_tok_s']:,.0f}" for s in speed if speed[s])
    label = next((speed[s]["label"] for s in speed if speed[s]), "")
    q = quality.get(QUALITY_ROW[scheme])
    rows = [_row("tensor_parallel_size", t,
                 f"the fewest {goal.gpu}s holding {scheme} weights and {goal.concurrency} x {goal.context} tokens "
                 "of KV (lab 09)", "; ".join(f"{s}: {f} GPU{'s' if f > 1 else ''}" if f else f"{s}: more than {goal.max_gpus}"
                                             for s, f in fits.items()), "lablib.mechanisms.parallel.memory_fit (a model)"),
            _row("quantization", {"bf16": None, "fp8": "fp8", "w4a16": "a W4A16 checkpoint (lab 06)"}[scheme],
                 f"{scheme}: the " + ("fastest allowed scheme" if len(fewest) > 1 else "only allowed scheme that fits")
                 + f" on {t} GPU{'s' if t > 1 else ''}, by the 8B's speed at batch {batch} (lab 06)",
                 f"the synthetic 8B's decode output tok/s at batch {batch}: {measured or 'not measured'}" + (
                     f"; perplexity {q['ppl_change_pct']:+.2f}% against bf16 on the embedded model" if q else ""),
                 label or "not measured: no recorded run of these schemes")]
    off, on = _summary(f"quant-bf16-b{batch}"), _summary(f"quant-bf16-kv-fp8-b{batch}")
    cost = f"; FP8 KV ran at {on['output_tok_s'] / off['output_tok_s']:.2f}x bf16 KV's tok/s at batch {batch}" if (
        on and off) else ""
    rows.append(_row("kv_cache_dtype", kv, "bf16 KV does not fit: FP8 halves its bytes" if kv == "fp8" else
                     "bf16 KV fits: FP8 KV would only buy capacity not needed here",
                     "FP8 KV held 2x the tokens of bf16 (lab 06)" + cost, on["label"] if on else MODEL))
    return scheme, t, kv, rows


def _batch_rows(goal: Goal, scheme: str, t: int, kv: str) -> tuple[int, list[dict[str, Any]]]:
    """max_num_seqs under the SLO and the replicas the rest of the load needs."""
    at_load = predicted_tpot_ms(goal, scheme, t, goal.concurrency, kv)
    if goal.tpot_slo_ms is None or at_load <= goal.tpot_slo_ms:
        cap, why = goal.concurrency, ("every request in flight at once: batching is free throughput while decode is "
                                      "bandwidth-bound (lab 01)") if goal.tpot_slo_ms is None else (
            f"all {goal.concurrency} at once keep TPOT at {at_load:.1f} ms, within the {goal.tpot_slo_ms:g} ms SLO")
    else:
        cap = max((b for b in range(1, goal.concurrency) if predicted_tpot_ms(goal, scheme, t, b, kv)
                   <= goal.tpot_slo_ms), default=0)
        why = (f"{goal.concurrency} at once would take TPOT to {at_load:.1f} ms, over the {goal.tpot_slo_ms:g} ms SLO" +
               (f"; at most {cap} per engine meet it" if cap else "; not even one request meets it on this setup"))
    measured = _summary(f"{RECORDED[scheme]}-b{_nearest(max(cap, 1), QUANT_BATCHES)}")
    evidence = (f"predicted TPOT {predicted_tpot_ms(goal, scheme, t, max(cap, 1), kv):.2f} ms at {max(cap, 1)}" +
                (f"; the 8B measured {measured['tpot_s']['p50'] * 1e3:.2f} ms at batch {measured['requests']} "
                 f"({measured['label']})" if measured and (goal.model, goal.gpu) == ("llama-3.1-8b", "H200") else ""))
    rows = [_row("max_num_seqs", cap or None, why, evidence, MODEL)]
    if cap and cap < goal.concurrency:
        replicas = math.ceil(goal.concurrency / cap)
        faster = next((u for u in tp.valid_tp_sizes(model_shape(goal.model, scheme)) if u > t and u <= goal.max_gpus
                       and predicted_tpot_ms(goal, scheme, u, goal.concurrency, kv) <= goal.tpot_slo_ms), None)
        rows.append(_row("replicas", replicas, f"{replicas} engines of {cap} carry the {goal.concurrency} in flight "
                         f"({replicas * t} GPUs; a replica doubles throughput exactly, lab 09)",
                         (f"or TP={faster} on {faster} GPUs meets the SLO with all {goal.concurrency} in one engine "
                          "(predicted; TP>1 speed is not measured yet: lab 09)") if faster else
                         "no larger TP meets the SLO with the whole load (predicted)", MODEL))
    elif not cap:
        rows.append(_row("replicas", None, "no engine meets the SLO: relax it, or cut the model (quantization) or "
                         "the step (TP, lab 09)", "", MODEL))
    return cap, rows


def _prefix_row(goal: Goal) -> dict[str, Any]:
    off, on = (_summary(s) for s in PREFIX_PAIR)
    evidence = (f"32 requests sharing a 512-token header on the 8B: TTFT p50 {off['ttft_s']['p50'] * 1e3:.0f} -> "
                f"{on['ttft_s']['p50'] * 1e3:.0f} ms, output tok/s x{on['output_tok_s'] / off['output_tok_s']:.2f} "
                "(lab 07)") if off and on else "not measured: lab 07's on/off pair is not recorded"
    reused = goal.shared_prefix_tokens // BLOCK * BLOCK
    why = (f"{reused} of each prompt's {goal.prompt_tokens} tokens are whole shared blocks: their prefill is "
           "skipped after the first request" if reused else
           "no whole 16-token block is shared here: nothing to reuse, so expect no gain (vLLM 0.26 turns it on "
           "by default; its cost without sharing is not measured here)")
    return _row("enable_prefix_caching", True, why, evidence, on["label"] if on else "not measured")


def _speculative_row(goal: Goal) -> dict[str, Any]:
    batch = _nearest(goal.concurrency, SPEC_BATCHES)
    base, draft = _summary(f"spec-8b-baseline-b{batch}"), _summary(f"spec-8b-draft_model-k4-b{batch}")
    if not (base and draft):
        return _row("speculative_config", None, "lab 08's 8B pair is not recorded", "", "not measured")
    rows = {r["step"]: r for r in reference_facts().get("speculative-8b", {}).get("rows", [])}
    length = rows.get(f"spec-8b-draft_model-k4-b{batch}", {}).get("mean_acceptance_length")
    ratio = draft["output_tok_s"] / base["output_tok_s"]
    pays = ratio > 1
    return _row("speculative_config", {"method": "draft_model", "num_speculative_tokens": 4} if pays else None,
                f"a 1B draft at k=4 {'paid' if pays else 'did not pay'} at batch {batch}, the nearest measured to "
                f"{goal.concurrency} in flight (lab 08)",
                f"output tok/s {base['output_tok_s']:,.0f} without, {draft['output_tok_s']:,.0f} with (x{ratio:.2f})" +
                (f", at the embedded pair's acceptance length {length:.2f}" if length else ""), draft["label"])


def advise(goal: Goal) -> list[dict[str, Any]]:
    """The settings for `goal`, in the order a deployment meets them, each with why, evidence and its source."""
    scheme, t, kv, rows = _weights(goal)
    _, batch = _batch_rows(goal, scheme, t, kv)
    return rows + batch + [_prefix_row(goal), _speculative_row(goal)]


def engine_kwargs(goal: Goal, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The advice as lablib.config.VLLMConfig's fields (the W4A16 scheme needs its checkpoint, lab 06)."""
    got = {r["knob"]: r["setting"] for r in rows or advise(goal)}
    quant = got["quantization"]
    return {"tensor_parallel_size": got["tensor_parallel_size"], "quantization": quant if quant == "fp8" else None,
            "kv_cache_dtype": got["kv_cache_dtype"], "max_num_seqs": got["max_num_seqs"] or 1,
            "max_model_len": goal.context, "enable_prefix_caching": got["enable_prefix_caching"],
            "speculative_config": got["speculative_config"]}  # a draft's "model" path still to add where it pays


def lines(goals: list[Goal]) -> list[str]:
    """One sentence per goal: the settings advised, then each lever left off and the measurement that says why."""
    out = []
    for goal in goals:
        rows = {r["knob"]: r for r in advise(goal)}
        cfg = engine_kwargs(goal, list(rows.values()))
        scheme = rows["quantization"]["why"].split(":")[0]
        text = (f"{goal.model}, {goal.concurrency} in flight on {goal.gpu}: {scheme} weights on "
                f"{cfg['tensor_parallel_size']} GPU(s), max_num_seqs {rows['max_num_seqs']['setting']}, KV "
                f"{cfg['kv_cache_dtype']}")
        if "replicas" in rows and rows["replicas"]["setting"]:
            text += f", {rows['replicas']['setting']} replicas"
        if "w4a16" in allowed_schemes(goal) and scheme != "w4a16":
            text += f"; W4A16 was allowed and not picked ({rows['quantization']['evidence']})"
        if rows["speculative_config"]["setting"] is None:
            text += f"; no draft model ({rows['speculative_config']['evidence']})"
        out.append(text + ".")
    return out
