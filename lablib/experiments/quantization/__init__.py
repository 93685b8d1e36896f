"""Lab 06, quantization: what each scheme costs in quality on the CPU, what it stores, and what it buys on the GPU.

Modules import one way, each only from those before it: measures < checkpoints < sizes < quality < layers <
verdicts < speed_runs < vllm_ppl < recording < checks < lab < record.

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
- `verdicts`: `claims` answers each common claim from those numbers; the Checks cell's claims about the run.
- `speed_runs`, the GPU half: `prepare_checkpoints` quantizes a synthetic Llama-3.1-8B in the quantization
  environment, then `vllm_speed_runs` measures decode speed and memory per scheme and batch through vLLM,
  each against its own bandwidth roofline.
- `vllm_ppl`: the same checkpoints' perplexity as vLLM runs them (`prompt_logprobs`), beside the CPU's;
  on bf16 the two must agree within `TOLERANCE_PCT`, and a `bf16-kv-fp8` row prices the FP8 KV cache; a live run on
  step `quantization-quality`'s settings (`RECORD`) is kept as that recording.
- `recording`: `speed`, the notebook's one call, live on a GPU, recorded elsewhere, whose live run of QUANT_A on
  step `quantization-a`'s grid is kept as that recording; the speed recording's facts (`speed_facts`).
- `checks`: the notebook's Checks cell, on the lab's object;
- `lab`: the notebook's knobs and steps as one object (`QuantizationLab`), each step keeping what it made;
- `record`: the GPU recording steps, which only scripts/record_reference.py calls: `record` (step `quantization`,
  or `quantization-a` and `-b`), `record_checkpoints` (`quantization-prepare`), `record_quality`
  (`quantization-quality`), each keeping what it made when cut short.

Import the module you call (`from lablib.experiments.quantization import quality`).
"""
