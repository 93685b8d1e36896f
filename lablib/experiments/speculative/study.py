"""Lab 08's CPU study: acceptance and speed of the embedded pair per k, the costs that predict the speed, as tables.

Cost on this CPU: two tiny models, so a forward is mostly fixed cost (Python, dispatch), and a verify
pass over k+1 positions costs only ~1.2-2 single-token target forwards. The speedup is
E / (k c + verify_cost) with both ratios measured here, two ways: forward by forward, the shapes
timed round-robin (`forward_costs`), and inside the loop (`Step.draft_s`, `Step.verify_s`). They
differ: in the loop c falls as k grows (the first draft forward after a verify costs more than the
next ones; likely the CPU caches, which a verify fills with the target's weights), which one c cannot
express. The in-loop
ratios account for the measured speedup up to the Python outside the forwards and the cut last step's
unused drafts. Every timing is labelled as this CPU's (`provenance`); on a shared machine it is noisy.

`cpu_study` runs it; `study_row`, `acceptance_table`, `cost_table`, `loop_lines` and `cost_lines` read what it returned.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from ... import validate
from ...bench.offline import run_step
from ...engines.hf import HFEngine
from ...mechanisms.speculative import SpecCounters, speedup
from ...workloads import load_workload
from ..journey import Step
from .acceptance import acceptance_report, counters_consistent
from .loops import (
    check_loop_args,
    forward_argmax,
    crop_cache,
    import_torch,
    greedy,
    greedy_speculative,
    load_pair,
    provenance,
)
from ...config import BenchConfig, HFConfig, lab_id


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


def forward_costs(target: Any, draft: Any, input_ids: Any, ks: Sequence[int] = (1, 2, 4, 8),
                  repeats: int = 50) -> dict[str, Any]:
    """c = draft forward of 1 token / target forward of 1 token, and verify_cost = target over k+1 / over 1.

    Each forward runs on top of the prompt's KV cache (cropped back after every call). The shapes are
    timed round-robin, `repeats` rounds after one warm-up round, so that load from other processes hits
    them alike; each time is the median of its rounds.
    """
    ks = validate.integers("forward_costs", "ks", ks, "pass draft lengths, e.g. (1, 2, 4, 8).")
    validate.integer("forward_costs", "repeats", repeats, "time at least one round, e.g. 50.")
    ids = check_loop_args(target, draft, input_ids, max(ks) + 1, max(ks))
    shapes = [(draft, 1), (target, 1), *((target, k + 1) for k in ks)]
    times: list[list[float]] = [[] for _ in shapes]
    with import_torch().inference_mode():
        caches = {id(m): forward_argmax(m, ids, None, 1)[1] for m in (target, draft)}
        for _ in range(repeats + 1):
            for (model, n), got in zip(shapes, times):
                t0 = time.perf_counter()
                forward_argmax(model, ids[-1:] * n, caches[id(model)], n)
                got.append(time.perf_counter() - t0)
                crop_cache(caches[id(model)], len(ids))
    draft_ms, target_ms, *verify = (1000 * statistics.median(t[1:]) for t in times)
    verify_ms = dict(zip(ks, verify))
    return {"context": len(ids), "draft_ms": draft_ms, "target_ms": target_ms, "c": draft_ms / target_ms,
            "verify_ms": verify_ms, "verify_cost": {k: v / target_ms for k, v in verify_ms.items()},
            "provenance": provenance()}


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
    torch = import_torch()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        target, draft, tok = pair or load_pair()
        prompts = load_workload("journey", limit=n_prompts).prompt_ids(tok)
        for p in prompts:
            check_loop_args(target, draft, p, max_new_tokens, max(ks))
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


# --- the same pair as engine rungs, through the lab's own harness (bench.run): the journey's lab 08 rungs -------

HARNESS = (("naive generate", ""), ("draft model", "draft"), ("n-gram (prompt lookup)", "ngram"))


def harness_runs(n_prompts: int = 16, max_new_tokens: int = 32, k: int = 4, *, store: Any = None,
                 lab: str = lab_id("08"), threads: int | None = 1) -> dict[str, Any]:
    """Naive generate, then transformers' assisted generation with the embedded draft and with prompt lookup,
    each an `HFEngine` run by `bench.run` on the same journey prompts (one warm-up request, exact lengths): what
    the journey's lab 08 rungs measure, with the latencies every other lab reports. On the CPU on every machine,
    in float32, as the loop (`cpu_study`): a GPU's bfloat16 rounds the verify pass over k+1 tokens differently
    from one-token decode steps, so "identical to naive" would test the rounding, not the method (lab 02 shows
    the same with eager against sdpa); vLLM is the GPU's speculative decoding, in step 7.

    Returns {"rows": one per engine (tok/s, speedup over naive, TTFT and TPOT p50, tokens per target forward,
    identical to naive's greedy tokens), "k", "provenance", "results"}. `threads` pins torch's threads (1: steady
    on a shared CPU)."""
    owner = "harness_runs"
    validate.integer(owner, "n_prompts", n_prompts, "journey prompts, e.g. 16.", 1, 64)
    validate.integer(owner, "max_new_tokens", max_new_tokens, "new tokens per request, e.g. 32.")
    validate.integer(owner, "k", k, "tokens proposed per verify step, e.g. 4.", 1, 16)
    wl = load_workload("journey", limit=n_prompts)
    bench = BenchConfig(max_new_tokens=max_new_tokens, progress=False)
    steps = [Step(f"hf-naive-{how}-k{k}" if how else "hf-naive-sdpa",
                  lambda m, how=how: HFEngine(m, HFConfig(speculative=how, num_speculative_tokens=k, device="cpu")))
             for _, how in HARNESS]
    results = [run_step(s, "embedded", wl, bench, lab=lab, store=store, threads=threads) for s in steps]
    rows, naive = [], results[0]
    for (name, how), r in zip(HARNESS, results):
        s, spec = r.summary, (r.engine_facts.get("last_run") or {}).get("speculative") or {}
        rows.append({"engine": name, "speculative": how or "off", "output_tok_s": s["output_tok_s"],
                     "speedup": s["output_tok_s"] / naive.summary["output_tok_s"],
                     "ttft_p50_ms": s["ttft_s"]["p50"] * 1e3, "tpot_p50_ms": s["tpot_s"]["p50"] * 1e3,
                     "tokens_per_target_forward": spec.get("tokens_per_forward"),
                     "identical_to_naive": [q.output_ids for q in r.requests] ==
                                           [q.output_ids for q in naive.requests]})
    return {"rows": rows, "k": k, "provenance": provenance(threads), "results": results}


def harness_lines(runs: dict[str, Any]) -> str:
    """What the harness runs say, every number from them."""
    out = [f"{runs['provenance']}; k = {runs['k']}:"]
    for r in runs["rows"][1:]:
        out.append(f"  {r['engine']}: {r['output_tok_s']:,.0f} output tok/s, {r['speedup']:.2f}x naive generate "
                   f"({runs['rows'][0]['output_tok_s']:,.0f}); {r['tokens_per_target_forward']:.2f} tokens per target "
                   f"forward; TPOT p50 {r['tpot_p50_ms']:.2f} ms against {runs['rows'][0]['tpot_p50_ms']:.2f}; "
                   f"tokens {'identical to' if r['identical_to_naive'] else 'NOT identical to'} naive's")
    return "\n".join(out)
