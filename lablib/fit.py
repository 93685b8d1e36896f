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

from .config import VLLMConfig
from .models import ModelSpec

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
        from .synthetic import parameter_count

        size = parameter_count(spec.config) * 2
    if config.quantization == "fp8" and spec.architecture()["dtype"] in ("bfloat16", "float16"):
        size //= 2  # fp8 weights for the linear layers (embeddings stay 16-bit: a slight under-estimate)
    return size


def check_fit(spec: ModelSpec, config: VLLMConfig, total_bytes: int, free_bytes: int | None = None) -> FitReport:
    """The memory budget of `config` on a GPU of `total_bytes`; `fits` False with `advice` naming the knob.

    Needs a local checkpoint (embedded, synthetic or a folder): a hub preset's shape is only known after download.
    """
    kv_per_tok = spec.kv_bytes_per_token(1 if config.kv_cache_dtype.startswith("fp8") else 2) or 0
    max_len = config.max_model_len or spec.architecture()["context"] or 2048
    budget = int(config.gpu_memory_utilization * total_bytes)
    weights = weight_bytes(spec, config) // config.tensor_parallel_size
    overhead = int(ACTIVATION_OVERHEAD + (0 if config.enforce_eager else GRAPH_OVERHEAD))
    kv = max(0, budget - weights - overhead - int(CONTEXT_OVERHEAD))
    tokens = kv // kv_per_tok if kv_per_tok else 0
    fits = tokens >= max_len
    advice = ""
    if free_bytes is not None and config.gpu_memory_utilization * total_bytes > free_bytes + CONTEXT_OVERHEAD:
        advice = (f"gpu_memory_utilization={config.gpu_memory_utilization} asks for "
                  f"{config.gpu_memory_utilization * total_bytes / GiB:.1f} GiB but only {free_bytes / GiB:.1f} GiB "
                  "is free (another process holds the rest). Fix: lower gpu_memory_utilization, or free the GPU.")
        fits = False
    elif not fits:
        advice = (f"{spec.name}: weights {weights / GiB:.2f} GiB + overhead {overhead / GiB:.2f} GiB leave room for "
                  f"{tokens:,} KV tokens, fewer than one sequence of max_model_len={max_len:,}. Fix: lower "
                  "max_model_len, raise gpu_memory_utilization, use kv_cache_dtype='fp8' or quantization='fp8', "
                  "or a smaller model.")
    return FitReport(budget, weights, overhead, kv, kv_per_tok, tokens, max_len,
                     tokens / max_len if max_len else 0.0, fits, advice)
