"""Speculative decoding: how many tokens a verify step yields, what it costs, and where it stops paying.

A cheap drafter (a small model, an n-gram lookup in the prompt, an EAGLE head) proposes k tokens; the
target scores all k+1 positions in ONE forward pass and keeps the longest prefix it agrees with. The
step always yields one more token than it accepted: at the first rejected position the target's own
distribution is already computed, so it supplies the correction, and if all k are accepted it supplies
a bonus token after them. A step never yields fewer tokens than plain decoding (one), at most k+1.

The output distribution is unchanged (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023): draft token x, drawn from q, is kept with probability
min(1, p(x)/q(x)); on rejection the token is drawn from max(0, p - q), renormalised. That is rejection
sampling, and every emitted token is distributed exactly as p. Under greedy decoding it reduces to "keep
the draft token iff it is the target's argmax", so the output is the target's greedy output (vLLM's
batched verify pass can still flip near-tied argmaxes: lossless in the maths, not bit-identical).

The model here is Leviathan's: each draft token is accepted with the same probability alpha,
independently, and the step stops at the first rejection. Then P(position i accepted) = alpha^i,
P(exactly j accepted) = alpha^j (1 - alpha) for j < k and alpha^k for j = k, and the tokens per step are

    E = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)      (= k + 1 at alpha = 1)

vLLM 0.26 counts `spec_decode_num_drafts`, `_num_draft_tokens`, `_num_accepted_tokens` and
`_num_accepted_tokens_per_pos`; its "mean acceptance length" is 1 + accepted / drafts, which is E, and
its "acceptance rate" is accepted / draft tokens, which is (E - 1) / k: the mean of alpha^i over the k
positions, smaller than alpha. `estimate_alpha` turns those counters back into alpha.

Cost. With c = (one draft forward) / (one target forward) at the batch in question, a step costs
k c + verify_cost target steps, verify_cost being the verify pass over k+1 positions: about 1 while the
target is memory-bound (the weights are streamed once whatever the positions), up to k+1 once it is
compute-bound. Speedup = E / (k c + verify_cost). A draft accepted a lot can still lose: this project's
embedded pair on vLLM (H200, batch 1, k=4) reached acceptance length 2.86 yet ran at 0.61x, because
both tiny models are launch-overhead-bound, so a draft step costs about a target step (c ~ 1; 2.86 / 5 =
0.57x; `implied_draft_cost` reads c = 0.92 off the measurement). An n-gram drafter runs no forward at
all (a lookup on the CPU), so c ~ 0 and any acceptance pays while verify_cost ~ 1 (vLLM's switch to
its V1 runner without async scheduling for n-gram is a separate, engine cost, not c). Batch size moves both c and verify_cost:
`Roofline` and `speedup_vs_batch` show the speedup falling below 1 as the batch grows (vLLM's blog: 1.4-1.8x
slower at high QPS; vLLM #17984: a 1B draft for a 70B target reverses at batch 32).
"""

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from lablib.validate import integer, integers, number, refuse

Real = float | Fraction  # a Fraction in gives exact results out, where the maths is rational


def _real(owner: str, field: str, value: object, fix: str, low: float, high: float = math.inf,
          low_open: bool = False) -> Real:
    """validate.number, also accepting a Fraction (checked as its float, returned unchanged)."""
    if isinstance(value, Fraction):
        number(owner, field, float(value), fix, low, high, low_open=low_open)
        return value
    return number(owner, field, value, fix, low, high, low_open=low_open)


def _alpha(owner: str, alpha: object) -> Real:
    return _real(owner, "alpha", alpha, "alpha is a per-token acceptance probability, e.g. 0.7.", 0.0, 1.0)


def _k(owner: str, k: object) -> int:
    integer(owner, "k", k, "draft at least one token per step, e.g. k=4.", 1)
    return k  # type: ignore[return-value]


def _geometric(alpha: Real, k: int) -> Real:
    """1 + alpha + ... + alpha^k: the closed form without its 0/0 at alpha = 1 or its cancellation near it."""
    return sum((alpha**i for i in range(k + 1)), start=Fraction(0) if isinstance(alpha, Fraction) else 0)


