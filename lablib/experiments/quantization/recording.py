"""Lab 06's speed step, live on a GPU and recorded elsewhere, and what its recording is (record.py records it).

`speed` is the notebook's call. Run live on a fresh GPU machine (no checkpoint made: the three vLLM switches, QUANT_A)
on step quantization-a's grid (`QUANT_A_GRID`) with a store, and with no engine failing, it is step `quantization-a`
itself: its Results go to the lab's store and `speed_facts` (the one function `record.record` writes its facts with)
to facts-quantization.json, each row naming the Result it was made from (step, recorded_at), which
scripts/pack_reference.py --labs takes as the recording. GPU time is the scarce thing: one run, not two.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...models import LABEL as SYNTHETIC_LABEL
from ...models.quantize import read_facts
from ...results.record import Result
from ...results.reference import load_reference, NotRecorded
from ...results.store import ResultStore, keep_if_recording
from ...session import Shown, live_or_recorded
from .speed_runs import (
    BATCHES,
    GPU_WORK,
    SPEED_MODEL,
    SPEED_SCHEMES,
    VLLM_SWITCHES,
    ENGINE_KNOBS,
    available_speed_schemes,
    gpu_skips,
    base_model,
    fixed_name,
    kv_sentence,
    speed_rows,
    vllm_speed_runs,
)

# lab 06's six speed engines over two commands (scripts/record_reference.py's quantization-a and -b): bf16 and
# bf16-kv-fp8 together (kv_sentence compares the two), AWQ last (never loaded in vLLM yet)
QUANT_A = ("bf16", "bf16-kv-fp8", "fp8")
QUANT_B = ("gptq-w4a16", "w8a8-int8", "awq-w4a16")
KEY = "quantization"  # the facts key of steps quantization and quantization-a (quantization-b's: "quantization-2")
# step quantization-a's grid: record.record(schemes=QUANT_A) with vllm_speed_runs' defaults, as speed() runs
QUANT_A_GRID: dict[str, Any] = {"schemes": QUANT_A, "batches": BATCHES, "model": SPEED_MODEL, "work_dir": GPU_WORK,
                                "prompt_len": 128, "output_len": 128, "gpu_memory_utilization": 0.9,
                                "max_model_len": 2048}


def speed_facts(results: Sequence[Result], *, asked: Sequence[str], batches: Sequence[int], model: str,
                work: Path, skipped: dict[str, str], failed: dict[str, str], complete: bool) -> dict[str, Any]:
    """facts[key] of a speed recording, from `record` and from a live `speed` run alike (one function, so the two
    cannot drift): the per-scheme summary (kernels, weight GiB, KV tokens), the FP8 KV sentence, the checkpoints'
    own facts, what was skipped or failed; a row per Result in `asked` order, naming its step and recorded_at (the
    Result scripts/pack_reference.py takes for a live run), the GPU and the day (UTC, the Results' first)."""
    order = {s: i for i, s in enumerate(asked)}
    runs = sorted(zip(speed_rows(results), results), key=lambda p: (order.get(p[0]["scheme"], len(order)), p[0]["batch"]))
    rows = [row for row, _ in runs]
    ran = [s for s in asked if any(r["scheme"] == s for r in rows)]
    gpu = next((r.hardware.get("gpu") for r in results if r.hardware.get("gpu")), None)
    return {
        "model": model, "label": SYNTHETIC_LABEL, "batches": list(batches), "asked": list(asked),
        "schemes": {s: {k: next(r[k] for r in rows if r["scheme"] == s)
                        for k in ("weight_gib", "kv_tokens", "kv_cache_dtype", "linear_kernels")} for s in ran},
        "kv": kv_sentence(rows),
        "checkpoints": {s: {k: (read_facts(work / s) or {}).get(k) for k in ("seconds", "wall_s", "weight_bytes",
                                                                            "device", "group_size")}
                        for s in asked if s not in VLLM_SWITCHES and read_facts(work / s) is not None},
        "rows": [{"scheme": row["scheme"], "batch": row["batch"], "step": r.step, "recorded_at": r.recorded_at}
                 for row, r in runs],
        "gpu": gpu, "date": min((r.recorded_at[:10] for r in results), default=time.strftime("%Y-%m-%d", time.gmtime())),
        "skipped": skipped, "failed": failed, "complete": complete}


def differs_from_quant_a(chosen: Sequence[str], kw: dict[str, Any]) -> list[str]:
    """Each knob of a live speed run that is not step quantization-a's (`QUANT_A_GRID`), in words; empty when the run
    is that step's own: QUANT_A's schemes (in any order) and vllm_speed_runs' settings as record passes them."""
    def plain(k: str, v: Any) -> Any:
        return list(v) if k == "batches" else str(v) if k == "work_dir" else v

    out = [] if sorted(chosen) == sorted(QUANT_A_GRID["schemes"]) else [
        f"schemes {sorted(chosen)} (quantization-a's: {sorted(QUANT_A_GRID['schemes'])})"]
    for k, v in kw.items():
        if k not in QUANT_A_GRID:
            out.append(f"{k}={v!r} (quantization-a passes none)")
        elif k != "schemes" and plain(k, v) != plain(k, QUANT_A_GRID[k]):
            out.append(f"{k}={plain(k, v)!r} (quantization-a's: {plain(k, QUANT_A_GRID[k])!r})")
    return out


def speed(force: bool | None = None, schemes: Sequence[str] | None = None, store: ResultStore | None = None,
          **kw: Any) -> Shown[list[dict[str, Any]]]:
    """speed_rows of every scheme and batch on the synthetic 8B: live on a GPU with vLLM (vllm_speed_runs), else the
    runs recorded on the H200 (step `quantization` of scripts/record_reference.py, or its halves -a and -b).

    Live, `schemes=None` runs what can run now (`available_speed_schemes`: a checkpoint scheme only once
    prepare_checkpoints has made it in the quantization environment); name them to have a missing one refused.
    Recorded, every recorded row; the line under the cell names each knob where the recording ran otherwise
    (`speed_knobs`). With a `store`, each live Result is appended to it as it ends, and a live run of QUANT_A on
    step quantization-a's grid (`QUANT_A_GRID`) is also kept as that step's recording (`keep_if_recording`), after
    every run ("complete": False until the last, as record's when cut short), so a run cut by a time limit or an
    engine that fails keeps what ran before it. Any other run stays this user's, and a line says so.
    """
    def live() -> list[dict[str, Any]]:
        chosen = schemes if schemes is not None else available_speed_schemes(kw.get("model", SPEED_MODEL),
                                                                             kw.get("work_dir", GPU_WORK))
        for scheme, why in gpu_skips(SPEED_SCHEMES if schemes is None else schemes).items():
            print(f"Not run on this GPU: {scheme}: {why}")
        differs = differs_from_quant_a(chosen, kw) if store is not None else ["no store"]
        so_far: list[Result] = []

        def keep(complete: bool) -> Path | None:  # step quantization-a's facts as they stand (cut short or not)
            return keep_if_recording(store, KEY, lambda: speed_facts(
                so_far, asked=QUANT_A_GRID["schemes"], batches=QUANT_A_GRID["batches"], model=QUANT_A_GRID["model"],
                work=Path(QUANT_A_GRID["work_dir"]) / QUANT_A_GRID["model"], skipped={}, failed={}, complete=complete),
                differs)

        def ended(r: Result) -> None:  # on the step's grid the facts are kept after every run: a cut run keeps what ran
            so_far.append(r)
            keep(False)

        results = vllm_speed_runs(chosen, store=store, on_result=ended, **kw)  # an engine that fails raises here
        if path := keep(True):
            print(f"Kept as step quantization-a's recording (record's schemes and grid, every engine ran): {path}")
        elif store is not None:
            print("Not kept as step quantization-a's recording (this is your run): " + "; ".join(differs))
        return speed_rows(results)

    def recorded() -> list[dict[str, Any]]:
        runs = load_reference(prefix="quant-")
        if not runs:
            raise NotRecorded("lab 06's speed and memory per scheme on the synthetic 8B", "quantization")
        rows = speed_rows(runs)
        if missing := missing_line(rows, schemes):  # what the recording lacks at any batch, not only the asked ones
            print(missing)
        return rows

    return live_or_recorded(live, recorded, force=force, asked=speed_knobs(schemes, kw),
                            where={"model": recorded_model, "batches": "batch", "schemes": "scheme"})


def missing_line(rows: Sequence[dict[str, Any]], schemes: Sequence[str] | None = None) -> str:
    """What the recorded speed rows lack of the two steps' schemes (or of `schemes`), and the steps that record it
    ("" when nothing): a scheme never run on the 8B is named as not measured, never left out without a word."""
    have = {r["scheme"] for r in rows}
    model = recorded_model(rows) if rows else base_model(SPEED_MODEL)
    lines = [f"{', '.join(gone)}: not measured on {model} yet (step {step}"
             f"{', after quantization-prepare makes its checkpoints' if step == 'quantization-b' else ''})"
             for step, wanted in (("quantization-a", QUANT_A), ("quantization-b", QUANT_B))
             if (gone := [x for x in wanted if x not in have and (schemes is None or x in schemes)])]
    return "; ".join(lines)  # empty when the recording holds every one


def speed_knobs(schemes: Sequence[str] | None, kw: dict[str, Any]) -> dict[str, Any]:
    """What a `speed(schemes, **kw)` call asks for, named as speed rows carry it: the model, the batches, the schemes
    when named (None: what can run, which a recording cannot say), the lengths and engine settings when passed."""
    asked: dict[str, Any] = {"model": base_model(kw.get("model", SPEED_MODEL)),
                             "batches": sorted(kw.get("batches", BATCHES))}
    if schemes is not None:
        asked["schemes"] = sorted(schemes)
    if "prompt_len" in kw or "output_len" in kw:
        asked["workload"] = fixed_name(**{k: kw[k] for k in ("prompt_len", "output_len") if k in kw})
    return asked | {k: kw[k] for k in ENGINE_KNOBS if k in kw}


def recorded_model(rows: Sequence[dict[str, Any]]) -> str:
    """The model speed rows ran: a vLLM switch's row names it, the others add "+<scheme>" to it."""
    return next((r["model"] for r in rows if r["scheme"] in VLLM_SWITCHES), str(rows[0]["model"]).split("+")[0])
