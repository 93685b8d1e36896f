"""Comparisons of measurements: a flat table of Results, and whether two runs generated the same tokens."""
from __future__ import annotations

from collections.abc import Sequence
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


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Where two token lists first part: the first position whose tokens differ, or where the shorter one stops
    (None: identical). Every "same greedy tokens?" in lablib is this, request by request."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return at if at is not None or len(a) == len(b) else min(len(a), len(b))


def token_agreement(a: Result, b: Result) -> float:
    """Fraction of requests (matched by id) whose generated token ids are identical in both runs."""
    ids_b = {r.request_id: r.output_ids for r in b.requests}
    pairs = [(r.output_ids, ids_b[r.request_id]) for r in a.requests if r.request_id in ids_b]
    if not pairs or any(x is None or y is None for x, y in pairs):
        raise ValueError("token_agreement: the runs share no requests with stored output_ids. "
                         "Fix: compare two live runs of the same workload.")
    return sum(first_divergence(x, y) is None for x, y in pairs) / len(pairs)


def outputs_agree(a: Result, b: Result) -> dict[str, Any]:
    """Greedy tokens of run `a` against run `b` of the same workload (caching on against off, sdpa against eager),
    request by request: how many are identical, and where each other one first parts (None: no output ids)."""
    b_ids = {r.request_id: r.output_ids for r in b.requests}
    diverged = []
    for r in a.requests:
        x, y = r.output_ids or [], b_ids.get(r.request_id) or []
        at = first_divergence(x, y)
        if at is not None or r.output_ids is None:
            diverged.append({"request_id": r.request_id, "first_divergence": at, "output_tokens": len(x)})
    return {"model": a.model.get("name"), "workload": a.workload.get("name"),
            "identical": len(a.requests) - len(diverged), "of": len(a.requests), "diverged": diverged}
