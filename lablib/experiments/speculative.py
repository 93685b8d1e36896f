"""Lab 08 on the CPU: greedy speculative decoding on the embedded pair in plain torch, against the formula.

The loop is the textbook one (Leviathan et al. 2023; Chen et al. 2023), one step at a time:

1. the draft proposes k tokens, one forward each, feeding its own KV cache;
2. the target scores all k+1 positions (the last accepted token and the k drafts) in ONE forward pass;
3. the longest prefix of drafts equal to the target's argmax is kept, and the target's own argmax at
   the first disagreement (the correction) or after all k (the bonus) is appended;
4. both KV caches are cropped back to the tokens now in the sequence.

Under greedy decoding a draft token is kept only if it is what the target would have chosen, so the
output IS the target's greedy output, token for token: the draft changes the speed, never the text.
`greedy` is the naive path it is tested against (one target forward per token).

What is counted follows vLLM 0.26 (`spec_decode_num_drafts`, `_num_draft_tokens`, `_num_accepted_tokens`,
`_num_accepted_tokens_per_pos`), so `lablib.mechanisms.speculative` reads these counters exactly as it
reads vLLM's: `estimate_alpha` gives alpha, `acceptance(alpha, k)` what the i.i.d. model predicts.
Every step drafts k tokens, the last one included: the counters stay those of k-token drafts (the
formula's assumption) and the output is cut exactly at max_new_tokens (at most k wasted draft forwards
per request). EOS is not a stop token (fixed output lengths, as every lablib benchmark).

Cost on this CPU: two tiny models, so a forward is mostly fixed cost (Python, dispatch), and a verify
pass over k+1 positions costs only ~1.2-2 single-token target forwards. The speedup is
E / (k c + verify_cost) with both ratios measured here, two ways: forward by forward, the shapes
timed round-robin (`forward_costs`), and inside the loop (`Step.draft_s`, `Step.verify_s`). They
differ: in the loop c falls as k grows (the first draft forward after a verify costs more than the
next ones; likely the CPU caches, which a verify fills with the target's weights), which one c cannot
express. The in-loop
ratios account for the measured speedup up to the Python outside the forwards and the cut last step's
unused drafts. Every timing is labelled as this CPU's (`provenance`); on a shared machine it is noisy.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import validate
from ..hardware.device import device_facts
from ..mechanisms.speculative import SpecCounters, acceptance, estimate_alpha, speedup
from ..models import load_hf_model, load_tokenizer, resolve_model
from ..workloads import load_workload

OWNER = "greedy_speculative"


@dataclass(frozen=True)
class Step:
    """One draft-then-verify step."""

    drafted: tuple[int, ...]  # the k token ids the draft proposed
    accepted: int  # drafts the target agreed with, 0..k (vLLM's count: before the cut at max_new_tokens)
    accepted_mask: tuple[bool, ...]  # position i = 1..k accepted; under greedy always a prefix
    emitted: tuple[int, ...]  # appended to the output: accepted drafts + correction/bonus, cut at max_new_tokens
    draft_s: float  # wall time of the k draft forwards (this CPU)
    verify_s: float  # wall time of the one verify forward


@dataclass(frozen=True)
class SpeculativeRun:
    """One request decoded speculatively: exactly max_new_tokens new tokens, and the steps that made them."""

    k: int  # draft tokens per step
    tokens: list[int]  # the new tokens (prompt excluded)
    steps: list[Step]  # in order


def _torch() -> Any:
    import torch

    return torch


def _ids(owner: str, input_ids: Any, vocab: int) -> list[int]:
    """A prompt as a list of ids: a list, a 1-D tensor or a (1, L) tensor."""
    ids = input_ids.reshape(-1).tolist() if hasattr(input_ids, "reshape") else list(input_ids)
    return validate.integers(owner, "input_ids", ids, f"pass a non-empty prompt of token ids in 0..{vocab - 1} "
                             "(one request: tokenizer(text).input_ids).", 0, vocab - 1)


def _check(target: Any, draft: Any | None, input_ids: Any, max_new_tokens: int, k: int | None) -> list[int]:
    """Refuse bad arguments before any forward pass: k, max_new_tokens, the vocabularies, the context."""
    vocab = target.config.vocab_size
    if k is not None:
        validate.integer(OWNER, "k", k, "draft at least one token per step, e.g. k=4.", 1)
    validate.integer(OWNER, "max_new_tokens", max_new_tokens, "generate at least one token, e.g. 64.", 1)
    if draft is not None and draft.config.vocab_size != vocab:
        raise validate.refuse(OWNER, "draft.vocab_size", draft.config.vocab_size,
                              f"{vocab} (the target's: the target scores the draft's ids)",
                              "use a draft trained on the target's tokenizer: the embedded draft, data/models/draft.")
    ids = _ids(OWNER, input_ids, vocab)
    limit = target.config.max_position_embeddings
    if len(ids) + max_new_tokens + (k or 0) > limit:
        raise validate.refuse(OWNER, "max_new_tokens", max_new_tokens,
                              f"prompt ({len(ids)}) + max_new_tokens + k within the context of {limit}",
                              "shorten the prompt or ask for fewer tokens.")
    return ids


def _seen(cache: Any) -> int:
    return 0 if cache is None else cache.get_seq_length()


def _keep(cache: Any, length: int) -> None:
    """Crop a DynamicCache to its first `length` positions (crop takes minus the number to remove)."""
    if _seen(cache) > length:
        cache.crop(length - _seen(cache))


def _forward(model: Any, fed: list[int], cache: Any, keep: int) -> tuple[Any, Any]:
    """One forward over `fed` on top of `cache`: the argmax at the last `keep` positions, and the cache."""
    torch = _torch()
    out = model(torch.tensor([fed]), past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:].argmax(-1), out.past_key_values


def greedy(target: Any, input_ids: Any, max_new_tokens: int) -> list[int]:
    """The naive path: one target forward per new token, KV cache kept, argmax (EOS ignored)."""
    seq = _check(target, None, input_ids, max_new_tokens, None)
    out: list[int] = []
    cache, fed = None, seq
    with _torch().inference_mode():
        while len(out) < max_new_tokens:
            best, cache = _forward(target, fed, cache, 1)
            fed = [int(best[0])]
            out += fed
    return out


def greedy_speculative(target: Any, draft: Any, input_ids: Any, max_new_tokens: int, k: int) -> SpeculativeRun:
    """The draft proposes k tokens, the target verifies them in one pass; output = the target's greedy tokens."""
    seq = _check(target, draft, input_ids, max_new_tokens, k)
    n_prompt = len(seq)
    steps: list[Step] = []
    t_cache = d_cache = None  # each holds every sequence position but the last token, which it is fed next
    with _torch().inference_mode():
        while len(seq) - n_prompt < max_new_tokens:
            drafts: list[int] = []
            t0 = time.perf_counter()
            for _ in range(k):  # 1. draft: feed what its cache has not seen yet (the prompt, on the first step)
                best, d_cache = _forward(draft, (seq + drafts)[_seen(d_cache):], d_cache, 1)
                drafts.append(int(best[0]))
            t1 = time.perf_counter()
            # 2. verify: row i of `best` is the target's choice after seq + drafts[:i], i = 0..k
            best, t_cache = _forward(target, (seq + drafts)[_seen(t_cache):], t_cache, k + 1)
            best = best.tolist()
            t2 = time.perf_counter()
            accepted = next((i for i in range(k) if drafts[i] != best[i]), k)  # 3. longest agreeing prefix
            new = drafts[:accepted] + [best[accepted]]  # + the correction, or the bonus when all k agreed
            _keep(t_cache, len(seq) + accepted)  # 4. drop rejected drafts; the new last token is fed next step
            _keep(d_cache, len(seq) + accepted)
            new = new[:max_new_tokens - (len(seq) - n_prompt)]
            mask = tuple(i < accepted for i in range(k))
            steps.append(Step(tuple(drafts), accepted, mask, tuple(new), t1 - t0, t2 - t1))
            seq += new
    return SpeculativeRun(k, seq[n_prompt:], steps)


