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

The same loop with an EAGLE-1 head as the drafter is `greedy_eagle` (the head: `lablib.models.eagle`, trained
for the embedded target by scripts/train_eagle.py): the head drafts from the target's own features, which the
verify pass hands it for free. `drafter_acceptance` runs both drafters on the same prompts, counted alike.

The rest of lab 08's CPU half: the formula's tables (`maths_tables`), the study as tables and lines, and the
batch model at 8B scale on the H200's spec-sheet roofline (`batch_model`: where the verify pass stops being
free and the speedup reverses). The vLLM half (the draft model, n-gram and the EAGLE head on vLLM against a
pinned baseline, `speculative_config`, `gpu_study`, `record`) is `lablib.experiments.speculative_vllm`; its
names are re-exported here, loaded on first use, so that `spec.gpu_study` and the CPU loop share one name space.
"""
from __future__ import annotations

import copy
import itertools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import validate
from ..hardware.device import device_facts, torch_threads
from ..mechanisms.gpus import GPU_PEAKS
from ..mechanisms.speculative import (
    Roofline,
    SpecCounters,
    acceptance,
    break_even_alpha,
    estimate_alpha,
    expected_tokens_per_step,
    optimal_k,
    reversal_batch,
    speedup,
    speedup_vs_batch,
)
from ..models import load_hf_model, load_tokenizer, resolve_model
from ..models.architecture import architectures, parameter_count
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


def _check(target: Any, draft: Any | None, input_ids: Any, max_new_tokens: int, k: int | None,
           owner: str = OWNER) -> list[int]:
    """Refuse bad arguments before any forward pass: k, max_new_tokens, the vocabularies, the context."""
    vocab = target.config.vocab_size
    if k is not None:
        validate.integer(owner, "k", k, "draft at least one token per step, e.g. k=4.", 1)
    validate.integer(owner, "max_new_tokens", max_new_tokens, "generate at least one token, e.g. 64.", 1)
    if draft is not None and draft.config.vocab_size != vocab:
        raise validate.refuse(owner, "draft.vocab_size", draft.config.vocab_size,
                              f"{vocab} (the target's: the target scores the draft's ids)",
                              "use a draft trained on the target's tokenizer: the embedded draft, data/models/draft.")
    ids = _ids(owner, input_ids, vocab)
    limit = target.config.max_position_embeddings
    if len(ids) + max_new_tokens + (k or 0) > limit:
        raise validate.refuse(owner, "max_new_tokens", max_new_tokens,
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


def greedy_eagle(target: Any, head: Any, input_ids: Any, max_new_tokens: int, k: int) -> SpeculativeRun:
    """The same loop with an EAGLE-1 head as the drafter (`lablib.models.eagle`); output = the target's greedy tokens.

    The head drafts from the target's features, so the target must have read a position before the head can
    draft after it: the target first reads the prompt but its last token (no token comes out of that), and from
    then on every step is the loop above. 1. the head reads the features it has not seen (row p: [e(x_{p+1}),
    h_p]) and drafts k tokens on its own features; 2. the target verifies [last token, k drafts] in one pass,
    which also gives the features of the positions it accepts; 3. the longest agreeing prefix + the correction;
    4. the target's cache is cropped to the sequence and the head's to the rows built from the target's features:
    its rows built from its own drafted features are dropped, and rebuilt next step from the verified ones.
    vLLM's first token comes from the prefill, undrafted; here every token comes from a step, as in
    `greedy_speculative`, so the two loops' counters compare one for one.
    """
    from ..models.eagle import check_pair, propose, target_features

    seq = _check(target, None, input_ids, max_new_tokens, k, "greedy_eagle")
    check_pair(target, head, "greedy_eagle")
    if len(seq) < 2:
        raise validate.refuse("greedy_eagle", "input_ids", seq, "at least 2 tokens (the head reads the feature "
                              "of the token before the last)", "pass the prompt with its bos token, as tokenizers add.")
    n_prompt, steps, h_cache = len(seq), [], None
    with _torch().inference_mode():
        features, _, t_cache = target_features(target, seq[:-1], None)  # the head's rows: tokens seq[1:], these
        tokens = seq[1:]
        while len(seq) - n_prompt < max_new_tokens:
            t0 = time.perf_counter()
            drafts, h_cache = propose(target, head, h_cache, tokens, features, k)  # 1.
            t1 = time.perf_counter()
            verified, best, t_cache = target_features(target, [seq[-1], *drafts], t_cache)  # 2. rows 0..k
            t2 = time.perf_counter()
            accepted = next((i for i in range(k) if drafts[i] != best[i]), k)  # 3.
            new = drafts[:accepted] + [best[accepted]]
            _keep(t_cache, len(seq) + accepted)  # 4.
            _keep(h_cache, len(seq) - 1)
            tokens, features = new, verified[:, :accepted + 1]  # the head's next rows, all from the target
            mask = tuple(i < accepted for i in range(k))
            new = new[:max_new_tokens - (len(seq) - n_prompt)]
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


# ------------------------------------------------------------------------------------------------------------------
# Lab 08's other steps. The maths (tables from lablib.mechanisms.speculative), the loop's numbers as rows, the batch
# model at 8B scale, and vLLM: the draft model and n-gram against a baseline on the same engine settings.
# ------------------------------------------------------------------------------------------------------------------

MODEL_BATCHES = tuple(sorted({round(2 ** (i / 8)) for i in range(8 * 9 + 1)}))  # 1..512, 8 points per octave


def maths_tables(alphas: Sequence[float] = (0.5, 0.7, 0.9), ks: Sequence[int] = (2, 4, 8),
                 costs: Sequence[float] = (0.0, 0.05, 0.2, 1.0)) -> dict[str, list[dict[str, Any]]]:
    """The formula's numbers for a few settings: tokens per step and speedup, the break-even alpha, the best k.

    `tokens`: per (alpha, k), E = (1 - alpha^(k+1)) / (1 - alpha), vLLM's acceptance rate (E - 1) / k and the
    speedup E / (k c + 1) for each draft cost c. `break_even`: per (k, c), the alpha below which speculation
    loses (None: even alpha = 1 cannot pay). `optimal_k`: per (alpha, c), the k in 1..16 with the best speedup.
    verify_cost is 1 throughout (a memory-bound target: the verify pass costs one step).
    """
    tokens = [{"alpha": a, "k": k, "tokens_per_step": float(expected_tokens_per_step(a, k)),
               "vllm_acceptance_rate": float(acceptance(a, k).acceptance_rate),
               **{f"speedup_c={c:g}": float(speedup(a, k, c)) for c in costs}} for a in alphas for k in ks]
    even = [{"k": k, "c": c, "break_even_alpha": break_even_alpha(k, c)} for k in ks for c in costs]
    best = [{"alpha": a, "c": c, "best_k": optimal_k(a, c)[0], "speedup": float(optimal_k(a, c)[1])}
            for a in alphas for c in costs]
    return {"tokens": tokens, "break_even": even, "optimal_k": best}


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


def study_row(study: dict[str, Any], k: int) -> dict[str, Any]:
    """The row of `cpu_study(...)` for one k."""
    rows = [r for r in study["rows"] if r["k"] == k]
    if not rows:
        raise validate.refuse("study_row", "k", k, f"one of {[r['k'] for r in study['rows']]}",
                              "pass a k the study ran (cpu_study(ks=...)).")
    return rows[0]


def acceptance_table(study: dict[str, Any]) -> list[dict[str, Any]]:
    """Per k of `cpu_study`: the loop's counters (vLLM's definitions), its mean acceptance length and the formula's."""
    out = []
    for r in study["rows"]:
        c = SpecCounters(r["num_drafts"], r["num_draft_tokens"], r["num_accepted_tokens"],
                         tuple(round(p * r["num_drafts"]) for p in r["measured_per_position"]))
        out.append({"k": r["k"], "drafts": r["num_drafts"], "draft_tokens": r["num_draft_tokens"],
                    "accepted": r["num_accepted_tokens"], "acceptance_rate": c.acceptance_rate, "alpha": r["alpha"],
                    "mean_length": r["measured_length"], "stderr": r["length_stderr"],
                    "formula_length": r["predicted_length"], "gap_in_stderrs": r["length_gap"] / r["length_stderr"],
                    "counters_consistent": counters_consistent(c, r["k"])[0],
                    "identical_to_greedy": r["identical_to_greedy"]})
    return out


