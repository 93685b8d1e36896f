"""Lab 09's recording steps, for a GPU session (scripts/record_reference.py), and what is recorded yet.

`record` is step tp1 (one H200: TP=1 for TP1_RUNS, facts["tp1"]); `record_scaling` step tp-scaling (several H200s of
one host: SCALING_RUNS, facts["tp_scaling"]). `remaining_runs` says which of the lab's GPU runs a recording holds and
what the rest need.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from ..hardware.device import device_facts
from ..results.record import Result
from ..results.store import ResultStore
from .parallel_runs import LAB, OUTPUT_LEN, PROMPT_LEN, _too_few, measure, not_measured

TP1_RUNS = (("llama-3.1-8b", "bf16"), ("llama-3.1-70b", "fp8"))  # the baseline: what one H200 can hold
SCALING_RUNS = (("llama-3.1-8b", "bf16", (1, 2, 4)), ("llama-3.1-70b", "bf16", (2, 4)),
                ("llama-3.1-70b", "fp8", (1, 2, 4)))  # what the multi-GPU machines are for


def remaining_runs(facts_keys: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The lab's GPU runs and whether they are recorded yet; what is missing says what it needs."""
    if facts_keys is None:
        from ..results.reference import reference_facts

        facts_keys = tuple(reference_facts())
    rows = [{"run": f"TP=1 baseline: {m} {s}, batch 1/8/64", "needs": "1 H200 (nvidia-h200)", "step": "tp1",
             "status": "recorded" if "tp1" in facts_keys else "not run yet"} for m, s in TP1_RUNS]
    for m, s, ts in SCALING_RUNS:
        for t in ts:
            rows.append({"run": f"TP={t}{' (the same host, as the baseline)' if t == 1 else ''}: {m} {s}, batch 1 and 64",
                         "needs": f"{max(t, 2)} H200s of one host (nvidia-h200-x{max(t, 2)})", "step": "tp-scaling",
                         "status": "recorded" if "tp_scaling" in facts_keys else "not run yet"})
    for what in ("custom all-reduce vs NCCL (disable_custom_all_reduce=True) at TP=2 and 4",
                 "pipeline parallelism (pipeline_parallel_size=2, 4) at the same GPU counts"):
        rows.append({"run": what, "needs": "2-4 H200s, and a VLLMConfig field for the knob (lablib/config.py)",
                     "step": "(none yet)", "status": "not run yet"})
    return rows



def _record(key: str, rows: list[dict[str, Any]], results: list[Result], store: ResultStore,
            facts: dict[str, Any]) -> None:
    for r in results:
        store.append(dataclasses.replace(r, provenance="recorded"))
    facts[key] = {"rows": rows, "gpu": device_facts()["gpu"], "date": time.strftime("%Y-%m-%d"),
                  "prompt_len": PROMPT_LEN, "output_len": OUTPUT_LEN}


def record(out_dir: Path, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step tp1 (one H200): TP=1 for each of TP1_RUNS at batch 1, 8, 64 -> facts["tp1"], Results into store."""
    rows, results = [], []
    for m, s in TP1_RUNS:
        try:
            got, res = measure(m, s, 1, (1, 8, 64), lab=LAB)
        except Exception as e:  # one run failing keeps the other's (the row says why)
            got, res = [not_measured(m, s, 1, b, f"failed: {type(e).__name__}: {e}"[:400]) for b in (1, 8, 64)], []
        rows += got
        results += res
        _record("tp1", rows, res, store, facts)  # kept as each run ends: a time limit later loses nothing made


def record_scaling(out_dir: Path, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step tp-scaling (2-8 H200s of one host): SCALING_RUNS at batch 1 and 64 -> facts["tp_scaling"]."""
    rows, results, machine = [], [], device_facts()
    for m, s, ts in SCALING_RUNS:
        for t in ts:
            short = _too_few(t, machine)
            if short:
                rows += [not_measured(m, s, t, b, short) for b in (1, 64)]
                continue
            got, res = measure(m, s, t, (1, 64), lab=LAB)
            rows += got
            results += res
    _record("tp_scaling", rows, results, store, facts)
