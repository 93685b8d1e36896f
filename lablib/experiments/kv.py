"""Lab 03's experiment: KV capacity against `gpu_memory_utilization`, one vLLM engine per value.

vLLM takes the given fraction of the GPU, loads the weights, profiles one step and gives
the KV cache the rest; each value needs its own engine, and every engine runs in its own
worker, so after it closes the GPU must be back at its baseline.

`KVLab` holds the notebook's steps (the arithmetic, the simulators, the engines) as one object's methods, each
keeping what it made, and `checks` is the notebook's Checks cell on that object.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

from ..config import lab_id, VLLMConfig
from ..engines.vllm import VLLMEngine
from ..hardware.device import device_facts
from ..hardware.fit import check_fit
from ..mechanisms import (
    FragmentationReport,
    kv_bytes_per_token,
    kv_cache_bytes,
    replay_block_allocation,
    simulate_fragmentation,
)
from ..mechanisms.paging import AllocatorSnapshot
from ..models import ModelSpec, resolve_model
from ..results.record import Result
from ..results.store import ResultStore
from ..results.reference import recorded_rows, reference_facts
from ..session import Checks, LabSteps, live_label, live_or_recorded, Shown
from ..workloads import Workload, load_workload
from .sweeps import config_sweep


def gpu_memory_utilization_sweep(values: list[float], model: str | ModelSpec = "embedded", workload: str = "journey",
                                 enforce_eager: bool = True, store: ResultStore | None = None,
                                 lab: str = lab_id("03"), on_row: Callable[[dict[str, Any]], None] | None = None
                                 ) -> tuple[list[dict[str, Any]], list[Result]]:
    """Start one vLLM engine per value, run the workload, record KV capacity, throughput and VRAM after close."""
    configs = [VLLMConfig(gpu_memory_utilization=g, enforce_eager=enforce_eager) for g in values]  # validate all first
    return config_sweep(configs, model, workload, lambda c: f"vllm-gmu-{c.gpu_memory_utilization}", store, lab,
                        on_row=on_row)


GMU_VALUES = (0.1, 0.3, 0.5)  # the sweep on the H200 (and its recording)


def gmu_values(total_bytes: int | None = None, top: float = 0.5) -> list[float]:
    """The sweep's gpu_memory_utilization values for this GPU (`total_bytes`: its memory; None: NVML's answer).

    GMU_VALUES where the smallest holds the embedded engine (`check_fit`: the weights, the allowance for
    activations and CUDA graphs, one full-length sequence of KV); on a smaller GPU (a T4's 15 GiB x 0.1 holds no
    engine) the smallest multiple of 0.05 that does, then halfway, then `top`. No GPU: GMU_VALUES."""
    if total_bytes is None:
        sizes = device_facts().get("gpu_memory_bytes") or []
        if not sizes:
            return list(GMU_VALUES)
        total_bytes = int(sizes[0])
    spec = resolve_model("embedded")
    fits = [g / 100 for g in range(5, int(top * 100) + 1, 5)
            if check_fit(spec, VLLMConfig(gpu_memory_utilization=g / 100), total_bytes).fits]
    if not fits:
        raise ValueError(f"gmu_values: no gpu_memory_utilization up to {top} holds the embedded engine on "
                         f"{total_bytes / 2**30:.1f} GiB. Fix: a GPU with more memory; the lab shows the H200's sweep.")
    if fits[0] <= GMU_VALUES[0]:
        return list(GMU_VALUES)
    low = fits[0]
    return sorted({low, round(round((low + top) / 2 / 0.05) * 0.05, 2), top})


def gpu_memory_utilization_rows(values: list[float] = GMU_VALUES, force: bool | None = None,
                                **kw: Any) -> Shown[list[dict[str, Any]]]:
    """Live sweep rows on a GPU with vLLM; otherwise the sweep recorded on the H200, every value (labelled)."""
    [VLLMConfig(gpu_memory_utilization=g) for g in values]  # refuse a bad value before anything starts
    model = kw.get("model", "embedded")
    return live_or_recorded(lambda: [{**r, "provenance": live_label()}
                                     for r in gpu_memory_utilization_sweep(list(values), **kw)[0]],
                            lambda: recorded_rows("sweep", "sweep"), force=force,
                            asked={"gpu_memory_utilization": list(values),
                                   "model": model if isinstance(model, str) else model.name},
                            # scripts/record_reference.py's sweep step runs the sweep's own default model
                            where={"model": lambda rows: "embedded"})


COLD_START_GMU = 0.3  # the cold start's gpu_memory_utilization, here and in scripts/record_reference.py's smoke step


def cold_start(gpu_memory_utilization: float = COLD_START_GMU, force: bool | None = None) -> Shown[dict[str, Any]]:
    """One vLLM engine on the embedded model: the KV capacity it reports next to lablib's fit estimate.

    Live: the engine's own facts (KV blocks and tokens, block size, attention backend, the fit
    estimate made before it started). Recorded: the same facts from the H200's first engine.
    Either way `kv_over_estimate` is vLLM's KV tokens over the estimate's (1.0 = the arithmetic was exact).
    """
    config = VLLMConfig(gpu_memory_utilization=gpu_memory_utilization)

    def live() -> dict[str, Any]:
        with VLLMEngine("embedded", config) as eng:
            eng.start()
        return with_ratio(dict(eng.facts))  # close() adds the VRAM-after-close facts to the same dict

    return live_or_recorded(live, lambda: with_ratio(dict(reference_facts()["cold_start"])), force=force,
                            asked={"gpu_memory_utilization": gpu_memory_utilization},
                            where={"gpu_memory_utilization": lambda facts: COLD_START_GMU})


def with_ratio(facts: dict[str, Any]) -> dict[str, Any]:
    """Engine facts plus `kv_over_estimate`: the KV tokens vLLM reported over lablib's fit estimate of them."""
    return {**facts, "kv_over_estimate": facts["kv_tokens"] / facts["fit_estimate"]["kv_tokens"]}


