"""Lab 09's experiments: the tensor-parallel cost model swept, the fit view and its refusals, TP=1 measured.

The cost model (`lablib.mechanisms.parallel`) prices one decode step under TP=t: each GPU reads
1/t of the weights and its share of the KV cache, then waits for 2 x layers all-reduces of
batch x hidden bf16 activations over the link. This module runs it over the shapes the lab
talks about (the synthetic Llama-3.1-8B and -70B, Qwen2.5-72B) and the links (NVLink 4, PCIe
Gen5 and Gen4), says where communication dominates, and compares TP=2 with PP=2 and with a
second replica. Every row it returns from the model says so in its "provenance" (SIMULATED).

The fit view turns `hardware.fit.tp_fit_table` into one table (model x scheme x GPU -> the
smallest t), and `fit_advice` is the refusal a user meets before renting anything: the
engine's own preflight (`check_fit`, which splits the KV heads by tensor_parallel_size) run
on the H200's memory, and the knobs that would make the configuration fit, each checked the
same way: tensor_parallel_size=N, quantization='fp8', max_model_len.

Measured: `tp1_baseline` runs vLLM (`VLLMEngine`) on the synthetic checkpoints at TP=1, b
fixed-shape requests at once (b = 1, 8, 64), and sets decode tok/s and the per-token latency
(median TPOT) beside the model's prediction for t=1 on the GPU it ran on. Before any engine
starts, a run that cannot happen here (a t the shape cannot split into, more GPUs than the
machine has, a configuration that cannot fit, a synthetic checkpoint larger than the free
disk) becomes a row that says "not measured" and why, never a number. `record` is the step a
GPU session runs to record it (facts["tp1"]); `record_scaling` the multi-GPU runs
(facts["tp_scaling"]), which only a machine with several GPUs can make.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from .. import validate
from ..config import BenchConfig, VLLMConfig
from ..hardware.device import device_facts, nvml_memory
from ..hardware.fit import SCHEME_BYTES, check_fit, tp_fit_table
from ..hardware.roofline import lookup_gpu
from ..mechanisms import parallel as tp
from ..mechanisms.gpus import GPU_PEAKS
from ..models.architecture import architectures, parameter_count
from ..models.spec import ModelSpec
from ..results.record import Result
from ..results.reference import load_reference, recorded_facts
from ..results.store import ResultStore
from ..session import Shown, live_label, live_or_recorded
from ..workloads import Request, Workload, load_workload

LAB = "09_tensor_parallelism"
SIMULATED = "simulated on this machine (lablib.mechanisms.parallel, spec-sheet peaks): a model, not a measurement"
LINKS = (tp.NVLINK4, tp.PCIE_GEN5_X16, tp.PCIE_GEN4_X16)
TPS = (1, 2, 4, 8)
BATCHES = (1, 8, 64, 256)
TP1_RUNS = (("llama-3.1-8b", "bf16"), ("llama-3.1-70b", "fp8"))  # the baseline: what one H200 can hold
SCALING_RUNS = (("llama-3.1-8b", "bf16", (1, 2, 4)), ("llama-3.1-70b", "bf16", (2, 4)),
                ("llama-3.1-70b", "fp8", (1, 2, 4)))  # what the multi-GPU machines are for
PROMPT_LEN, OUTPUT_LEN = 128, 256  # the fixed shapes of the measured runs
SYNTHETIC_ROOT = Path("/tmp/lablib-synthetic")  # where lablib.models.synthetic writes its checkpoints
QUANTIZATION = {"bf16": None, "fp8": "fp8"}  # scheme -> VLLMConfig.quantization (online FP8 of a bf16 checkpoint)
ONE_LONG_SEQUENCE = VLLMConfig(max_model_len=8192)  # the fit view's question: one sequence of 8,192 tokens


# --- the cost model, swept ----------------------------------------------------------------------


def link_rows() -> list[dict[str, Any]]:
    """The links the model prices (spec-sheet bandwidth; latency per collective an assumption), and HBM beside."""
    return [{"link": link.name, "GB/s per direction": link.bandwidth / 1e9, "latency per collective (us)":
             link.latency_s * 1e6, "latency source": "assumed (measure it, then replace)" if link.latency_s else "-"}
            for link in (*LINKS, tp.H200_HBM3E)]


def lookup(rows: list[dict[str, Any]], key: str, **match: Any) -> Any:
    """row[key] of the one row matching every `match` (ValueError when none or several do)."""
    got = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if len(got) != 1:
        raise ValueError(f"lookup: {len(got)} rows match {match}; pass rows that hold exactly one.")
    return got[0][key]


def pcie_share_above_nvlink(rows: list[dict[str, Any]]) -> bool:
    """Whether, at every model, t > 1 and batch in the rows, both PCIe links spend a larger share of the step on
    all-reduces than NVLink 4 (the seeds' warning, as the model states it)."""
    keys = {(r["model"], r["t"], r["batch"]) for r in rows if r["t"] > 1}
    share = {(r["model"], r["t"], r["batch"], r["link"]): r["communication_share"] for r in rows}
    return bool(keys) and all(share[k + (pcie.name,)] > share[k + (tp.NVLINK4.name,)]
                              for k in keys for pcie in (tp.PCIE_GEN4_X16, tp.PCIE_GEN5_X16))


def overhead_effect(overhead_s: float, model: str = "llama-3.1-8b", batch: int = 1,
                    link: tp.Link = tp.NVLINK4) -> list[dict[str, Any]]:
    """Speedup and efficiency against t with no fixed per-step cost and with `overhead_s` (which TP cannot split)."""
    bare, paid = (cost_rows((model,), batches=(batch,), links=(link,), overhead_s=o) for o in (0.0, overhead_s))
    return [{"t": a["t"], "latency_ms": a["latency_s"] * 1e3, "speedup": a["speedup"],
             f"latency_ms with {overhead_s * 1e3:.2f} ms overhead": b["latency_s"] * 1e3,
             "speedup with overhead": b["speedup"], "efficiency with overhead": b["efficiency"],
             "provenance": SIMULATED} for a, b in zip(bare, paid)]


def model_shape(model: str, scheme: str = "bf16", kv_bytes: int = 2) -> tp.DenseShape:
    """The cost model's shape of a shipped architecture under a weight scheme, as tp_fit_table counts it:
    linear layers at the scheme's bytes, embeddings and LM head at 2 (one average byte count per weight)."""
    archs = architectures()
    validate.choice("model_shape", "model", model, tuple(archs))
    validate.choice("model_shape", "scheme", scheme, tuple(SCHEME_BYTES))
    cfg = archs[model]
    total = parameter_count(cfg)
    embed = cfg["vocab_size"] * cfg["hidden_size"] * (1 if cfg.get("tie_word_embeddings") else 2)
    average = ((total - embed) * SCHEME_BYTES[scheme] + embed * 2) / total
    return tp.DenseShape.from_config(cfg, weight_bytes=average, kv_bytes=kv_bytes)


def cost_rows(models: tuple[str, ...] = ("llama-3.1-8b", "llama-3.1-70b"), scheme: str = "bf16",
              tps: tuple[int, ...] = TPS, batches: tuple[int, ...] = BATCHES, links: tuple[tp.Link, ...] = LINKS,
              context: int = 1024, gpu: tp.Gpu = tp.H200, overhead_s: float = 0.0) -> list[dict[str, Any]]:
    """`tp_sweep` for each model and link: every part of the step's time, latency, throughput, speedup, fits."""
    gpu = dataclasses.replace(gpu, overhead_s=overhead_s)
    return [{"model": m, "scheme": scheme, **row, "provenance": SIMULATED}
            for m in models for link in links
            for row in tp.tp_sweep(model_shape(m, scheme), tps, batches, context, gpu, link)]


def prediction_rows(runs: tuple[tuple[str, str], ...] = TP1_RUNS, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
                    context: int = PROMPT_LEN + OUTPUT_LEN // 2, t: int = 1) -> list[dict[str, Any]]:
    """The model's line for the measured runs: each (model, scheme) at TP=t, context of the fixed shapes' midpoint."""
    return [row for m, s in runs for row in cost_rows((m,), s, (t,), batches, (tp.NVLINK4,), context)]


def dominance_rows(model: str = "llama-3.1-8b", scheme: str = "bf16", tps: tuple[int, ...] = (2, 4, 8),
                   links: tuple[tp.Link, ...] = LINKS, context: int = 1024, max_batch: int = 1024,
                   gpu: tp.Gpu = tp.H200) -> list[dict[str, Any]]:
    """Per link and t: the all-reduces' share of the step at batch 1 and 64, and the smallest batch (powers of
    two up to max_batch, only those whose KV fits at that t) where they take half the step or more ("never")."""
    shape = model_shape(model, scheme)
    batches = [2**k for k in range(int(math.log2(max_batch)) + 1)]
    rows = []
    for link in links:
        for t in tps:
            fits = [b for b in batches if tp.memory_fit(shape, b, context, t, gpu).fits]
            share = {b: tp.decode_step(shape, b, context, t, gpu, link).communication_share for b in fits}
            rows.append({"model": model, "link": link.name, "t": t, "share_batch_1": share.get(1),
                         "share_batch_64": share.get(64), "largest_batch_that_fits": max(fits, default=None),
                         "dominates_from_batch": next((b for b in fits if share[b] >= 0.5), "never"),
                         "provenance": SIMULATED})
    return rows


def two_gpu_rows(model: str = "llama-3.1-8b", batches: tuple[int, ...] = (1, 64), scheme: str = "bf16",
                 context: int = 1024, link: tp.Link = tp.NVLINK4) -> list[dict[str, Any]]:
    """TP=2 vs PP=2 vs two TP=1 replicas (`compare_two_gpus`) at each batch: a model, labelled as one."""
    return [{"model": model, "batch": b, **row, "provenance": SIMULATED}
            for b in batches for row in tp.compare_two_gpus(model_shape(model, scheme), b, context, tp.H200, link)]


# --- the fit view and the refusal ---------------------------------------------------------------


def fit_rows(context: int = 8192, batch: int = 1, **kw: Any) -> list[dict[str, Any]]:
    """tp_fit_table as one row per (model, scheme): the weights, then per GPU the smallest t that holds the
    weights and `batch` sequences of `context` tokens ("> 8" when not even 8 do)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in tp_fit_table(context=context, batch=batch, **kw):
        row = rows.setdefault((r["model"], r["scheme"]), {"model": r["model"], "scheme": r["scheme"],
                                                           "weights_GB": round(r["weights_GB"], 1)})
        row[r["gpu"]] = r["smallest_tp"] if r["smallest_tp"] is not None else "> 8"
    return list(rows.values())


def shape_spec(model: str) -> ModelSpec:
    """A synthetic model known by its shape alone (no checkpoint: weights are counted from the config)."""
    archs = architectures()
    validate.choice("shape_spec", "model", model, tuple(archs))
    cfg = {**archs[model], "dtype": "bfloat16"}  # as the synthetic checkpoint's config.json will say
    return ModelSpec(f"synthetic:{model}", f"/nonexistent/shape-only/{model}", "synthetic", cfg)


def gpu_bytes(gpu: str = "H200") -> int:
    """A GPU's capacity from the spec-sheet table (GB as the datasheet states it, in bytes)."""
    validate.choice("gpu_bytes", "gpu", gpu, tuple(GPU_PEAKS))
    return int(GPU_PEAKS[gpu].memory_gb * 1e9)


def check_tp(model: str, t: int, gpus: int | None = None) -> int:
    """Refuse, before launch, a tensor_parallel_size the shape cannot split into or the machine cannot hold."""
    shape = model_shape(model)
    validate.integer("tensor_parallel_size", "t", t, "1 for one GPU, else the number of GPUs to split across.")
    allowed = tp.valid_tp_sizes(shape)
    if t not in allowed:
        raise validate.refuse("VLLMConfig", "tensor_parallel_size", t, f"one of {allowed} for {model} (it must "
                              f"divide heads={shape.heads} and intermediate={shape.intermediate}, and divide or be "
                              f"a multiple of kv_heads={shape.kv_heads})", "pick one of those; vLLM refuses it too.")
    if gpus is not None and t > gpus:
        raise validate.refuse("VLLMConfig", "tensor_parallel_size", t, f"at most {gpus}, the GPUs this machine has",
                              "lower tensor_parallel_size, or run on a machine with more GPUs.")
    return t


def _scheme(config: VLLMConfig) -> str:
    if config.quantization not in (None, "fp8"):
        raise validate.refuse("fit_advice", "quantization", config.quantization, "None (bf16) or 'fp8'",
                              "the synthetic checkpoints are bf16; vLLM quantizes them to FP8 online.")
    return "fp8" if config.quantization == "fp8" else "bf16"


def fit_advice(model: str = "llama-3.1-70b", config: VLLMConfig = ONE_LONG_SEQUENCE,
               gpu: str = "H200", total_bytes: int | None = None) -> dict[str, Any]:
    """The engine's preflight (`check_fit`) for `config` on one `gpu`, and, when it refuses, the knobs that fit.

    Each knob is checked with check_fit itself: the smallest tensor_parallel_size (of 2, 4, 8 the shape can
    split into) at the same scheme, quantization='fp8' at the same t, and the longest max_model_len the
    budget leaves KV room for (none when the weights alone overflow it).
    """
    spec, scheme = shape_spec(model), _scheme(config)
    check_tp(model, config.tensor_parallel_size)
    total = total_bytes if total_bytes is not None else gpu_bytes(gpu)
    report = check_fit(spec, config, total)
    out = {"model": model, "gpu": gpu, "gpu_bytes": total, "tensor_parallel_size": config.tensor_parallel_size,
           "scheme": scheme, "max_model_len": report.max_model_len, "fits": report.fits,
           "weights_GiB_per_gpu": report.weight_bytes / 2**30, "budget_GiB": report.budget_bytes / 2**30,
           "kv_tokens": report.kv_tokens, "check_fit_advice": report.advice, "knobs": [], "advice": ""}
    if report.fits:
        out["advice"] = (f"{model} at {scheme}, tensor_parallel_size={config.tensor_parallel_size}, fits: "
                         f"{report.weight_bytes / 2**30:.1f} GiB of weights per {gpu} leave KV room for "
                         f"{report.kv_tokens:,} tokens (max_model_len={report.max_model_len:,}). No change needed.")
        return out
    allowed = tp.valid_tp_sizes(model_shape(model))
    t_fit = next((t for t in (2, 4, 8) if t > config.tensor_parallel_size and t in allowed
                  and check_fit(spec, dataclasses.replace(config, tensor_parallel_size=t), total).fits), None)
    knobs = [f"tensor_parallel_size={t_fit}"] if t_fit else []
    if scheme == "bf16" and check_fit(spec, dataclasses.replace(config, quantization="fp8"), total).fits:
        knobs.append("quantization='fp8'")
    if report.kv_tokens > 0:
        knobs.append(f"max_model_len={report.kv_tokens:,} or less")
    why = (f"the weights alone ({report.weight_bytes / 2**30:.1f} GiB per GPU) exceed the budget "
           f"({report.budget_bytes / 2**30:.1f} GiB), so no max_model_len helps" if report.kv_tokens == 0 else
           f"the budget leaves KV room for {report.kv_tokens:,} tokens, fewer than max_model_len={report.max_model_len:,}")
    out["knobs"] = knobs
    out["advice"] = (f"{model} at {scheme}, tensor_parallel_size={config.tensor_parallel_size}, does not fit one "
                     f"{gpu}: {why}. Fix: " + (" or ".join(knobs) if knobs else "a larger GPU") + ".")
    return out


def refusals(model: str = "llama-3.1-70b") -> list[dict[str, str]]:
    """The bad inputs the lab refuses before any engine starts, each with the message a user gets."""
    gpus = device_facts()["gpu_count"]
    more = max(2, 2 * gpus)  # more GPUs than this machine has
    asked = [("tensor_parallel_size=3 (does not divide the heads)", lambda: check_tp(model, 3)),
             (f"tensor_parallel_size={more} on this machine ({gpus} GPUs)", lambda: check_tp(model, more, gpus)),
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


def _raise_unless_fits(advice: dict[str, Any]) -> None:
    if not advice["fits"]:
        raise ValueError(advice["advice"])


def engine_refusal(model: str = "llama-3.1-70b", config: VLLMConfig = ONE_LONG_SEQUENCE) -> str:
    """What `VLLMEngine(...)` says on this machine for `config`, before any worker starts.

    Without a GPU its preflight refuses first for that (or for vLLM missing); on an H200 it refuses a
    configuration that cannot fit with check_fit's advice. A configuration it accepts starts no worker here."""
    from ..engines.vllm import VLLMEngine

    try:
        VLLMEngine(shape_spec(model), config)
    except ValueError as e:
        return f"refused before launch: {e}"
    return "accepted by the preflight (no worker was started)"


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
            "predicted_ms": None, "measured_over_predicted": None}


def _needs(t: int, gpus: int) -> str:
    return f"needs {t} GPU{'s' if t > 1 else ''}, this machine has {gpus}"


def why_not(model: str, scheme: str, t: int, config: VLLMConfig, facts: dict[str, Any] | None = None) -> str | None:
    """Why this run cannot happen on this machine (GPU count, memory, disk), or None when it can."""
    facts = facts if facts is not None else device_facts()
    if t > facts["gpu_count"]:
        return _needs(t, facts["gpu_count"])
    mem = nvml_memory()
    total = mem[2] if mem else gpu_bytes()
    report = check_fit(shape_spec(model), config, total)
    if not report.fits:
        return report.advice
    need = parameter_count(architectures()[model]) * 2  # the bf16 synthetic checkpoint
    folder = SYNTHETIC_ROOT / model
    if not (folder / "config.json").exists():
        probe = next(p for p in (folder, *folder.parents) if p.exists())
        free = shutil.disk_usage(probe).free
        if free < 1.05 * need:
            return (f"the bf16 synthetic checkpoint needs {need / 1e9:.0f} GB of disk under {SYNTHETIC_ROOT}, "
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
    rows, results = [], []
    with VLLMEngine(synthetic_spec(model, SYNTHETIC_ROOT), config) as eng:
        for b in batches:
            r = run(eng, fixed_shapes(b, prompt_len, output_len), BenchConfig(progress=False), lab=lab,
                    step=f"tp{t}-{model}-{scheme}-b{b}", store=store)
            rows.append(_row(r, model, scheme, t, b))
            results.append(r)
    return rows, results


def _recorded(key: str, step: str) -> list[dict[str, Any]]:
    got = recorded_facts(key, step)
    return [{**row, "provenance": f"recorded on {got['gpu']}, {got['date']}"} for row in got["rows"]]


def tp1_baseline(runs: tuple[tuple[str, str], ...] = TP1_RUNS, batches: tuple[int, ...] = (1, 8, 64),
                 force: bool | None = None, store: ResultStore | None = None) -> Shown[list[dict[str, Any]]]:
    """TP=1 on one GPU for each (model, scheme): live with vLLM, else the recording (facts["tp1"], step tp1)."""
    def live() -> list[dict[str, Any]]:
        return [{**row, "provenance": live_label()} for m, s in runs for row in measure(m, s, 1, batches, store=store)[0]]

    return live_or_recorded(live, lambda: _recorded("tp1", "tp1"), force=force)


def tp_scaling(runs: tuple[tuple[str, str, tuple[int, ...]], ...] = SCALING_RUNS, batches: tuple[int, ...] = (1, 64),
               force: bool | None = None, store: ResultStore | None = None) -> Shown[list[dict[str, Any]]]:
    """TP=1/2/4 on one host: live only on a machine with 2 or more GPUs and vLLM, else the recording
    (facts["tp_scaling"], step tp-scaling); t above the machine's GPU count is a "not measured" row."""
    def live() -> list[dict[str, Any]]:
        return [{**row, "provenance": live_label()} for m, s, ts in runs for t in ts
                for row in _measure_or_skip(m, s, t, batches, store)]

    if force is None and device_facts()["gpu_count"] < 2:
        force = False  # one GPU: show what a multi-GPU machine recorded
    return live_or_recorded(live, lambda: _recorded("tp_scaling", "tp-scaling"), force=force)


def _measure_or_skip(model: str, scheme: str, t: int, batches: tuple[int, ...],
                     store: ResultStore | None) -> list[dict[str, Any]]:
    gpus = device_facts()["gpu_count"]
    if t > gpus:
        return [not_measured(model, scheme, t, b, _needs(t, gpus)) for b in batches]
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


def headline(rows: list[dict[str, Any]], fits: list[dict[str, Any]]) -> list[str]:
    """What the lab's figures say, in sentences with their numbers (all from the cost model's rows)."""
    m = "llama-3.1-8b"
    sp = {link.name: lookup(rows, "speedup", model=m, t=2, batch=1, link=link.name) for link in LINKS}
    share8 = {link.name: lookup(rows, "communication_share", model=m, t=8, batch=1, link=link.name) for link in LINKS}
    big = next(r for r in fits if (r["model"], r["scheme"]) == ("llama-3.1-70b", "bf16"))
    fp8 = next(r for r in fits if (r["model"], r["scheme"]) == ("llama-3.1-70b", "fp8"))
    return [(f"{m}, batch 1: TP=2 is {sp['NVLink 4']:.2f}x faster per token over NVLink 4, "
             f"{sp['PCIe Gen5 x16']:.2f}x over PCIe Gen5, {sp['PCIe Gen4 x16']:.2f}x over PCIe Gen4 (2x is the ideal)"),
            (f"{m}, batch 1, TP=8: all-reduces take {share8['NVLink 4']:.0%} of the step over NVLink 4, "
             f"{share8['PCIe Gen4 x16']:.0%} over PCIe Gen4"),
            (f"llama-3.1-70b needs {big['H200']} H200s in bf16, {fp8['H200']} in FP8 ({big['weights_GB']:.0f} GB and "
             f"{fp8['weights_GB']:.0f} GB of weights)"),
            f"[{SIMULATED}]"]


def calibrated_overhead(points: list[dict[str, Any]]) -> float:
    """Seconds per step the model misses at batch 1: the recorded TPOT less the prediction (kernel efficiency
    and fixed per-step cost together, a calibration on a recording, not a part the model derives)."""
    one = next(p for p in points if p["batch"] == 1)
    return max(0.0, (one["tpot_ms"] - one["predicted_ms"]) / 1e3)


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
        got, res = measure(m, s, 1, (1, 8, 64), lab=LAB)
        rows += got
        results += res
    _record("tp1", rows, results, store, facts)


def record_scaling(out_dir: Path, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step tp-scaling (2-8 H200s of one host): SCALING_RUNS at batch 1 and 64 -> facts["tp_scaling"]."""
    rows, results = [], []
    gpus = device_facts()["gpu_count"]
    for m, s, ts in SCALING_RUNS:
        for t in ts:
            if t > gpus:
                rows += [not_measured(m, s, t, b, _needs(t, gpus)) for b in (1, 64)]
                continue
            got, res = measure(m, s, t, (1, 64), lab=LAB)
            rows += got
            results += res
    _record("tp_scaling", rows, results, store, facts)
