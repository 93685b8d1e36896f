"""Lab 08's speculative SAMPLING on the CPU: the embedded pair at temperature T, and the test that it keeps p.

Greedy speculation keeps the target's argmax; speculative sampling keeps the target's distribution (Leviathan et
al. 2023, Algorithm 1; Chen et al. 2023). At temperature T the draft samples x_1..x_k from its own
q_i = softmax(draft logits / T); the target computes p_i at all k+1 positions in one pass; x_i is kept with
probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the token is drawn from the residual
norm(max(0, p_i - q_i)) and the step ends; after k acceptances a bonus token is drawn from p_{k+1}.

Why the emitted token is distributed as p: it is x either because the draft proposed x and kept it, with
probability q(x) min(1, p(x)/q(x)) = min(p, q)(x), or because the draft was rejected, with probability
beta' = 1 - sum min(p, q) = sum max(0, p - q), and x was then drawn from the residual max(0, p - q) / beta':

    P(x) = min(p, q)(x) + (1 - sum min(p, q)) * residual(x) = min(p, q)(x) + max(0, p - q)(x) = p(x).

Text from the loop is text from the target; only the speed changes. As T -> 0 both distributions become one-hot
at their argmax and the rule is the greedy loop's (`loops.greedy_speculative`). `sample` is the naive
path it is compared with: one target forward per token, at the same T.

The claim is tested at two levels, by chi-square tests (`lablib.stats`, without scipy: `chi2_sf` is Numerical Recipes'
`gammq`; bins with an expected count below 5 pooled into one, as the test requires):

- `rule_test`, exact at one position: p and q from the real models after a prompt, the rule run N times
  vectorised (no model call in the loop), the emitted tokens against p (goodness of fit). Two wrong rules show
  that the test has power: keeping every draft (the output is q) and resampling a rejection from p instead of
  the residual (the output is min(p, q) + (1 - sum min(p, q)) p).
- `loop_test`, end to end: the whole loop, one seed per run, and plain sampling at the same T; the token at one
  output position (one per run: independent samples) compared between the two (homogeneity), stratified by prompt.
Every row carries `detectable_w`: the effect size (Cohen's w) the test finds with probability 0.9 at its level.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ... import validate
from ...hardware.device import torch_threads
from ...stats import chi2_sf, detectable_w, goodness_of_fit, homogeneity  # noqa: F401 - re-exported
from ...workloads import load_workload
from .loops import SpeculativeRun, Step, check_loop_args, crop_cache, cache_length, import_torch, load_pair

OWNER = "speculative_sample"
VERIFY_RULES = ("leviathan", "accept_all", "resample_from_p")  # the correct rule, then two wrong ones
ALPHA = 0.01  # every test's level: a correct rule is wrongly rejected at fixed seeds with probability 0.01 a priori


def _temperature(owner: str, temperature: Any) -> float:
    return validate.number(owner, "temperature", temperature, "sample at a temperature above 0, e.g. 1.0 or 0.7 "
                           "(greedy decoding is spec.greedy_speculative).", 0.0, low_open=True)


def _probs(logits: Any, temperature: float) -> Any:
    """softmax(logits / T) in float64: the residual p - q and the tests' expected counts n p keep their digits."""
    return import_torch().softmax(logits.double() / temperature, dim=-1)


def _logits(model: Any, fed: list[int], cache: Any, keep: int) -> tuple[Any, Any]:
    """One forward over `fed` on top of `cache`: the logits at the last `keep` positions, and the cache."""
    torch = import_torch()
    out = model(torch.tensor([fed]), past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:], out.past_key_values