class KVLab(LabSteps):
    """Lab 03 as one object: each step of the notebook is one method, and what it made stays on the object (None until
    the step ran); the figures (`lablib.plots`) read those values and the Checks cell takes the object (`checks`)."""

    STEPS = {"llama8b": "arithmetic", "start": "cold_start", "report": "fragmentation", "snaps": "block_table",
             "sweep": "gmu_sweep"}

    def __init__(self, workload: str = "journey", store: ResultStore | None = None) -> None:
        self.workload: Workload = load_workload(workload)  # the real lengths the simulators are fed
        self.store = store if store is not None else ResultStore.for_lab(lab_id("03"))  # every live run lands here
        self.llama8b: int | None = None  # `arithmetic`: Llama-3.1-8B's KV bytes per token
        self.start: Shown | None = None  # `cold_start`: vLLM's KV capacity beside the fit estimate
        self.report: FragmentationReport | None = None  # `fragmentation`: contiguous reservation against paging
        self.snaps: list[AllocatorSnapshot] | None = None  # `block_table`: the pool after every step
        self.num_blocks: int | None = None  # `block_table`: the pool's size
        self.sweep: Shown | None = None  # `gmu_sweep`: one engine per gpu_memory_utilization

    def arithmetic(self) -> None:
        """Llama-3.1-8B's KV per token and for 8 sequences of 8k tokens (`mechanisms.kv_bytes_per_token`)."""
        self.llama8b = kv_bytes_per_token(32, 8, 128, "bfloat16")
        print(f"Llama-3.1-8B: {self.llama8b / 1024:.0f} KiB per token, "
              f"{kv_cache_bytes(32, 8, 128, 2, 8192, 8) / 2**30:.1f} GiB for 8 × 8k tokens")

    def cold_start(self) -> None:
        """vLLM's reported KV tokens against lablib's fit estimate, live or recorded (`cold_start`)."""
        self.start = cold_start()
        print(self.start.line("estimated {fit_estimate[kv_tokens]:,} KV tokens, vLLM reported {kv_tokens:,} "
                              "({kv_over_estimate:.3f}x); blocks of {block_size} tokens, backend {attention_backend}"))

    def fragmentation(self, budget_tokens: int = 65536, block_size: int = 16,
                      max_model_len: int = 2048) -> FragmentationReport:
        """The workload's lengths reserved contiguously against paged (`mechanisms.simulate_fragmentation`)."""
        self.report = simulate_fragmentation(self.workload.lengths, budget_tokens=budget_tokens, block_size=block_size,
                                             max_model_len=max_model_len)
        return self.report

    def fragmentation_table(self) -> Any:
        """`fragmentation`'s two policies as a table."""
        import pandas as pd  # deferred: pandas only where a table is shown

        return pd.DataFrame(self.ran("report").rows())

    def block_table(self, requests: int = 12, num_blocks: int = 160, block_size: int = 16,
                    max_num_seqs: int = 6) -> None:
        """The first `requests` through a pool of `num_blocks` (`mechanisms.replay_block_allocation`)."""
        self.num_blocks = num_blocks
        self.snaps = replay_block_allocation(self.workload.lengths[:requests], num_blocks=num_blocks,
                                             block_size=block_size, max_num_seqs=max_num_seqs)

    def snapshot(self, numerator: int, denominator: int) -> AllocatorSnapshot:
        """The pool `numerator`/`denominator` of the way through `block_table`'s replay."""
        snaps = self.ran("snaps")
        return snaps[numerator * len(snaps) // denominator]

    def gmu_sweep(self, values: list[float] | None = None, chart: Any = None) -> Shown:
        """One vLLM engine per gpu_memory_utilization, live or recorded (`gpu_memory_utilization_rows`); with a
        `chart` (a `widgets.VRAMChart`) the GPU's memory is followed while it runs, a mark where each engine closed.
        `values` None: `gmu_values()`, the ones this GPU holds (0.1, 0.3, 0.5 on the H200)."""
        values = gmu_values() if values is None else values
        mark = None if chart is None else (lambda r: chart.mark(f"gmu={r['gpu_memory_utilization']} closed"))
        with chart if chart is not None else contextlib.nullcontext():
            self.sweep = gpu_memory_utilization_rows(list(values), store=self.store, on_row=mark)
        return self.sweep

    def summary(self) -> None:
        """The fragmentation simulator's figures, from this run."""
        report = self.ran("report")
        print(f"simulated here: contiguous wastes {report.contiguous.waste_fraction:.0%} and fits "
              f"{report.contiguous.max_concurrent} requests; paged wastes {report.paged.waste_fraction:.1%} and fits "
              f"{report.paged.max_concurrent}")


def checks(lab: KVLab) -> None:
    """Lab 03's Checks cell: the arithmetic's and the simulators' claims asserted on this run, vLLM's when measured
    live. Prints what ran and what did not (and returns nothing, so the cell shows it once)."""
    lab.require_all()
    llama8b, report, snaps, rows, start = lab.llama8b, lab.report, lab.snaps, lab.sweep, lab.start
    c = Checks(lab_id("03"))
    c.that("Llama-3.1-8B: 128 KiB of KV per token", llama8b == 131072, llama8b)
    c.that("contiguous reservation wastes over half; paging under 4%",
           report.contiguous.waste_fraction > 0.5 and report.paged.waste_fraction < 0.04)
    c.that("paging fits over twice as many requests",
           report.paged.max_concurrent > 2 * report.contiguous.max_concurrent)
    c.that("every block is free or in exactly one block table",
           all(s.free_blocks + sum(len(t) for t in s.block_tables.values()) == lab.num_blocks for s in snaps))
    c.live(rows, "VRAM back to baseline after every engine", lambda rs: all(r["back_to_baseline"] for r in rs))
    c.live(rows, "KV capacity grows with gpu_memory_utilization",
           lambda rs: all(a["kv_tokens"] < b["kv_tokens"] for a, b in zip(rs, rs[1:])))
    c.live(start, "vLLM's KV tokens within 10% of lablib's estimate", lambda s: 0.9 < s["kv_over_estimate"] < 1.1,
           lambda s: s["kv_over_estimate"])
    c.done()
