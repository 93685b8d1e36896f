"""Lab 09's measured runs: vLLM at TP=t on the synthetic checkpoints, beside the cost model's prediction.

`tp1_baseline` runs vLLM (`VLLMEngine`) on the synthetic checkpoints at TP=1, b fixed-shape requests
at once (b = 1, 8, 64), and sets decode tok/s and the per-token latency (median TPOT) beside the
model's prediction for t=1 on the GPU it ran on. Before any engine starts, a run that cannot happen
here (a t the shape cannot split into, more GPUs than a worker here can use, which is NVML's count
cut to CUDA_VISIBLE_DEVICES, a configuration that cannot fit) becomes a row that says "not measured"
and why, never a number (a synthetic checkpoint larger than the free disk runs on vLLM's dummy weights
instead: `no_room_on_disk`); `refusals` lists
the bad inputs refused outright. `record` is the step a GPU session runs to record it
(facts["tp1"]); `record_scaling` the multi-GPU runs (facts["tp_scaling"]), which only a machine
with several GPUs can make.

The lab's other two parts live beside this module, and their public names are importable from here
too (the notebook calls `experiments.parallel` for all of them): `parallel_model`, the tensor-parallel
cost model swept over shapes, links and batches; `parallel_fit`, the fit view and the refusal a user
meets before renting anything.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from .. import validate
from ..config import BenchConfig, VLLMConfig
from ..hardware.device import device_facts, nvml_memory, usable_gpu_count
from ..hardware.fit import check_fit
from ..hardware.roofline import lookup_gpu
from ..mechanisms import parallel as tp
from ..models.architecture import architectures, parameter_count
from ..models.synthetic import synthetic_folder
from ..results.record import Result
from ..results.reference import load_reference, recorded_facts
from ..results.store import ResultStore
from ..session import Shown, asked_rows, live_label, live_or_recorded
from ..workloads import Request, Workload, load_workload
from .parallel_fit import (  # noqa: F401 - re-exported: the notebook and the tests read them here
    ONE_LONG_SEQUENCE,
    _raise_unless_fits,
    check_tp,
    engine_refusal,
    fit_advice,
    fit_rows,
    gpu_bytes,
    shape_spec,
)
from .parallel_model import (  # noqa: F401 - re-exported, as above
    BATCHES,
    LINKS,
    SIMULATED,
    TPS,
    calibrated_overhead,
    cost_rows,
    dominance_rows,
    headline,
    link_rows,
    lookup,
    model_shape,
    overhead_effect,
    pcie_share_above_nvlink,
    two_gpu_rows,
)

LAB = "09_tensor_parallelism"
TP1_RUNS = (("llama-3.1-8b", "bf16"), ("llama-3.1-70b", "fp8"))  # the baseline: what one H200 can hold
SCALING_RUNS = (("llama-3.1-8b", "bf16", (1, 2, 4)), ("llama-3.1-70b", "bf16", (2, 4)),
                ("llama-3.1-70b", "fp8", (1, 2, 4)))  # what the multi-GPU machines are for
PROMPT_LEN, OUTPUT_LEN = 128, 256  # the fixed shapes of the measured runs
QUANTIZATION = {"bf16": None, "fp8": "fp8"}  # scheme -> VLLMConfig.quantization (online FP8 of a bf16 checkpoint)


# --- beside the measured runs: the model's line, and what is refused before any engine starts -----


def prediction_rows(runs: tuple[tuple[str, str], ...] = TP1_RUNS, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
                    context: int = PROMPT_LEN + OUTPUT_LEN // 2, t: int = 1) -> list[dict[str, Any]]:
    """The model's line for the measured runs: each (model, scheme) at TP=t, context of the fixed shapes' midpoint."""
    return [row for m, s in runs for row in cost_rows((m,), s, (t,), batches, (tp.NVLINK4,), context)]


def _gpus_here(facts: dict[str, Any] | None = None) -> tuple[int, str]:
    """The GPUs a worker started here can use (`usable_gpu_count`), and, when CUDA_VISIBLE_DEVICES hides some
    of those NVML counts, the note that says so ("CUDA_VISIBLE_DEVICES='0' of its 8 GPUs"), else ""."""
    facts = device_facts() if facts is None else facts
    usable = usable_gpu_count(facts)
    if usable == facts["gpu_count"]:
        return usable, ""
    return usable, f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} of its {facts['gpu_count']} GPUs"


def refusals(model: str = "llama-3.1-70b") -> list[dict[str, str]]:
    """The bad inputs the lab refuses before any engine starts, each with the message a user gets."""
    gpus, note = _gpus_here()
    more = max(2, 2 * gpus)  # more GPUs than a worker here can use
    here = f"{gpus} GPUs a worker can use, {note}" if note else f"{gpus} GPUs"
    machine = f"the GPUs a worker can use here ({note})" if note else None
    asked = [("tensor_parallel_size=3 (does not divide the heads)", lambda: check_tp(model, 3)),
             (f"tensor_parallel_size={more} on this machine ({here})", lambda: check_tp(model, more, gpus, machine)),
             ("bf16 at tensor_parallel_size=1 on one H200 (does not fit)",
              lambda: _raise_unless_fits(fit_advice(model, ONE_LONG_SEQUENCE)))]
    out = []
    for what, call in asked:
        try:
            call()
            out.append({"asked": what, "refused with": "(accepted)"})
        except ValueError as e:
            out.append({"asked": what, "refused with": str(e)})
    return out


# --- measured: vLLM at TP=t ---------------------------------------------------------------------


def fixed_shapes(n: int, prompt_len: int = PROMPT_LEN, output_len: int = OUTPUT_LEN) -> Workload:
    """n distinct prompts of exactly prompt_len tokens (held-out code from the evaluation set, the embedded
    tokenizer's ids, which a synthetic checkpoint takes), output_len tokens each. A synthetic model is sent the
    chat form (bench.offline.prepare renders it), a few tokens longer: rows use the context the records report."""
    from ..models import load_tokenizer, resolve_model

    validate.integer("fixed_shapes", "n", n, "ask for at least one request, e.g. 8.")
    tok = load_tokenizer(resolve_model("embedded"))
    windows = [tok(r.prompt).input_ids[1:] for r in load_workload("evaluation").requests]
    reqs: list[Request] = []
    for start in range(0, 511, prompt_len):
        for w in windows:
            text = tok.decode(w[start:start + prompt_len - 1])
            if len(tok(text).input_ids) == prompt_len and len(reqs) < n:
                reqs.append(Request(f"fixed-{len(reqs):03d}", text, ({"role": "user", "content": text},),
                                    output_len, prompt_len))
    if len(reqs) < n:
        raise ValueError(f"fixed_shapes: only {len(reqs)} prompts of exactly {prompt_len} tokens; asked for {n}. "
                         "Fix: a shorter prompt_len or fewer requests.")
    return Workload(f"fixed-{prompt_len}x{output_len}", 1, "held-out code cut to a fixed token length", tuple(reqs))


def predict(model: str, scheme: str, t: int, batch: int, context: float, gpu_name: str | None) -> dict[str, Any]:
    """The cost model's step for this run on the GPU it ran on (None when the GPU is not in the spec table)."""
    peak = lookup_gpu(gpu_name)
    if peak is None or not (peak.bf16_flops or peak.fp16_flops):
        return {"predicted_ms": None, "predicted_tok_s": None}
    gpu = tp.Gpu(peak.name, peak.memory_gb * 1e9, peak.peak_bw, peak.bf16_flops or peak.fp16_flops)
    step = tp.decode_step(model_shape(model, scheme), batch, round(context), t, gpu, tp.NVLINK4)
    return {"predicted_ms": step.latency_s * 1e3, "predicted_tok_s": step.throughput_tok_s}


def not_measured(model: str, scheme: str, t: int, batch: int, why: str) -> dict[str, Any]:
    """The row of a run that did not happen: its reason, no number."""
    return {"model": model, "scheme": scheme, "t": t, "batch": batch, "status": f"not measured: {why}",
            "tpot_ms": None, "decode_tok_s": None, "output_tok_s": None, "ttft_ms": None, "peak_memory_GiB": None,
            "predicted_ms": None, "measured_over_predicted": None, "weights": None}


def _too_few(t: int, facts: dict[str, Any] | None = None) -> str | None:
    """Why TP=t cannot run here ("needs 4 GPUs, this machine has 2"), or None when a worker can use t GPUs."""
    gpus, note = _gpus_here(facts)
    if t <= gpus:
        return None
    return f"needs {t} GPU{'s' if t > 1 else ''}, this machine " + (
        f"lets a worker use {gpus} ({note})" if note else f"has {gpus}")


def why_not(model: str, scheme: str, t: int, config: VLLMConfig, facts: dict[str, Any] | None = None) -> str | None:
    """Why this run cannot happen on this machine (GPUs a worker can use, memory), or None when it can (a checkpoint
    the disk cannot hold is no reason: `measure` runs vLLM's dummy weights then, see `no_room_on_disk`)."""
    short = _too_few(t, facts)
    if short:
        return short
    mem = nvml_memory()
    total = mem[2] if mem else gpu_bytes()
    report = check_fit(shape_spec(model), config, total)
    if not report.fits:
        return report.advice
    return None


def no_room_on_disk(model: str) -> str | None:
    """Why the bf16 synthetic checkpoint of `model` cannot be written here (absent, larger than the free disk), or
    None when it is there or fits. `measure` then runs vLLM's dummy weights instead (`synthetic_spec(weights=False)`)."""
    need = parameter_count(architectures()[model]) * 2  # the bf16 synthetic checkpoint
    folder = synthetic_folder(model)
    if not (folder / "config.json").exists():
        probe = next(p for p in (folder, *folder.parents) if p.exists())
        free = shutil.disk_usage(probe).free
        if free < 1.05 * need:
            return (f"the bf16 synthetic checkpoint needs {need / 1e9:.0f} GB of disk under {folder.parent}, "
                    f"{free / 1e9:.0f} GB is free")
    return None


def _row(r: Result, model: str, scheme: str, t: int, batch: int) -> dict[str, Any]:
    tpot, ttft = r.summary["tpot_s"].get("p50"), r.summary["ttft_s"].get("p50")
    context = statistics.mean(q.prompt_tokens + q.output_tokens / 2 for q in r.requests)
    pred = predict(model, scheme, t, batch, context, r.hardware.get("gpu"))
    peak = r.memory.get("peak_bytes")
    return {"model": model, "scheme": scheme, "t": t, "batch": batch, "status": "measured",
            "tpot_ms": tpot * 1e3 if tpot else None, "decode_tok_s": batch / tpot if tpot else None,
            "output_tok_s": r.summary["output_tok_s"], "ttft_ms": ttft * 1e3 if ttft is not None else None,
            "peak_memory_GiB": peak / 2**30 if peak else None, "context": context, **pred,
            "measured_over_predicted": tpot * 1e3 / pred["predicted_ms"] if tpot and pred["predicted_ms"] else None,
            "gpu": r.hardware.get("gpu"), "step": r.step}


def measure(model: str, scheme: str = "bf16", t: int = 1, batches: tuple[int, ...] = (1, 8, 64),
            prompt_len: int = PROMPT_LEN, output_len: int = OUTPUT_LEN, store: ResultStore | None = None,
            lab: str = LAB) -> tuple[list[dict[str, Any]], list[Result]]:
    """vLLM on the synthetic `model` at TP=t: one engine, then b fixed-shape requests at once for each batch.

    Refuses a bad t (ValueError) and turns a run this machine cannot make into "not measured" rows, both
    before any engine starts. With t > 1 NVLink multicast is left off (VLLM_ALLREDUCE_USE_SYMM_MEM=0).
    """
    validate.choice("measure", "scheme", scheme, tuple(QUANTIZATION))
    batches = tuple(validate.integers("measure", "batches", batches, "pass batch sizes, e.g. (1, 8, 64)."))
    check_tp(model, t)
    config = VLLMConfig(max_num_seqs=max(batches), max_model_len=4096, quantization=QUANTIZATION[scheme],
                        tensor_parallel_size=t)
    why = why_not(model, scheme, t, config)
    if why:
        return [not_measured(model, scheme, t, b, why) for b in batches], []
    from ..bench.offline import run
    from ..engines.vllm import VLLMEngine
    from ..models.synthetic import synthetic_spec

    if t > 1:
        os.environ.setdefault("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")
    disk = no_room_on_disk(model)
    if disk:  # vLLM draws the weights itself: same shape, same speed, nothing on disk
        config = dataclasses.replace(config, load_format="dummy")
    rows, results = [], []
    with VLLMEngine(synthetic_spec(model, weights=not disk), config) as eng:
        for i, b in enumerate(batches):
            try:
                r = run(eng, fixed_shapes(b, prompt_len, output_len), BenchConfig(progress=False), lab=lab,
                        step=f"tp{t}-{model}-{scheme}-b{b}", store=store)
            except Exception as e:  # the batches before it stay measured; this one and the rest say why not
                why = f"failed: {type(e).__name__}: {e}"[:400]
                rows += [not_measured(model, scheme, t, later, why if later == b else f"not run after batch {b} "
                                      "failed") for later in batches[i:]]
                break
            rows.append({**_row(r, model, scheme, t, b), "weights": f"vLLM dummy weights ({disk})" if disk else
                         "synthetic checkpoint"})
            results.append(r)
    return rows, results


def _recorded(key: str, step: str, fields: tuple[str, ...], points: list[tuple], batches: tuple[int, ...]
              ) -> list[dict[str, Any]]:
    """facts[key]'s rows at the asked points (`fields` of a row, e.g. model and scheme) and batches when the
    recording holds them all; otherwise every row (and `_knobs` of each side says which stand in)."""
    got = recorded_facts(key, step)
    rows = [{**row, "provenance": f"recorded on {got['gpu']}, {got['date']}"} for row in got["rows"]]
    return asked_rows(rows, lambda r: (*(r[f] for f in fields), r["batch"]), [(*p, b) for p in points for b in batches])


def _knobs(fields: tuple[str, ...], points: list[Any], batches: Any) -> dict[str, Any]:
    """The runs and batches a cell asked for, or a recording holds, named the same way on both sides."""
    return {f"({', '.join(fields)})": sorted({tuple(p) for p in points}), "batches": sorted(set(batches))}


def _shown(fields: tuple[str, ...]) -> Any:
    """recorded_with for rows keyed by `fields` and batch: the knobs as the recorded rows ran them."""
    return lambda rows: _knobs(fields, [[r[f] for f in fields] for r in rows], [r["batch"] for r in rows])


def tp1_baseline(runs: tuple[tuple[str, str], ...] = TP1_RUNS, batches: tuple[int, ...] = (1, 8, 64),
                 force: bool | None = None, store: ResultStore | None = None) -> Shown[list[dict[str, Any]]]:
    """TP=1 on one GPU for each (model, scheme): live with vLLM, else the recording (facts["tp1"], step tp1): the
    asked runs and batches when it holds them all, else every row, and the line under the cell names the stand-ins."""
    def live() -> list[dict[str, Any]]:
        return [{**row, "provenance": live_label()} for m, s in runs for row in measure(m, s, 1, batches, store=store)[0]]

    fields = ("model", "scheme")
    return live_or_recorded(live, lambda: _recorded("tp1", "tp1", fields, list(runs), batches), force=force,
                            asked=_knobs(fields, runs, batches), recorded_with=_shown(fields))


def tp_scaling(runs: tuple[tuple[str, str, tuple[int, ...]], ...] = SCALING_RUNS, batches: tuple[int, ...] = (1, 64),
               force: bool | None = None, store: ResultStore | None = None) -> Shown[list[dict[str, Any]]]:
    """TP=1/2/4 on one host: live only where a worker can use 2 or more GPUs and vLLM is installed, else the
    recording (facts["tp_scaling"], step tp-scaling), picked as tp1_baseline's; t above the GPUs a worker can use
    is a "not measured" row."""
    def live() -> list[dict[str, Any]]:
        return [{**row, "provenance": live_label()} for m, s, ts in runs for t in ts
                for row in _measure_or_skip(m, s, t, batches, store)]

    if force is None and _gpus_here()[0] < 2:
        force = False  # one usable GPU: show what a multi-GPU machine recorded
    fields, points = ("model", "scheme", "t"), [(m, s, t) for m, s, ts in runs for t in ts]
    return live_or_recorded(live, lambda: _recorded("tp_scaling", "tp-scaling", fields, points, batches), force=force,
                            asked=_knobs(fields, points, batches), recorded_with=_shown(fields))


def _measure_or_skip(model: str, scheme: str, t: int, batches: tuple[int, ...],
                     store: ResultStore | None) -> list[dict[str, Any]]:
    short = _too_few(t)
    if short:
        return [not_measured(model, scheme, t, b, short) for b in batches]
    return measure(model, scheme, t, batches, store=store)[0]


def recorded_tp1_points(steps: tuple[str, ...] = ("vllm-8b-single", "vllm-8b-256x128x128")) -> Shown[list[dict]]:
    """The synthetic 8B's TP=1 runs already recorded on the H200 (labs 01-03), each beside the model's prediction
    at that run's own mean batch and context (the roofline's figures for the run)."""
    rows = []
    for r in load_reference(*steps):
        batch, context = r.roofline["batch"], r.roofline["context_len"]
        tpot = r.summary["tpot_s"]["p50"]
        pred = predict("llama-3.1-8b", "bf16", 1, batch, context, r.hardware.get("gpu"))
        rows.append({"model": "llama-3.1-8b", "scheme": "bf16", "t": 1, "batch": batch, "context": context,
                     "status": "measured", "tpot_ms": tpot * 1e3, "decode_tok_s": batch / tpot, **pred,
                     "measured_over_predicted": tpot * 1e3 / pred["predicted_ms"], "step": r.step,
                     "provenance": f"recorded on {r.hardware.get('gpu')}, {r.recorded_at[:10]}"})
    return Shown(rows, False, rows[0]["provenance"] if rows else "no recorded runs", "recorded for labs 01-03")


def tp_cuts_latency(rows: list[dict[str, Any]], model: str, scheme: str, t: int, batch: int = 1) -> bool:
    """Whether the measured per-token latency at TP=t is below TP=1's (False when either was not measured)."""
    got = {r["t"]: r["tpot_ms"] for r in rows if (r["model"], r["scheme"], r["batch"]) == (model, scheme, batch)
           and r["status"] == "measured"}
    return 1 in got and t in got and got[t] < got[1]


def batch_gain(rows: list[dict[str, Any]], model: str, scheme: str, batch: int = 64, t: int = 1) -> float | None:
    """Measured decode tok/s at `batch` over batch 1's, both at TP=t (None when either was not measured)."""
    got = {r["batch"]: r["decode_tok_s"] for r in rows if (r["model"], r["scheme"], r["t"]) == (model, scheme, t)
           and r["status"] == "measured"}
    return got[batch] / got[1] if 1 in got and batch in got else None


def remaining_runs(facts_keys: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The lab's GPU runs and whether they are recorded yet; what is missing says what it needs."""
    if facts_keys is None:
        from ..results.reference import reference_facts

        facts_keys = tuple(reference_facts())
    rows = [{"run": f"TP=1 baseline: {m} {s}, batch 1/8/64", "needs": "1 H200 (nvidia-h200)", "step": "tp1",
             "status": "recorded" if "tp1" in facts_keys else "not run yet"} for m, s in TP1_RUNS]
    for m, s, ts in SCALING_RUNS:
        for t in ts:
            rows.append({"run": f"TP={t}{' (the same host, as the baseline)' if t == 1 else ''}: {m} {s}, batch 1 and 64",
                         "needs": f"{max(t, 2)} H200s of one host (nvidia-h200-x{max(t, 2)})", "step": "tp-scaling",
                         "status": "recorded" if "tp_scaling" in facts_keys else "not run yet"})
    for what in ("custom all-reduce vs NCCL (disable_custom_all_reduce=True) at TP=2 and 4",
                 "pipeline parallelism (pipeline_parallel_size=2, 4) at the same GPU counts"):
        rows.append({"run": what, "needs": "2-4 H200s, and a VLLMConfig field for the knob (lablib/config.py)",
                     "step": "(none yet)", "status": "not run yet"})
    return rows


# --- recording (a GPU session: scripts/record_reference.py) -------------------------------------


def _record(key: str, rows: list[dict[str, Any]], results: list[Result], store: ResultStore,
            facts: dict[str, Any]) -> None:
    for r in results:
        store.append(dataclasses.replace(r, provenance="recorded"))
    facts[key] = {"rows": rows, "gpu": device_facts()["gpu"], "date": time.strftime("%Y-%m-%d"),
                  "prompt_len": PROMPT_LEN, "output_len": OUTPUT_LEN}


def record(out_dir: Path, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step tp1 (one H200): TP=1 for each of TP1_RUNS at batch 1, 8, 64 -> facts["tp1"], Results into store."""
    rows, results = [], []
    for m, s in TP1_RUNS:
        try:
            got, res = measure(m, s, 1, (1, 8, 64), lab=LAB)
        except Exception as e:  # one run failing keeps the other's (the row says why)
            got, res = [not_measured(m, s, 1, b, f"failed: {type(e).__name__}: {e}"[:400]) for b in (1, 8, 64)], []
        rows += got
        results += res
        _record("tp1", rows, res, store, facts)  # kept as each run ends: a time limit later loses nothing made


def record_scaling(out_dir: Path, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step tp-scaling (2-8 H200s of one host): SCALING_RUNS at batch 1 and 64 -> facts["tp_scaling"]."""
    rows, results, machine = [], [], device_facts()
    for m, s, ts in SCALING_RUNS:
        for t in ts:
            short = _too_few(t, machine)
            if short:
                rows += [not_measured(m, s, t, b, short) for b in (1, 64)]
                continue
            got, res = measure(m, s, t, (1, 64), lab=LAB)
            rows += got
            results += res
    _record("tp_scaling", rows, results, store, facts)