def cost_table(study: dict[str, Any]) -> list[dict[str, Any]]:
    """Per k of `cpu_study`: c and verify_cost two ways, the two predicted speedups and the one this run measured."""
    return [{"k": r["k"], "c": r["c"], "verify_cost": r["verify_cost"], "predicted": r["predicted_speedup"],
             "c_in_loop": r["c_in_loop"], "verify_cost_in_loop": r["verify_cost_in_loop"],
             "predicted_in_loop": r["predicted_speedup_in_loop"], "this_run": r["measured_speedup"],
             "tok_s": r["tok_s"], "greedy_tok_s": r["baseline_tok_s"]} for r in study["rows"]]


def loop_lines(study: dict[str, Any]) -> str:
    """One line per k: the loop's acceptance against the formula, and whether its tokens were greedy's."""
    lines = [f"{study['prompts']} journey prompts x {study['max_new_tokens']} new tokens, {study['provenance']}"]
    for r in acceptance_table(study):
        lines.append(f"k={r['k']}: {r['drafts']} verify steps, {r['accepted']} of {r['draft_tokens']} drafts accepted; "
                     f"mean acceptance length {r['mean_length']:.3f} +/- {r['stderr']:.3f}, formula at alpha="
                     f"{r['alpha']:.3f}: {r['formula_length']:.3f} ({r['gap_in_stderrs']:+.2f} standard errors); "
                     f"tokens identical to greedy: {r['identical_to_greedy']}")
    return "\n".join(lines)


