"""Lab 10's latency model replayed on every server the H200 recorded under load, predicted against measured.

`check` runs the advice on a GPU; this needs none. Each recorded run of vLLM's OpenAI server under Poisson arrivals
(lab 05's journey at five rates, lab 07's shared-prefix set with caching off and on at four, `check`'s three goals)
kept every request's arrival, prompt and output length. `replay` sends those very requests, at those very moments,
through the model `load.under_load` uses (lab 04's scheduler simulator, each step priced by `load.StepCost`) on the
run's own engine (weights, max_num_seqs, vLLM's server token budget) and sets the per-request TPOT it predicts beside
the one measured, at p50 and p90. No run here was used to fit the model: its prices come from lab 06's and lab 07's
offline runs (`latency`), so every row is a test of it.

What the replay cannot see: a prompt is counted cached when it shares whole blocks with the run's shared prefix and
is not the run's first, even where it arrived before the first one's prefill had written them (a burst).
"""
from __future__ import annotations

import re
import statistics
from typing import Any

from ...results.record import Result
from ...results.reference import load_reference, recorded_facts, reference_steps
from ...stats import percentile
from .latency import BLOCK
from .load import SERVER_MAX_NUM_BATCHED_TOKENS, StepCost, replay
from .plan import Goal

PREFIXES = ("serve-rate-", "prefix-serve-", "advisor-check-")  # lab 05's, lab 07's and check's recorded servers
SERVER_MAX_NUM_SEQS = 1024  # vLLM 0.26's server default on a GPU of 70 GiB or more (engine/arg_utils.py)
TARGET = 0.10  # the advisor's aim (`check.TARGET`): TPOT p90 within 10% of the measured


def served_steps() -> list[str]:
    """The recorded server runs under Poisson arrivals (not the bursts: every request at once, rate inf)."""
    return [s for s in reference_steps() if s.startswith(PREFIXES) and not s.endswith("-inf")]


def shared_prefix(r: Result) -> int:
    """Tokens every prompt of the run shares: lab 07's sets name it (shared-prefix-512), a goal's is in the recorded
    facts of `check` (matched by its rate); 0 otherwise."""
    name = r.workload.get("name", "")
    if m := re.search(r"shared-prefix-(\d+)", name):
        return int(m.group(1))
    if name == "advisor-goal":
        goals = recorded_facts("advisor_check", "advisor-check").get("goals", {})
        return next((g["goal"]["shared_prefix_tokens"] for g in goals.values()
                     if g.get("rate_rps") and abs(g["rate_rps"] - r.config.get("rate", -1)) < 1e-3), 0)
    return 0


def scheme_of(r: Result) -> str:
    """The run's weights: fp8 where the server was started with --quantization fp8, else bf16."""
    args = list(r.config.get("extra_args") or [])
    return "fp8" if "--quantization" in args and args[args.index("--quantization") + 1] == "fp8" else "bf16"


def tpot_ms(records: list[Any]) -> list[float]:
    """Each request's TPOT (ms): its first to last token over the gaps between them."""
    return [(q.last_token - q.first_token) / (q.output_tokens - 1) * 1e3 for q in records
            if q.output_tokens > 1 and q.first_token is not None and q.last_token is not None]


def replay_run(r: Result) -> dict[str, Any]:
    """One recorded server run replayed through the model: its requests, arrivals and engine; TPOT p50/p90 measured
    and predicted (ms) and the prediction's error (predicted / measured - 1)."""
    reqs = sorted(r.requests, key=lambda q: q.arrival)
    prompts, outs = [q.prompt_tokens for q in reqs], [q.output_tokens for q in reqs]
    shared = shared_prefix(r) if r.config.get("enable_prefix_caching") else 0
    goal = Goal(model="llama-3.1-8b", concurrency=1, prompt_tokens=round(statistics.mean(prompts)),
                output_tokens=max(2, round(statistics.mean(outs))))  # the decode step's mean context
    scheme = scheme_of(r)
    cost = StepCost(goal, scheme, 1, "auto")
    cached = [0 if i == 0 else min(shared // BLOCK * BLOCK, (p - 1) // BLOCK * BLOCK) for i, p in enumerate(prompts)]
    t0 = reqs[0].arrival
    predicted = replay(cost, list(zip(prompts, cached, outs)), [q.arrival - t0 for q in reqs],
                       r.config.get("max_num_seqs") or SERVER_MAX_NUM_SEQS, SERVER_MAX_NUM_BATCHED_TOKENS)
    measured, model = tpot_ms(reqs), tpot_ms(predicted)
    row = {"step": r.step, "lab": r.lab, "weights": scheme, "rate_rps": r.config.get("rate"), "requests": len(reqs),
           "cached_prefix": shared}
    for q in (50, 90):
        m, p = percentile(measured, q), percentile(model, q)
        row.update({f"measured_p{q}_ms": m, f"predicted_p{q}_ms": p, f"error_p{q}": p / m - 1})
    row["within_target"] = abs(row["error_p90"]) <= TARGET
    row["provenance"] = r.label
    return row


def replay_all() -> list[dict[str, Any]]:
    """`replay_run` on every recorded server run (`served_steps`), in the recording's order."""
    return [replay_run(r) for r in load_reference(*served_steps())]


def summary_line(rows: list[dict[str, Any]]) -> str:
    """How often the model's TPOT p90 was within the advisor's aim, and its largest miss."""
    worst = max(rows, key=lambda r: abs(r["error_p90"]))
    within = sum(r["within_target"] for r in rows)
    return (f"TPOT p90 predicted within {TARGET:.0%} of the measured on {within} of {len(rows)} recorded servers "
            f"(median error {statistics.median(r['error_p90'] for r in rows):+.1%}); the largest miss: {worst['step']} "
            f"({worst['requests']} requests, {worst['error_p90']:+.1%}) [replayed here: the H200's recorded requests "
            "through lab 04's simulator, priced by lab 06's and 07's offline runs]")
