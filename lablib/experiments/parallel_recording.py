"""Lab 09's recording steps, for a GPU session (scripts/record_reference.py), and what is recorded yet.

`record` is step tp1 (one H200: TP=1 for TP1_RUNS at TP1_BATCHES, facts["tp1"]); `record_scaling` step tp-scaling
(several H200s of one host, facts["tp_scaling"]): `scaling_grid`, which is TP=1/2/4 for SCALING_RUNS, then at each
GPU count of COMPARED_GPUS vLLM's custom all-reduce against NCCL's (TP=g twice) and pipeline parallelism (PP=g at
TP=1) for COMPARED_RUNS. Both measure run by run (`measure_runs`): a run the machine has too few GPUs for, or one
that fails, is a row that says "not measured" and why, and the facts are kept after every run, so a time limit
later loses nothing made. The facts (`run_facts`) name the GPU, how many a worker could use, and the day.

A live TP=1 run of the lab's own grid is the same measurement: `tp1_baseline` keeps it as facts["tp1"]
(`keeps_as_tp1`, `ResultStore.keep_facts`), as lab 08's live run doubles as its recording.
`remaining_runs` reads each planned run's rows in the recordings and says what is recorded and what remains.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..hardware.device import device_facts
from ..results.record import Result
from ..results.store import ResultStore
from .parallel_runs import LAB, OUTPUT_LEN, PROMPT_LEN, Run, _gpus_here, _too_few, measure, not_measured

TP1 = "tp1"  # step and facts key of the one-GPU baseline
SCALING, SCALING_STEP = "tp_scaling", "tp-scaling"  # facts key and step of the multi-GPU runs
TP1_RUNS = (("llama-3.1-8b", "bf16"), ("llama-3.1-70b", "fp8"))  # the baseline: what one H200 can hold
TP1_BATCHES = (1, 8, 64)
SCALING_RUNS = (("llama-3.1-8b", "bf16", (1, 2, 4)), ("llama-3.1-70b", "bf16", (2, 4)),
                ("llama-3.1-70b", "fp8", (1, 2, 4)))  # what the multi-GPU machines are for
SCALING_BATCHES = (1, 64)
COMPARED_RUNS = (("llama-3.1-8b", "bf16"), ("llama-3.1-70b", "fp8"))  # all-reduce kernels and PP, at the same GPUs
COMPARED_GPUS = (2, 4)

OnRun = Callable[[list[dict[str, Any]], list[Result], list[Result]], None]


def tp1_grid(runs: Sequence[tuple[str, str]] = TP1_RUNS) -> list[Run]:
    return [Run(m, s) for m, s in runs]


def scaling_grid(runs: Sequence[tuple[str, str, Sequence[int]]] = SCALING_RUNS,
                 compared: Sequence[tuple[str, str]] = COMPARED_RUNS,
                 gpu_counts: Sequence[int] = COMPARED_GPUS) -> list[Run]:
    """The multi-GPU runs: TP=t for each (model, scheme, ts); then, per (model, scheme) of `compared` and GPU count
    g, TP=g on NCCL's all-reduce (against the TP=g on vLLM's of the first part) and PP=g at TP=1 on as many GPUs."""
    grid = [Run(m, s, t) for m, s, ts in runs for t in ts]
    for m, s in compared:
        for g in gpu_counts:
            grid += [Run(m, s, g, all_reduce="nccl"), Run(m, s, 1, pp=g)]
    return list(dict.fromkeys(grid))


def measure_runs(planned: Sequence[Run], batches: tuple[int, ...], store: ResultStore | None = None,
                 on_run: OnRun | None = None) -> tuple[list[dict[str, Any]], list[Result]]:
    """Each planned run's rows and Results, one engine at a time: a run this machine has too few GPUs for, or one
    that raises, becomes its "not measured" rows with the reason, and the rest still run. `on_run(rows, results,
    new)` is called after each run with everything so far and that run's own Results."""
    rows: list[dict[str, Any]] = []
    results: list[Result] = []
    for run in planned:
        short = _too_few(run.gpus)
        if short:
            got, new = [not_measured(run.model, run.scheme, run.t, b, short, run.pp, run.all_reduce)
                        for b in batches], []
        else:
            try:
                got, new = measure(run.model, run.scheme, run.t, batches, store=store, lab=LAB, pp=run.pp,
                                   all_reduce=run.all_reduce)
            except Exception as e:  # one run failing keeps the others' (its rows say why)
                why = f"failed: {type(e).__name__}: {e}"[:400]
                got, new = [not_measured(run.model, run.scheme, run.t, b, why, run.pp, run.all_reduce)
                            for b in batches], []
        rows += got
        results += new
        if on_run is not None:
            on_run(rows, results, new)
    return rows, results