def expected_tokens_per_step(alpha: Real, k: int) -> Real:
    """E = (1 - alpha^(k+1)) / (1 - alpha): tokens one verify step yields (Leviathan et al. 2023)."""
    return _geometric(_alpha("expected_tokens_per_step", alpha), _k("expected_tokens_per_step", k))


@dataclass(frozen=True)
class Acceptance:
    """What the i.i.d. model predicts for one (alpha, k), in the terms of vLLM's counters."""

    alpha: Real  # per-token acceptance probability
    k: int  # draft tokens per step
    distribution: tuple[Real, ...]  # P(exactly j drafts accepted), j = 0..k; sums to 1
    per_position: tuple[Real, ...]  # alpha^i, i = 1..k: vLLM's accepted_per_pos[i-1] / num_drafts
    mean_acceptance_length: Real  # E = 1 + mean accepted: vLLM's 1 + accepted / drafts, tokens per step
    acceptance_rate: Real  # (E - 1) / k: vLLM's accepted / draft_tokens (not alpha)


def acceptance(alpha: Real, k: int) -> Acceptance:
    """The accepted-count distribution, per-position rates, mean acceptance length and vLLM's acceptance rate."""
    a, k = _alpha("acceptance", alpha), _k("acceptance", k)
    dist = tuple(a**j * (1 - a) for j in range(k)) + (a**k,)
    e = _geometric(a, k)
    return Acceptance(a, k, dist, tuple(a**i for i in range(1, k + 1)), e, (e - 1) / k)


