"""Lab 10's Checks cell: the road this machine ran and showed, and the advice, asserted on the lab's object.

What ran here answered every request (a batch-1 rung at real size: its stated subset); every rung shown but not
measured here says where and when it was recorded; every skipped rung says why; the road holds a rung of every lab that adds one; vLLM's rung beats every
HF rung only where vLLM ran here (`Checks.live`); every setting advised names why and what it rests on.
"""
from __future__ import annotations

from ...config import lab_id
from ...session import Checks
from ..journey import NAIVE_REAL_SIZE, labs_on_road, vllm_gain
from .lab import JourneyLab
from .plan import advise


def checks(lab: JourneyLab) -> None:
    """Lab 10's Checks cell, on the road `lab.run` made and the goals `lab.advise` was asked about. Prints what ran
    and what did not (and returns nothing, so the cell shows it once)."""
    lab.require_all()
    results, shown, skipped = lab.results, lab.shown, lab.skipped
    c = Checks(lab_id("10"))
    live = [r for r in results if r.provenance == "live" and r.workload.get("name") == "journey"]
    batch = max(lab.batch_sizes)
    hf = {"hf-naive", *([f"hf-static-b{batch}"] if batch > 1 else [])}
    c.that("naive generate and static batching ran here, every request answered (a rung's stated subset, all of it)",
           hf <= {r.step for r in live} and all(
               r.summary["requests"] == (min(lab.requests, NAIVE_REAL_SIZE) if r.config.get("subset") else lab.requests)
               for r in live))
    c.that("every rung shown that was not measured here says where and when it was recorded",
           all("recorded on" in r.label for r in shown if r.provenance == "recorded"))
    c.that("every rung this machine skipped says why", all(s["why"] for s in skipped))
    on_road = labs_on_road(shown, lab.batch_sizes)
    c.that("the road holds a rung of every lab that adds one, live or recorded",
           on_road >= {"01", "02", "03", "05", "06", "07", "08"}, on_road)
    c.live(vllm_gain(results), "vLLM's rung out-runs every HF rung on the journey here", lambda gain: gain > 1)
    c.that("every setting advised names why and what it rests on",
           all(r["why"] and r["source"] for g in lab.goals for r in advise(g)))
    c.that("under load, no request's predicted TPOT beats one request decoding alone (rounding aside)",
           all(u["tpot_ms"]["p50"] >= u["alone_tpot_ms"] * (1 - 1e-9) for u in lab.loads.values()))
    c.live(lab.checked, "the advised engine answered every request sent under its load, and TPOT was measured",
           lambda got: all(g["answered"] == g["requests"] and not g["failures"] and g["measured"]["tpot_ms"]["p90"]
                           for g in got.values()), lambda got: [g["verdict"] for g in got.values()])
    c.done()
