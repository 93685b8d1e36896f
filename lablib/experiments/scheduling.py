"""Lab 04's experiments: vLLM against HF static batching on the journey, and vLLM's scheduler knobs.

`journey_comparison` runs the whole journey through HF static batching (one batch of 64) and
through vLLM, on the embedded model when this machine can run vLLM, else shows the H200's
recording of the same pair on the 8B-shaped synthetic model.

The knobs (`max_num_seqs`, `max_num_batched_tokens`) are fixed when an engine starts, so each
point is one engine, started in its own worker and closed before the next; each row carries KV
capacity, throughput, tail TTFT and whether the GPU returned to its baseline.

`SchedulingLab` holds the notebook's steps as one object's methods, each keeping what it made, and `checks` is the
notebook's Checks cell on that object.
"""
from __future__ import annotations

from typing import Any

from ..bench.offline import run
from ..config import BenchConfig, HFConfig, lab_id, VLLMConfig
from ..engines.hf import HFEngine
from ..engines.vllm import VLLMEngine
from ..mechanisms import continuous_batching, static_batching
from ..mechanisms.batching import ScheduleResult
from ..models import ModelSpec
from ..results.record import Result
from ..results.store import ResultStore
from ..results.reference import load_reference, recorded_rows
from ..session import Checks, frame, LabSteps, live_label, live_or_recorded, Shown
from ..workloads import Workload, load_workload
from .sweeps import config_sweep


def scheduler_sweep(max_num_seqs: list[int] = (8, 32, 128, 256), max_num_batched_tokens: list[int | None] = (None,),
                    model: str | ModelSpec = "embedded", workload: str = "journey", store: ResultStore | None = None,
                    lab: str = lab_id("04"), **engine: Any) -> tuple[list[dict[str, Any]], list[Result]]:
    """vLLM's scheduler knobs: one engine per (max_num_seqs, max_num_batched_tokens) pair."""
    configs = [VLLMConfig(max_num_seqs=n, max_num_batched_tokens=b, **engine)
               for n in max_num_seqs for b in max_num_batched_tokens]
    return config_sweep(configs, model, workload,
                        lambda c: f"vllm-seqs{c.max_num_seqs}-tok{c.max_num_batched_tokens}", store, lab)


def scheduler_rows(max_num_seqs: list[int] = (8, 64), max_num_batched_tokens: list[int | None] = (None,),
                   force: bool | None = None, **kw: Any) -> Shown[list[dict[str, Any]]]:
    """Live scheduler-sweep rows on a GPU with vLLM; otherwise the synthetic-8B sweep recorded on the H200, whole."""
    [VLLMConfig(max_num_seqs=n, max_num_batched_tokens=b) for n in max_num_seqs for b in max_num_batched_tokens]  # refuse first
    model = kw.get("model", "embedded")
    return live_or_recorded(lambda: [{**r, "provenance": live_label()} for r in
                                     scheduler_sweep(list(max_num_seqs), list(max_num_batched_tokens), **kw)[0]],
                            lambda: recorded_rows("scheduler_sweep", "knobs"), force=force,
                            asked={"(max_num_seqs, max_num_batched_tokens)":
                                   [[n, b] for n in max_num_seqs for b in max_num_batched_tokens],
                                   "model": model if isinstance(model, str) else model.name},
                            where={"(max_num_seqs, max_num_batched_tokens)": ("max_num_seqs", "max_num_batched_tokens")})


def more_seqs_help(rows: list[dict[str, Any]]) -> bool:
    """The knob sweep's claim: the most running sequences beat the fewest on throughput and on p99 TTFT."""
    few, many = min(rows, key=lambda r: r["max_num_seqs"]), max(rows, key=lambda r: r["max_num_seqs"])
    return many["output_tok_s"] > few["output_tok_s"] and many["ttft_p99_s"] < few["ttft_p99_s"]


def pair(hf: Result, vllm: Result) -> dict[str, Any]:
    """The two journey runs and vLLM's output tok/s over HF static batching's."""
    return {"hf": hf, "vllm": vllm, "hf_tok_s": hf.summary["output_tok_s"], "vllm_tok_s": vllm.summary["output_tok_s"],
            "ratio": vllm.summary["output_tok_s"] / hf.summary["output_tok_s"], "model": vllm.model.get("name")}


