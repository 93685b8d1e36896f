"""What this machine is and what each lab will do on it (lab 00).

A workshop room mixes laptops, Colab CPU and GPU runtimes and the odd A100. Lab 00 says,
before anything runs: which hardware this is, what NVML reports, which model shapes fit
its memory, and for each later lab whether it will measure live or show recorded runs.
"""
from __future__ import annotations

from typing import Any

from .gpu import device_facts
from .mechanisms.kv import kv_bytes_per_token
from .roofline import lookup_gpu
from .synthetic import architectures, parameter_count

GiB = 2**30

LABS = [
    ("00_setup", "this page: hardware, NVML, what fits", "cpu"),
    ("01_batching", "naive HF generate vs static batching; the memory wall; prefill vs decode", "cpu"),
    ("02_kv_cache", "KV-cache sizes, fragmentation and paging, the gpu_memory_utilization sweep", "vllm"),
    ("03_continuous_batching", "static vs continuous batching, HF vs vLLM on the journey", "vllm"),
]


def machine_summary() -> dict[str, Any]:
    """Device facts plus the roofline entry for this GPU (None when unknown or no GPU)."""
    facts = device_facts(import_torch=True)
    peak = lookup_gpu(facts["gpu"]) if facts["gpu"] else None
    return {**facts, "roofline_entry": peak.name if peak else None,
            "peak_bandwidth_TBps": peak.peak_bw / 1e12 if peak else None}


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
            # 90% of memory for vLLM, ~2 GiB of it for activations and graphs (see lablib.fit)
            row[f"fits_{c}"] = None if gpu_memory_bytes is None else weights + kv * c + 2 * GiB <= 0.9 * gpu_memory_bytes
        rows.append(row)
    return rows


def lab_plan() -> list[dict[str, str]]:
    """For each lab: what it does and whether it measures live here or shows recorded runs."""
    from .reference import mode

    m = mode()
    return [{"lab": lab, "does": does,
             "here": "live" if need == "cpu" or m["live"] else f"simulators live, vLLM recorded ({m['why']})"}
            for lab, does, need in LABS]
