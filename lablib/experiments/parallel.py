"""Lab 09's notebook calls: the cost model's line beside vLLM's TP=t runs, live or recorded, and what is refused.

`tp1_baseline` shows vLLM on the synthetic checkpoints at TP=1 on one GPU, b fixed-shape requests at once (b = 1, 8,
64), beside the model's prediction for t=1 on the GPU it ran on; `tp_scaling` TP=1/2/4 on several GPUs of one host.
Each is live where this machine can run it, else the recording (facts["tp1"], facts["tp_scaling"]); a run that
cannot happen here is a row that says "not measured" and why, never a number; `refusals` lists the bad inputs
refused outright.

The lab's other parts live beside this module, and their public names are importable from here too (the notebook
calls `experiments.parallel` for all of them): `parallel_model`, the tensor-parallel cost model swept over shapes,
links and batches; `parallel_fit`, the fit view and the refusal a user meets before renting anything;
`parallel_runs`, the measured runs (`measure`); `parallel_recording`, the recording steps (`record`,
`record_scaling`) and `remaining_runs`.
"""
from __future__ import annotations

from typing import Any

from ..mechanisms import parallel as tp
from ..results.reference import load_reference, recorded_facts
from ..results.store import ResultStore
from ..session import Shown, asked_rows, live_label, live_or_recorded
from .parallel_fit import (  # noqa: F401 - re-exported: the notebook and the tests read them here
    ONE_LONG_SEQUENCE,
    _raise_unless_fits,
    check_tp,
    engine_refusal,
    fit_advice,
    fit_rows,
    gpu_bytes,
    shape_spec,
)
from .parallel_model import (  # noqa: F401 - re-exported, as above
    BATCHES,
    LINKS,
    SIMULATED,
    TPS,
    calibrated_overhead,
    cost_rows,
    dominance_rows,
    headline,
    link_rows,
    lookup,
    model_shape,
    overhead_effect,
    pcie_share_above_nvlink,
    two_gpu_rows,
)

from .parallel_recording import (  # noqa: F401 - re-exported, as above
    SCALING_RUNS,
    TP1_RUNS,
    record,
    record_scaling,
    remaining_runs,
)
from .parallel_runs import (  # noqa: F401 - re-exported, as above
    LAB,
    OUTPUT_LEN,
    PROMPT_LEN,
    QUANTIZATION,
    _gpus_here,
    fixed_shapes,
    measure,
    measure_or_skip,
    no_room_on_disk,
    not_measured,
    predict,
    why_not,
)

# --- beside the measured runs: the model's line, and what is refused before any engine starts -----


