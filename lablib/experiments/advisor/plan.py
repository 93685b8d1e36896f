"""Lab 10's tuning advisor: from what a deployment needs to vLLM's knobs, each setting resting on a measurement.

Labs 03-09 each measured one lever, on the synthetic Llama-3.1-8B on an H200 for speed and memory and on the
embedded trained models for quality. A deployment meets the levers in one order, and the advisor walks it:

1. fit (labs 06 and 09): per allowed weight scheme, the fewest GPUs (`tensor_parallel_size`) whose memory holds
   the weights and the KV of every request in flight, with FP8 KV where it saves GPUs;
2. weights (lab 06): among the schemes on the fewest GPUs, the fastest by the recorded decode speed at the batch
   nearest the load (the common claim "int4 is faster" is tested here, not assumed);
3. the load (labs 01, 04 and 09): under a per-token latency target, the largest batch per engine that meets it,
   then the fewest GPUs that carry the whole load: replicas of that engine, or a larger TP;
4. `enable_prefix_caching` (lab 07) and `speculative_config` (lab 08): what the recorded pairs nearest the goal
   bought.

Per-token latency comes from `advisor_latency`: lab 09's cost model plus what lab 06's recorded 8B step spent
beyond it at the same batch. Each row names its source: a run recorded on the H200 (with its date), or the cost
model; a lever measured on the H200 only, or only at TP=1, says so.
This is advice: run the configuration under lab 05's load generator before trusting it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ... import validate
from ...mechanisms import parallel as tp
from ...models.architecture import architectures
from ...results.reference import reference_facts
from ..speculative import eagle_8b
from .latency import (BLOCK, FP8_GPUS, GPUS, MODEL, QUANT_BATCHES, RECORDED, SCHEMES, beyond_bound_ms, loaded_tpot_ms,
                      predicted_tpot_ms, summary_of)
from ..parallel.model import model_shape

QUALITY_ROW = {"bf16": "bf16", "fp8": "fp8-dynamic", "w4a16": "gptq-w4a16"}  # facts["quantization_quality"] rows
SPEC_BATCHES = (1, 4, 16, 64)
PREFIXES = (128, 200, 512, 1024)  # lab 07's on/off pairs on the 8B, prefix-{on,off}-shared-prefix-N-llama-3.1-8b
MAX_GPUS = 8  # one host


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
    max_gpus: int = MAX_GPUS  # GPUs of one host the deployment may use

    def __post_init__(self) -> None:
        validate.choice("Goal", "model", self.model, tuple(architectures()),
                        "one of the shipped shapes, e.g. 'llama-3.1-8b'.")
        validate.choice("Goal", "gpu", self.gpu, tuple(GPUS))
        for name in ("concurrency", "prompt_tokens", "output_tokens"):
            validate.integer("Goal", name, getattr(self, name), "a whole number >= 1.")
        validate.integer("Goal", "max_gpus", self.max_gpus, f"1 to {MAX_GPUS} (one host; more nodes: lab 09).", 1,
                         MAX_GPUS)
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


def _tp_sizes(goal: Goal, scheme: str) -> tuple[int, ...]:
    """The TP sizes vLLM accepts for the goal's model (its heads divide by them), up to max_gpus."""
    return tuple(t for t in tp.valid_tp_sizes(model_shape(goal.model, scheme)) if t <= goal.max_gpus)


def fit(goal: Goal, scheme: str, kv: str = "auto", batch: int | None = None) -> int | None:
    """The fewest GPUs (one of `_tp_sizes`) holding the weights and the KV of `batch` (default: concurrency)
    requests of full context (lab 09's memory model), or None when none does."""
    shape = model_shape(goal.model, scheme, 1 if kv == "fp8" else 2)
    return tp.smallest_fitting_tp(shape, batch or goal.concurrency, goal.context, GPUS[goal.gpu],
                                  _tp_sizes(goal, scheme))


