"""Lab 10 as one object: the whole road run and read, and the goals the advisor was asked about.

A notebook cell calls one step (`lab.run(...)`, `lab.side_roads()`, `lab.advise(goal)`): the step keeps what it
made on the object (`lab.results`, `lab.shown`, `lab.goals`, ...) and returns the table to show, so the figure, the
report and the Checks cell (`checks.checks(lab)`) read the same object instead of the notebook's variables.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ...config import BenchConfig, lab_id
from ...results.compare import table
from ...results.record import Result
from ...results.reference import recorded_facts
from ...results.store import ResultStore, results_dir
from ...session import frame, LabSteps, live_or_recorded, mode
from ...workloads import load_workload
from .. import journey
from . import check, load, plan, served
from .record import GOALS

ROAD_COLUMNS = ["step", "provenance", "output_tok_s", "ttft_p50_s", "tpot_p50_s"]
SERVED_COLUMNS = ["step", "weights", "rate_rps", "requests", "cached_prefix", "measured_p50_ms", "predicted_p50_ms",
                  "measured_p90_ms", "predicted_p90_ms", "error_p90", "provenance"]
SIDE_ROAD_COLUMNS = ["rung", "baseline", "lab", "where", "model", "workload", "tok_s_ratio", "ttft_speedup",
                     "tpot_speedup", "tokens_per_forward", "journey_gain"]



# The road's size, by the model `run` climbs (`journey.default_model`): on the embedded model (a CPU) 8 requests of 32
# new tokens, HF batches of 1 and 8, the ladder in a minute or two; at real size (a GPU) all 64 journey requests (the
# batch-1 rungs the first 8 of them: `journey.NAIVE_REAL_SIZE`), HF batches of 1 and what the GPU holds
# (`journey.default_batch_sizes`), each output capped at 128 tokens: an 8B's HF rungs decode 128 steps rather than the
# journey's longest, 512 (`lablab` runs them whole)
QUICK = {"requests": 8, "batch_sizes": [1, 8], "max_new_tokens": 32}
REAL_SIZE = {"requests": None, "batch_sizes": None, "max_new_tokens": 128}


class JourneyLab(LabSteps):
    """Lab 10's measurements: the road (None until `run`) and every goal advised (in the order asked)."""

    CALL = "(...)"
    STEPS = {"results": "run", "shown": "run", "checked": "check_advice"}

    def __init__(self, store: ResultStore | None = None) -> None:
        self.bench = BenchConfig(progress=False)  # `run` sets max_new_tokens by the model's size (QUICK, REAL_SIZE)
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
        self.replayed: list[dict[str, Any]] | None = None  # `served`: the model on the H200's recorded servers

    def run(self, cpu_threads: int | None = 1, **size: Any) -> Any:
        """Every rung of every lab on the same journey requests (`journey.run_journey`) on the model this machine
        climbs (`journey.default_model`), then the road with the recorded rungs (`journey.road`); returns the road's
        table. Its size is QUICK on the embedded model and REAL_SIZE otherwise, or `requests` and `max_new_tokens`
        (None: the workload's own) and `batch_sizes` (None: `journey.default_batch_sizes`) as given; printed before the
        first rung."""
        model = journey.default_model()
        unknown = sorted(set(size) - set(QUICK))
        if unknown:
            raise ValueError(f"JourneyLab.run: {unknown[0]}=...: allowed {sorted(QUICK)} (and cpu_threads). Fix: "
                             "e.g. lab.run(requests=8, batch_sizes=[1, 8], max_new_tokens=32).")
        size = {**(REAL_SIZE if journey.is_real_size(model) else QUICK), **size}
        batch_sizes = list(size["batch_sizes"] or journey.default_batch_sizes(model))
        requests = size["requests"] or len(load_workload("journey"))
        bench = replace(self.bench, max_new_tokens=size["max_new_tokens"],
                        tags={**self.bench.tags, "max_new_tokens": size["max_new_tokens"]})
        outputs = (f"each output capped at {size['max_new_tokens']} tokens" if size["max_new_tokens"] else
                   "the journey's own output lengths")
        print(f"{model}: {requests} journey requests, HF batch sizes {batch_sizes}, {outputs}")
        results, skipped = journey.run_journey(model, requests=requests, batch_sizes=batch_sizes, bench=bench,
                                               store=self.store, lab=lab_id("10"), cpu_threads=cpu_threads)
        self.requests, self.batch_sizes, self.bench = requests, batch_sizes, bench  # (kept once the road ran)
        self.results, self.skipped = results, skipped
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

    def served(self) -> Any:
        """The latency model replayed on every server the H200 recorded under load (`served.replay_all`): TPOT
        p50/p90 predicted against measured, per run; prints how often p90 was within the aim and the largest miss."""
        self.replayed = served.replay_all()
        print(served.summary_line(self.replayed))
        return frame(self.replayed, SERVED_COLUMNS)

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
