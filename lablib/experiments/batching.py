"""Lab 01's reading of its own runs: what one decode step costs against batch size, where the time went, and the Checks.

A decode step costs a fixed part, paid once per step whatever the batch (reading every weight, launching
the kernels, Python), plus a part per sequence in the batch (its share of the FLOPs and its KV reads):

    step time(B) = fixed + per_sequence x B

`step_costs` fits that line to the measured time per output token (TPOT p50: in a static batch every member
waits for the same steps, so a member's TPOT is the batch's step time). Batching divides the fixed part
among B sequences, so B sequences cost less than B steps of one, and throughput can gain at most
(fixed + per_sequence) / per_sequence however large the batch. On a GPU the fixed part dominates (the
weights stream from HBM once per step: the memory wall) and the gain is large; on a CPU the per-sequence
part is compute and as large as the fixed part, so the gain stays near 2x. The fit says which this machine is.

`phase_shares` reads where each request's time went. Summed over requests, a static batch's prefill counts
once per member: every member waits while the whole batch's prompts (padded to the longest) are prefilled
before any of them decodes, so the prefill share grows with the batch size.
"""
from __future__ import annotations

import re

from typing import Any

from ..results.compare import token_agreement
from ..results.record import Result
from ..config import lab_id
from ..session import Checks


def batch_size(r: Result) -> int:
    """The batch size a journey Result ran with (naive generate is batch 1)."""
    return int(r.config.get("batch_size") or 1)


LAB01_RUNG = re.compile(r"hf-naive|hf-static-b\d+")  # journey.hf_steps' names for lab 01's own rungs


def hf_runs(results: list[Result]) -> list[Result]:
    """Lab 01's HF rungs (naive and static batching, one attention kernel): the runs whose step is one fixed
    batch. On a GPU the journey also runs vLLM, whose batch changes every step: it has no place on this line;
    later labs' HF rungs (another attention kernel, speculative decoding) change more than the batch."""
    return [r for r in results if r.engine in ("hf-naive", "hf-static") and LAB01_RUNG.fullmatch(r.step)]


def step_costs(results: list[Result]) -> dict[str, Any]:
    """Fit step time(B) = fixed + per_sequence x B (least squares) to TPOT p50 against batch size.

    Returns the fit (seconds), the largest gain it allows ((fixed + per_sequence) / per_sequence, or None when
    the per-sequence part is not positive), and per run: B, the step time, and the step time over B naive steps
    (below 1: the batch shares the step)."""
    results = hf_runs(results)
    pts = [(batch_size(r), r.summary["tpot_s"]["p50"]) for r in results if r.summary["tpot_s"]["p50"]]
    if len({b for b, _ in pts}) < 2:
        raise ValueError(f"step_costs: need runs at two batch sizes or more, got {sorted({b for b, _ in pts})}; "
                         "Fix: pass naive and static runs, e.g. run_journey(batch_sizes=[1, 4, 16]).")
    n = len(pts)
    mb, mt = sum(b for b, _ in pts) / n, sum(t for _, t in pts) / n
    per_seq = sum((b - mb) * (t - mt) for b, t in pts) / sum((b - mb) ** 2 for b, _ in pts)
    fixed = mt - per_seq * mb
    one = next((r.summary["tpot_s"]["p50"] for r in results if batch_size(r) == 1), fixed + per_seq)
    rows = [{"step": r.step, "batch": batch_size(r), "step_ms": r.summary["tpot_s"]["p50"] * 1e3,
             "vs_B_single_steps": r.summary["tpot_s"]["p50"] / (batch_size(r) * one)} for r in results]
    bounded = per_seq > 0 and fixed > 0  # a fixed part <= 0 is noise the fit cannot read: no bound claimed
    return {"fixed_s": fixed, "per_sequence_s": per_seq,
            "max_gain": (fixed + per_seq) / per_seq if bounded else None, "single_step_s": one, "rows": rows}


def phase_shares(results: list[Result]) -> list[dict[str, Any]]:
    """Per run: prefill and decode seconds summed over its requests, and prefill's share of their sum."""
    out = []
    for r in results:
        p, d = r.summary.get("prefill_s") or 0.0, r.summary.get("decode_s") or 0.0
        out.append({"step": r.step, "batch": batch_size(r), "prefill_s": p, "decode_s": d,
                    "prefill_share": p / (p + d) if p + d else None})
    return out


