"""Lab 09's planned GPU runs: the TP=1 baseline and the scaling grid in parts, measured run by run, and what is
recorded of them yet.

Step tp1 runs TP1_RUNS at TP1_BATCHES on one H200 (facts["tp1"]); the multi-GPU runs (several H200s of one host,
facts["tp_scaling"]) are `scaling_grid`: TP=1/2/4 for SCALING_RUNS, then at each GPU count of COMPARED_GPUS vLLM's
custom all-reduce against NCCL's (TP=g twice) and pipeline parallelism (PP=g at TP=1) for COMPARED_RUNS. The whole
grid is 16 engine starts, too many for one 10-minute GPU command, so it is recorded in parts (SCALING_PARTS: steps
tp-scaling-8b, ..., each a `scaling_part` of a few engines) whose rows merge into facts["tp_scaling"] by run and batch
(`merge_scaling`), in record.py and in scripts/pack_reference.py. The scaling runs' Results are named
"scaling-tp1-...", never step tp1's "tp1-...".

Every run is measured run by run (`measure_runs`): a run the machine has too few GPUs for, or one that fails, is a
row that says "not measured" and why, and the facts are kept after every run, so a time limit later loses nothing
made. The facts (`run_facts`) name the GPU, how many a worker could use, and the day.

A live TP=1 run of the lab's own grid is the same measurement: `tp1_baseline` keeps it as facts["tp1"] after
every run (`keeps_as_tp1`, `live_keeper`), and the lab's quick live scaling runs add their rows to
facts["tp_scaling"] the same way. `remaining_runs` reads each planned run's rows in the recordings and says what
is recorded and what remains.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ... import validate
from ...hardware.device import device_facts
from ...results.record import Result
from ...results.reference import reference_facts
from ...results.store import ResultStore, keep_if_recording
from .runs import LAB, OUTPUT_LEN, PROMPT_LEN, Run, gpus_here, too_few, measure, not_measured

TP1 = "tp1"  # step and facts key of the one-GPU baseline
SCALING = "tp_scaling"  # facts key of the multi-GPU runs
SCALING_PREFIX = "scaling-"  # before a scaling run's Result step: its TP=1 rows are not step tp1's Results
TP1_RUNS = (("llama-3.1-8b", "bf16"), ("llama-3.1-70b", "fp8"))  # the baseline: what one H200 can hold
TP1_BATCHES = (1, 8, 64)
SCALING_RUNS = (("llama-3.1-8b", "bf16", (1, 2, 4)), ("llama-3.1-70b", "bf16", (2, 4)),
                ("llama-3.1-70b", "fp8", (1, 2, 4)))  # what the multi-GPU machines are for
SCALING_BATCHES = (1, 64)
COMPARED_RUNS = (("llama-3.1-8b", "bf16"), ("llama-3.1-70b", "fp8"))  # all-reduce kernels and PP, at the same GPUs
COMPARED_GPUS = (2, 4)

OnRun = Callable[[list[dict[str, Any]], list[Result], list[Result]], None]
Shape = tuple[str, str]  # (model, scheme)


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


def scaling_part(models: Sequence[Shape] | None = None, gpu_counts: Sequence[int] | None = None,
                 compared: bool | None = None) -> list[Run]:
    """The runs of `scaling_grid` a part records, in the grid's order: those of `models` ((model, scheme) pairs),
    on `gpu_counts` GPUs (t x pp), plain TP only (compared=False) or only NCCL's all-reduce and PP (True); None:
    every one. A filter that keeps nothing is refused: it names no run of the grid."""
    grid = [r for r in scaling_grid() if (models is None or (r.model, r.scheme) in set(map(tuple, models)))
            and (gpu_counts is None or r.gpus in set(gpu_counts))
            and (compared is None or compared == (r.pp > 1 or r.all_reduce != "custom"))]
    if not grid:
        raise validate.refuse("scaling_part", "models", models, f"(model, scheme) pairs of the grid, "
                              f"{sorted({(r.model, r.scheme) for r in scaling_grid()})}, on GPU counts "
                              f"{sorted({r.gpus for r in scaling_grid()})}",
                              "pass a shape and GPU count the grid runs, or None for all of them.")
    return grid


_8B, _70B, _70B_FP8 = ("llama-3.1-8b", "bf16"), ("llama-3.1-70b", "bf16"), ("llama-3.1-70b", "fp8")
# the grid in steps of a 10-minute GPU command: at ~100-150 s per engine start, three 8B engines or two 70B ones a
# step (7 and 6 minutes at most); 8B plain TP first, then 8B NCCL/PP, then the 70B; x4 parts need 4 GPUs
SCALING_PARTS: dict[str, dict[str, Any]] = {
    "tp-scaling-8b": {"models": (_8B,), "compared": False},  # TP=1, 2, 4
    "tp-scaling-8b-x2": {"models": (_8B,), "gpu_counts": (2,), "compared": True},  # tp2-nccl, tp1-pp2
    "tp-scaling-8b-x4": {"models": (_8B,), "gpu_counts": (4,), "compared": True},  # tp4-nccl, tp1-pp4
    "tp-scaling-70b-bf16": {"models": (_70B,)},  # TP=2, 4 (bf16 does not fit one H200)
    "tp-scaling-70b-fp8": {"models": (_70B_FP8,), "gpu_counts": (1, 2), "compared": False},  # TP=1, 2
    "tp-scaling-70b-fp8-x2": {"models": (_70B_FP8,), "gpu_counts": (2,), "compared": True},  # tp2-nccl, tp1-pp2
    "tp-scaling-70b-fp8-x4": {"models": (_70B_FP8,), "gpu_counts": (4,), "compared": False},  # TP=4
    "tp-scaling-70b-fp8-x4-compared": {"models": (_70B_FP8,), "gpu_counts": (4,), "compared": True},
}
SCALING_STEP = ",".join(SCALING_PARTS)  # the steps that record facts["tp_scaling"] (step tp-scaling: all at once)


def part_of(run: Run) -> str:
    """The step of SCALING_PARTS that records `run`."""
    return next(name for name, part in SCALING_PARTS.items() if run in scaling_part(**part))


def measure_runs(planned: Sequence[Run], batches: tuple[int, ...], store: ResultStore | None = None,
                 on_run: OnRun | None = None, step_prefix: str = "") -> tuple[list[dict[str, Any]], list[Result]]:
    """Each planned run's rows and Results, one engine at a time: a run this machine has too few GPUs for, or one
    that raises, becomes its "not measured" rows with the reason, and the rest still run. `on_run(rows, results,
    new)` is called after each run with everything so far and that run's own Results. `step_prefix` goes before
    each Result's step (`Run.step`)."""
    rows: list[dict[str, Any]] = []
    results: list[Result] = []
    for run in planned:
        short = too_few(run.gpus)
        if short:
            got, new = [not_measured(run.model, run.scheme, run.t, b, short, run.pp, run.all_reduce)
                        for b in batches], []
        else:
            try:
                got, new = measure(run.model, run.scheme, run.t, batches, store=store, lab=LAB, pp=run.pp,
                                   all_reduce=run.all_reduce, step_prefix=step_prefix)
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
    return {"rows": rows, "gpu": gpu, "gpu_count": gpus_here(machine)[0], "date": date, "prompt_len": PROMPT_LEN,
            "output_len": OUTPUT_LEN}


