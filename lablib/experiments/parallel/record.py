"""Lab 09's GPU recording steps (scripts/record_reference.py calls them; the notebook never does).

`record` is step tp1 (one H200: TP=1 for TP1_RUNS at TP1_BATCHES, facts["tp1"]); `record_scaling` records the
multi-GPU runs of `grid.scaling_part` (the SCALING_PARTS steps each record a part, merged into facts["tp_scaling"]).
Each keeps every run's Results as recorded and its facts after every run, so a time limit later loses nothing made.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...results.record import Result
from ...results.store import ResultStore
from .grid import (
    SCALING,
    SCALING_BATCHES,
    SCALING_PREFIX,
    TP1,
    TP1_BATCHES,
    OnRun,
    Shape,
    measure_runs,
    merge_scaling,
    run_facts,
    scaling_part,
    tp1_grid,
)


def _recording(key: str, store: ResultStore, facts: dict[str, Any], merge: bool = False) -> OnRun:
    """record's on_run: each new Result into `store` as recorded, and facts[key] after every run (merged onto the
    facts[key] this command already holds, with `merge_scaling`, when `merge`)."""
    before = facts.get(key) if merge else None

    def kept(rows: list[dict[str, Any]], results: list[Result], new: list[Result]) -> None:
        for r in new:
            store.append_recorded(r)
        got = run_facts(list(rows), list(results))
        facts[key] = merge_scaling(before, got) if merge else got  # after every run: a time limit later loses nothing
    return kept


def record(out_dir: Path, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step tp1 (one H200): TP=1 for each of TP1_RUNS at TP1_BATCHES -> facts["tp1"], Results into store."""
    measure_runs(tp1_grid(), TP1_BATCHES, on_run=_recording(TP1, store, facts))


def record_scaling(out_dir: Path, store: ResultStore, facts: dict[str, Any], *,
                   models: Sequence[Shape] | None = None, gpu_counts: Sequence[int] | None = None,
                   compared: bool | None = None) -> None:
    """The scaling runs of `scaling_part(models, gpu_counts, compared)` (all of `scaling_grid` by default; the
    SCALING_PARTS steps each record a part) on 2-8 H200s of one host at SCALING_BATCHES -> facts["tp_scaling"],
    merged onto what this command recorded before (`merge_scaling`); Results named "scaling-..." into store."""
    measure_runs(scaling_part(models, gpu_counts, compared), SCALING_BATCHES,
                 on_run=_recording(SCALING, store, facts, merge=True), step_prefix=SCALING_PREFIX)