def cost_lines(study: dict[str, Any]) -> str:
    """The cost side in words: c and verify_cost on this CPU, and the predicted against the measured speedup."""
    costs = study["costs"]
    rounds = ", ".join(f"{x:.0f}" for x in study["baseline_tok_s_range"])
    lines = [f"this CPU, shared with other jobs, so noisy: {study['provenance']}",
             (f"isolated forwards at context {costs['context']}: draft {costs['draft_ms']:.2f} ms, target "
              f"{costs['target_ms']:.2f} ms, so c = {costs['c']:.3f}; greedy {study['baseline_tok_s']:.0f} tok/s "
              f"(rounds: {rounds})")]
    for r in cost_table(study):
        lines.append(f"k={r['k']}: verify_cost {r['verify_cost']:.2f} -> predicted {r['predicted']:.2f}x; in the loop "
                     f"c {r['c_in_loop']:.3f}, verify_cost {r['verify_cost_in_loop']:.2f} -> "
                     f"{r['predicted_in_loop']:.2f}x; this run {r['this_run']:.2f}x ({r['tok_s']:.0f} tok/s)")
    return "\n".join(lines)


_threads = torch_threads  # torch on n threads, restored after (lablib.hardware.device)


def assisted_matches(pair: tuple[Any, Any, Any] | None = None, n_prompts: int = 1, max_new_tokens: int = 32,
                     k: int = 4, threads: int = 1) -> dict[str, Any]:
    """transformers' assisted generation (`hf_assisted`, the same pair, k drafts a step) against `greedy`."""
    validate.integer("assisted_matches", "n_prompts", n_prompts, "journey prompts to compare, e.g. 1.", 1, 64)
    with _threads(threads):
        target, draft, tok = pair or load_pair()
        prompts = load_workload("journey", limit=n_prompts).prompt_ids(tok)
        same = [hf_assisted(target, draft, p, max_new_tokens, k) == greedy(target, p, max_new_tokens) for p in prompts]
    return {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "k": k, "identical": sum(same),
            "all_identical": all(same)}