def journey_comparison(workload: str = "journey", *, gpu_memory_utilization: float = 0.3, hf_batch: int = 64,
                       store: ResultStore | None = None, lab: str = lab_id("04"),
                       force: bool | None = None) -> Shown[dict[str, Any]]:
    """HF static batching (one batch of `hf_batch`) against vLLM on the whole journey, same requests, same model.

    Live (a GPU with vLLM): both on the embedded model, full output lengths, steps
    'vllm-embedded-journey' and 'hf-static-b64-embedded-journey' (the names the packing script
    collects). Recorded: 'vllm-8b-journey' and 'hf-static-b64-8b-journey' from the H200, on the
    8B-shaped synthetic model. The value: {"hf", "vllm" (Results), "hf_tok_s", "vllm_tok_s", "ratio", "model"}.
    """
    vllm_config, hf_config = VLLMConfig(gpu_memory_utilization=gpu_memory_utilization), HFConfig("static", hf_batch)

    def live() -> dict[str, Any]:
        wl, bench = load_workload(workload), BenchConfig(progress=False)
        with VLLMEngine("embedded", vllm_config) as eng:
            vllm = run(eng, wl, bench, lab=lab, step=f"vllm-embedded-{workload}", store=store)
        hf_engine = HFEngine("embedded", hf_config)
        try:
            hf = run(hf_engine, wl, bench, lab=lab, step=f"hf-static-b{hf_batch}-embedded-{workload}", store=store)
        finally:
            hf_engine.close()
        return pair(hf, vllm)

    def recorded() -> dict[str, Any]:
        vllm, hf = load_reference("vllm-8b-journey", "hf-static-b64-8b-journey")
        return pair(hf, vllm)

    return live_or_recorded(live, recorded, force=force,
                            asked={"model": "embedded", "workload": workload, "hf_batch": hf_batch,
                                   "gpu_memory_utilization": gpu_memory_utilization},
                            where={"workload": "vllm.workload.name", "hf_batch": "hf.config.batch_size",
                                   "gpu_memory_utilization": "vllm.config.gpu_memory_utilization"})


def batch_starts(result: Result) -> int:
    """How many distinct start times a real run's requests have: the batches of a static run, counted over the requests
    a Gantt chart draws (those with a first token and an end, `plots.scheduling.result_gantt_rows`)."""
    drawn = [q for q in result.requests
             if q.first_token is not None and (q.finished if q.finished is not None else q.last_token) is not None]
    return len({q.start if q.start is not None else q.arrival for q in drawn})



