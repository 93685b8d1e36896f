"""Lab 10 as one object: the whole road run and read, and the goals the advisor was asked about.

A notebook cell calls one step (`lab.run(...)`, `lab.side_roads()`, `lab.advise(goal)`): the step keeps what it
made on the object (`lab.results`, `lab.shown`, `lab.goals`, ...) and returns the table to show, so the figure, the
report and the Checks cell (`checks.checks(lab)`) read the same object instead of the notebook's variables.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...config import BenchConfig, lab_id
from ...results.compare import table
from ...results.record import Result
from ...results.reference import recorded_facts
from ...results.store import ResultStore, results_dir
from ...session import frame, LabSteps, live_or_recorded, mode
from .. import journey
from . import check, load, plan
from .record import GOALS

ROAD_COLUMNS = ["step", "provenance", "output_tok_s", "ttft_p50_s", "tpot_p50_s"]
SIDE_ROAD_COLUMNS = ["rung", "baseline", "lab", "where", "model", "workload", "tok_s_ratio", "ttft_speedup",
                     "tpot_speedup", "tokens_per_forward", "journey_gain"]



class JourneyLab(LabSteps):
    """Lab 10's measurements: the road (None until `run`) and every goal advised (in the order asked)."""

    CALL = "(...)"
    STEPS = {"results": "run", "shown": "run", "checked": "check_advice"}

    def __init__(self, max_new_tokens: int = 32, store: ResultStore | None = None) -> None:
        self.bench = BenchConfig(max_new_tokens=max_new_tokens, progress=False)
        self.store = store if store is not None else ResultStore.for_lab(lab_id("10"))  # every run lands here
        self.banner: str = mode()["banner"]  # live or recorded, and why
        self.requests: int | None = None  # `run`: the journey requests each rung served
        self.batch_sizes: list[int] | None = None  # `run`: the batch sizes that name the HF rungs
        self.results: list[Result] | None = None  # `run`: the rungs run on this machine now
        self.skipped: list[dict[str, str]] | None = None  # `run`: the rungs this machine skipped, and why
        self.shown: list[Result] | None = None  # `run`: the whole road, run here or recorded (`journey.road`)
        self.goals: list[plan.Goal] = []  # `advise`: every goal advised
        self.loads: dict[plan.Goal, dict[str, Any]] = {}  # `under_load`: each goal's predicted percentiles
        self.checked: Any = None  # `check_advice`: the advice run under its load (a Shown: live, or recorded)
        self.compared: dict[str, Any] = {}  # `check_advice`: each goal measured against the model's prediction

    def run(self, requests: int = 8, batch_sizes: list[int] = (1, 8), cpu_threads: int | None = 1) -> Any:
        """Every rung of every lab on the same `requests` journey requests (`journey.run_journey`), then the road
        with the recorded rungs (`journey.road`); returns the road's table."""
        self.requests, self.batch_sizes = requests, list(batch_sizes)
        self.results, self.skipped = journey.run_journey(requests=requests, batch_sizes=self.batch_sizes,
                                                         bench=self.bench, store=self.store, lab=lab_id("10"),
                                                         cpu_threads=cpu_threads)
        self.shown = journey.road(self.results, self.batch_sizes)
        return frame(table(self.shown), ROAD_COLUMNS)

    def side_roads(self) -> Any:
        """Each rung against the rung it changes, on the same requests and machine (`journey.side_roads`)."""
        return frame(journey.side_roads(self.ran("shown"), self.batch_sizes), SIDE_ROAD_COLUMNS)

    @property
    def report_path(self) -> Path:
        """Where the road's one-page report goes: beside this lab's results."""
        return results_dir() / f"{lab_id('10')}.html"

    def advise(self, goal: plan.Goal) -> Any:
        """The advisor's settings for `goal` (`plan.advise`), kept among `goals` for the summary and the checks."""
        rows = plan.advise(goal)
        if goal not in self.goals:
            self.goals.append(goal)
        return frame(rows)

    def under_load(self, goal: plan.Goal) -> Any:
        """The advice for `goal` under its own Poisson arrivals, predicted (`load.under_load`, a model): TTFT, TPOT
        and ITL at p50/p90/p99 (ms); prints the rate, TPOT decoding alone and the goodput against the target."""
        u = self.loads[goal] = load.under_load(goal)
        target = f"; {u['goodput']['verdict']}" if "goodput" in u else ""
        print(f"Poisson at {u['rate_rps']:.1f} req/s ({goal.concurrency} in flight on average): TPOT p90 "
              f"{u['tpot_ms']['p90']:.2f} ms against {u['steady_tpot_ms']:.2f} decoding alone{target} "
              "[predicted: lab 04's simulator, priced by lab 09's cost model and the H200's recorded runs]")
        return frame([{"figure": f.upper(), **u[f"{f}_ms"]} for f in check.FIGURES])

    def check_advice(self, name: str = "chat-shared-prefix") -> Any:
        """One of `record.GOALS` advised, then served on this GPU under its arrivals (`check.check`: a synthetic
        checkpoint's server, minutes); without a GPU, the H200's recording of all three. Each measurement is set
        against what the model predicts now for the same engine, rate and requests (`check.compared`)."""
        goal = GOALS[name]
        self.checked = live_or_recorded(lambda: {name: check.check(goal, store=self.store)},
                                        lambda: recorded_facts("advisor_check", "advisor-check")["goals"])
        got = self.checked.value
        if got is None:
            print(self.checked.label)
            return None
        self.compared = {n: check.compared(GOALS[n], g) for n, g in got.items() if n in GOALS and "measured" in g}
        lines = []
        for n, g in got.items():
            if n not in self.compared:
                lines.append(f"{n}: {g.get('error', 'not measured')}")
                continue
            c = self.compared[n]
            lines.append(f"{n} (max_num_seqs {g['advice']['max_num_seqs']}, {g['advice']['scheme']}, "
                         f"{g['rate_rps']:.2f} req/s): {c['target']}; measured: "
                         f"{(c['goodput'] or {}).get('verdict', '')}"
                         + "".join(f"\n  why: {w}" for w in c["why"]))
        when = self.checked.label
        if not self.checked.live:  # the step's own date, not the span of every recording
            rec = recorded_facts("advisor_check", "advisor-check")
            when = f"recorded on {rec.get('gpu')}, {rec.get('date')}"
        print("\n".join(lines) + f"\n[measured: {when}; predicted: this model, for the engine and arrivals served]")
        return frame([{"goal": n, **r} for n, c in self.compared.items() for r in c["rows"]])

    def advice_lines(self) -> str:
        """One sentence per goal advised (`plan.lines`)."""
        return "\n".join(plan.lines(self.goals))

    def missing(self) -> list[str]:
        """The steps the Checks cell needs that have not run yet: `run`, `check_advice`, and `advise` and
        `under_load` until a goal went through each."""
        return sorted(super().missing() + ([] if self.goals else ["advise"]) + ([] if self.loads else ["under_load"]))
