"""Lab 09's notebook calls: the cost model's line beside vLLM's TP=t runs, live or recorded, and what is refused.

`tp1_baseline` shows vLLM on the synthetic checkpoints at TP=1 on one GPU, b fixed-shape requests at once (b = 1, 8,
64), beside the model's prediction for t=1 on the GPU it ran on; `tp_scaling` TP=1/2/4 on several GPUs of one host
(live, the notebook runs only its quick grid, the 8B at TP=1 and 2; the whole grid is the recording steps').
Each is live where this machine can run it, else the recording (facts["tp1"], facts["tp_scaling"]); a run that
cannot happen here is a row that says "not measured" and why, never a number; `refusals` lists the bad inputs
refused outright.
"""
from __future__ import annotations

from typing import Any

from ...mechanisms import parallel as tp
from ...results.reference import load_reference, recorded_facts
from ...results.store import ResultStore
from ...session import Shown, live_label, live_or_recorded
from .fit import ONE_LONG_SEQUENCE, raise_unless_fits, check_tp, fit_advice
from .model import cost_rows

from .grid import (
    COMPARED_GPUS,
    COMPARED_RUNS,
    SCALING,
    SCALING_BATCHES,
    SCALING_PREFIX,
    SCALING_RUNS,
    SCALING_STEP,
    TP1,
    TP1_BATCHES,
    TP1_RUNS,
    live_keeper,
    keeps_as_tp1,
    measure_runs,
    recorded_label,
    scaling_grid,
    tp1_grid,
)
from .runs import OUTPUT_LEN, PROMPT_LEN, gpus_here, predict

# --- beside the measured runs: the model's line, and what is refused before any engine starts -----


