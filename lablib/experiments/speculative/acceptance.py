"""Lab 08's acceptance, counted: the greedy loops' steps as vLLM's counters, beside the i.i.d. formula.

What is counted follows vLLM 0.26 (`spec_decode_num_drafts`, `_num_draft_tokens`, `_num_accepted_tokens`,
`_num_accepted_tokens_per_pos`), so `lablib.mechanisms.speculative` reads these counters exactly as it
reads vLLM's: `estimate_alpha` gives alpha, `acceptance(alpha, k)` what the i.i.d. model predicts.
`spec_counters` sums a run's steps, `acceptance_report` sets them beside the formula, `counters_consistent`
says whether four counters hang together (for the loop's and for vLLM's), and `drafter_acceptance` runs
both drafters (the draft model, the EAGLE head) on the same prompts, counted alike.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import math
import multiprocessing
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ... import validate
from ...hardware.device import torch_threads
from ...mechanisms.speculative import SpecCounters, acceptance, estimate_alpha
from ...workloads import load_workload
from .loops import (
    SpeculativeRun,
    greedy,
    greedy_eagle,
    greedy_speculative,
    load_eagle,
    load_pair,
    provenance,
)

_threads = torch_threads  # torch on n threads, restored after (lablib.hardware.device)


def spec_counters(runs: Sequence[SpeculativeRun]) -> SpecCounters:
    """vLLM's four counters summed over runs of one k: drafts, draft tokens, accepted, accepted per position."""
    ks = sorted({r.k for r in runs})
    if len(ks) != 1:
        raise validate.refuse("spec_counters", "runs", f"{len(runs)} runs with k in {ks}", "runs of one k",
                              "count each k separately.")
    k, steps = ks[0], [s for r in runs for s in r.steps]
    per_pos = tuple(sum(i < len(s.accepted_mask) and s.accepted_mask[i] for s in steps) for i in range(k))
    # a model drafter drafts k every step; an n-gram drafter up to k (`ngram.replay` keeps only steps that drafted)
    return SpecCounters(len(steps), sum(len(s.drafted) for s in steps), sum(s.accepted for s in steps), per_pos)


@dataclass(frozen=True)
class AcceptanceReport:
    """Measured acceptance next to the i.i.d. formula's prediction at the alpha estimated from the same counters.

    The formula assumes every draft token is accepted with the same alpha, independently. Real text
    does not: acceptance clusters. An easy continuation (a closing bracket, the rest of a keyword, a
    repeated identifier) is accepted at every position, a hard one fails at the first, so given that
    position i-1 was accepted, position i is more likely to be (`conditional_per_position` rises with i
    where the model has a constant alpha). The fitted alpha then underestimates the deep positions
    and overestimates the first; the mean length, which weighs them all, can still land close.
    `length_stderr` and `stderr_per_position` (binomial, sqrt(p(1-p)/num_drafts)) say which gaps are
    beyond sampling noise (over prompts and steps: the decoding itself is deterministic).
    """

    k: int  # draft tokens per step
    alpha: float  # estimate_alpha(counters): the per-position maximum-likelihood estimate
    counters: SpecCounters  # the measured counters (vLLM's definitions)
    measured_length: float  # 1 + accepted / drafts
    length_stderr: float  # its standard error: std of the accepted count per step / sqrt(num_drafts)
    predicted_length: float  # (1 - alpha^(k+1)) / (1 - alpha)
    measured_per_position: tuple[float, ...]  # accepted_per_pos[i] / num_drafts, i = 1..k
    predicted_per_position: tuple[float, ...]  # alpha^i
    stderr_per_position: tuple[float, ...]  # binomial standard error of each measured rate
    conditional_per_position: tuple[float | None, ...]  # P(position i accepted | i-1 accepted): alpha for i.i.d.

    @property
    def gap_per_position(self) -> tuple[float, ...]:
        return tuple(m - p for m, p in zip(self.measured_per_position, self.predicted_per_position))

    @property
    def length_gap(self) -> float:
        return self.measured_length - self.predicted_length

    def row(self) -> dict[str, Any]:
        """One flat dict for a table: the counters, the lengths and every per-position list."""
        c, names = self.counters, ("measured", "predicted", "gap", "stderr", "conditional")
        return {"k": self.k, "alpha": self.alpha, "num_drafts": c.num_drafts, "num_draft_tokens": c.num_draft_tokens,
                "num_accepted_tokens": c.num_accepted_tokens, "measured_length": self.measured_length,
                "length_stderr": self.length_stderr, "predicted_length": self.predicted_length, "length_gap": self.length_gap,
                **{f"{n}_per_position": list(getattr(self, f"{n}_per_position")) for n in names}}