def _nearest(value: int, options: tuple[int, ...]) -> int:
    return min(options, key=lambda o: abs(math.log(o) - math.log(max(value, 1))))


def _row(knob: str, setting: Any, why: str, evidence: str, source: str) -> dict[str, Any]:
    return {"knob": knob, "setting": setting, "why": why, "evidence": evidence, "source": source}


def _fits(goal: Goal) -> dict[str, tuple[int, str] | None]:
    """Per allowed scheme: (GPUs, KV dtype), FP8 KV only where it saves GPUs; None where nothing fits."""
    out: dict[str, tuple[int, str] | None] = {}
    for s in allowed_schemes(goal):
        auto, fp8 = fit(goal, s), (fit(goal, s, "fp8") if goal.gpu in FP8_GPUS else None)
        out[s] = (auto, "auto") if auto and not (fp8 and fp8 < auto) else (fp8, "fp8") if fp8 else None
    return out


def _load(goal: Goal, scheme: str, t: int, kv: str) -> tuple[int, int, int]:
    """(TP size, max_num_seqs, replicas): the whole load in one engine when the SLO allows, else the option of
    fewest GPUs (replicas of the largest batch meeting it, at this or a larger TP) within max_gpus."""
    at = lambda u, b: loaded_tpot_ms(goal, scheme, u, b, kv)  # noqa: E731
    if goal.tpot_slo_ms is None or at(t, goal.concurrency) <= goal.tpot_slo_ms:
        return t, goal.concurrency, 1
    options = []  # (GPUs, replicas, TP, batch) for each TP size with a batch meeting the SLO
    for u in (u for u in _tp_sizes(goal, scheme) if u >= t):
        lo, hi = 0, goal.concurrency  # the largest batch meeting the SLO: TPOT grows with the batch
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if at(u, mid) <= goal.tpot_slo_ms else (lo, mid - 1)
        if lo:
            replicas = math.ceil(goal.concurrency / lo)
            options.append((replicas * u, replicas, u, lo))
    within = [o for o in options if o[0] <= goal.max_gpus]
    if not within:
        largest = max(_tp_sizes(goal, scheme))
        need = (f"{min(options)[0]} {goal.gpu}s ({min(options)[1]} replicas of TP={min(options)[2]}, up to "
                f"{min(options)[3]} requests each)") if options else (
            f"more than one engine can give: at best {at(largest, 1):.2f} ms, one request on TP={largest}")
        raise validate.refuse("Goal", "tpot_slo_ms", goal.tpot_slo_ms,
                              f"what max_gpus={goal.max_gpus} can carry; {goal.concurrency} in flight at {scheme} "
                              f"needs {need}", "relax the SLO, lower concurrency, raise max_gpus, or allow cheaper "
                              "weights (lowest_precision).")
    gpus, replicas, u, cap = min(within)  # the fewest GPUs, then the fewest engines
    return u, cap, replicas