def run_facts(rows: list[dict[str, Any]], results: list[Result]) -> dict[str, Any]:
    """The recording of some runs as facts hold it: the rows, the GPU (its Results', else this machine's), how many
    GPUs a worker could use, the day (its first Result's, else today's, UTC) and the fixed shapes."""
    machine = device_facts()
    gpu = next((r.hardware.get("gpu") for r in results if r.hardware.get("gpu")), None) or machine.get("gpu")
    date = min((r.recorded_at[:10] for r in results), default=time.strftime("%Y-%m-%d", time.gmtime()))
    return {"rows": rows, "gpu": gpu, "gpu_count": _gpus_here(machine)[0], "date": date, "prompt_len": PROMPT_LEN,
            "output_len": OUTPUT_LEN}


def keeps_as_tp1(runs: Sequence[tuple[str, str]], batches: Sequence[int], rows: list[dict[str, Any]]) -> bool:
    """Whether a live TP=1 run is step tp1's recording: record's runs and batches, in its order, every row measured
    (another grid, or a run that failed, is this user's run, not the recording)."""
    return (tuple(tuple(r) for r in runs) == TP1_RUNS and tuple(batches) == TP1_BATCHES and bool(rows)
            and all(r["status"] == "measured" for r in rows))


def _keeper(key: str, store: ResultStore, facts: dict[str, Any]) -> OnRun:
    def kept(rows: list[dict[str, Any]], results: list[Result], new: list[Result]) -> None:
        for r in new:
            store.append(dataclasses.replace(r, provenance="recorded"))
        facts[key] = run_facts(list(rows), list(results))  # after every run: a time limit later loses nothing made
    return kept


def record(out_dir: Path, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step tp1 (one H200): TP=1 for each of TP1_RUNS at TP1_BATCHES -> facts["tp1"], Results into store."""
    measure_runs(tp1_grid(), TP1_BATCHES, on_run=_keeper(TP1, store, facts))


def record_scaling(out_dir: Path, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step tp-scaling (2-8 H200s of one host): `scaling_grid` at SCALING_BATCHES -> facts["tp_scaling"]."""
    measure_runs(scaling_grid(), SCALING_BATCHES, on_run=_keeper(SCALING, store, facts))


def _key(row: dict[str, Any]) -> tuple:
    return row["model"], row["scheme"], row["t"], row.get("pp", 1), row.get("all_reduce", "custom")


def _status(facts: dict[str, Any], key: str, run: Run, batches: Sequence[int]) -> str:
    """What the recording `facts[key]` holds of `run`: "recorded", a row's "not measured: why", or "not run yet"."""
    want = (run.model, run.scheme, run.t, run.pp, run.all_reduce)
    rows = {r["batch"]: r for r in (facts.get(key) or {}).get("rows", []) if _key(r) == want and r["batch"] in batches}
    if not rows:
        return "not run yet"
    missing = [rows[b]["status"] if b in rows else "not run yet" for b in batches
               if b not in rows or rows[b]["status"] != "measured"]
    if not missing:
        return f"recorded on {(facts[key].get('gpu_count') or '?')} x {facts[key].get('gpu')}, {facts[key].get('date')}"
    return missing[0]


def _what(run: Run, batches: Sequence[int]) -> str:
    on = f"{run.model} {run.scheme}, batch {' and '.join(map(str, batches))}"
    if run.pp > 1:
        return f"PP={run.pp} (pipeline_parallel_size={run.pp}, TP=1) against TP={run.pp} on as many GPUs: {on}"
    if run.all_reduce == "nccl":
        return f"TP={run.t} on NCCL's all-reduce (disable_custom_all_reduce=True) against vLLM's custom one: {on}"
    return f"TP={run.t}{' (the same host, as the baseline)' if run.t == 1 else ''}: {on}"


def remaining_runs(facts: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The lab's GPU runs and what the recordings (`facts`: the reference facts by default) hold of each, read row by
    row: "recorded ...", the recorded reason it was not measured (a 2-GPU machine cannot make TP=4), or "not run yet";
    `needs` says which machine makes it."""
    if facts is None:
        from ..results.reference import reference_facts

        facts = reference_facts()
    out = [{"run": f"TP=1 baseline: {r.model} {r.scheme}, batch {'/'.join(map(str, TP1_BATCHES))}",
            "needs": "1 H200 (nvidia-h200)", "step": TP1, "status": _status(facts, TP1, r, TP1_BATCHES)}
           for r in tp1_grid()]
    for r in scaling_grid():
        g = max(r.gpus, 2)
        out.append({"run": _what(r, SCALING_BATCHES), "needs": f"{g} H200s of one host (nvidia-h200-x{g})",
                    "step": SCALING_STEP, "status": _status(facts, SCALING, r, SCALING_BATCHES)})
    return out
