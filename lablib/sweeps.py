"""Sweeps that restart the engine: one knob, several engine configurations, one row each.

A knob fixed at engine start (gpu_memory_utilization, max_num_seqs, max_num_batched_tokens)
needs a fresh engine per value; each runs in its own worker, and after each the GPU must
be back at its baseline (the row records it). Knobs that do not need a restart (request
count, concurrency) reuse one engine: see `bench.run` on the same engine.

Without a GPU, `gpu_memory_utilization_rows()` returns the sweep recorded on the H200.
"""
from __future__ import annotations

from typing import Any

from .bench import run
from .config import BenchConfig, VLLMConfig
from .results import Result, ResultStore
from .workloads import load_workload


def gpu_memory_utilization_sweep(values: list[float], model: str = "embedded", workload: str = "journey",
                                 enforce_eager: bool = True, store: ResultStore | None = None,
                                 lab: str = "02_kv_cache") -> tuple[list[dict[str, Any]], list[Result]]:
    """Start one vLLM engine per value, run the workload, record KV capacity, throughput and VRAM after close."""
    from .engines.vllm import VLLMEngine, _nvml_used

    configs = [VLLMConfig(gpu_memory_utilization=g, enforce_eager=enforce_eager) for g in values]  # validate all first
    wl = load_workload(workload)
    rows, results = [], []
    for cfg in configs:
        before = _nvml_used()
        with VLLMEngine(model, cfg) as eng:
            r = run(eng, wl, BenchConfig(progress=False), lab=lab, step=f"vllm-gmu-{cfg.gpu_memory_utilization}",
                    store=store)
        results.append(r)
        rows.append({"gpu_memory_utilization": cfg.gpu_memory_utilization, "kv_tokens": eng.facts.get("kv_tokens"),
                     "max_concurrency": eng.facts.get("max_concurrency"), "output_tok_s": r.summary["output_tok_s"],
                     "peak_used_bytes": r.memory.get("peak_bytes"), "vram_before_bytes": before[0] if before else None,
                     "vram_after_close_bytes": eng.facts.get("vram_after_close_bytes"),
                     "back_to_baseline": eng.facts.get("vram_back_to_baseline"),
                     "startup_s": eng.facts.get("startup_s"), "provenance": "live"})
    return rows, results


def gpu_memory_utilization_rows(values: list[float] = (0.1, 0.3, 0.5), live: bool | None = None,
                                **kw: Any) -> list[dict[str, Any]]:
    """Live sweep rows on a GPU with vLLM; otherwise the rows recorded on the H200 (labelled)."""
    from .reference import mode, reference_facts

    if live is None:
        live = mode()["live"]
    if live:
        return gpu_memory_utilization_sweep(list(values), **kw)[0]
    head = reference_facts()["headline"]
    return [{**row, "provenance": f"recorded on {head['gpu']}, {head['date']}"} for row in reference_facts()["sweep"]]