def plan(goal: Goal) -> dict[str, Any]:
    """The whole advice: scheme, TP size, KV dtype, max_num_seqs, replicas, and the rows that say why."""
    fits = _fits(goal)
    if not any(fits.values()):
        cheaper = "" if goal.lowest_precision == "w4a16" else "allow lowest_precision='w4a16', "
        raise validate.refuse("Goal", "concurrency", goal.concurrency,
                              f"what {goal.max_gpus} {goal.gpu}s hold of {goal.model} at {', '.join(fits)} with "
                              f"{goal.context} tokens each", f"lower it or the lengths, {cheaper}raise max_gpus (up "
                              f"to {MAX_GPUS}), or span nodes (lab 09).")
    batch = _nearest(goal.concurrency, QUANT_BATCHES)
    fewest = min(f[0] for f in fits.values() if f)
    speed = {s: summary_of(f"{RECORDED[s]}-b{batch}") for s, f in fits.items() if f and f[0] == fewest}
    scheme = max(speed, key=lambda s: speed[s]["output_tok_s"] if speed[s] else 0)
    t0, kv = fits[scheme]
    t, cap, replicas = _load(goal, scheme, t0, kv)
    quality = {r["scheme"]: r for r in reference_facts().get("quantization_quality", {}).get("rows", [])}.get(
        QUALITY_ROW[scheme])
    fit_text = "; ".join(f"{s}: {f[0]} GPU{'s' if f[0] > 1 else ''}{' with FP8 KV' if f[1] == 'fp8' else ''}" if f
                         else f"{s}: more than {goal.max_gpus}" for s, f in fits.items())
    if goal.gpu not in FP8_GPUS and goal.lowest_precision != "bf16":
        fit_text += (f"; fp8 not tried: the {goal.gpu} has no FP8 tensor cores (vLLM runs FP8 there weight-only, "
                     "not measured here)")
    tp_why = (f"the fewest {goal.gpu}s holding {scheme} weights and {goal.concurrency} x {goal.context} tokens of "
              "KV (lab 09)") if t == t0 else (f"the latency target needs TP={t}: on TP={t0} too few requests per "
                                             "engine meet it")
    tp_note = "; TP>1 speed is predicted, not measured yet (lab 09)" if t > 1 else ""
    rows = [_row("tensor_parallel_size", t, tp_why, fit_text + tp_note, "lablib.mechanisms.parallel (a model)"),
            _row("quantization", {"bf16": None, "fp8": "fp8", "w4a16": "w4a16 (a checkpoint made in lab 06)"}[scheme],
                 _scheme_why(goal, scheme, fits, speed, t0, t, batch),
                 f"the synthetic 8B's decode output tok/s at batch {batch}: " + (", ".join(
                     f"{s} {v['output_tok_s']:,.0f}" for s, v in speed.items() if v) or "not measured") +
                 (f"; perplexity {quality['ppl_change_pct']:+.2f}% against bf16 on the embedded model" if quality
                  else ""),
                 speed[scheme]["label"] if speed[scheme] else "not measured: no recorded run of this scheme"),
            _kv_row(kv, batch)]
    tpot, steady = loaded_tpot_ms(goal, scheme, t, cap, kv), predicted_tpot_ms(goal, scheme, t, cap, kv)
    rows.append(_row("max_num_seqs", cap, f"all {goal.concurrency} in flight in one engine" + (
        "" if goal.tpot_slo_ms is None else f", within the {goal.tpot_slo_ms:g} ms SLO") if cap == goal.concurrency
        else f"the largest batch per engine within the {goal.tpot_slo_ms:g} ms SLO",
        f"predicted TPOT {tpot:.2f} ms at {cap} in flight, new prompts' prefill sharing the steps ({steady:.2f} ms "
        f"decoding alone: the model's bound plus {beyond_bound_ms(scheme, cap):.2f} ms the 8B's {scheme} step spent "
        f"beyond it at that batch on the H200)", MODEL))
    if replicas > 1:
        rows.append(_row("replicas", replicas, f"{replicas} engines of TP={t} with up to {cap} requests each carry "
                         f"the {goal.concurrency} in flight: {replicas * t} of {goal.max_gpus} GPUs",
                         "replicas share nothing, so their throughputs add (a model: lab 09's two-GPU rows)", MODEL))
    rows += [_prefix_row(goal), _speculative_row(goal, cap, scheme)]
    return {"scheme": scheme, "t": t, "kv": kv, "max_num_seqs": cap, "replicas": replicas, "rows": rows}


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}"