def keeps_as_tp1(runs: Sequence[tuple[str, str]], batches: Sequence[int]) -> bool:
    """Whether a live TP=1 run is step tp1's recording: record's runs and batches, in its order (another grid is
    this user's run, not the recording). A run of it that fails is kept as record keeps it: rows that say why."""
    return tuple(tuple(r) for r in runs) == TP1_RUNS and tuple(batches) == TP1_BATCHES


def run_key(row: dict[str, Any]) -> tuple:
    """Which measurement a row is: (model, scheme, t, pp, all_reduce, batch); rows before pp and all_reduce ran the
    defaults (1, "custom")."""
    return (*_key(row), row["batch"])


def merge_scaling(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """Two recordings of scaling runs as one: the rows of both by `run_key`, a new row replacing the old one of
    the same run and batch unless the new one is "not measured" and the old one measured (a 2-GPU machine's
    "needs 4 GPUs" never hides a 4-GPU machine's number); the grid's order; the GPU and day of the newer, the most
    GPUs a worker could use in either (each row keeps its own `gpu` and `recorded_at`), every day in `dates`."""
    if not old or not old.get("rows"):
        return {**new, "dates": sorted({*new.get("dates", []), new.get("date")} - {None})}
    rows = {run_key(r): r for r in old["rows"]}
    for r in new["rows"]:
        k = run_key(r)
        if k not in rows or r["status"] == "measured" or rows[k]["status"] != "measured":
            rows[k] = r
    order = {(r.model, r.scheme, r.t, r.pp, r.all_reduce): i for i, r in enumerate(scaling_grid())}
    merged = sorted(rows.values(), key=lambda r: (order.get(_key(r), len(order)), r["batch"]))
    counts = [c for c in (old.get("gpu_count"), new.get("gpu_count")) if c is not None]
    dates = {*old.get("dates", []), *new.get("dates", []), old.get("date"), new.get("date")} - {None}
    return {**old, **new, "rows": merged, "gpu_count": max(counts) if counts else None, "dates": sorted(dates)}


def live_keeper(key: str, store: ResultStore | None, differs: Sequence[str] = (), merge: bool = False) -> OnRun:
    """A live cell's on_run: facts[key] as its recording step writes them, kept as that step's recording after every
    run (`keep_if_recording`: given a store, and nothing in `differs`, the ways this run is not the step's; bench.run
    stored the Results already). With `merge`, the rows add to those the same store kept before (`merge_scaling`)."""
    path = store.facts_path(key) if store is not None else None
    before = json.loads(path.read_text()) if merge and path is not None and path.exists() else None

    def kept(rows: list[dict[str, Any]], results: list[Result], new: list[Result]) -> None:
        def facts() -> dict[str, Any]:
            got = run_facts(list(rows), list(results))
            return merge_scaling(before, got) if merge else got
        keep_if_recording(store, key, facts, differs)
    return kept


def _key(row: dict[str, Any]) -> tuple:
    return row["model"], row["scheme"], row["t"], row.get("pp", 1), row.get("all_reduce", "custom")


def recorded_label(facts: dict[str, Any]) -> str:
    """How a recording is labelled: "recorded on 2 x NVIDIA H200, 2026-12-02" (the GPUs a worker could use there,
    where the facts say more than one; "recorded on NVIDIA H200, ..." for one, as every one-GPU recording is labelled,
    so that a figure merges their dates into one phrase)."""
    n = facts.get("gpu_count")
    return (f"recorded on {f'{n} x ' if n and n > 1 else ''}{facts.get('gpu') or 'a GPU'}, "
            f"{facts.get('date') or 'date unknown'}")


def _status(facts: dict[str, Any], key: str, run: Run, batches: Sequence[int]) -> str:
    """What the recording `facts[key]` holds of `run`: "recorded", a row's "not measured: why", or "not run yet"."""
    want = (run.model, run.scheme, run.t, run.pp, run.all_reduce)
    rows = {r["batch"]: r for r in (facts.get(key) or {}).get("rows", []) if _key(r) == want and r["batch"] in batches}
    if not rows:
        return "not run yet"
    missing = [rows[b]["status"] if b in rows else "not run yet" for b in batches
               if b not in rows or rows[b]["status"] != "measured"]
    if not missing:
        return recorded_label(facts[key])
    return missing[0]


def _what(run: Run, batches: Sequence[int]) -> str:
    on = f"{run.model} {run.scheme}, batch {' and '.join(map(str, batches))}"
    if run.pp > 1:
        return (f"PP={run.pp} (pipeline_parallel_size={run.pp}, TP=1; one microbatch in flight) against TP={run.pp} "
                f"on as many GPUs: {on}")
    if run.all_reduce == "nccl":
        return f"TP={run.t} on NCCL's all-reduce (disable_custom_all_reduce=True) against vLLM's custom one: {on}"
    return f"TP={run.t}{' (the same host, as the baseline)' if run.t == 1 else ''}: {on}"


def remaining_runs(facts: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The lab's GPU runs and what the recordings (`facts`: the reference facts by default) hold of each, read row by
    row: "recorded ...", the recorded reason it was not measured (a 2-GPU machine cannot make TP=4), or "not run yet";
    `needs` says which machine makes it."""
    if facts is None:
        facts = reference_facts()
    out = [{"run": f"TP=1 baseline: {r.model} {r.scheme}, batch {'/'.join(map(str, TP1_BATCHES))}",
            "needs": "1 H200 (nvidia-h200)", "step": TP1, "status": _status(facts, TP1, r, TP1_BATCHES)}
           for r in tp1_grid()]
    for r in scaling_grid():
        g = max(r.gpus, 2)
        out.append({"run": _what(r, SCALING_BATCHES), "needs": f"{g} H200s of one host (nvidia-h200-x{g})",
                    "step": part_of(r), "status": _status(facts, SCALING, r, SCALING_BATCHES)})
    return out
