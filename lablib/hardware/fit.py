"""Will it fit? The memory budget of a vLLM engine, checked before the engine starts.

vLLM takes `gpu_memory_utilization` × the GPU's memory and splits it into the weights,
the activations of the largest step it will run (plus CUDA-graph buffers unless
`enforce_eager`), and the KV cache, which gets everything left. It refuses to start when
the KV cache cannot hold even one sequence of `max_model_len` tokens. Starting an engine
costs a minute or more, so the lab does the arithmetic first and names the knob to turn.

The overhead figures are deliberately rough (a fixed allowance for the CUDA context,
activations and graphs); lab 02 puts the estimate next to the KV capacity vLLM reports.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import validate
from ..config import VLLMConfig
from ..mechanisms import parallel
from ..mechanisms.gpus import GPU_PEAKS
from ..models.architecture import architectures, kv_bytes_per_token, parameter_count
from ..models.spec import ModelSpec
from .device import device_facts

GiB = 2**30
CONTEXT_OVERHEAD = 0.75 * GiB  # CUDA context, cuBLAS workspaces, allocator slack (not inside vLLM's budget)
ACTIVATION_OVERHEAD = 1.0 * GiB  # peak activations of one scheduler step (profiled by vLLM at start)
GRAPH_OVERHEAD = 0.5 * GiB  # CUDA-graph memory pools (0 with enforce_eager)


@dataclass(frozen=True)
class FitReport:
    budget_bytes: int  # gpu_memory_utilization × total
    weight_bytes: int
    overhead_bytes: int
    kv_bytes: int  # what is left for the KV cache
    kv_bytes_per_token: int
    kv_tokens: int  # KV capacity in tokens (the estimate vLLM's own figure is compared with)
    max_model_len: int
    max_concurrency: float  # full-length sequences that fit at once
    fits: bool
    advice: str

    def to_dict(self) -> dict:
        return asdict(self)


def weight_bytes(spec: ModelSpec, config: VLLMConfig) -> int:
    """Bytes of weights on the GPU: the checkpoint's size on disk, or from the shape for a hub preset."""
    files = list(Path(spec.path).glob("*.safetensors"))
    if files:
        size = sum(f.stat().st_size for f in files)
    else:
        size = parameter_count(spec.config) * 2
    arch = spec.architecture()
    if config.quantization == "fp8" and arch["dtype"] in ("bfloat16", "float16"):
        # fp8 for the Linears only: the embedding and LM head tables stay 16-bit (vLLM's Fp8Config quantizes
        # LinearBase layers; the norms and the file's header, under a MB, are halved with the Linears)
        tables = (arch["vocab"] or 0) * (arch["hidden"] or 0) * 2 * (1 if arch["tie_word_embeddings"] else 2)
        size -= (size - tables) // 2
    return size