def _scheme_why(goal: Goal, scheme: str, fits: dict[str, tuple[int, str] | None], speed: dict[str, Any], t0: int,
                t: int, batch: int) -> str:
    """Why this scheme, in the terms the choice was made: the fewest GPUs that hold the load, then the 8B's recorded
    speed among the schemes tied there; what every other allowed scheme needs; where TP was raised for latency and
    which measurements stand in (the 8B's, the H200's) for the model and GPU asked about."""
    if len(fits) == 1:
        why = f"{scheme}: the only scheme lowest_precision={goal.lowest_precision!r} allows"
    elif len(speed) > 1:
        why = (f"{scheme}: of the schemes that fit on the fewest GPUs ({_gpus(t0)}: {', '.join(speed)}), the fastest "
               f"by the synthetic 8B's speed at batch {batch} (lab 06)")
    else:
        others = ", ".join(f"{s} {_gpus(f[0])}" if f else f"{s} more than {goal.max_gpus}"
                           for s, f in fits.items() if s != scheme)
        why = f"{scheme}: the only allowed scheme that fits on {_gpus(t0)} (the others need: {others})"
    if t != t0:
        why += f"; run at TP={t} for the latency target (tensor_parallel_size)"
    stand_ins = [x for x in ("" if goal.model == "llama-3.1-8b" else f"the synthetic 8B, not the {goal.model}",
                             "" if goal.gpu == "H200" else f"the H200, not the {goal.gpu}") if x]
    return why + (f"; speed measured on {' and '.join(stand_ins)}" if stand_ins else "")


def _kv_row(kv: str, batch: int) -> dict[str, Any]:
    schemes = reference_facts().get("quantization", {}).get("schemes", {})
    held = (schemes["bf16-kv-fp8"]["kv_tokens"] / schemes["bf16"]["kv_tokens"]) if {"bf16", "bf16-kv-fp8"} <= set(
        schemes) else None
    off, on = summary_of(f"quant-bf16-b{batch}"), summary_of(f"quant-bf16-kv-fp8-b{batch}")
    evidence = "; ".join(x for x in (f"FP8 KV held {held:.2f}x bf16 KV's tokens on the 8B (lab 06)" if held else "",
                                     f"and ran at {on['output_tok_s'] / off['output_tok_s']:.2f}x its tok/s at batch "
                                     f"{batch}" if on and off else "") if x) or "not measured"
    return _row("kv_cache_dtype", kv, "FP8 KV holds the load on fewer GPUs" if kv == "fp8" else
                "bf16 KV fits on as few GPUs: FP8 KV would buy only capacity not needed here", evidence,
                on["label"] if on else "not measured")


def _prefix_row(goal: Goal) -> dict[str, Any]:
    """Lab 07's on/off pair nearest the shared prefix; with none shared, its shared-after pair (the same prompts with
    a per-request line first: 0% hits), which is what caching on costs when nothing is reused."""
    reused = goal.shared_prefix_tokens // BLOCK * BLOCK
    n = _nearest(goal.shared_prefix_tokens or 512, PREFIXES)
    workload = f"shared-prefix-{n}" if reused else "shared-prefix-512-shared-after"
    off, on = (summary_of(f"prefix-{w}-{workload}-llama-3.1-8b") for w in ("off", "on"))
    what = (f"sharing a {n}-token header" if reused else
            "reusing nothing (the header behind a per-request line: 0% hits)")
    evidence = (f"{off['requests']} requests {what} on the 8B, off -> on: TTFT p50 {off['ttft_s']['p50'] * 1e3:.0f} -> "
                f"{on['ttft_s']['p50'] * 1e3:.0f} ms, output tok/s x{on['output_tok_s'] / off['output_tok_s']:.2f}, "
                "one run each (lab 07)") if off and on else "not measured"
    why = (f"{reused} of each prompt's {goal.prompt_tokens} tokens are whole shared blocks: their prefill is "
           "skipped after the first request" if reused else "no whole 16-token block is shared here: nothing to "
           "reuse, so expect no gain; vLLM 0.26 turns it on by default, and its cost with nothing reused is below")
    return _row("enable_prefix_caching", True, why, evidence, on["label"] if on else "not measured")