def lines(results: list[Result], label: str) -> str:
    """What this run measured, as the lab's "What you should see" prints it."""
    costs = step_costs(results)
    gain = costs["max_gain"]
    out = [", ".join(f"{r.step} {r.summary['output_tok_s']:,.0f} tok/s" for r in results) + f" [{label}]",
           f"one decode step = {costs['fixed_s'] * 1e3:.2f} ms fixed + {costs['per_sequence_s'] * 1e3:.2f} ms per "
           f"sequence (fit to TPOT p50), so batching can gain at most "
           + (f"{gain:.1f}x" if gain else "by a factor this fit cannot bound") + " in decode throughput",
           "prefill share of the time summed over requests: "
           + ", ".join(f"{s['step']} {s['prefill_share']:.0%}" for s in phase_shares(results) if s["prefill_share"] is not None)]
    latency = e2e_line(results)
    return "\n".join(out + ([latency] if latency else []))


def e2e_line(results: list[Result]) -> str | None:
    """Median end-to-end latency per HF step against naive's, the direction read from the numbers (None without a
    naive run): a batch finishes the set sooner, but each request waits for its batch's longest member."""
    hf = hf_runs(results)
    naive = next((r for r in hf if r.step == "hf-naive"), None)
    if naive is None:
        return None
    base = naive.summary["e2e_s"]["p50"]
    static = [r for r in hf if r.step != "hf-naive"]
    below = [r.step for r in static if r.summary["e2e_s"]["p50"] < base]
    above = [r.step for r in static if r.summary["e2e_s"]["p50"] >= base]
    said = "; ".join(part for part in (
        f"below naive's at {', '.join(below)} (the whole set finishes sooner)" if below else "",
        f"at or above it at {', '.join(above)} (each request waits for its batch's longest)" if above else "") if part)
    return ("median end-to-end latency: " + ", ".join(f"{r.step} {r.summary['e2e_s']['p50']:.2f} s" for r in hf)
            + (f"; {said}" if said else ""))


def checks(results: list[Result]) -> None:
    """Lab 01's Checks cell (prints what passed; raises on the first claim this run breaks): batching shares the
    decode step, wins throughput, keeps the tokens, and a static batch waits for its longest member."""
    hf = hf_runs(results)
    steps = {r.step for r in hf}
    if "hf-naive" not in steps or not any(s.startswith("hf-static") for s in steps):
        raise ValueError(f"batching.checks: needs the hf-naive run and at least one hf-static-b<N> run, got "
                         f"{sorted(steps)}; Fix: run_journey(batch_sizes=[1, 4, 16]) and pass all its Results.")
    naive = next(r for r in hf if r.step == "hf-naive")
    largest = max((r for r in hf if r.step.startswith("hf-static")), key=batch_size)
    best = max(hf, key=lambda r: r.summary["output_tok_s"])
    step = next(row for row in step_costs(results)["rows"] if row["step"] == largest.step)
    c = Checks(lab_id("01"))
    c.that(f"a decode step of {step['batch']} sequences costs less than {step['batch']} steps of one",
           step["vs_B_single_steps"] < 1, f"{step['step_ms']:.2f} ms = {step['vs_B_single_steps']:.2f} x "
           f"{step['batch']} single steps")
    c.that("some batch size beats naive generate on throughput", best.step != "hf-naive",
           f"{best.step}: {best.summary['output_tok_s'] / naive.summary['output_tok_s']:.2f}x naive")
    # Padding is masked, so batching must not change greedy tokens. In float32 (the CPU default) it does not; in
    # bfloat16 (the GPU default) the padded batch rounds differently and near-ties flip.
    need = 0.9 if naive.engine_facts["dtype"] == "float32" else 0.6
    c.that(f"batching keeps the greedy tokens of at least {need:.0%} of requests",
           token_agreement(naive, largest) >= need, naive.engine_facts["dtype"])
    c.that(f"static batching costs a single user latency: median end-to-end at batch {batch_size(largest)} is above "
           "naive's", largest.summary["e2e_s"]["p50"] > naive.summary["e2e_s"]["p50"],
           f"{largest.summary['e2e_s']['p50']:.2f} s against {naive.summary['e2e_s']['p50']:.2f} s")
    c.done()
