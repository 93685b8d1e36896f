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
from ...results.store import ResultStore, results_dir
from ...session import frame, LabSteps, mode
from .. import journey
from . import plan

ROAD_COLUMNS = ["step", "provenance", "output_tok_s", "ttft_p50_s", "tpot_p50_s"]
SIDE_ROAD_COLUMNS = ["rung", "baseline", "lab", "where", "model", "workload", "tok_s_ratio", "ttft_speedup",
                     "tpot_speedup", "tokens_per_forward", "journey_gain"]



class JourneyLab(LabSteps):
    """Lab 10's measurements: the road (None until `run`) and every goal advised (in the order asked)."""

    CALL = "(...)"
    STEPS = {"results": "run", "shown": "run"}

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

    def advice_lines(self) -> str:
        """One sentence per goal advised (`plan.lines`)."""
        return "\n".join(plan.lines(self.goals))

    def missing(self) -> list[str]:
        """The steps the Checks cell needs that have not run yet: `run`, and `advise` until a goal was advised."""
        return sorted(super().missing() + ([] if self.goals else ["advise"]))
