"""Comparisons of measurements: a flat table of Results, and whether two runs generated the same tokens."""
from __future__ import annotations

from typing import Any

from .record import Result


def table(results: list[Result]) -> list[dict[str, Any]]:
    """One flat row per Result (for pandas.DataFrame or a printed table)."""
    rows = []
    for r in results:
        s = r.summary
        rows.append({
            "step": r.step, "engine": r.engine, "provenance": r.provenance, "requests": s["requests"],
            "output_tok_s": s["output_tok_s"], "total_tok_s": s["total_tok_s"], "requests_s": s["requests_s"],
            "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p99_s": s["ttft_s"]["p99"],
            "tpot_p50_s": s["tpot_s"]["p50"], "e2e_p99_s": s["e2e_s"]["p99"],
            "peak_mem_bytes": r.memory.get("peak_bytes"), "mbu": r.roofline.get("mbu"),
            "hardware": r.hardware.get("gpu") or "CPU"})
    return rows


def token_agreement(a: Result, b: Result) -> float:
    """Fraction of requests (matched by id) whose generated token ids are identical in both runs."""
    ids_b = {r.request_id: r.output_ids for r in b.requests}
    pairs = [(r.output_ids, ids_b[r.request_id]) for r in a.requests if r.request_id in ids_b]
    if not pairs or any(x is None or y is None for x, y in pairs):
        raise ValueError("token_agreement: the runs share no requests with stored output_ids. "
                         "Fix: compare two live runs of the same workload.")
    return sum(x == y for x, y in pairs) / len(pairs)
