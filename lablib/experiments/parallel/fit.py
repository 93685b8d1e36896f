"""Lab 09's fit view: how many GPUs each shape needs, and the refusal a user meets before renting anything.

The fit view turns `hardware.fit.tp_fit_table` into one table (model x scheme x GPU -> the
smallest t), and `fit_advice` is the refusal a user meets before renting anything: the
engine's own preflight (`check_fit`, which splits the KV heads by tensor_parallel_size) run
on the H200's memory, and the knobs that would make the configuration fit, each checked the
same way: tensor_parallel_size=N, quantization='fp8', max_model_len. `check_tp` refuses a
tensor_parallel_size the shape cannot split into, and `engine_refusal` shows what `VLLMEngine`
itself says.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ... import validate
from ...config import VLLMConfig
from ...engines.vllm import VLLMEngine
from ...hardware.fit import check_fit, tp_fit_table
from ...mechanisms import parallel as tp
from ...mechanisms.gpus import GPU_PEAKS
from ...models.architecture import architectures
from ...models.spec import ModelSpec
from .model import model_shape

ONE_LONG_SEQUENCE = VLLMConfig(max_model_len=8192)  # the fit view's question: one sequence of 8,192 tokens


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


def check_tp(model: str, t: int, gpus: int | None = None, machine: str | None = None) -> int:
    """Refuse, before launch, a tensor_parallel_size the shape cannot split into or more than the `gpus` a worker
    can use (`machine` says what they are; "the GPUs this machine has" unless CUDA_VISIBLE_DEVICES hides some)."""
    shape = model_shape(model)
    validate.integer("tensor_parallel_size", "t", t, "1 for one GPU, else the number of GPUs to split across.")
    allowed = tp.valid_tp_sizes(shape)
    if t not in allowed:
        raise validate.refuse("VLLMConfig", "tensor_parallel_size", t, f"one of {allowed} for {model} (it must "
                              f"divide heads={shape.heads} and intermediate={shape.intermediate}, and divide or be "
                              f"a multiple of kv_heads={shape.kv_heads})", "pick one of those; vLLM refuses it too.")
    if gpus is not None and t > gpus:
        raise validate.refuse("VLLMConfig", "tensor_parallel_size", t,
                              f"at most {gpus}, {machine or 'the GPUs this machine has'}",
                              "lower tensor_parallel_size, or run on a machine with more GPUs" +
                              (", or list more of them in CUDA_VISIBLE_DEVICES." if machine else "."))
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


def raise_unless_fits(advice: dict[str, Any]) -> None:
    if not advice["fits"]:
        raise ValueError(advice["advice"])


def engine_refusal(model: str = "llama-3.1-70b", config: VLLMConfig = ONE_LONG_SEQUENCE) -> str:
    """What `VLLMEngine(...)` says on this machine for `config`, before any worker starts.

    Without a GPU its preflight refuses first for that (or for vLLM missing); on an H200 it refuses a
    configuration that cannot fit with check_fit's advice. A configuration it accepts starts no worker here."""
    try:
        VLLMEngine(shape_spec(model), config)
    except ValueError as e:
        return f"refused before launch: {e}"
    return "accepted by the preflight (no worker was started)"