MODEL_DRAFTERS = ("draft_model", "eagle")  # vLLM's names of the drafters that run a forward per draft token


def load_eagle(target: Any) -> Any:
    """The EAGLE head shipped for the embedded target (data/models/eagle; float32, CPU, eval), checked against it."""
    from ..models.eagle import load_head

    return load_head(target=target)


def drafter_acceptance(drafters: Sequence[str] = MODEL_DRAFTERS, n_prompts: int = 8, max_new_tokens: int = 32,
                       ks: Sequence[int] = (2, 4), threads: int = 1, pair: tuple[Any, Any, Any] | None = None,
                       head: Any = None) -> list[dict[str, Any]]:
    """Each drafter's greedy loop on the same journey prompts, per k, counted alike (vLLM's definitions).

    "draft_model" is the embedded draft in `greedy_speculative`, "eagle" the EAGLE head (`head`, by default the
    shipped one) in `greedy_eagle`. A row per drafter and k: `AcceptanceReport.row()` (mean acceptance length and
    its standard error, the per-position rates, alpha and the formula's length at it), whether every prompt's
    tokens equal plain `greedy`'s, and whether the counters hang together (`counters_consistent`). Greedy and
    deterministic: the same prompts give the same counts on any CPU, up to float32 near-ties.
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
    with _threads(threads):
        target, draft, tok = pair or load_pair()
        if head is None and "eagle" in drafters:
            head = load_eagle(target)
        prompts = load_workload("journey", limit=n_prompts).prompt_ids(tok)
        plain = [greedy(target, p, max_new_tokens) for p in prompts]
        out = []
        for d in drafters:
            for k in ks:
                runs = [greedy_eagle(target, head, p, max_new_tokens, k) if d == "eagle" else
                        greedy_speculative(target, draft, p, max_new_tokens, k) for p in prompts]
                rep = acceptance_report(runs)
                out.append({"drafter": d, **rep.row(), "identical_to_greedy": all(
                    r.tokens == g for r, g in zip(runs, plain)), "counters_consistent": counters_consistent(
                    rep.counters, k)[0], "prompts": len(prompts), "max_new_tokens": max_new_tokens,
                    "provenance": provenance(threads)})
    return out


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


def roofline_of(arch: str, gpu: str = "H200", overhead_s: float = 0.0) -> Roofline:
    """A synthetic architecture in bf16 on a GPU of the spec-sheet table: 2 bytes and 2 FLOPs per parameter."""
    validate.choice("roofline_of", "arch", arch, tuple(architectures()))
    validate.choice("roofline_of", "gpu", gpu, tuple(GPU_PEAKS))
    peak, params = GPU_PEAKS[gpu], parameter_count(architectures()[arch])
    if not peak.bf16_flops:
        raise validate.refuse("roofline_of", "gpu", gpu, "a GPU with a bf16 peak in lablib.mechanisms.gpus",
                              "pick e.g. 'H200' or 'H100 SXM'.")
    return Roofline(2.0 * params, peak.peak_bw, 2.0 * params, peak.bf16_flops, overhead_s)


def batch_model(alpha: float, k: int, batches: Sequence[int] = MODEL_BATCHES, gpu: str = "H200",
                target: str = "llama-3.1-8b", draft: str = "llama-3.2-1b") -> dict[str, Any]:
    """Where speculation stops paying, as a model: the speedup against batch size on the roofline, and the reversal.

    The target and the draft are the synthetic architectures' parameter counts in bf16 on the GPU's spec sheet
    (`roofline_of`), with no launch overhead: the regime where decode is bandwidth-bound. c and verify_cost come
    from the two rooflines at each batch (`speedup_vs_batch`); an n-gram drafter has no forward (c = 0).
    A model, not a measurement: it leaves out KV reads and attention FLOPs, so real reversals come sooner.
    """
    t, d = roofline_of(target, gpu), roofline_of(draft, gpu)
    curves = {"draft model": speedup_vs_batch(alpha, k, batches, t, d),
              "n-gram": speedup_vs_batch(alpha, k, batches, t)}
    reversal = {"draft model": reversal_batch(alpha, k, t, d), "n-gram": reversal_batch(alpha, k, t)}
    peak = GPU_PEAKS[gpu]
    where = (f"simulated (no engine ran): a roofline of {gpu} spec-sheet peaks ({peak.peak_bw / 1e12:.1f} TB/s, "
             f"{peak.bf16_flops / 1e12:.1f} TFLOP/s bf16), {target} target, {draft} draft, bf16, no launch overhead")
    rows = [{"drafter": name, "batch": p.batch, "c": p.draft_cost, "verify_cost": p.verify_cost, "speedup": p.speedup}
            for name, points in curves.items() for p in points if p.batch in (1, 4, 16, 64)]
    return {"alpha": alpha, "k": k, "tokens_per_step": float(expected_tokens_per_step(alpha, k)), "gpu": gpu,
            "target": target, "draft": draft, "curves": curves, "reversal": reversal, "rows": rows, "where": where}


def pays_then_reverses(model: dict[str, Any]) -> bool:
    """`batch_model`'s claim: every drafter pays at batch 1 and is slower than plain decoding from some batch on."""
    return all(points[0].batch == 1 and points[0].speedup > 1 for points in model["curves"].values()) and all(
        b is not None for b in model["reversal"].values())