def hf_assisted(target: Any, draft: Any, input_ids: Any, max_new_tokens: int, k: int) -> list[int]:
    """transformers' assisted generation with exactly k assistant tokens per step (no schedule, no early stop).

    Its candidate generator (generation/candidate_generator.py) reads the assistant's generation_config;
    transformers 5.17's defaults are 20 tokens, schedule "constant" and a confidence threshold of 0.4
    (the draft stops a proposal early when unsure, and with scikit-learn the threshold is re-fitted).
    `num_assistant_tokens=k`, schedule "constant" and threshold 0 make every proposal k tokens, as in
    `greedy_speculative`, except near the end, where HF drafts fewer (max_length - 1 caps it).
    The draft's config is restored afterwards.
    """
    torch = _torch()
    ids = _check(target, draft, input_ids, max_new_tokens, k)
    gen = copy.deepcopy(target.generation_config)
    gen.update(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
    saved, mine = draft.generation_config, copy.deepcopy(draft.generation_config)
    mine.update(num_assistant_tokens=k, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
    draft.generation_config = mine
    try:
        with torch.inference_mode():
            x = torch.tensor([ids])
            out = target.generate(x, attention_mask=torch.ones_like(x), generation_config=gen, assistant_model=draft)
    finally:
        draft.generation_config = saved
    return out[0, len(ids):].tolist()


def spec_counters(runs: Sequence[SpeculativeRun]) -> SpecCounters:
    """vLLM's four counters summed over runs of one k: drafts, draft tokens, accepted, accepted per position."""
    ks = sorted({r.k for r in runs})
    if len(ks) != 1:
        raise validate.refuse("spec_counters", "runs", f"{len(runs)} runs with k in {ks}", "runs of one k",
                              "count each k separately.")
    k, steps = ks[0], [s for r in runs for s in r.steps]
    per_pos = tuple(sum(s.accepted_mask[i] for s in steps) for i in range(k))
    return SpecCounters(len(steps), k * len(steps), sum(s.accepted for s in steps), per_pos)


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


def provenance(threads: int | None = None) -> str:
    """The label every timing carries: which CPU, how many torch threads."""
    torch = _torch()
    return (f"measured on this machine's CPU ({device_facts().get('cpu') or 'unknown CPU'}), torch "
            f"{torch.__version__}, {threads or torch.get_num_threads()} thread(s)")


def forward_costs(target: Any, draft: Any, input_ids: Any, ks: Sequence[int] = (1, 2, 4, 8),
                  repeats: int = 50) -> dict[str, Any]:
    """c = draft forward of 1 token / target forward of 1 token, and verify_cost = target over k+1 / over 1.

    Each forward runs on top of the prompt's KV cache (cropped back after every call). The shapes are
    timed round-robin, `repeats` rounds after one warm-up round, so that load from other processes hits
    them alike; each time is the median of its rounds.
    """
    ks = validate.integers("forward_costs", "ks", ks, "pass draft lengths, e.g. (1, 2, 4, 8).")
    validate.integer("forward_costs", "repeats", repeats, "time at least one round, e.g. 50.")
    ids = _check(target, draft, input_ids, max(ks) + 1, max(ks))
    shapes = [(draft, 1), (target, 1), *((target, k + 1) for k in ks)]
    times: list[list[float]] = [[] for _ in shapes]
    with _torch().inference_mode():
        caches = {id(m): _forward(m, ids, None, 1)[1] for m in (target, draft)}
        for _ in range(repeats + 1):
            for (model, n), got in zip(shapes, times):
                t0 = time.perf_counter()
                _forward(model, ids[-1:] * n, caches[id(model)], n)
                got.append(time.perf_counter() - t0)
                _keep(caches[id(model)], len(ids))
    draft_ms, target_ms, *verify = (1000 * statistics.median(t[1:]) for t in times)
    verify_ms = dict(zip(ks, verify))
    return {"context": len(ids), "draft_ms": draft_ms, "target_ms": target_ms, "c": draft_ms / target_ms,
            "verify_ms": verify_ms, "verify_cost": {k: v / target_ms for k, v in verify_ms.items()},
            "provenance": provenance()}


def load_pair() -> tuple[Any, Any, Any]:
    """The embedded target, its draft (float32, CPU, eval) and the shared tokenizer."""
    spec = resolve_model("embedded-target")
    return load_hf_model(spec), load_hf_model(resolve_model("embedded-draft")), load_tokenizer(spec)


def cpu_study(n_prompts: int = 8, max_new_tokens: int = 64, ks: Sequence[int] = (1, 2, 4, 8), rounds: int = 3,
              threads: int = 1, pair: tuple[Any, Any, Any] | None = None) -> dict[str, Any]:
    """Acceptance and speed of the embedded pair on this CPU, per k, measured next to the formula.

    The first n_prompts journey prompts, each decoded to exactly max_new_tokens. Each round runs every
    prompt through the baseline (`greedy`) and every k, one prompt after the other, so that drift from
    other processes hits them alike; tok/s is new tokens over wall time (prefill included), median
    over rounds (min, max beside it). Two predictions, both `speedup(alpha, k, c, verify_cost)` at the alpha estimated
    from that k's counters: `predicted_speedup` with c and verify_cost from the isolated forwards of
    `forward_costs`, `predicted_speedup_in_loop` with the forward times measured inside the loop
    (per forward, over a target forward of the same round's baseline, prefill included on both sides).
    The measured speedup is the median over rounds of each round's speculative / baseline tok/s.
    """
    owner = "cpu_study"
    for name, value in (("n_prompts", n_prompts), ("rounds", rounds), ("threads", threads)):
        validate.integer(owner, name, value, "pass a small positive count, e.g. 8 prompts, 3 rounds, 1 thread.")
    ks = validate.integers(owner, "ks", ks, "pass draft lengths, e.g. (1, 2, 4, 8).")
    torch = _torch()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        target, draft, tok = pair or load_pair()
        prompts = load_workload("journey", limit=n_prompts).prompt_ids(tok)
        for p in prompts:
            _check(target, draft, p, max_new_tokens, max(ks))
        costs = forward_costs(target, draft, prompts[0], ks)
        total = len(prompts) * max_new_tokens
        per_round: list[dict[Any, Any]] = []
        for _ in range(rounds):
            got: dict[Any, Any] = {**{k: [] for k in (None, *ks)}, **{(k, "s"): 0.0 for k in (None, *ks)}}
            for p in prompts:  # every method on one prompt, then the next: load from elsewhere hits all alike
                for k in (None, *ks):
                    t0 = time.perf_counter()
                    got[k].append(greedy(target, p, max_new_tokens) if k is None else
                                  greedy_speculative(target, draft, p, max_new_tokens, k))
                    got[k, "s"] += time.perf_counter() - t0
            per_round.append({**got, **{(k, "tok_s"): total / got[k, "s"] for k in (None, *ks)}})
        base = sorted(r[None, "tok_s"] for r in per_round)
        rows = [_timing_row(k, per_round, costs, statistics.median(base)) for k in ks]
    finally:
        torch.set_num_threads(before)
    return {"rows": rows, "costs": costs, "baseline_tok_s": statistics.median(base), "baseline_tok_s_range": base,
            "prompts": len(prompts), "max_new_tokens": max_new_tokens, "rounds": rounds,
            "provenance": provenance(threads)}


def _timing_row(k: int, per_round: list[dict[Any, Any]], costs: dict[str, Any], base_tok_s: float) -> dict[str, Any]:
    """One k: acceptance (deterministic: greedy), tok/s over rounds, in-loop c and verify_cost, the predictions."""
    rep = acceptance_report(per_round[0][k])
    tok_s = sorted(r[k, "tok_s"] for r in per_round)
    in_loop = []
    for r in per_round:
        steps = [s for run in r[k] for s in run.steps]
        target_s = 1 / r[None, "tok_s"]  # baseline seconds per target forward (one per token)
        in_loop.append((sum(s.draft_s for s in steps) / (k * len(steps)) / target_s,
                        sum(s.verify_s for s in steps) / len(steps) / target_s))
    c_loop = statistics.median(c for c, _ in in_loop)
    v_loop = statistics.median(v for _, v in in_loop)
    c, v = costs["c"], costs["verify_cost"][k]
    return {**rep.row(), "identical_to_greedy": all(r[k][i].tokens == r[None][i] for r in per_round
                                                    for i in range(len(r[None]))),
            "tok_s": statistics.median(tok_s), "tok_s_min": tok_s[0], "tok_s_max": tok_s[-1],
            "baseline_tok_s": base_tok_s,  # the speedup is the median of each round's paired ratio, robust to drift
            "measured_speedup": statistics.median(r[k, "tok_s"] / r[None, "tok_s"] for r in per_round),
            "c": c, "verify_cost": v, "predicted_speedup": float(speedup(rep.alpha, k, c, v)),
            "c_in_loop": c_loop, "verify_cost_in_loop": v_loop,
            "predicted_speedup_in_loop": float(speedup(rep.alpha, k, c_loop, v_loop))}