def _eagle_at(concurrency: int) -> dict[str, Any] | None:
    """Lab 08's EAGLE grid (the head on the synthetic 8B, pinned, bf16) at the measured batch nearest `concurrency`:
    its best k, that run and its baseline; None where no part is recorded."""
    shown = eagle_8b.eagle_study(force=False)
    if shown.value is None or not eagle_8b.best_k(shown.value):
        return None
    best = {r["batch"]: r for r in eagle_8b.best_k(shown.value)}
    batch = _nearest(concurrency, tuple(sorted(best)))
    run = next(r for r in eagle_8b.head_rows(shown.value) if r["batch"] == batch and r["k"] == best[batch]["best_k"])
    base = next(r for r in shown.value["rows"] if r["method"] == "baseline" and r["batch"] == batch and r["pinned"]
                and not r.get("quantization") and r.get("part") == run.get("part"))
    v = shown.value
    where = shown.label if shown.live else f"recorded on {', '.join(v['gpu']) or 'a GPU'}, {', '.join(v['dates'])}"
    return {"batch": batch, "run": run, "base": base, "ks": sorted({r["k"] for r in eagle_8b.head_rows(v)}),
            "largest": max(best), "source": f"{where}; {v['label']}"}


def _speculative_row(goal: Goal, per_engine: int | None = None, scheme: str = "bf16") -> dict[str, Any]:
    """Lab 08's measurements at real size nearest each engine's load (`per_engine`: max_num_seqs, the goal's
    concurrency where not given): the EAGLE head's grid first (a head step costs a fraction of a draft model's),
    then the 1B draft model; each advised only where it paid there. Both were measured with bf16 weights."""
    load = min(goal.concurrency, per_engine or goal.concurrency)
    batch = _nearest(load, SPEC_BATCHES)
    base, draft = summary_of(f"spec-8b-baseline-b{batch}"), summary_of(f"spec-8b-draft_model-k4-b{batch}")
    eagle = _eagle_at(load)
    if not (base and draft) and eagle is None:
        return _row("speculative_config", None, "lab 08's 8B runs are not recorded", "", "not measured")
    facts = reference_facts().get("speculative-8b", {})
    length = {r["step"]: r for r in facts.get("rows", [])}.get(f"spec-8b-draft_model-k4-b{batch}", {}).get(
        "mean_acceptance_length")
    ratio = draft["output_tok_s"] / base["output_tok_s"] if base and draft else None
    draft_text = (f"a 1B draft at k=4 {'paid' if ratio > 1 else 'did not pay'} at batch {batch} (x{ratio:.2f})"
                  if ratio is not None else "the 1B draft is not recorded")
    draft_evidence = (f"draft model: x{ratio:.2f} over its own baseline ({base['output_tok_s']:,.0f} -> "
                      f"{draft['output_tok_s']:,.0f} tok/s)" + (f", acceptance set to the embedded pair's length "
                                                                f"{length:.2f}" if length else "")
                      if ratio is not None else "")
    draft_source = f"{draft['label']}; {facts.get('label', '')}".rstrip("; ") if draft else ""
    weights = "" if scheme == "bf16" else (f"; measured with bf16 weights, and the advice is {scheme}: lighter "
                                           "weights make a target step cheaper, so the head's share of it grows "
                                           "(lab 08's FP8 part measures that)")
    if eagle is not None:
        run, b = eagle["run"], eagle["batch"]
        beyond = load > eagle["largest"]  # the gain falls with batch: never carried past the grid
        pays = run["speedup"] > 1 and not beyond
        c = f", its step costing c = {run['implied_c']:.2f} of the target's" if run.get("implied_c") is not None else ""
        why = (f"on the synthetic 8B an EAGLE head at k={run['k']} (of k {', '.join(map(str, eagle['ks']))}) "
               f"{'paid' if run['speedup'] > 1 else 'did not pay'} at batch {b}, the nearest measured to {load} in "
               f"flight per engine: x{run['speedup']:.2f}{c}" + (
                   f", but {load} in flight is beyond the largest batch measured, where the gain falls with batch: "
                   "not advised without a run there" if beyond else "") + f"; {draft_text} (lab 08){weights}. Its "
               "acceptance was set to the trained embedded head's: a head trained for your model accepts "
               "differently, so measure it (lab 08's loop, then vLLM's counters)")
        length_text = (f", mean acceptance length {run['mean_acceptance_length']:.2f}"
                       if run.get("mean_acceptance_length") is not None else "")
        evidence = (f"EAGLE: x{run['speedup']:.2f} over its own baseline ({eagle['base']['output_tok_s']:,.0f} -> "
                    f"{run['output_tok_s']:,.0f} tok/s){length_text}, bf16 weights (step {run['step']})"
                    + (f"; {draft_evidence} (another recording, its own baseline)" if draft_evidence else ""))
        setting = {"method": "eagle", "num_speculative_tokens": run["k"]} if pays else (
            {"method": "draft_model", "num_speculative_tokens": 4} if ratio and ratio > 1 and not beyond else None)
        return _row("speculative_config", setting, why, evidence, eagle["source"] + (
            f"; draft model: {draft_source}" if draft_source else ""))
    return _row("speculative_config", {"method": "draft_model", "num_speculative_tokens": 4} if ratio > 1 else None,
                f"{draft_text}, the nearest measured to {load} in flight per engine (lab 08), on the synthetic 8B"
                + weights, draft_evidence, draft_source)