def check_fit(spec: ModelSpec, config: VLLMConfig, total_bytes: int, free_bytes: int | None = None) -> FitReport:
    """The memory budget of `config` on a GPU of `total_bytes`; `fits` False with `advice` naming the knob.

    Needs a local checkpoint (embedded, synthetic or a folder): a hub preset's shape is only known after download.
    """
    kv_per_tok = spec.kv_bytes_per_token(1 if config.kv_cache_dtype.startswith("fp8") else 2) or 0
    t, p = config.tensor_parallel_size, config.pipeline_parallel_size
    layers = spec.architecture().get("layers") or 0
    stage = -(-layers // p) if layers else 0  # the largest stage's layers (vLLM's get_pp_indices: first stages most)
    if p > 1 and kv_per_tok and layers:  # vLLM sizes KV by the GPU with the least room: the largest stage
        kv_per_tok = kv_per_tok * stage // layers
    if t > 1 and kv_per_tok:  # each GPU holds kv_heads / t heads, never fewer than one (replicated below that)
        arch = spec.architecture()
        kv_heads = arch.get("kv_heads") or arch.get("num_key_value_heads")
        if kv_heads:
            kv_per_tok = kv_per_tok * max(kv_heads // t, 1) // kv_heads
    max_len = config.max_model_len or spec.architecture()["context"] or 2048
    budget = int(config.gpu_memory_utilization * total_bytes)
    weights = weight_bytes(spec, config) // t
    if p > 1 and layers:  # the largest stage's share of the layers (embeddings, on the end stages, left out)
        weights = weights * stage // layers
    overhead = int(ACTIVATION_OVERHEAD + (0 if config.enforce_eager else GRAPH_OVERHEAD))
    kv = max(0, budget - weights - overhead - int(CONTEXT_OVERHEAD))
    if config.kv_cache_memory_bytes is not None:  # vLLM takes exactly this, whatever gpu_memory_utilization leaves
        kv = config.kv_cache_memory_bytes
    tokens = kv // kv_per_tok if kv_per_tok else 0
    fits = tokens >= max_len
    advice = ""
    need = weights + overhead + int(CONTEXT_OVERHEAD) + kv
    if free_bytes is not None and config.gpu_memory_utilization * total_bytes > free_bytes + CONTEXT_OVERHEAD:
        advice = (f"gpu_memory_utilization={config.gpu_memory_utilization} asks for "
                  f"{config.gpu_memory_utilization * total_bytes / GiB:.1f} GiB but only {free_bytes / GiB:.1f} GiB "
                  "is free (another process holds the rest). Fix: lower gpu_memory_utilization, or free the GPU.")
        fits = False
    elif config.kv_cache_memory_bytes is not None and free_bytes is not None and need > free_bytes:
        advice = (f"kv_cache_memory_bytes={kv / GiB:.2f} GiB + weights {weights / GiB:.2f} GiB + overhead "
                  f"{(overhead + CONTEXT_OVERHEAD) / GiB:.2f} GiB need {need / GiB:.1f} GiB, but only "
                  f"{free_bytes / GiB:.1f} GiB is free. Fix: a smaller kv_cache_memory_bytes, or free the GPU.")
        fits = False
    elif not fits and config.kv_cache_memory_bytes is not None:
        advice = (f"kv_cache_memory_bytes={kv / GiB:.2f} GiB holds {tokens:,} KV tokens, fewer than one sequence of "
                  f"max_model_len={max_len:,}. Fix: at least {max_len * kv_per_tok / GiB:.2f} GiB, or a lower "
                  "max_model_len.")
    elif not fits and weights + overhead + CONTEXT_OVERHEAD >= budget:
        advice = (f"{spec.name}: the weights alone ({weights / GiB:.2f} GiB per GPU at tensor_parallel_size="
                  f"{config.tensor_parallel_size}, pipeline_parallel_size={config.pipeline_parallel_size}) + overhead {overhead / GiB:.2f} GiB exceed the budget "
                  f"{budget / GiB:.1f} GiB, so no max_model_len helps. Fix: a larger tensor_parallel_size (split the "
                  "weights across GPUs) or pipeline_parallel_size (split the layers), quantization='fp8' (or a W4A16 "
                  "checkpoint), or a smaller model.")
    elif not fits:
        advice = (f"{spec.name}: weights {weights / GiB:.2f} GiB + overhead {overhead / GiB:.2f} GiB leave room for "
                  f"{tokens:,} KV tokens, fewer than one sequence of max_model_len={max_len:,}. Fix: lower "
                  "max_model_len, raise gpu_memory_utilization, use kv_cache_dtype='fp8' or quantization='fp8', "
                  "a larger tensor_parallel_size, or a smaller model.")
    return FitReport(budget, weights, overhead, kv, kv_per_tok, tokens, max_len,
                     tokens / max_len if max_len else 0.0, fits, advice)


def fit_table(gpu_memory_bytes: int | None = None, contexts: tuple[int, ...] = (2048, 8192)) -> list[dict[str, Any]]:
    """Per real architecture: bf16 weights, KV per token, and whether weights + one sequence of each context fit.

    `gpu_memory_bytes` defaults to this machine's first GPU; None without one (the columns say so).
    """
    if gpu_memory_bytes is None:
        mem = device_facts().get("gpu_memory_bytes") or []
        gpu_memory_bytes = mem[0] if mem else None
    rows = []
    for name, cfg in architectures().items():
        heads = cfg["num_attention_heads"]
        kv = kv_bytes_per_token(cfg["num_hidden_layers"], cfg.get("num_key_value_heads", heads),
                                cfg.get("head_dim") or cfg["hidden_size"] // heads, "bfloat16")
        weights = parameter_count(cfg) * 2
        row = {"architecture": name, "parameters_B": parameter_count(cfg) / 1e9, "weights_GiB": weights / GiB,
               "kv_KiB_per_token": kv / 1024}
        for c in contexts:
            # vLLM's default budget (90% of the GPU) less the same overheads check_fit allows for
            need = weights + kv * c + CONTEXT_OVERHEAD + ACTIVATION_OVERHEAD + GRAPH_OVERHEAD
            row[f"fits_{c}"] = None if gpu_memory_bytes is None else need <= 0.9 * gpu_memory_bytes
        rows.append(row)
    return rows


# Bytes per weight of the linear layers under each scheme; embeddings and lm_head stay 16-bit in all of them (vLLM's
# online fp8 and llm-compressor's recipes leave lm_head out; the embedding is a lookup). W4A16: 4 bits plus one 16-bit
# scale per group of 128 (vLLM's Marlin/Machete default group size).
SCHEME_BYTES = {"bf16": 2.0, "fp8": 1.0, "w4a16": 0.5 + 2 / 128}
FIT_GPUS = ("H200", "H100 SXM", "A100 80GB SXM", "A100 40GB", "L40S", "L4", "T4")
RESERVE_BYTES = int(CONTEXT_OVERHEAD + ACTIVATION_OVERHEAD + GRAPH_OVERHEAD)  # what check_fit keeps back


def _shape_for(cfg: dict[str, Any], scheme: str, kv_bytes: int = 2) -> parallel.DenseShape:
    """The TP cost model's shape with one average byte count per weight: linear layers at the scheme's bytes,
    embeddings and lm_head at 2 bytes (so memory_fit's weights/t is the scheme's real per-GPU size)."""
    total = parameter_count(cfg)
    embed = cfg["vocab_size"] * cfg["hidden_size"] * (1 if cfg.get("tie_word_embeddings") else 2)
    average = ((total - embed) * SCHEME_BYTES[scheme] + embed * 2) / total
    return parallel.DenseShape.from_config(cfg, weight_bytes=average, kv_bytes=kv_bytes)


def tp_fit_table(models: tuple[str, ...] = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b"),
                 schemes: tuple[str, ...] = ("bf16", "fp8", "w4a16"), gpus: tuple[str, ...] = FIT_GPUS,
                 tps: tuple[int, ...] = (1, 2, 4, 8), context: int = 8192, batch: int = 1) -> list[dict[str, Any]]:
    """Which shapes fit on 1, 2, 4, 8 GPUs of each kind at each scheme, before anyone rents them.

    One row per (model, scheme, GPU): the whole model's weight bytes, per t whether weights / t plus `batch`
    sequences of `context` tokens (KV heads split by t, replicated below one per GPU) plus the engine's reserve
    fit in 90% of one GPU (`mechanisms.parallel.memory_fit`, with check_fit's reserve), and the smallest t that
    does (None: not even 8). A t the shape cannot split into (heads, intermediate, KV heads) reads None.
    Memory only: whether a GPU runs the scheme at all (no bf16 on a T4, FP8 weights only through Marlin before
    Ada/Hopper) is the vLLM engine's preflight to say.
    """
    for s_ in schemes:
        validate.choice("tp_fit_table", "schemes", s_, tuple(SCHEME_BYTES))
    for g in gpus:
        validate.choice("tp_fit_table", "gpus", g, tuple(GPU_PEAKS))
    archs = architectures()
    for m in models:
        validate.choice("tp_fit_table", "models", m, tuple(archs))
    rows = []
    for m in models:
        for scheme in schemes:
            shape = _shape_for(archs[m], scheme)
            allowed = parallel.valid_tp_sizes(shape)
            for g in gpus:
                peak = GPU_PEAKS[g]
                gpu = parallel.Gpu(g, peak.memory_gb * 1e9, peak.peak_bw, peak.bf16_flops or peak.fp16_flops or 1.0)
                fits = {t: (parallel.memory_fit(shape, batch, context, t, gpu, reserve_bytes=RESERVE_BYTES).fits
                            if t in allowed else None) for t in tps}
                rows.append({"model": m, "scheme": scheme, "gpu": g, "gpu_GB": peak.memory_gb,
                             "weights_GB": parallel.params_per_gpu(shape, 1) * shape.weight_bytes / 1e9,
                             **{f"tp{t}": fits[t] for t in tps},
                             "smallest_tp": next((t for t in tps if fits[t]), None)})
    return rows
