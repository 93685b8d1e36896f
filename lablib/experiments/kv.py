"""Lab 03's experiment: KV capacity against `gpu_memory_utilization`, one vLLM engine per value.

vLLM takes the given fraction of the GPU, loads the weights, profiles one step and gives
the KV cache the rest; each value needs its own engine, and every engine runs in its own
worker, so after it closes the GPU must be back at its baseline.
"""
from __future__ import annotations

from typing import Any, Callable

from ..config import lab_id, VLLMConfig
from ..models import ModelSpec
from ..results.record import Result
from ..results.store import ResultStore
from ..results.reference import recorded_rows, reference_facts
from ..session import Shown, asked_rows, live_label, live_or_recorded
from .sweeps import config_sweep


def gpu_memory_utilization_sweep(values: list[float], model: str | ModelSpec = "embedded", workload: str = "journey",
                                 enforce_eager: bool = True, store: ResultStore | None = None,
                                 lab: str = lab_id("03"), on_row: Callable[[dict[str, Any]], None] | None = None
                                 ) -> tuple[list[dict[str, Any]], list[Result]]:
    """Start one vLLM engine per value, run the workload, record KV capacity, throughput and VRAM after close."""
    configs = [VLLMConfig(gpu_memory_utilization=g, enforce_eager=enforce_eager) for g in values]  # validate all first
    return config_sweep(configs, model, workload, lambda c: f"vllm-gmu-{c.gpu_memory_utilization}", store, lab,
                        on_row=on_row)


def gpu_memory_utilization_rows(values: list[float] = (0.1, 0.3, 0.5), force: bool | None = None,
                                **kw: Any) -> Shown[list[dict[str, Any]]]:
    """Live sweep rows on a GPU with vLLM; otherwise the rows recorded on the H200 (labelled)."""
    [VLLMConfig(gpu_memory_utilization=g) for g in values]  # refuse a bad value before anything starts
    model = kw.get("model", "embedded")
    return live_or_recorded(lambda: [{**r, "provenance": live_label()}
                                     for r in gpu_memory_utilization_sweep(list(values), **kw)[0]],
                            lambda: asked_rows(recorded_rows("sweep", "sweep"), "gpu_memory_utilization", values),
                            force=force,
                            asked={"gpu_memory_utilization": list(values),
                                   "model": model if isinstance(model, str) else model.name},
                            # scripts/record_reference.py's sweep step runs the sweep's own default model
                            recorded_with=lambda rows: {"gpu_memory_utilization": [r["gpu_memory_utilization"]
                                                                                   for r in rows], "model": "embedded"})


COLD_START_GMU = 0.3  # the cold start's gpu_memory_utilization, here and in scripts/record_reference.py's smoke step


def cold_start(gpu_memory_utilization: float = COLD_START_GMU, force: bool | None = None) -> Shown[dict[str, Any]]:
    """One vLLM engine on the embedded model: the KV capacity it reports next to lablib's fit estimate.

    Live: the engine's own facts (KV blocks and tokens, block size, attention backend, the fit
    estimate made before it started). Recorded: the same facts from the H200's first engine.
    Either way `kv_over_estimate` is vLLM's KV tokens over the estimate's (1.0 = the arithmetic was exact).
    """
    config = VLLMConfig(gpu_memory_utilization=gpu_memory_utilization)

    def live() -> dict[str, Any]:
        from ..engines.vllm import VLLMEngine

        with VLLMEngine("embedded", config) as eng:
            eng.start()
        return with_ratio(dict(eng.facts))  # close() adds the VRAM-after-close facts to the same dict

    return live_or_recorded(live, lambda: with_ratio(dict(reference_facts()["cold_start"])), force=force,
                            asked={"gpu_memory_utilization": gpu_memory_utilization},
                            recorded_with=lambda facts: {"gpu_memory_utilization": COLD_START_GMU})


def with_ratio(facts: dict[str, Any]) -> dict[str, Any]:
    """Engine facts plus `kv_over_estimate`: the KV tokens vLLM reported over lablib's fit estimate of them."""
    return {**facts, "kv_over_estimate": facts["kv_tokens"] / facts["fit_estimate"]["kv_tokens"]}