def acceptance_report(runs: Sequence[SpeculativeRun]) -> AcceptanceReport:
    """Counters from the runs, alpha from the counters, and the formula's acceptance at that alpha beside them."""
    c = spec_counters(runs)
    k, alpha = len(c.accepted_per_pos), estimate_alpha(c)
    predicted = acceptance(alpha, k)
    rates = c.per_position_rates
    prev = (c.num_drafts, *c.accepted_per_pos[:-1])
    counts = [s.accepted for r in runs for s in r.steps]
    stderr = statistics.pstdev(counts) / math.sqrt(len(counts))
    return AcceptanceReport(
        k, alpha, c, c.mean_acceptance_length, stderr, float(predicted.mean_acceptance_length), rates,
        tuple(float(p) for p in predicted.per_position), tuple(math.sqrt(p * (1 - p) / c.num_drafts) for p in rates),
        tuple(a / b if b else None for a, b in zip(c.accepted_per_pos, prev)))


def counters_consistent(c: SpecCounters, k: int, every_draft_k: bool = True) -> tuple[bool, str]:
    """Whether four counters hang together as the formula reads them, and if not, what breaks.

    Every draft has k tokens (a model drafter: num_draft_tokens = k x num_drafts; an n-gram drafter may
    propose fewer, so only <=), accepted <= drafted, 1 <= mean acceptance length <= k + 1, and, when
    per-position counts are there, k of them, non-increasing (position i needs i - 1), summing to accepted.
    """
    broken = []
    if every_draft_k and c.num_draft_tokens != k * c.num_drafts:
        broken.append(f"num_draft_tokens {c.num_draft_tokens} != k x num_drafts = {k * c.num_drafts}")
    if c.num_draft_tokens > k * c.num_drafts:
        broken.append(f"num_draft_tokens {c.num_draft_tokens} > k x num_drafts = {k * c.num_drafts}")
    if not 1 <= c.mean_acceptance_length <= k + 1:
        broken.append(f"mean acceptance length {c.mean_acceptance_length:.3f} outside [1, {k + 1}]")
    pos = c.accepted_per_pos
    if pos is not None:
        if len(pos) != k:
            broken.append(f"{len(pos)} per-position counts for k={k}")
        if any(b > a for a, b in itertools.pairwise(pos)):
            broken.append(f"per-position counts {list(pos)} increase")
    return not broken, "; ".join(broken) or "consistent"


def length_gap_stderr(ref: dict[str, Any], num_drafts: int) -> float:
    """The standard error of the gap between a loop's mean acceptance length (`ref`: an `AcceptanceReport.row()`)
    and another count of the same drafting over `num_drafts` drafts (vLLM's): the loop's own standard error and the
    loop's per-step spread over sqrt(num_drafts), since the other count's per-step counts are not kept."""
    spread = ref["length_stderr"] * math.sqrt(ref["num_drafts"])  # the loop's per-step std of accepted counts
    return math.sqrt(ref["length_stderr"] ** 2 + spread**2 / num_drafts)


MODEL_DRAFTERS = ("draft_model", "eagle")  # vLLM's names of the drafters that run a forward per draft token

def drafter_acceptance(drafters: Sequence[str] = MODEL_DRAFTERS, n_prompts: int = 8, max_new_tokens: int = 32,
                       ks: Sequence[int] = (2, 4), threads: int = 1, pair: tuple[Any, Any, Any] | None = None,
                       head: Any = None, workers: int = 1) -> list[dict[str, Any]]:
    """Each drafter's greedy loop on the same journey prompts, per k, counted alike (vLLM's definitions).

    "draft_model" is the embedded draft in `greedy_speculative`, "eagle" the EAGLE head (`head`, by default the
    shipped one) in `greedy_eagle`. A row per drafter and k: `AcceptanceReport.row()` (mean acceptance length and
    its standard error, the per-position rates, alpha and the formula's length at it), whether every prompt's
    tokens equal plain `greedy`'s, and whether the counters hang together (`counters_consistent`). Greedy and
    deterministic: the same prompts give the same counts on any CPU, up to float32 near-ties.

    `workers` > 1 splits the prompts over that many spawned processes of `threads` torch threads each (the shipped
    models only: not with `pair` or `head`). Each prompt is decoded as it would be alone, so the rows are the same
    as one process's; on a 16-core GPU host it takes 64 prompts x 64 tokens x 2 drafters x 2 k from about 2
    minutes to what its slowest share takes.
    """
    owner = "drafter_acceptance"
    drafters = list(drafters)
    if not drafters:
        raise validate.refuse(owner, "drafters", drafters, f"one or more of {MODEL_DRAFTERS}", "e.g. ('eagle',).")
    for d in drafters:
        validate.choice(owner, "drafters", d, MODEL_DRAFTERS)
    ks = validate.integers(owner, "ks", ks, "draft lengths, e.g. (2, 4).")
    validate.integer(owner, "n_prompts", n_prompts, "journey prompts, e.g. 8.", 1, 64)
    validate.integer(owner, "max_new_tokens", max_new_tokens, "new tokens per prompt, e.g. 32.")
    validate.integer(owner, "workers", workers, "processes to split the prompts over, e.g. 1 (this one) or 8.", 1, 64)
    if workers > 1 and (pair is not None or head is not None):
        raise validate.refuse(owner, "workers", workers, "1 when `pair` or `head` is given (other processes load "
                              "the shipped models, not these)", "workers=1, or leave pair and head out.")
    workers = min(workers, n_prompts)
    if workers == 1:
        plain, runs = _prompt_runs(drafters, ks, list(range(n_prompts)), n_prompts, max_new_tokens, threads, pair, head)
    else:
        plain, runs = _parallel_runs(drafters, ks, n_prompts, max_new_tokens, threads, workers)
    out = []
    for d in drafters:
        for k in ks:
            rep = acceptance_report(runs[d, k])
            out.append({"drafter": d, **rep.row(), "identical_to_greedy": all(
                r.tokens == g for r, g in zip(runs[d, k], plain)), "counters_consistent": counters_consistent(
                rep.counters, k)[0], "prompts": n_prompts, "max_new_tokens": max_new_tokens,
                "provenance": provenance(threads) + (f", {workers} processes" if workers > 1 else "")})
    return out