class SchedulingLab(LabSteps):
    """Lab 04 as one object: each step of the notebook is one method, and what it made stays on the object (None until
    the step ran); the figures (`lablib.plots`) read those values and the Checks cell takes the object (`checks`)."""

    STEPS = {"static": "simulate", "hf_live": "hf_static", "seqs": "seq_sweep", "race": "journey_race",
             "knobs": "scheduler_knobs", "continuous": "simulate"}
    OPTIONAL = frozenset({"continuous"})

    def __init__(self, workload: str = "journey", store: ResultStore | None = None) -> None:
        self.workload: Workload = load_workload(workload)  # the requests every step schedules
        self.store = store if store is not None else ResultStore.for_lab(lab_id("04"))  # every live run lands here
        self.static: ScheduleResult | None = None  # `simulate`: static batching of the first requests
        self.continuous: ScheduleResult | None = None  # `simulate`: continuous batching of the same
        self.hf_live: Result | None = None  # `hf_static`: HF static batching on the embedded model, live here
        self.hf_label: str | None = None  # `hf_static`: where it ran
        self.race: Shown | None = None  # `journey_race`: HF static b=64 against vLLM on the whole journey
        self.seqs: dict[str, ScheduleResult] | None = None  # `seq_sweep`: the simulator per max_num_seqs
        self.budget: dict[str, ScheduleResult] | None = None  # `budget_sweep`: per step-token budget
        self.knobs: Shown | None = None  # `scheduler_knobs`: vLLM per max_num_seqs

    def simulate(self, requests: int = 24, slots: int = 8) -> None:
        """The first `requests` of the workload through the simulator, static then continuous, `slots` at a time."""
        lengths = self.workload.lengths[:requests]
        self.static = static_batching(lengths, batch_size=slots)
        self.continuous = continuous_batching(lengths, max_num_seqs=slots)

    def simulated_table(self) -> Any:
        """Both schedules' summaries side by side."""
        both = (self.ran("static"), self.ran("continuous"))
        return frame([{"policy": s.policy, **vars(s.summary)} for s in both])

    def hf_static(self, requests: int = 24, batch_size: int = 8, max_new_tokens: int = 48) -> Result:
        """HF static batching of the first `requests`, `batch_size` per batch, on the embedded model, live here."""
        engine = HFEngine("embedded", HFConfig("static", batch_size))
        try:
            self.hf_live = run(engine, self.workload.head(requests),
                               BenchConfig(max_new_tokens=max_new_tokens, progress=False), lab=lab_id("04"),
                               store=self.store)
        finally:
            engine.close()
        self.hf_label = live_label()
        return self.hf_live

    def journey_race(self) -> Shown:
        """HF static batching against vLLM on the whole journey, live or recorded (`journey_comparison`)."""
        self.race = journey_comparison(store=self.store)
        return self.race

    def ratio(self) -> None:
        """vLLM's output tok/s over HF static batching's, labelled."""
        print(self.ran("race").line(
            "vLLM / HF static b=64: {ratio:.1f}x output tok/s ({vllm_tok_s:,.0f} vs {hf_tok_s:,.0f}; model {model})"))

    def seq_sweep(self, max_num_seqs: tuple[int, ...] = (1, 4, 16, 64)) -> dict[str, ScheduleResult]:
        """The simulator on the whole workload per `max_num_seqs`."""
        self.seqs = {f"max_num_seqs={n}": continuous_batching(self.workload.lengths, max_num_seqs=n)
                     for n in max_num_seqs}
        return self.seqs

    def budget_sweep(self, budgets: tuple[int, ...] = (128, 512, 2048, 8192),
                     max_num_seqs: int = 64) -> dict[str, ScheduleResult]:
        """The simulator on the whole workload per step-token budget (`max_num_batched_tokens`)."""
        self.budget = {f"budget={b}": continuous_batching(self.workload.lengths, max_num_seqs=max_num_seqs,
                                                          max_num_batched_tokens=b) for b in budgets}
        return self.budget

    def scheduler_knobs(self, max_num_seqs: list[int] = (8, 64)) -> Shown:
        """vLLM per `max_num_seqs`, one engine each, live or recorded (`scheduler_rows`)."""
        self.knobs = scheduler_rows(list(max_num_seqs), store=self.store)
        return self.knobs


def checks(lab: SchedulingLab) -> None:
    """Lab 04's Checks cell: the simulator's and HF's claims asserted on this run, vLLM's when measured live. Prints
    what ran and what did not (and returns nothing, so the cell shows it once)."""
    lab.require_all()
    static, continuous, seqs, race, knobs = lab.static, lab.continuous, lab.seqs, lab.race, lab.knobs
    c = Checks(lab_id("04"))
    c.that("simulator: continuous batching finishes the 24 requests sooner",
           continuous.summary.makespan < static.summary.makespan)
    c.that("simulator: continuous batching keeps the slots busier",
           continuous.summary.slot_utilisation > static.summary.slot_utilisation)
    c.that("HF static, 24 requests in batches of 8: three batch starts", batch_starts(lab.hf_live) == 3)
    c.that("simulator: 64 running sequences out-serve 1",
           seqs["max_num_seqs=64"].summary.throughput > seqs["max_num_seqs=1"].summary.throughput)
    c.live(race, "vLLM over 10x HF static b=64 on the journey", lambda v: v["ratio"] > 10,
           lambda v: f"{v['ratio']:.1f}x")
    c.live(knobs, "more running sequences: more throughput and a lower p99 TTFT", more_seqs_help)
    c.live(knobs, "VRAM back to baseline after every engine", lambda rows: all(r["back_to_baseline"] for r in rows))
    c.done()