def alpha_for_acceptance_length(length: float, k: int) -> float:
    """The alpha whose E(alpha, k) equals a measured mean acceptance length (bisection; E rises with alpha)."""
    k = _k("alpha_for_acceptance_length", k)
    length = _real("alpha_for_acceptance_length", "length", length,
                   "a mean acceptance length lies in [1, k+1]: 1 + accepted / drafts.", 1.0, k + 1)
    if length == 1 or length == k + 1:
        return float(length == k + 1)
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _geometric(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


def alpha_from_per_position(accepted_per_pos: Sequence[int], num_drafts: int) -> float:
    """Maximum-likelihood alpha from per-position accepted counts: accepted / (accepted + rejections).

    Each draft that stopped early made one rejection; the accepted_per_pos[-1] drafts that kept all k
    made none. With counts exactly num_drafts x alpha^i this returns alpha exactly (a censored geometric).
    Assumes every draft had k = len(accepted_per_pos) tokens (a model drafter; n-gram drafts can be shorter).
    """
    owner = "alpha_from_per_position"
    integer(owner, "num_drafts", num_drafts, "pass the delta of vllm:spec_decode_num_drafts over the run.", 1)
    counts = integers(owner, "accepted_per_pos", accepted_per_pos, "pass the delta of "
                      "vllm:spec_decode_num_accepted_tokens_per_pos, one count per position.", 0, num_drafts)
    if any(later > earlier for earlier, later in itertools.pairwise(counts)):
        raise refuse(owner, "accepted_per_pos", counts, "non-increasing counts (position i needs i-1 accepted)",
                     "pass the counters in position order, as deltas over the same run.")
    accepted = sum(counts)
    return accepted / (accepted + num_drafts - counts[-1])  # >= 1 trial: counts[-1] <= num_drafts


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's four speculative-decoding counters over one run (deltas), or the simulator's equivalents."""

    num_drafts: int  # verify steps that carried drafts
    num_draft_tokens: int  # tokens drafted in them
    num_accepted_tokens: int  # of those, accepted
    accepted_per_pos: tuple[int, ...] | None = None  # accepted at position 1..k; None if not recorded

    def __post_init__(self) -> None:
        fix = "take the counters' deltas over one run from get_metrics() or /metrics."
        integer("SpecCounters", "num_drafts", self.num_drafts, fix, 1)
        integer("SpecCounters", "num_draft_tokens", self.num_draft_tokens, fix, self.num_drafts)
        integer("SpecCounters", "num_accepted_tokens", self.num_accepted_tokens, fix, 0)
        if self.num_accepted_tokens > self.num_draft_tokens:
            raise refuse("SpecCounters", "num_accepted_tokens", self.num_accepted_tokens,
                         f"at most num_draft_tokens={self.num_draft_tokens}", fix)
        if self.accepted_per_pos is None:
            return
        integers("SpecCounters", "accepted_per_pos", self.accepted_per_pos, fix, 0, self.num_drafts)
        if sum(self.accepted_per_pos) != self.num_accepted_tokens:
            raise refuse("SpecCounters", "accepted_per_pos", self.accepted_per_pos,
                         f"counts summing to num_accepted_tokens={self.num_accepted_tokens}", fix)

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.num_accepted_tokens / self.num_drafts

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def per_position_rates(self) -> tuple[float, ...] | None:
        return None if self.accepted_per_pos is None else tuple(a / self.num_drafts for a in self.accepted_per_pos)


def estimate_alpha(counters: SpecCounters) -> float:
    """alpha from vLLM's counters: per-position MLE when recorded, else the alpha that gives the mean length."""
    if counters.accepted_per_pos is not None:
        return alpha_from_per_position(counters.accepted_per_pos, counters.num_drafts)
    k, rest = divmod(counters.num_draft_tokens, counters.num_drafts)
    if rest:
        raise refuse("estimate_alpha", "counters.num_draft_tokens", counters.num_draft_tokens,
                     f"a multiple of num_drafts={counters.num_drafts} (k tokens every draft)",
                     "drafts of varying length (n-gram): pass accepted_per_pos too.")
    return alpha_for_acceptance_length(counters.mean_acceptance_length, k)


def simulate_acceptance(alpha: float, k: int, steps: int, seed: int = 0) -> SpecCounters:
    """Monte Carlo of the i.i.d. model: per step, accept each draft with probability alpha until one is rejected."""
    alpha, k = _alpha("simulate_acceptance", alpha), _k("simulate_acceptance", k)
    integer("simulate_acceptance", "steps", steps, "simulate at least one step, e.g. 10000.", 1)
    rng = random.Random(seed)
    per_pos = [0] * k
    for _ in range(steps):
        for i in range(k):
            if rng.random() >= alpha:
                break
            per_pos[i] += 1
    return SpecCounters(steps, steps * k, sum(per_pos), tuple(per_pos))


def _cost(owner: str, draft_cost: object, verify_cost: object) -> tuple[Real, Real]:
    c = _real(owner, "draft_cost", draft_cost, "one draft forward / one target forward: 0 for n-gram, e.g. 0.05.", 0.0)
    v = _real(owner, "verify_cost", verify_cost, "the verify pass in target steps: 1.0 when memory-bound.", 0.0,
              low_open=True)
    return c, v


def speedup(alpha: Real, k: int, draft_cost: Real, verify_cost: Real = 1) -> Real:
    """Walltime speedup E / (k c + verify_cost) over plain decoding (Leviathan et al. 2023)."""
    c, v = _cost("speedup", draft_cost, verify_cost)
    return expected_tokens_per_step(alpha, k) / (k * c + v)


def implied_draft_cost(length: float, k: int, measured_speedup: float, verify_cost: float = 1.0) -> float:
    """The c a measured speedup implies at a measured acceptance length: (length / speedup - verify_cost) / k."""
    owner = "implied_draft_cost"
    k = _k(owner, k)
    length = _real(owner, "length", length, "1 + accepted / drafts.", 1.0, k + 1)
    s = _real(owner, "measured_speedup", measured_speedup, "speculative tok/s / baseline tok/s.", 0.0, low_open=True)
    v = _cost(owner, 0.0, verify_cost)[1]
    return (length / s - v) / k


def optimal_k(alpha: Real, draft_cost: Real, k_max: int = 16, verify_cost: Real = 1) -> tuple[int, Real]:
    """The k in 1..k_max with the highest speedup (smallest k on a tie), and that speedup."""
    integer("optimal_k", "k_max", k_max, "search at least k=1, e.g. k_max=16.", 1)
    return max(((k, speedup(alpha, k, draft_cost, verify_cost)) for k in range(1, k_max + 1)),
               key=lambda pair: (pair[1], -pair[0]))


def break_even_alpha(k: int, draft_cost: Real, verify_cost: Real = 1) -> float | None:
    """The alpha at which speedup = 1 (E = k c + verify_cost): 0.0 if even alpha = 0 pays, None if alpha = 1 cannot."""
    k = _k("break_even_alpha", k)
    c, v = _cost("break_even_alpha", draft_cost, verify_cost)
    budget = k * c + v
    if budget <= 1:
        return 0.0
    return None if budget > k + 1 else alpha_for_acceptance_length(float(budget), k)


@dataclass(frozen=True)
class Roofline:
    """One model's forward pass on one GPU: the slower of streaming its weights and doing its FLOPs, plus overhead.

    t(batch, positions) = max(weight_bytes / bandwidth, flops_per_token x batch x positions / peak_flops) + overhead

    KV-cache reads (which grow with batch x context) and attention FLOPs are left out: a lower bound on
    the compute-bound side, so the real reversal comes at a smaller batch than this predicts.
    """

    weight_bytes: float  # bytes streamed per forward: parameters x bytes per element (8B in bf16: 16e9)
    bandwidth: float  # memory bandwidth, B/s (a spec sheet's, or lablib.hardware's peak table)
    flops_per_token: float  # ~2 x parameters
    peak_flops: float  # dense FLOP/s at the weights' dtype
    overhead: float = 0.0  # seconds per forward whatever its size: launches, scheduling, Python

    def __post_init__(self) -> None:
        for name in ("weight_bytes", "bandwidth", "flops_per_token", "peak_flops", "overhead"):
            number("Roofline", name, getattr(self, name), "pass a finite positive number (overhead may be 0).",
                   0.0, low_open=name != "overhead")

    def step_time(self, batch: int, positions: int = 1) -> float:
        """Seconds for one forward over `positions` tokens of each of `batch` sequences."""
        integer("Roofline.step_time", "batch", batch, "pass the number of running sequences.", 1)
        integer("Roofline.step_time", "positions", positions, "1 for decode, k+1 for a verify pass.", 1)
        work = self.flops_per_token * batch * positions / self.peak_flops
        return max(self.weight_bytes / self.bandwidth, work) + self.overhead


@dataclass(frozen=True)
class BatchPoint:
    """The speedup at one batch size, with the c and verify_cost the roofline gives there."""

    batch: int
    draft_cost: float  # t_draft(batch, 1) / t_target(batch, 1); 0 without a draft model
    verify_cost: float  # t_target(batch, k+1) / t_target(batch, 1): 1 memory-bound, k+1 compute-bound
    speedup: float  # E / (k draft_cost + verify_cost)


def speedup_vs_batch(alpha: float, k: int, batches: Sequence[int], target: Roofline,
                     draft: Roofline | None = None) -> list[BatchPoint]:
    """Leviathan's speedup at each batch size, c and verify_cost read off the two rooflines (draft None: n-gram).

    Worked example, H200 spec-sheet numbers (4.8e12 B/s, 989e12 dense bf16 FLOP/s), no overhead: an 8B
    target (16e9 bytes, 16e9 FLOPs/token) is memory-bound below 206 tokens per step, and a 1B draft (2e9
    bytes, 2e9 FLOPs/token) gives c = 0.125. At alpha 0.8, k 4 (E = 3.3616): batch 1 2.24x; batch 64
    1.64x (verify_cost 1.55); batch 117 1.007x; batch 118 0.999x, the reversal; batch 256 0.61x
    (verify_cost 5). With no draft forward (n-gram, c = 0) the reversal moves to batch 139.
    """
    k = _k("speedup_vs_batch", k)
    e = expected_tokens_per_step(alpha, k)
    out = []
    for b in integers("speedup_vs_batch", "batches", batches, "pass batch sizes, e.g. [1, 4, 16, 64]."):
        base = target.step_time(b, 1)
        c = 0.0 if draft is None else draft.step_time(b, 1) / base
        v = target.step_time(b, k + 1) / base
        out.append(BatchPoint(b, c, v, float(e / (k * c + v))))
    return out


def reversal_batch(alpha: float, k: int, target: Roofline, draft: Roofline | None = None,
                   max_batch: int = 4096) -> int | None:
    """The smallest batch in 1..max_batch where speculation is slower than plain decoding, or None."""
    integer("reversal_batch", "max_batch", max_batch, "search up to the engine's max_num_seqs, e.g. 4096.", 1)
    points = speedup_vs_batch(alpha, k, range(1, max_batch + 1), target, draft)
    return next((p.batch for p in points if p.speedup < 1), None)