def prediction_rows(runs: tuple[tuple[str, str], ...] = TP1_RUNS, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
                    context: int = PROMPT_LEN + OUTPUT_LEN // 2, t: int = 1) -> list[dict[str, Any]]:
    """The model's line for the measured runs: each (model, scheme) at TP=t, context of the fixed shapes' midpoint."""
    return [row for m, s in runs for row in cost_rows((m,), s, (t,), batches, (tp.NVLINK4,), context)]


def refusals(model: str = "llama-3.1-70b") -> list[dict[str, str]]:
    """The bad inputs the lab refuses before any engine starts, each with the message a user gets."""
    gpus, note = _gpus_here()
    more = max(2, 2 * gpus)  # more GPUs than a worker here can use
    here = f"{gpus} GPUs a worker can use, {note}" if note else f"{gpus} GPUs"
    machine = f"the GPUs a worker can use here ({note})" if note else None
    asked = [("tensor_parallel_size=3 (does not divide the heads)", lambda: check_tp(model, 3)),
             (f"tensor_parallel_size={more} on this machine ({here})", lambda: check_tp(model, more, gpus, machine)),
             ("bf16 at tensor_parallel_size=1 on one H200 (does not fit)",
              lambda: _raise_unless_fits(fit_advice(model, ONE_LONG_SEQUENCE)))]
    out = []
    for what, call in asked:
        try:
            call()
            out.append({"asked": what, "refused with": "(accepted)"})
        except ValueError as e:
            out.append({"asked": what, "refused with": str(e)})
    return out


# --- measured: vLLM at TP=t ---------------------------------------------------------------------
def _recorded(key: str, step: str, fields: tuple[str, ...], points: list[tuple], batches: tuple[int, ...]
              ) -> list[dict[str, Any]]:
    """facts[key]'s rows at the asked points (`fields` of a row, e.g. model and scheme) and batches when the
    recording holds them all; otherwise every row (and `_knobs` of each side says which stand in)."""
    got = recorded_facts(key, step)
    rows = [{**row, "provenance": f"recorded on {got['gpu']}, {got['date']}"} for row in got["rows"]]
    return asked_rows(rows, lambda r: (*(r[f] for f in fields), r["batch"]), [(*p, b) for p in points for b in batches])


def _knobs(fields: tuple[str, ...], points: list[Any], batches: Any) -> dict[str, Any]:
    """The runs and batches a cell asked for, or a recording holds, named the same way on both sides."""
    return {f"({', '.join(fields)})": sorted({tuple(p) for p in points}), "batches": sorted(set(batches))}


def _shown(fields: tuple[str, ...]) -> Any:
    """recorded_with for rows keyed by `fields` and batch: the knobs as the recorded rows ran them."""
    return lambda rows: _knobs(fields, [[r[f] for f in fields] for r in rows], [r["batch"] for r in rows])


def tp1_baseline(runs: tuple[tuple[str, str], ...] = TP1_RUNS, batches: tuple[int, ...] = (1, 8, 64),
                 force: bool | None = None, store: ResultStore | None = None) -> Shown[list[dict[str, Any]]]:
    """TP=1 on one GPU for each (model, scheme): live with vLLM, else the recording (facts["tp1"], step tp1): the
    asked runs and batches when it holds them all, else every row, and the line under the cell names the stand-ins."""
    def live() -> list[dict[str, Any]]:
        return [{**row, "provenance": live_label()} for m, s in runs for row in measure(m, s, 1, batches, store=store)[0]]

    fields = ("model", "scheme")
    return live_or_recorded(live, lambda: _recorded("tp1", "tp1", fields, list(runs), batches), force=force,
                            asked=_knobs(fields, runs, batches), recorded_with=_shown(fields))


def tp_scaling(runs: tuple[tuple[str, str, tuple[int, ...]], ...] = SCALING_RUNS, batches: tuple[int, ...] = (1, 64),
               force: bool | None = None, store: ResultStore | None = None) -> Shown[list[dict[str, Any]]]:
    """TP=1/2/4 on one host: live only where a worker can use 2 or more GPUs and vLLM is installed, else the
    recording (facts["tp_scaling"], step tp-scaling), picked as tp1_baseline's; t above the GPUs a worker can use
    is a "not measured" row."""
    def live() -> list[dict[str, Any]]:
        return [{**row, "provenance": live_label()} for m, s, ts in runs for t in ts
                for row in measure_or_skip(m, s, t, batches, store)]

    if force is None and _gpus_here()[0] < 2:
        force = False  # one usable GPU: show what a multi-GPU machine recorded
    fields, points = ("model", "scheme", "t"), [(m, s, t) for m, s, ts in runs for t in ts]
    return live_or_recorded(live, lambda: _recorded("tp_scaling", "tp-scaling", fields, points, batches), force=force,
                            asked=_knobs(fields, points, batches), recorded_with=_shown(fields))


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
           and r["status"] == "measured"}
    return 1 in got and t in got and got[t] < got[1]


def batch_gain(rows: list[dict[str, Any]], model: str, scheme: str, batch: int = 64, t: int = 1) -> float | None:
    """Measured decode tok/s at `batch` over batch 1's, both at TP=t (None when either was not measured)."""
    got = {r["batch"]: r["decode_tok_s"] for r in rows if (r["model"], r["scheme"], r["t"]) == (model, scheme, t)
           and r["status"] == "measured"}
    return got[batch] / got[1] if 1 in got and batch in got else None


