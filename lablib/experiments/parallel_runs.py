"""Lab 09's measured runs: vLLM at TP=t on the synthetic checkpoints, each batch beside the cost model's step.

`measure` starts one engine (`VLLMEngine`) for a (model, scheme, t) and sends b fixed-shape requests at once for
each batch b (`fixed_shapes`), and sets decode tok/s and the per-token latency (median TPOT) beside the model's
prediction for that t on the GPU it ran on (`predict`). Before any engine starts, a run that cannot happen here (a
t the shape cannot split into, more GPUs than a worker here can use, which is NVML's count cut to
CUDA_VISIBLE_DEVICES, a configuration that cannot fit) becomes a row that says "not measured" and why, never a
number (`not_measured`, `why_not`); a synthetic checkpoint larger than the free disk runs on vLLM's dummy weights
instead (`no_room_on_disk`). The notebook's calls (`lablib.experiments.parallel`) and the recording steps
(`lablib.experiments.parallel_recording`) both measure through here.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
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
from ..results.store import ResultStore
from ..workloads import Request, Workload, load_workload
from .parallel_fit import check_tp, gpu_bytes, shape_spec
from .parallel_model import model_shape

LAB = "09_tensor_parallelism"
PROMPT_LEN, OUTPUT_LEN = 128, 256  # the fixed shapes of the measured runs
QUANTIZATION = {"bf16": None, "fp8": "fp8"}  # scheme -> VLLMConfig.quantization (online FP8 of a bf16 checkpoint)


def _gpus_here(facts: dict[str, Any] | None = None) -> tuple[int, str]:
    """The GPUs a worker started here can use (`usable_gpu_count`), and, when CUDA_VISIBLE_DEVICES hides some
    of those NVML counts, the note that says so ("CUDA_VISIBLE_DEVICES='0' of its 8 GPUs"), else ""."""
    facts = device_facts() if facts is None else facts
    usable = usable_gpu_count(facts)
    if usable == facts["gpu_count"]:
        return usable, ""
    return usable, f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} of its {facts['gpu_count']} GPUs"



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


def measure_or_skip(model: str, scheme: str, t: int, batches: tuple[int, ...],
                     store: ResultStore | None) -> list[dict[str, Any]]:
    short = _too_few(t)
    if short:
        return [not_measured(model, scheme, t, b, short) for b in batches]
    return measure(model, scheme, t, batches, store=store)[0]


