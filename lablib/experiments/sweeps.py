"""Sweeps that restart the engine: one knob, several engine configurations, one row each.

A knob fixed at engine start (gpu_memory_utilization, max_num_seqs, max_num_batched_tokens)
needs a fresh engine per value; each runs in its own worker, and after each the GPU must
be back at its baseline (the row records it). Knobs that do not need a restart (request
count, concurrency) reuse one engine: see `bench.run` on the same engine.

Without a GPU, `gpu_memory_utilization_rows()` returns the sweep recorded on the H200.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import validate
from ..bench.offline import run
from ..config import BenchConfig, VLLMConfig
from ..engines.vllm import nvml_used, VLLMEngine
from ..models import ModelSpec
from ..results.record import Result
from ..results.store import ResultStore
from ..session import live_label
from ..workloads import load_workload


def config_sweep(configs: list[VLLMConfig], model: str | ModelSpec = "embedded", workload: str = "journey",
                 step: Callable[[VLLMConfig], str] = lambda c: "vllm", store: ResultStore | None = None,
                 lab: str = "sweep", bench: BenchConfig = BenchConfig(progress=False),
                 on_row: Callable[[dict[str, Any]], None] | None = None) -> tuple[list[dict[str, Any]], list[Result]]:
    """One vLLM engine per configuration (each in its own worker), the workload on each, one row per engine:
    KV capacity, throughput, latency and GPU memory before start and after close. `on_row(row)` is
    called as each engine closes (a live figure marks it)."""
    wl = load_workload(workload)
    rows, results = [], []
    for cfg in configs:
        before = nvml_used()
        with VLLMEngine(model, cfg) as eng:
            r = run(eng, wl, bench, lab=lab, step=step(cfg), store=store)
        results.append(r)
        rows.append({**cfg.to_dict(), "model": eng.spec.name, "kv_tokens": eng.facts.get("kv_tokens"),
                     "max_concurrency": eng.facts.get("max_concurrency"), "output_tok_s": r.summary["output_tok_s"],
                     "ttft_p99_s": r.summary["ttft_s"]["p99"], "tpot_p50_s": r.summary["tpot_s"]["p50"],
                     "peak_used_bytes": r.memory.get("peak_bytes"), "vram_before_bytes": before[0] if before else None,
                     "vram_after_close_bytes": eng.facts.get("vram_after_close_bytes"),
                     "back_to_baseline": eng.facts.get("vram_back_to_baseline"),
                     "startup_s": eng.facts.get("startup_s"), "provenance": live_label()})
        if on_row is not None:
            on_row(rows[-1])
    return rows, results


def request_count_sweep(engine: Any, counts: list[int], workload: str = "journey", store: ResultStore | None = None,
                        lab: str = "sweep", bench: BenchConfig = BenchConfig(progress=False)) -> list[Result]:
    """The first n requests of the workload for each n, all on ONE engine: the request count is not an engine knob,
    so nothing restarts (start-up is paid once, and every point sees the same warm engine)."""
    wl = load_workload(workload)
    validate.integers("request_count_sweep", "counts", counts, f"request counts within the {len(wl)} of {workload!r}.",
                      1, len(wl))
    return [run(engine, wl.head(n), bench, lab=lab, step=f"{engine.name}-n{n}", store=store) for n in counts]