def prediction_rows(runs: tuple[tuple[str, str], ...] = TP1_RUNS, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
                    context: int = PROMPT_LEN + OUTPUT_LEN // 2, t: int = 1) -> list[dict[str, Any]]:
    """The model's line for the measured runs: each (model, scheme) at TP=t, context of the fixed shapes' midpoint."""
    return [row for m, s in runs for row in cost_rows((m,), s, (t,), batches, (tp.NVLINK4,), context)]


def refusals(model: str = "llama-3.1-70b") -> list[dict[str, str]]:
    """The bad inputs the lab refuses before any engine starts, each with the message a user gets."""
    gpus, note = gpus_here()
    more = max(2, 2 * gpus)  # more GPUs than a worker here can use
    here = f"{gpus} GPUs a worker can use, {note}" if note else f"{gpus} GPUs"
    machine = f"the GPUs a worker can use here ({note})" if note else None
    asked = [("tensor_parallel_size=3 (does not divide the heads)", lambda: check_tp(model, 3)),
             (f"tensor_parallel_size={more} on this machine ({here})", lambda: check_tp(model, more, gpus, machine)),
             ("bf16 at tensor_parallel_size=1 on one H200 (does not fit)",
              lambda: raise_unless_fits(fit_advice(model, ONE_LONG_SEQUENCE)))]
    out = []
    for what, call in asked:
        try:
            call()
            out.append({"asked": what, "refused with": "(accepted)"})
        except ValueError as e:
            out.append({"asked": what, "refused with": str(e)})
    return out


# --- measured: vLLM at TP=t, live or recorded ------------------------------------------------------

RUN_DEFAULTS = {"pp": 1, "all_reduce": "custom"}  # what a row without the field ran (a recording made before them)


def _field(row: dict[str, Any], name: str) -> Any:
    return row[name] if name in row else RUN_DEFAULTS[name]


def _recorded(key: str, step: str) -> list[dict[str, Any]]:
    """facts[key]'s rows, every one, each labelled with the recording's GPUs and day."""
    got = recorded_facts(key, step)
    return [{**row, "provenance": recorded_label(got)} for row in got["rows"]]


def _shown_or_recorded(live: Any, key: str, step: str, fields: tuple[str, ...], points: list[Any], batches: Any,
                       force: bool | None) -> Shown[list[dict[str, Any]]]:
    """live_or_recorded on rows keyed by `fields` and batch: the cell's runs and batches against the recording's."""
    runs = f"({', '.join(fields)})"
    return live_or_recorded(live, lambda: _recorded(key, step), force=force,
                            asked={runs: [list(p) for p in points], "batches": list(batches)},
                            where={runs: fields, "batches": "batch"})


def tp1_baseline(runs: tuple[tuple[str, str], ...] = TP1_RUNS, batches: tuple[int, ...] = TP1_BATCHES,
                 force: bool | None = None, store: ResultStore | None = None) -> Shown[list[dict[str, Any]]]:
    """TP=1 on one GPU for each (model, scheme): live with vLLM, else the recording (facts["tp1"], step tp1), every
    row, and where the cell asked other runs or batches the line under it names them.

    Live with the step's runs and batches (the defaults) and a `store`, the run is also kept as step tp1's recording
    after every run (`live_keeper`, the facts record.record writes, a failed run's rows saying why as the step's
    do): lab 09 run live on one H200 is its own baseline recording, and a 70B that fails or a command cut during it
    keeps the 8B's rows. Any other grid stays this user's run."""
    planned = tp1_grid(runs)  # bad knobs refused on every machine, before the mode decides

    def live() -> list[dict[str, Any]]:
        keep = live_keeper(TP1, store, [] if keeps_as_tp1(runs, batches) else ["not step tp1's runs and batches"])
        rows, _ = measure_runs(planned, tuple(batches), store=store, on_run=keep)
        return [{**row, "provenance": live_label()} for row in rows]

    return _shown_or_recorded(live, TP1, TP1, ("model", "scheme"), list(runs), batches, force)


QUICK_SCALING_RUNS = (("llama-3.1-8b", "bf16", (1, 2)),)  # the lab's live grid: two 8B engines, TP=1 and TP=2


def tp_scaling(runs: tuple[tuple[str, str, tuple[int, ...]], ...] = SCALING_RUNS,
               batches: tuple[int, ...] = SCALING_BATCHES, force: bool | None = None,
               store: ResultStore | None = None, compared: tuple[tuple[str, str], ...] = COMPARED_RUNS,
               gpu_counts: tuple[int, ...] = COMPARED_GPUS, quick: bool = False) -> Shown[list[dict[str, Any]]]:
    """TP=1/2/4 on one host, then NCCL's all-reduce against vLLM's and PP at the same GPU counts (`scaling_grid`):
    live only where a worker can use 2 or more GPUs and vLLM is installed, else the recording (facts["tp_scaling"],
    the SCALING_PARTS steps), picked as tp1_baseline's; a run needing more GPUs than a worker can use is a "not
    measured" row. A shape a t cannot split is refused before anything runs.

    `quick=True` (the notebook's call) runs only QUICK_SCALING_RUNS live at `batches`, the 8B at TP=1 and TP=2 (two
    engine starts, which fit the lab's 10-minute run beside step 4's two), and, given a `store`, adds their rows to
    the recording after every run (`grid.live_keeper`, facts["tp_scaling"] merged row by row as the parts'
    are); the recording shown elsewhere is still the whole grid the other knobs name."""
    planned = scaling_grid(runs, compared, gpu_counts)
    for run in planned:
        check_tp(run.model, run.t)
    ran = scaling_grid(QUICK_SCALING_RUNS, (), ()) if quick else planned

    def live() -> list[dict[str, Any]]:
        keep = live_keeper(SCALING, store, [] if quick else ["not the quick grid"], merge=True)
        rows, _ = measure_runs(ran, tuple(batches), store=store, on_run=keep, step_prefix=SCALING_PREFIX)
        return [{**row, "provenance": live_label()} for row in rows]

    if force is None and gpus_here()[0] < 2:
        force = False  # one usable GPU: show what a multi-GPU machine recorded
    points = [(r.model, r.scheme, r.t, r.pp, r.all_reduce) for r in planned]
    return _shown_or_recorded(live, SCALING, SCALING_STEP, ("model", "scheme", "t", "pp", "all_reduce"), points,
                              batches, force)


def plain_tp(row: dict[str, Any]) -> bool:
    """A row of plain tensor parallelism (no pipeline stages, vLLM's own all-reduce): the cost model's TP line."""
    return _field(row, "pp") == 1 and _field(row, "all_reduce") == "custom"


def recorded_tp1_points(steps: tuple[str, ...] = ("vllm-8b-single", "vllm-8b-256x128x128")) -> Shown[list[dict]]:
    """The synthetic 8B's TP=1 runs already recorded on the H200 (labs 01-03), each beside the model's prediction
    at that run's own mean batch and context (the roofline's figures for the run)."""
    rows = []
    for r in load_reference(*steps):
        batch, context = r.roofline["batch"], r.roofline["context_len"]
        tpot = r.summary["tpot_s"]["p50"]
        pred = predict("llama-3.1-8b", "bf16", 1, batch, context, r.hardware.get("gpu"))
        rows.append({"model": "llama-3.1-8b", "scheme": "bf16", "t": 1, "batch": batch, "context": context,
                     "status": "measured", "tpot_ms": tpot * 1e3, "decode_tok_s": batch / tpot, **pred,
                     "measured_over_predicted": tpot * 1e3 / pred["predicted_ms"], "step": r.step,
                     "provenance": f"recorded on {r.hardware.get('gpu')}, {r.recorded_at[:10]}"})
    return Shown(rows, False, rows[0]["provenance"] if rows else "no recorded runs", "recorded for labs 01-03")


def tp_cuts_latency(rows: list[dict[str, Any]], model: str, scheme: str, t: int, batch: int = 1) -> bool:
    """Whether the measured per-token latency at TP=t is below TP=1's (False when either was not measured)."""
    got = {r["t"]: r["tpot_ms"] for r in rows if (r["model"], r["scheme"], r["batch"]) == (model, scheme, batch)
           and r["status"] == "measured" and plain_tp(r)}
    return 1 in got and t in got and got[t] < got[1]


def batch_gain(rows: list[dict[str, Any]], model: str, scheme: str, batch: int = 64, t: int = 1) -> float | None:
    """Measured decode tok/s at `batch` over batch 1's, both at TP=t (None when either was not measured)."""
    got = {r["batch"]: r["decode_tok_s"] for r in rows if (r["model"], r["scheme"], r["t"]) == (model, scheme, t)
           and r["status"] == "measured" and plain_tp(r)}
    return got[batch] / got[1] if 1 in got and batch in got else None