def apply_rule(p: Any, q: Any, drafts: Any, generator: Any, rule: str = "leviathan") -> tuple[Any, Any]:
    """The verify rule, vectorised: p, q of shape (R, V), drafts (R, S) drawn from q; S samples per row.

    Returns `keep` (R, S), whether each draft is kept, and `fallback` (R, S), the token emitted where it is not:
    leviathan keeps x with probability min(1, p(x)/q(x)) and falls back on norm(max(0, p - q)) (on p where the
    residual is empty, p = q); accept_all keeps every draft; resample_from_p falls back on p itself.
    """
    torch = import_torch()
    validate.choice("apply_rule", "rule", rule, VERIFY_RULES)
    u = torch.rand(drafts.shape, generator=generator, dtype=torch.float64)
    keep = u * q.gather(1, drafts) < p.gather(1, drafts)
    if rule == "accept_all":
        keep = torch.ones_like(keep)
    fall = p
    if rule == "leviathan":
        residual = (p - q).clamp_min(0)
        fall = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)
    return keep, torch.multinomial(fall, drafts.shape[1], replacement=True, generator=generator)


def _run(target: Any, draft: Any, seq: list[int], max_new_tokens: int, k: int, temperature: float, generator: Any,
         rule: str, t_cache: Any = None, d_cache: Any = None) -> SpeculativeRun:
    """The loop on caches that hold a prefix of `seq` (none, or a shared prompt): greedy_speculative's four steps."""
    torch = import_torch()
    n_prompt, seq, steps = len(seq), list(seq), []
    while len(seq) - n_prompt < max_new_tokens:
        drafts: list[int] = []
        qs = []
        t0 = time.perf_counter()
        for _ in range(k):  # 1. draft: sample from q, feeding the draft's cache what it has not seen
            logits, d_cache = _logits(draft, (seq + drafts)[cache_length(d_cache):], d_cache, 1)
            qs.append(_probs(logits, temperature))
            drafts.append(int(torch.multinomial(qs[-1][0], 1, generator=generator)))
        t1 = time.perf_counter()
        logits, t_cache = _logits(target, (seq + drafts)[cache_length(t_cache):], t_cache, k + 1)  # 2. p at k+1 rows
        p = _probs(logits, temperature)
        t2 = time.perf_counter()
        keep, fallback = apply_rule(p[:k], torch.cat(qs), torch.tensor(drafts)[:, None], generator, rule)  # 3.
        accepted = next((i for i in range(k) if not keep[i, 0]), k)
        last = int(fallback[accepted, 0]) if accepted < k else int(torch.multinomial(p[k], 1, generator=generator))
        new = drafts[:accepted] + [last]  # the residual's token at the first rejection, or the bonus from p_{k+1}
        crop_cache(t_cache, len(seq) + accepted)  # 4. drop rejected drafts
        crop_cache(d_cache, len(seq) + accepted)
        new = new[:max_new_tokens - (len(seq) - n_prompt)]
        steps.append(Step(tuple(drafts), accepted, tuple(i < accepted for i in range(k)), tuple(new), t1 - t0, t2 - t1))
        seq += new
    return SpeculativeRun(k, seq[n_prompt:], steps)


def _generator(seed: int, owner: str = OWNER) -> Any:
    validate.integer(owner, "seed", seed, "pass a seed >= 0, e.g. 0.", 0)
    return import_torch().Generator().manual_seed(seed)


def speculative_sample(target: Any, draft: Any, input_ids: Any, max_new_tokens: int, k: int, temperature: float,
                       seed: int = 0, rule: str = "leviathan") -> SpeculativeRun:
    """Speculative sampling at temperature T on the CPU, seeded: the draft samples k tokens, the target verifies.

    The run and its steps are `greedy_speculative`'s types, counted alike (exactly max_new_tokens tokens; EOS is
    not a stop). `rule` is the verify rule: "leviathan", the correct one, or one of the wrong ones the tests reject.
    """
    seq = check_loop_args(target, draft, input_ids, max_new_tokens, k, OWNER)
    temperature = _temperature(OWNER, temperature)
    validate.choice(OWNER, "rule", rule, VERIFY_RULES)
    with import_torch().inference_mode():
        return _run(target, draft, seq, max_new_tokens, k, temperature, _generator(seed), rule)