def _prompt_runs(drafters: Sequence[str], ks: Sequence[int], indices: Sequence[int], n_prompts: int,
                 max_new_tokens: int, threads: int, pair: Any = None, head: Any = None
                 ) -> tuple[list[list[int]], dict[tuple[str, int], list[SpeculativeRun]]]:
    """Plain greedy's tokens and every drafter x k loop on the journey prompts at `indices` (of the first
    n_prompts), in that order: one process's share of `drafter_acceptance`."""
    with _threads(threads):
        target, draft, tok = pair or load_pair()
        if head is None and "eagle" in drafters:
            head = load_eagle(target)
        every = load_workload("journey", limit=n_prompts).prompt_ids(tok)
        prompts = [every[i] for i in indices]
        plain = [greedy(target, p, max_new_tokens) for p in prompts]
        runs = {(d, k): [greedy_eagle(target, head, p, max_new_tokens, k) if d == "eagle" else
                         greedy_speculative(target, draft, p, max_new_tokens, k) for p in prompts]
                for d in drafters for k in ks}
    return plain, runs


def _parallel_runs(drafters: Sequence[str], ks: Sequence[int], n_prompts: int, max_new_tokens: int, threads: int,
                   workers: int) -> tuple[list[list[int]], dict[tuple[str, int], list[SpeculativeRun]]]:
    """`_prompt_runs` over `workers` spawned processes, prompt i in share i % workers, put back in prompt order."""
    shares = [list(range(w, n_prompts, workers)) for w in range(workers)]
    ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold torch's threads or CUDA
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        got = list(pool.map(_prompt_runs, *zip(*[(drafters, ks, share, n_prompts, max_new_tokens, threads)
                                                 for share in shares])))
    plain: list[Any] = [None] * n_prompts
    runs: dict[tuple[str, int], list[Any]] = {(d, k): [None] * n_prompts for d in drafters for k in ks}
    for share, (p, r) in zip(shares, got):
        for j, i in enumerate(share):
            plain[i] = p[j]
            for key in runs:
                runs[key][i] = r[key][j]
    return plain, runs


DRAFTER_NAMES = {"draft_model": "draft model", "eagle": "EAGLE head"}


def drafter_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`drafter_acceptance`'s rows, the columns a reader compares: length, per position, alpha, greedy's tokens."""
    return [{"drafter": DRAFTER_NAMES[r["drafter"]], "k": r["k"], "drafts": r["num_drafts"],
             "accepted": r["num_accepted_tokens"], "mean_length": r["measured_length"], "stderr": r["length_stderr"],
             "per_position": [round(x, 3) for x in r["measured_per_position"]], "alpha": r["alpha"],
             "formula_length": r["predicted_length"], "identical_to_greedy": r["identical_to_greedy"],
             "counters_consistent": r["counters_consistent"]} for r in rows]


def drafter_lines(rows: Sequence[dict[str, Any]]) -> str:
    """One line per drafter and k: mean acceptance length and per-position acceptance, measured here."""
    head = rows[0] if rows else {}
    lines = [f"{head.get('prompts')} journey prompts x {head.get('max_new_tokens')} new tokens, "
             + str(head.get("provenance"))]
    for r in drafter_table(rows):
        lines.append(f"{r['drafter']}, k={r['k']}: mean acceptance length {r['mean_length']:.3f} +/- {r['stderr']:.3f}"
                     f", per position {', '.join(f'{x:.2f}' for x in r['per_position'])} (alpha {r['alpha']:.3f}); "
                     f"tokens identical to greedy: {r['identical_to_greedy']}")
    return "\n".join(lines)