def summary_lines(study: dict[str, Any], model: dict[str, Any]) -> str:
    """What this run showed, in three lines: acceptance vs the formula, speed on this CPU, the model's reversal."""
    acc = acceptance_table(study)
    cost = {r["k"]: r for r in cost_table(study)}
    return "\n".join([
        "loop, live on this CPU: " + "; ".join(
            f"k={r['k']} alpha {r['alpha']:.2f}, {r['mean_length']:.2f} tokens per step "
            f"(formula {r['formula_length']:.2f})"
            for r in acc),
        "speed on this CPU (noisy): " + "; ".join(
            f"k={k} {r['this_run']:.2f}x measured, {r['predicted_in_loop']:.2f}x predicted in the loop"
            for k, r in cost.items()) + f"; c = {study['costs']['c']:.2f}",
        f"batch model ({model['gpu']}, {model['target']} + {model['draft']}, alpha {model['alpha']:.2f}, "
        f"k={model['k']}): "
        + "; ".join(f"{name} {pts[0].speedup:.2f}x at batch 1, slower from batch {model['reversal'][name]}"
                    for name, pts in model["curves"].items())])


# The vLLM half, re-exported on first use (PEP 562): `spec.gpu_study` works, and importing the CPU loop loads no
# vLLM-side code. speculative_vllm imports this module, so the names cannot be imported at the top.
VLLM_NAMES = ("LAB", "STEP", "METHODS", "VLLM_METHODS", "NOT_IN_THIS_LAB", "REFUSED_WITH_SPECULATION",
              "PinnedVLLMConfig", "RUNNER_ENV", "runner_env", "speculative_config", "Setting", "settings",
              "counters_from_delta", "vllm_spec_runs", "loop_acceptance", "cross_check", "gpu_study", "gpu_table",
              "record", "speedup_falls_with_batch")


def __getattr__(name: str) -> Any:
    if name in VLLM_NAMES:
        from . import speculative_vllm

        return getattr(speculative_vllm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *VLLM_NAMES])
