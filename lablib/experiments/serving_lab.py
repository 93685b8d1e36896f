"""Lab 05 as one object: each step of the notebook is one method, and what it made stays on the object.

A cell calls one step (`lab.rate_sweep(...)`, `lab.referee()`, `lab.client_ceiling()`): the step runs `serving` (the
server's load tests, live or recorded) or `bench.client` (this machine's client ceiling), keeps the value (`lab.online`,
`lab.verdict`, `lab.ceiling`) and returns what the cell shows; the figures (`lablib.plots.serving`) read those values,
and the Checks cell takes the whole object (`checks(lab)`). A cell run before the step it reads says which step to run.
"""
from __future__ import annotations

from typing import Any

from ..bench.client import client_ceiling
from ..config import lab_id
from ..results.record import Result
from ..results.store import ResultStore
from ..session import Checks, LabSteps, live_label
from . import serving

LOAD_COLUMNS = ["step", "requests", "output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p99_s"]


class ServingLab(LabSteps):
    """Lab 05's measurements, one attribute per step, filled in as the notebook runs them (None until then)."""

    STEPS = {"online": "rate_sweep", "served": "rate_sweep", "verdict": "referee", "ceiling": "client_ceiling"}

    def __init__(self, store: ResultStore | None = None) -> None:
        self.store = store if store is not None else ResultStore.for_lab(lab_id("05"))  # every live load test
        self.gauges: Any = None  # the notebook's live /metrics figure (plots.serving.LiveServerMetrics), if any
        self.online: Any = None  # `rate_sweep`: the Shown of the whole sweep (capacity, load tests, referee)
        self.served: Any = None  # `rate_sweep`: its load tests (a Shown of Results)
        self.verdict: Any = None  # `referee`: did the lab's client keep up with the server
        self.ceiling: dict[str, Any] | None = None  # `client_ceiling`: this machine's client, measured here

    def rate_sweep(self, model: str = "embedded", repeat: int = 4, **kw: Any) -> list[Result]:
        """The server under Poisson load (`serving.rate_sweep_or_recorded`), feeding `self.gauges` while it runs:
        prints the capacity line, returns the load tests (what the figures read)."""
        if self.gauges is not None:
            kw = {"on_metrics": self.gauges.update, "on_result": self.gauges.flush, **kw}
        self.online = serving.rate_sweep_or_recorded(model, repeat=repeat, store=self.store, **kw)
        self.served = serving.results_of(self.online)
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
        """Did the lab's client keep up (`serving.client_verdict`, printed), and the burst's lab / `vllm bench
        serve` figures, one row each (returned)."""
        self.verdict = serving.client_verdict(self.ran("online"))
        print(self.verdict.line("{verdict}"))
        return serving.compare_rows(self.online).table()

    def agreements(self) -> Any:
        """Every lab-vs-vLLM comparison recorded on the H200 (`serving.recorded_agreements`)."""
        return serving.recorded_agreements().table()

    def burst(self) -> list[Result]:
        """The load test that sent everything at once, for the token-gap figure."""
        return [serving.burst(self.results())]

    def client_ceiling(self) -> None:
        """This machine's client ceiling (`bench.client.client_ceiling`), live everywhere, beside the burst above."""
        self.ceiling = client_ceiling()
        c = self.ceiling
        print(f"this machine's client ({c['library']}): {c['cpu_us_per_event']:.1f} us of CPU per token event, at most "
              f"{c['ceiling_events_s']:,.0f} events/s on one core [{live_label()}]")
        print(self.ran("online").line("the burst above streamed {burst_output_tok_s:,.0f} output tokens/s"))


def checks(lab: ServingLab) -> None:
    """Lab 05's Checks cell: the client's ceiling measured here; where the server ran live, more load more queueing,
    every request back, the client kept up, and the lab's client agreeing with `vllm bench serve`."""
    lab.require_all()
    online, verdict, ceiling = lab.online, lab.verdict, lab.ceiling
    c = Checks(lab_id("05"))
    c.that("the client's ceiling was measured on this machine",
           ceiling["cpu_us_per_event"] > 0 and ceiling["ceiling_events_s"] > 0, ceiling["library"])
    c.live(online, "more load, more queueing: median TTFT at the highest rate over 2x the lowest", serving.ttft_grows)
    c.live(online, "every request of every load test came back",
           lambda v: all(len(r.requests) == 256 and not r.notes for r in v["results"]))
    c.live(verdict, "the lab's client measured the server, not itself", lambda v: v["kept_up"] is not False,
           lambda v: v["verdict"])
    # one burst each: within what single bursts scatter on the embedded model; repeated rounds agree (tests/results)
    c.live(online, "lab / vllm bench serve output tok/s within 0.8-1.25",
           lambda v: 0.8 < v["compare"]["figures"]["output_tok_s"]["ratio"] < 1.25,
           lambda v: v["compare"]["figures"]["output_tok_s"])
    c.done()
