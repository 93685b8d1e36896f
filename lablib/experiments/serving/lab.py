"""Lab 05 as one object: each step of the notebook is one method, and what it made stays on the object.

A cell calls one step (`lab.rate_sweep(...)`, `lab.referee()`, `lab.client_ceiling()`): the step runs `runs` (the
server's load tests, live or recorded) or `bench.client` (this machine's client ceiling), keeps the value (`lab.online`,
`lab.verdict`, `lab.ceiling`) and returns what the cell shows; the figures (`lablib.plots.serving`) read those values,
and the Checks cell takes the whole object (`checks.checks(lab)`). A cell run before the step it reads says which step
to run.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ... import validate
from ...bench.client import client_ceiling
from ...config import ServerConfig, lab_id
from ...results.record import Result
from ...results.store import ResultStore
from ...bench.goodput import SLO
from ...results.reference import NotRecorded, recorded_facts
from ...session import LabSteps, frame, live_label, mode
from . import capacity as cap
from . import pareto
from . import runs

LOAD_COLUMNS = ["step", "requests", "output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p99_s"]


class ServingLab(LabSteps):
    """Lab 05's measurements, one attribute per step, filled in as the notebook runs them (None until then)."""

    STEPS = {"online": "rate_sweep", "served": "rate_sweep", "verdict": "referee", "ceiling": "client_ceiling",
             "found": "capacity", "tuned": "pareto"}

    def __init__(self, store: ResultStore | None = None) -> None:
        self.store = store if store is not None else ResultStore.for_lab(lab_id("05"))  # every live load test
        self.gauges: Any = None  # the notebook's live /metrics figure (plots.serving.LiveServerMetrics), if any
        self.online: Any = None  # `rate_sweep`: the Shown of the whole sweep (capacity, load tests, referee)
        self.served: Any = None  # `rate_sweep`: its load tests (a Shown of Results)
        self.verdict: Any = None  # `referee`: did the lab's client keep up with the server
        self.ceiling: dict[str, Any] | None = None  # `client_ceiling`: this machine's client, measured here
        self.found: dict[str, Any] | None = None  # `capacity`: the SLO capacity search (server or simulator)
        self.found_where = ""  # `capacity`: where it ran (this GPU live, or the simulator)
        self.tuned: dict[str, Any] | None = None  # `pareto`: the tuning front's points and front
        self.tuned_where = ""  # `pareto`: where it ran (this GPU live, the H200's recording, or the simulator)

    def rate_sweep(self, model: str = "embedded", repeat: int = 4, **kw: Any) -> list[Result]:
        """The server under Poisson load (`runs.rate_sweep_or_recorded`), feeding `self.gauges` while it runs:
        prints the capacity line, returns the load tests (what the figures read)."""
        if self.gauges is not None:
            kw = {"on_metrics": self.gauges.update, "on_result": self.gauges.flush, **kw}
        self.online = runs.rate_sweep_or_recorded(model, repeat=repeat, store=self.store, **kw)
        self.served = runs.results_of(self.online)
        print(self.online.line("capacity C = {capacity_rps:.1f} requests/s; server start {server[startup_s]:.1f} s; "
                               "model {model_name}"))
        return self.served.value

    def results(self) -> list[Result]:
        """The sweep's load tests, for a figure."""
        return self.ran("served").value

    def load_table(self) -> Any:
        """One row per load test, labelled."""
        return self.ran("served").table(LOAD_COLUMNS)

    def referee(self) -> Any:
        """Did the lab's client keep up (`runs.client_verdict`, printed), and the burst's lab / `vllm bench
        serve` figures, one row each (returned)."""
        self.verdict = runs.client_verdict(self.ran("online"))
        print(self.verdict.line("{verdict}"))
        return runs.compare_rows(self.online).table()

    def agreements(self) -> Any:
        """Every lab-vs-vLLM comparison recorded on the H200 (`runs.recorded_agreements`)."""
        return runs.recorded_agreements().table()

    def burst(self) -> list[Result]:
        """The load test that sent everything at once, for the token-gap figure."""
        return [runs.burst(self.results())]

    def client_ceiling(self) -> None:
        """This machine's client ceiling (`bench.client.client_ceiling`), live everywhere, beside the burst above."""
        self.ceiling = client_ceiling()
        c = self.ceiling
        print(f"this machine's client ({c['library']}): {c['cpu_us_per_event']:.1f} us of CPU per token event, at most "
              f"{c['ceiling_events_s']:,.0f} events/s on one core [{live_label()}]")
        print(self.ran("online").line("the burst above streamed {burst_output_tok_s:,.0f} output tokens/s"))

    def capacity(self, ttft_ms: float | None = 1000.0, tpot_ms: float | None = None, percentile: float = 90.0,
                 low: float | None = None, high: float | None = None, model: str = "embedded", **kw: Any) -> Any:
        """The highest Poisson rate meeting the SLO (`capacity`): on vLLM's server where it runs live here, else on lab
        04's simulator, labelled. Prints the verdict, returns one row per probe."""
        slo = SLO(ttft_ms=ttft_ms, tpot_ms=tpot_ms, percentile=percentile)  # refused here, before any server
        if mode()["live"]:
            self.found = cap.on_server(slo, low, high, model, store=self.store, **kw)
            self.found_where = live_label()
        else:
            self.found = cap.on_simulator(slo, 1.0 if low is None else low, 64.0 if high is None else high, **kw)
            self.found_where = cap.SIMULATOR
        print(f"{self.found['verdict']} [{self.found_where}]")
        return frame(cap.probe_rows(self.found))

    def pareto(self, model: str = "embedded", max_num_seqs: tuple[int, ...] = (256,),
               max_num_batched_tokens: tuple[int, ...] = (2048,), levels: tuple[int, ...] = (1, 4, 16, 64, 256),
               **kw: Any) -> Any:
        """The tuning front (`pareto`): live, one server per setting on this GPU (`pareto.sweep`, bf16; by default
        one server, whose 1 to 256 requests in flight stand for a max_num_seqs of that many: a server capped at N
        runs N at a time whatever the client sends, as the N-in-flight point does); elsewhere
        the H200's recording of the synthetic 8B (bf16 and FP8) where there is one, else lab 04's simulator over the
        same settings, labelled. Prints how many load tests made the front, returns the front's rows."""
        pareto.settings_of(max_num_seqs, max_num_batched_tokens, ("bf16",), "ServingLab.pareto")  # refused here,
        runs.check_levels(levels)  # on any machine, before a server starts
        unknown = sorted(set(kw) - {f.name for f in dataclasses.fields(ServerConfig)} - {"workload", "repeat", "out_dir"})
        if unknown:
            raise validate.refuse("ServingLab.pareto", unknown[0], kw[unknown[0]], "the server's settings "
                                  "(ServerConfig's fields), workload, repeat or out_dir", "check the keyword's spelling.")
        if mode()["live"]:
            self.tuned = pareto.sweep(model, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                      schemes=("bf16",), levels=levels, store=self.store, **kw)
            self.tuned_where = live_label()
        else:
            try:
                self.tuned = recorded_facts("pareto", "pareto")
                self.tuned_where = (f"recorded on the {self.tuned['gpu']}, {self.tuned['date']}, "
                                    f"{self.tuned['model']}")
            except NotRecorded as e:
                self.tuned = pareto.on_simulator(max_num_seqs, max_num_batched_tokens, levels)
                self.tuned_where = f"{cap.SIMULATOR} ({e})"
        print(f"{len(self.tuned['front'])} of {len(self.tuned['points'])} load tests on the front [{self.tuned_where}]")
        return frame([{k: p.get(k) for k in ("scheme", "max_num_seqs", "max_num_batched_tokens", "concurrency",
                                              "tok_s_per_gpu", "tok_s_per_user", "tpot_p50_ms")}
                      for p in self.tuned["front"]])