def sample(target: Any, input_ids: Any, max_new_tokens: int, temperature: float, n: int = 1,
           seed: int = 0) -> list[list[int]]:
    """The naive path: n sequences sampled from p at temperature T, one target forward per token (batched over n)."""
    torch = import_torch()
    seq = check_loop_args(target, None, input_ids, max_new_tokens, None, "sample")
    temperature = _temperature("sample", temperature)
    validate.integer("sample", "n", n, "draw at least one sequence, e.g. 1000.", 1)
    generator, out = _generator(seed, "sample"), []
    with torch.inference_mode():
        logits, cache = _logits(target, seq, None, 1)
        cache.batch_repeat_interleave(n)  # the prompt is read once, the n samples share its KV
        logits = logits.expand(n, -1)
        out.append(torch.multinomial(_probs(logits, temperature), 1, generator=generator))
        while len(out) < max_new_tokens:
            logits = target(out[-1], past_key_values=cache, use_cache=True).logits[:, -1]
            out.append(torch.multinomial(_probs(logits, temperature), 1, generator=generator))
    return torch.cat(out, dim=1).tolist()


def _settings(owner: str, temperatures: Sequence[float], alpha: float, rules: Sequence[str], seed: int) -> list[float]:
    """The checks both tests share, made before any model loads."""
    _generator(seed, owner)
    validate.number(owner, "alpha", alpha, "test at a level in (0, 1), e.g. 0.01.", 0.0, 1.0, low_open=True,
                    high_open=True)
    for rule in rules:
        validate.choice(owner, "rule", rule, VERIFY_RULES)
    if not temperatures:
        raise validate.refuse(owner, "temperatures", temperatures, "a non-empty list", "pass e.g. (1.0, 0.7).")
    return [_temperature(owner, t) for t in temperatures]


def _prompts(pair: tuple[Any, Any, Any] | None, n_prompts: int) -> tuple[Any, Any, list[list[int]]]:
    target, draft, tok = pair or load_pair()
    return target, draft, load_workload("journey", limit=n_prompts).prompt_ids(tok)


def rule_law(p: Any, q: Any, rule: str) -> Any:
    """The distribution a rule emits at one position, in closed form (leviathan's is p; the wrong ones are not)."""
    torch = import_torch()
    if rule == "accept_all":
        return q
    both, residual = torch.minimum(p, q), (p - q).clamp_min(0)
    return both + (1 - both.sum()) * (residual / residual.sum() if rule == "leviathan" else p)


def rule_test(pair: tuple[Any, Any, Any] | None = None, prompts: Sequence[int] = (0, 3),
              temperatures: Sequence[float] = (1.0, 0.7), n: int = 200_000, rules: Sequence[str] = VERIFY_RULES,
              seed: int = 0, alpha: float = ALPHA, threads: int = 1) -> list[dict[str, Any]]:
    """The rule at one position, exactly: the first emitted token of n vectorised trials against p (goodness of fit).

    p and q are the target's and the draft's next-token distributions after each journey prompt in `prompts`; a row
    per (prompt, temperature, rule), with the acceptance probability sum min(p, q) and the rule's distance from p
    (total variation, in closed form: 0 for leviathan).
    """
    validate.integer("rule_test", "n", n, "run the rule at least once, e.g. 200000.", 1)
    picked = validate.integers("rule_test", "prompts", prompts, "journey prompt indices 0..63, e.g. (0, 3).", 0, 63)
    temps = _settings("rule_test", temperatures, alpha, rules, seed)
    torch, rows = import_torch(), []
    with torch_threads(threads), torch.inference_mode():
        target, draft, ids = _prompts(pair, max(picked) + 1)
        for prompt in picked:
            x = torch.tensor([ids[prompt]])
            lt, ld = target(x).logits[0, -1:], draft(x).logits[0, -1:]
            for temperature in temps:
                p, q = _probs(lt, temperature), _probs(ld, temperature)
                for i, rule in enumerate(rules):
                    generator = _generator(seed + i)
                    drafts = torch.multinomial(q, n, replacement=True, generator=generator)
                    keep, fallback = apply_rule(p, q, drafts, generator, rule)
                    counts = torch.bincount(torch.where(keep, drafts, fallback)[0], minlength=p.shape[1]).tolist()
                    test = goodness_of_fit(counts, p[0].tolist(), alpha)
                    rows.append({"prompt": prompt, "temperature": temperature, "rule": rule,
                                 "accept_prob": float(torch.minimum(p, q).sum()),
                                 "tv_from_p": float((rule_law(p, q, rule) - p).abs().sum() / 2), **test,
                                 "detectable_w": detectable_w(test["df"], n, alpha) if test["df"] else None})
    return rows


