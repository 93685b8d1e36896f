"""The child side of the quantizer: llm-compressor in a process (and, on a GPU machine, an environment) of its own.

    python -m lablib.models.quantize_worker JOB.json

`lablib.models.quantize` checks everything first and writes the job (model folder, output folder,
scheme, group size, ignored modules, the calibration texts); this script only builds the recipe,
runs `oneshot`, saves the compressed-tensors checkpoint with its tokenizer and recipe.yaml, and writes
what it did to the job's `result` file. It imports no other lablib module and needs only llm-compressor's
own environment (torch, transformers, datasets, llmcompressor), so it runs where vLLM is not installed.

The recipes (llm-compressor 0.14):
- gptq: `GPTQModifier` with one config group: int4 symmetric weights, strategy "group".
- awq: `AWQModifier(duo_scaling="both")`, then `QuantizationModifier` with int4 asymmetric groups.
- fp8: `QuantizationModifier(scheme="FP8_DYNAMIC")`, data-free.
- smoothquant+gptq: `SmoothQuantModifier(smoothing_strength=0.8)`, then `GPTQModifier(scheme="W8A8")`.
lm_head (and whatever else the job ignores) stays in the model's own dtype.

On a machine with no accelerator llm-compressor 0.14's AWQ pins its cached activations in page-locked
memory (`IntermediatesCache.pin_memory`, only there to speed copies to a GPU) and fails with "Cannot
access accelerator device". There the worker skips the pinning, which changes nothing but copy speed,
and records the workaround in the result.
"""
from __future__ import annotations

import json
import platform
import sys
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("llmcompressor", "compressed-tensors", "torch", "transformers", "datasets"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def build_recipe(method: str, group_size: int | None, ignore: list[str]) -> list[Any]:
    """The llm-compressor modifiers for one scheme (see the module docstring)."""
    from llmcompressor.modifiers.gptq import GPTQModifier  # deferred: llmcompressor
    from llmcompressor.modifiers.quantization import QuantizationModifier  # deferred: llmcompressor

    def int4(symmetric: bool) -> dict[str, Any]:
        weights = {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": group_size}
        return {"group_0": {"targets": ["Linear"], "weights": weights}}

    if method == "gptq":
        return [GPTQModifier(config_groups=int4(True), ignore=ignore)]
    if method == "awq":
        from llmcompressor.modifiers.transform.awq import AWQModifier  # deferred: llmcompressor

        return [AWQModifier(duo_scaling="both"), QuantizationModifier(config_groups=int4(False), ignore=ignore)]
    if method == "fp8":
        return [QuantizationModifier(targets=["Linear"], scheme="FP8_DYNAMIC", ignore=ignore)]
    if method == "smoothquant+gptq":
        from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier  # deferred: llmcompressor

        return [SmoothQuantModifier(smoothing_strength=0.8),
                GPTQModifier(targets=["Linear"], scheme="W8A8", ignore=ignore)]
    raise ValueError(f"unknown method {method!r}")


def _no_accelerator_workarounds() -> list[str]:
    import torch  # deferred: torch

    if torch.accelerator.is_available():
        return []
    from llmcompressor.pipelines.cache import IntermediatesCache  # deferred: llmcompressor

    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None
    return ["no accelerator: IntermediatesCache.pin_memory skipped (llm-compressor 0.14 pins for GPU copies "
            "unconditionally; AWQ fails without this)"]


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Quantize as the job says and save; returns the facts for quantization.json."""
    t_start = time.perf_counter()
    import torch  # deferred: torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: transformers

    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    workarounds = _no_accelerator_workarounds()
    from llmcompressor import oneshot  # deferred: llmcompressor

    tokenizer = AutoTokenizer.from_pretrained(job.get("tokenizer_dir") or job["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype="auto")
    recipe = build_recipe(job["scheme_details"]["method"], job["group_size"], job["ignore"])
    kwargs: dict[str, Any] = {}
    if job["texts"]:
        from datasets import Dataset  # deferred: datasets

        ids = [tokenizer(t, truncation=True, max_length=job["max_seq_length"])["input_ids"] for t in job["texts"]]
        if not all(ids):
            raise ValueError(f"the tokenizer from {job.get('tokenizer_dir') or job['model_dir']} turned "
                             f"{sum(not i for i in ids)} of {len(ids)} calibration texts into no ids: it is empty. "
                             "Fix: copy the model's own tokenizer files into its folder.")
        data = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]})
        kwargs = {"dataset": data, "processor": tokenizer, "num_calibration_samples": len(ids), "max_seq_length": job["max_seq_length"],
                  "shuffle_calibration_samples": False}
    t0 = time.perf_counter()
    oneshot(model=model, recipe=recipe, **kwargs)
    seconds = time.perf_counter() - t0
    model.save_pretrained(job["out_dir"], save_compressed=True)  # also writes recipe.yaml
    tokenizer.save_pretrained(job["out_dir"])
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({_cpu_name()})"
    return {"seconds": round(seconds, 2), "worker_s": round(time.perf_counter() - t_start, 2), "device": device,
            "torch_threads": torch.get_num_threads(), "versions": _versions(), "workarounds": workarounds,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m lablib.models.quantize_worker JOB.json (written by lablib.models.quantize)")
        return 2
    with open(argv[0]) as f:
        job = json.load(f)
    try:
        result = run(job)
    except BaseException:
        traceback.print_exc()
        return 1
    with open(job["result"], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
