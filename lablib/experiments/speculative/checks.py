"""Lab 08's Checks cell: the CPU loop's claims asserted on this run, vLLM's claims when its grid ran live.

`checks` takes the lab's object (`lab.SpeculativeLab`: the CPU study, transformers' assisted generation, the
harness runs, both drafters' acceptance, the two chi-square tests, the batch model, the vLLM study) and asserts each
claim on it: exactness of the greedy loops, the counters' consistency, the formula within three standard
errors, the distribution kept at temperature T, the batch model's reversal; vLLM's counters, starts, cross-check
and the model drafters' cost (c at least 0.5: they never pay at this size) only where `gpu` was measured on this machine
(`Checks.live`).
"""
from __future__ import annotations

from ...config import lab_id
from ...session import Checks
from .lab import SpeculativeLab
from .maths import pays_then_reverses
from .ngram import against_grid, agrees_with_vllm, copy_pays_more
from .sampling import distribution_kept
from .study import acceptance_table
from .vllm_runs import model_drafter_costs, model_drafters_never_pay


def checks(lab: SpeculativeLab) -> None:
    """Lab 08's Checks cell, on every step `lab` ran. Prints what ran and what did not (and returns nothing, so the
    cell shows it once)."""
    lab.require_all()
    study, hf, harness, drafters, model, gpu = lab.study, lab.hf, lab.harness, lab.drafters, lab.model, lab.gpu
    sampling_rule, sampling_loop = lab.sampling_rule, lab.sampling_loop
    c = Checks(lab_id("08"))
    acc = acceptance_table(study)
    c.that("the loop emits exactly the target's greedy tokens, every k", all(r["identical_to_greedy"] for r in acc))
    c.that("the loop's counters are consistent (vLLM's definitions)", all(r["counters_consistent"] for r in acc))
    c.that("transformers' assisted generation keeps naive generate's tokens, draft and n-gram, through the harness",
           all(r["identical_to_naive"] for r in harness["rows"]))
    c.that("mean acceptance length within 3 standard errors of E(alpha, k), every k",
           all(abs(r["gap_in_stderrs"]) <= 3 for r in acc), [round(r["gap_in_stderrs"], 2) for r in acc])
    c.that("transformers' assisted generation gives the same tokens", hf["all_identical"], hf)
    c.that("the EAGLE loop emits the target's greedy tokens, its counters consistent, every k",
           all(r["identical_to_greedy"] and r["counters_consistent"] for r in drafters if r["drafter"] == "eagle"))
    c.that("speculative sampling keeps the target's distribution (chi-square at level 0.01, the rule and the loop), "
           "and the test rejects both wrong rules", distribution_kept(sampling_rule, sampling_loop),
           [round(r["p_value"], 3) for r in sampling_rule + sampling_loop if r["rule"] == "leviathan"])
    c.that("the batch model: every drafter pays at batch 1 and reverses at a larger batch", pays_then_reverses(model),
           model["reversal"])
    ngram_rows = lab.ngram_rows
    c.that("n-gram drafts more often and makes more tokens per step on code edits than on the journey, every k",
           copy_pays_more(ngram_rows), [(r["text"], r["k"], round(r["tokens_per_step"] or 0, 2)) for r in ngram_rows])
    c.live(gpu, "vLLM's counters are consistent in every speculative run",
           lambda v: all(r["counters_consistent"] for r in v["rows"] if r["method"] != "baseline"))
    c.live(gpu, "every setting's engine started and served every batch", lambda v: not v.get("failed"),
           lambda v: v.get("failed"))
    c.live(gpu, "vLLM's mean acceptance length within 3 standard errors of the loop's, same drafter and prompts",
           lambda v: bool(v["cross_check"]) and all(x["within_3_stderrs"] for x in v["cross_check"]),
           lambda v: [round(x["gap_in_stderrs"], 2) for x in v["cross_check"]])
    c.live(gpu, "on the embedded pair a model drafter's step costs about a target step (c >= 0.5), so neither the "
           "draft model nor the EAGLE head beats plain decoding at any batch", model_drafters_never_pay,
           model_drafter_costs)
    c.live(gpu, "vLLM's n-gram counts on the journey within 3 standard errors of the replay on the same text",
           lambda v: agrees_with_vllm(ngram_rows, v),
           lambda v: [round(x["gap_in_stderrs"], 2) for x in against_grid(ngram_rows, v)])
    c.live(gpu, "VRAM back to baseline after every engine", lambda v: all(r["back_to_baseline"] for r in v["rows"]))
    c.done()
