"""Lab 06, quantization: what each scheme costs in quality on the CPU, what it stores, and what it buys on the GPU.

The lab's path, one module per noun, each importing only from the ones above it in this list:

- `measures`: perplexity, greedy agreement and the quality gate, each against bf16; the evaluation set
  (disjoint from the calibration set); a checkpoint loaded on the CPU, and how its numerics relate to vLLM's.
- `checkpoints`: `quantize_all` makes (or reuses) the embedded target's checkpoints, `recipe_text` shows
  what llm-compressor ran, `group_size_rows` which 4-bit group sizes tile the model.
- `sizes`: `storage` reads what each checkpoint stores from its safetensors headers; `weights_alone` does
  the same byte arithmetic on the published 8B and 70B shapes.
- `quality`: `quality_table` scores every checkpoint against bf16, `lm_head_rows` measures lm_head kept
  16-bit against quantized.
- `layers`: `layer_rows` quantizes one scheme into the MLP only, attention only and every Linear (lm_head
  16-bit in each) and scores each against bf16: which part quantization hurts more per byte saved.
- `verdicts`: `claims` answers each seed claim from those numbers; the Checks cell's claims about the run.
- `vllm_ppl`: the same checkpoints' perplexity as vLLM runs them (`prompt_logprobs`), beside the CPU's;
  on bf16 the two must agree within `TOLERANCE_PCT`, and a `bf16-kv-fp8` row prices the FP8 KV cache; `record` is
  step `quantization-quality`, and a live run on its settings (`RECORD`) is kept as that recording.
- `speed_runs`, the GPU half: `prepare_checkpoints` quantizes a synthetic Llama-3.1-8B in the quantization
  environment, then `vllm_speed_runs` measures decode speed and memory per scheme and batch through vLLM,
  each against its own bandwidth roofline.
- `recording`: scripts/record_reference.py's steps for it, `record_checkpoints` (step `quantization-prepare`)
  and `record` (step `quantization`, or `quantization-a` and `-b`), each keeping what it made when cut short;
  and `speed`, the notebook's one call, live on a GPU, recorded elsewhere, whose live run of QUANT_A on record's
  grid is kept as step `quantization-a`'s recording.

Every public name is importable from here (`from lablib.experiments import quantization as qe`), as the
notebook, scripts/record_reference.py and the tests use them.
"""
from __future__ import annotations

from .checkpoints import group_size_rows, quantize_all, quiet_progress, recipe_text
from .vllm_ppl import (
    KV_FP8,
    TOLERANCE_PCT,
    CPU_SCHEMES,
    bf16_agrees,
    default_schemes,
    differs_from_record,
    gpu_quality,
    gpu_quality_lines,
    quality_facts,
    quality_recording,
    vllm_quality_rows,
)
from .measures import (
    OWNER,
    Agreement,
    Gate,
    Perplexity,
    agreement,
    check_disjoint,
    evaluation_set,
    from_logprobs,
    greedy_tokens,
    load_model,
    perplexity,
    provenance,
    quality_gate,
)
from .quality import gate_rows, lm_head_rows, lm_head_sentence, quality_table
from .sizes import (
    QUANTIZED_DTYPES,
    WEIGHT_FORMATS,
    linear_bytes,
    linear_shapes,
    predicted_bytes,
    storage,
    storage_rows,
    weight_bytes,
    weights_alone,
)
from .speed_runs import (
    BATCHES,
    GPU_WORK,
    KERNEL_LINE,
    KV_LINE,
    LAB,
    LOAD_LINE,
    SPEED_MODEL,
    SPEED_SCHEMES,
    VLLM_SWITCHES,
    available_speed_schemes,
    fixed_workload,
    kv_sentence,
    prepare_checkpoints,
    speed_rows,
    vllm_log_facts,
    vllm_speed_runs,
)
from .recording import (
    QUANT_A,
    QUANT_A_GRID,
    QUANT_B,
    differs_from_quant_a,
    record,
    record_checkpoints,
    speed,
    speed_facts,
)
from .layers import PARTS, attention_more_sensitive, layer_rows, layer_sentence
from .verdicts import claims, gate_judged, headline, int4_costs_more, kernels_logged, under_one_percent

__all__ = [
    "CPU_SCHEMES", "KV_FP8", "TOLERANCE_PCT", "bf16_agrees", "default_schemes", "differs_from_record", "gpu_quality",
    "gpu_quality_lines", "quality_facts", "quality_recording", "vllm_quality_rows",
    "BATCHES", "GPU_WORK", "KERNEL_LINE", "KV_LINE", "LAB", "LOAD_LINE", "OWNER", "QUANTIZED_DTYPES", "SPEED_MODEL",
    "SPEED_SCHEMES", "VLLM_SWITCHES", "WEIGHT_FORMATS", "Agreement", "Gate", "Perplexity", "agreement",
    "available_speed_schemes", "check_disjoint", "claims", "evaluation_set", "fixed_workload", "from_logprobs",
    "gate_rows", "greedy_tokens", "group_size_rows", "headline", "kv_sentence", "linear_bytes", "linear_shapes",
    "lm_head_rows", "lm_head_sentence", "load_model", "perplexity", "predicted_bytes", "prepare_checkpoints",
    "provenance", "quality_gate", "quality_table", "quantize_all", "quiet_progress", "recipe_text", "record",
    "record_checkpoints", "speed", "QUANT_A", "QUANT_A_GRID", "QUANT_B", "differs_from_quant_a", "speed_facts",
    "speed_rows", "storage", "storage_rows", "under_one_percent", "vllm_log_facts", "vllm_speed_runs",
    "weight_bytes", "weights_alone", "PARTS", "attention_more_sensitive", "layer_rows", "layer_sentence",
    "gate_judged", "int4_costs_more", "kernels_logged",
]