def loop_test(pair: tuple[Any, Any, Any] | None = None, temperatures: Sequence[float] = (1.0, 0.7),
              n_prompts: int = 4, runs: int = 150, plain_runs: int = 600, k: int = 2, position: int = 2,
              seed: int = 0, rule: str = "leviathan", alpha: float = ALPHA, threads: int = 1) -> list[dict[str, Any]]:
    """The whole loop against plain sampling: the token at output `position`, stratified by prompt (homogeneity).

    Per temperature and journey prompt: `runs` speculative generations of position + 1 tokens (run r seeded with a
    seed of its own; the prompt's KV is computed once and cropped back after each run) and `plain_runs` plain
    samples. One token per run, so the counts are multinomial; the strata's statistics and df add up. At k = 2 and
    position 2 that token is an accepted draft, a residual's token or the bonus of step 1, or a token of step 2.
    A row per temperature: statistic, df, p-value, n (speculative runs), n_plain, verdict, detectable_w.
    """
    validate.integer("loop_test", "n_prompts", n_prompts, "journey prompts to test, e.g. 4.", 1, 64)
    validate.integer("loop_test", "runs", runs, "sample at least one run per prompt, e.g. 150.", 1)
    validate.integer("loop_test", "plain_runs", plain_runs, "sample at least one plain run per prompt, e.g. 600.", 1)
    validate.integer("loop_test", "position", position, "an output position >= 0, e.g. 2 (the 3rd new token).", 0)
    validate.integer("loop_test", "k", k, "draft at least one token per step, e.g. k=2.", 1)
    temps = _settings("loop_test", temperatures, alpha, [rule], seed)
    torch, rows = import_torch(), []
    with torch_threads(threads), torch.inference_mode():
        target, draft, prompts = _prompts(pair, n_prompts)
        prompts = [check_loop_args(target, draft, ids, position + 1, k, "loop_test") for ids in prompts]
        for ti, temperature in enumerate(temps):
            strata = []
            for pi, seq in enumerate(prompts):
                base = seed + 1_000_000 * (ti * len(prompts) + pi)  # every stratum its own seeds
                (_, t_cache), (_, d_cache) = _logits(target, seq[:-1], None, 1), _logits(draft, seq[:-1], None, 1)
                spec = Counter()
                for r in range(runs):
                    run = _run(target, draft, seq, position + 1, k, temperature, _generator(base + r), rule,
                               t_cache, d_cache)
                    spec[run.tokens[position]] += 1
                    crop_cache(t_cache, len(seq) - 1)
                    crop_cache(d_cache, len(seq) - 1)
                plain = sample(target, seq, position + 1, temperature, plain_runs, base + runs)
                strata.append((spec, Counter(s[position] for s in plain)))
            test = homogeneity(strata, alpha)
            n_eff = len(prompts) * runs * plain_runs / (runs + plain_runs)
            rows.append({"temperature": temperature, "rule": rule, "prompts": len(prompts), "k": k,
                         "position": position, **test, "n_plain": len(prompts) * plain_runs,
                         "detectable_w": detectable_w(test["df"], n_eff, alpha) if test["df"] else None})
    return rows


def distribution_kept(rule_rows: Sequence[dict[str, Any]], loop_rows: Sequence[dict[str, Any]]) -> bool:
    """The lab's claim on both tests' rows: the correct rule passes every test, every wrong rule is rejected."""
    right = [r for r in [*rule_rows, *loop_rows] if r["rule"] == "leviathan"]
    wrong = [r for r in [*rule_rows, *loop_rows] if r["rule"] != "leviathan"]
    return bool(right) and all(r["p_value"] >= ALPHA for r in right) and all(r["p_value"] < ALPHA for r in wrong)
