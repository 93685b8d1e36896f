"""Lab 07's GPU recording steps (scripts/record_reference.py calls them; the notebook never does).

Each runs what the lab's cell runs live, on the H200, and keeps it as what a machine without a GPU shows: its
Results stored as recorded, its rows in facts[KEY]. Steps `prefix` and `prefix-batch` (the counters, one request
at a time and 32 at once) are scripts/record_reference.py's own `step_prefix`.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...hardware.device import device_facts
from ...results.store import ResultStore
from . import runs, scarce, serving
from .workloads import BIG


def record_on_off(out_dir: Any, store: ResultStore, facts: dict[str, Any], models: tuple[Any, ...] = ("embedded", BIG)
                  ) -> None:
    """Step `prefix-on-off`: `runs.on_off_runs` into facts[runs.ON_OFF_KEY], its Results recorded."""
    value, results = runs.on_off_runs(models, lab="reference")
    for r in results:
        store.append_recorded(r)
    facts[runs.ON_OFF_KEY] = value
    for a in value["agreement"]:
        print(f"prefix on/off {a['model']} {a['workload']}: {a['identical']} of {a['of']} greedy outputs identical")
    for p in runs.on_off_pairs(value["runs"]):
        print(f"prefix on/off {p['model']} {p['workload']}: TTFT p50 on/off {p['ttft_p50_on_over_off']:.2f}, "
              f"total tok/s on/off {p['total_tok_s_on_over_off']:.2f}, hit rate {p['hit_rate']}")


def record_serve(out_dir: Any, store: ResultStore, facts: dict[str, Any], model: Any = BIG,
                 rates: Sequence[float] = serving.RATES, limit: int | None = None) -> None:
    """Step `prefix-serve`: `serving.serve_runs` into facts[serving.KEY], its Results recorded."""
    rows, results = serving.serve_runs(model, rates=rates, limit=limit, lab="reference",
                                       out_dir=Path(out_dir) / "prefix-serve")
    for r in results:
        store.append_recorded(r)
    facts[serving.KEY] = rows
    for r in rows:
        print(f"prefix serve {r['model']} caching {r['caching']} at {r['rate']:g} req/s: hits {r['hits']} of "
              f"{r['queries']} (simulator {r['predicted_hits']} of {r['predicted_queries']}), TTFT p50 "
              f"{r['ttft_p50_s']:.4f} s, p99 {r['ttft_p99_s']:.4f} s, {r['output_tok_s']:.0f} output tok/s")


def record_scarce(out_dir: Any, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step `prefix-scarce`: `scarce.scarce_vllm_rows` into facts[scarce.KEY], its Results recorded."""
    results: list[Any] = []
    rows = scarce.scarce_vllm_rows(lab="reference", results=results)
    for r in results:
        store.append_recorded(r)
    label = f"recorded on {device_facts().get('gpu')}, {time.strftime('%Y-%m-%d')}"
    facts[scarce.KEY] = [{**r, "provenance": label} for r in rows]
    for r in rows:
        print(f"prefix scarce: {r['verdict']}")