def advise(goal: Goal) -> list[dict[str, Any]]:
    """The settings for `goal`, in the order a deployment meets them, each with why, evidence and its source."""
    return plan(goal)["rows"]


def engine_kwargs(goal: Goal, advice: dict[str, Any] | None = None) -> dict[str, Any]:
    """The advice as lablib.config.VLLMConfig's fields, per engine (`config_text` names what they leave out)."""
    p = advice or plan(goal)
    got = {r["knob"]: r["setting"] for r in p["rows"]}
    return {"tensor_parallel_size": p["t"], "quantization": "fp8" if p["scheme"] == "fp8" else None,
            "kv_cache_dtype": p["kv"], "max_num_seqs": p["max_num_seqs"], "max_model_len": goal.context,
            "enable_prefix_caching": got["enable_prefix_caching"], "speculative_config": got["speculative_config"]}


def _needs(spec: dict[str, Any] | None) -> str:
    """What a speculative_config the advice gives still needs from the user."""
    if not spec:
        return ""
    if spec["method"] == "eagle":
        return "speculative_config needs an EAGLE head trained for this model: its 'model' path"
    return "speculative_config needs the draft's 'model' path"


def config_text(goal: Goal, advice: dict[str, Any] | None = None) -> str:
    """`VLLMConfig(...)` to paste, and what it cannot say: the checkpoint, the draft's path, the replicas."""
    p = advice or plan(goal)
    kwargs = engine_kwargs(goal, p)
    text = "VLLMConfig(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"
    notes = [f"model: a W4A16 checkpoint of {goal.model} (lab 06 makes one with llm-compressor)"
             if p["scheme"] == "w4a16" else "", f"x {p['replicas']} replicas" if p["replicas"] > 1 else "",
             _needs(kwargs["speculative_config"])]
    return text + "".join(f"  # {n}" for n in notes if n)


def lines(goals: list[Goal]) -> list[str]:
    """One sentence per goal: the settings advised, then each lever left off and the measurement that says why."""
    out = []
    for goal in goals:
        p = plan(goal)
        rows = {r["knob"]: r for r in p["rows"]}
        text = (f"{goal.model}, {goal.concurrency} in flight on {goal.gpu}: {p['scheme']} weights, TP={p['t']}, "
                f"max_num_seqs {p['max_num_seqs']}, KV {p['kv']}" + (f", {p['replicas']} replicas" if p["replicas"] > 1
                                                                     else ""))
        if "w4a16" in allowed_schemes(goal) and p["scheme"] != "w4a16":
            text += f"; W4A16 was allowed and not picked ({rows['quantization']['evidence']})"
        if rows["speculative_config"]["setting"] is None:
            text += f"; no speculation ({rows['speculative_config']['why']})"
        out.append(text + ".")
    return out
