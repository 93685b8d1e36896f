"""Lab 07's claims: the readers of the on/off runs, and the Checks cell.

`part` takes one part of an on/off run's Shown (its runs, its agreement) still labelled; `on_off_pairs`
sets caching on beside off per model and workload; `caching_cuts_ttft` and `falls_with_capacity` are the
claims on them, `serve_hits_predicted` and `serve_cuts_ttft` the claims on the server under load
(`serving`); `checks` is the notebook's Checks cell: the simulator's exact cases asserted on this run,
vLLM's claims when measured live.
"""
from __future__ import annotations

import itertools
from typing import Any

from ...session import Checks
from .runs import counters_keep_only_the_first, on_off_pairs
from .scarce import pool_as_asked
from .workloads import BIG
from ...config import lab_id


def part(shown: Any, key: str, then: Any = None) -> Any:
    """One part of a Shown dict (e.g. on_off's "runs"), passed through `then` if given, still labelled; no value
    stays no value."""
    value = None if shown.value is None else shown.value[key] if then is None else then(shown.value[key])
    return shown.derived(value)  # the same label and stand-ins


CONTROL = "-shared-after"  # the workload whose shared part follows a per-request line: caching on reuses nothing


def _all_identical(count: str) -> bool:
    """'32 of 32' (outputs_agree's count, as the rows carry it): every request identical."""
    same, _, of = count.partition(" of ")
    return same == of


def control_identical(rows: list[dict[str, Any]], model: str = "embedded") -> bool:
    """Where caching reuses nothing (the shared-after control), `model`'s greedy tokens are identical on and off."""
    mine = [a for a in rows if a["model"] == model and a["workload"].endswith(CONTROL)]
    return bool(mine) and all(a["identical"] == a["of"] for a in mine)


def agreement_lines(shown: Any) -> str:
    """Per model, what the on/off greedy comparison says, every number from the rows: the control (nothing reused)
    against the sets that reuse blocks, the same run twice where recorded, and which of the two explanations the
    numbers leave."""
    if shown.value is None:
        return f"[{shown.label}]"
    out = []
    rows = shown.value["agreement"]
    for model in dict.fromkeys(a["model"] for a in rows):
        mine = [a for a in rows if a["model"] == model]
        control = [a for a in mine if a["workload"].endswith(CONTROL)]
        reused = [a for a in mine if not a["workload"].endswith(CONTROL)]
        same = sum(a["identical"] for a in reused)
        firsts = sorted(d["first_divergence"] for a in reused for d in a["diverged"] if d["first_divergence"] is not None)
        text = (f"{model}: {same} of {sum(a['of'] for a in reused)} requests identical on the sets that reuse blocks"
                + (f" (first difference at token {firsts[len(firsts) // 2]} in the median)" if firsts else "")
                + "; the control, which reuses nothing: "
                + ", ".join(f"{a['identical']} of {a['of']}" for a in control))
        twice = [a["off_twice"] for a in mine if a.get("off_twice")]
        if twice:
            text += f"; caching off, the same run twice: {', '.join(twice)}"
        quiet = control_identical(rows, model)
        steady = all(_all_identical(t) for t in twice)  # one engine, caching off, run twice: nothing moved
        moved = same < sum(a["of"] for a in reused)  # on against off parted somewhere the cache reused blocks
        if twice and not steady and moved:
            text += (". One engine with caching off, run twice on the same sets, already parts, so on against off "
                     "cannot single out the cache here: " +
                     ("random weights give flat logits, where near-ties are everywhere and bf16's last bits decide."
                      if model.startswith("synthetic") else "bf16's last bits move between runs and greedy decoding "
                      "flips at near-ties."))
        elif quiet and moved:
            text += (". Without reuse on and off agree exactly, so the differences come with reused blocks: K/V "
                     "computed in another request's prefill, in another batch shape, differ in bf16's last bits, "
                     "and greedy decoding flips where two tokens are nearly tied.")
        elif control and not quiet and twice and steady:
            text += (". The control differs too, while one engine with caching off, run twice, agrees exactly: the "
                     "differences are neither the reused blocks' nor one engine's run-to-run noise, they come with "
                     "the second engine, the one with caching on (switching caching on, or only starting another "
                     "engine: this run cannot tell the two apart), where greedy decoding flips at near-ties.")
        elif control and not quiet:
            text += (". The control differs too, so these differences are not the cache's: two engines of the same "
                     "configuration already part on this model" +
                     (" (random weights give flat logits, where near-ties are everywhere)." if model.startswith(
                         "synthetic") else "."))
        out.append(text)
    return "\n".join(out) + f"\n[{shown.label}]"


def caching_cuts_ttft(runs: list[dict[str, Any]], model: str = f"synthetic:{BIG}") -> bool:
    """The lab's claim: on every shared-first set, caching on gives `model` a lower TTFT p50 than off."""
    pairs = [p for p in on_off_pairs(runs) if p["model"] == model and not p["workload"].endswith(CONTROL)]
    return bool(pairs) and all(p["ttft_p50_on_s"] < p["ttft_p50_off_s"] for p in pairs)


def serve_hits_predicted(rows: list[dict[str, Any]]) -> bool:
    """The serving claim: with caching on, at every rate, the counters' hits and queries over the test equal the
    simulator's for the same requests, and every request was answered."""
    on = [r for r in rows if r["caching"] == "on"]
    return bool(on) and all(r["errors"] == 0 and (r["hits"], r["queries"]) == (r["predicted_hits"],
                                                                             r["predicted_queries"]) for r in on)


def serve_cuts_ttft(rows: list[dict[str, Any]], model: str = f"synthetic:{BIG}") -> bool:
    """At the highest rate, where prefills queue, caching on gives `model` a lower TTFT p50 than off (shared-first
    sets only: the shared-after variant hits nothing)."""
    mine = [r for r in rows if r["model"] == model and not r["workload"].endswith(CONTROL)]
    top = max((r["rate"] for r in mine), default=None)
    by = {r["caching"]: r["ttft_p50_s"] for r in mine if r["rate"] == top}
    return {"on", "off"} <= set(by) and by["on"] < by["off"]


def falls_with_capacity(rows: list[dict[str, Any]]) -> bool:
    """The scarce-memory claim: for every order, less room never raises the hit rate nor lowers the evictions."""
    for order in dict.fromkeys(r["order"] for r in rows):
        mine = sorted((r for r in rows if r["order"] == order), key=lambda r: r["num_blocks"])
        if any(a["hit_rate"] > b["hit_rate"] or a["evictions"] < b["evictions"]
               for a, b in itertools.pairwise(mine)):
            return False
    return True


def checks(lab: Any) -> None:
    """Lab 07's Checks cell, on what the lab's object (`lab.PrefixLab`) made: the simulator's exact cases asserted on
    this run, vLLM's claims when measured live.

    Reads the repeat table, the hash chain, the prefix-length rows, the advice runs, the eviction demo, the
    scarce-memory rows, the sequential counters, the on/off runs, and where they ran the transformers reuse study,
    the server's load tests, the counters 32 at once and vLLM's scarce-memory runs. Prints what ran and what did
    not (and returns nothing, so the cell shows it once)."""
    lab.require_all()
    idea, chain, lengths, advice, demo, scarce = lab.idea, lab.chain, lab.lengths, lab.advice, lab.demo, lab.scarce
    seq, onoff, reuse, serve, batch, scarce_vllm = lab.seq, lab.onoff, lab.reuse, lab.served, lab.batch, lab.scarce_vllm
    c = Checks(lab_id("07"))
    c.that(
        "a repeated 64-token prompt caches 48 tokens: whole blocks, the last token recomputed",
        idea.loc[64, "cached_second_time"] == 48,
        idea.loc[64].to_dict(),
    )
    c.that(
        "chained hashes: shared over the 128 shared tokens (8 blocks) only; a line first shares none",
        [r["shared"] for r in chain] == [True] * 8 + [False] * 2 and not any(r["shared, line first"] for r in chain),
    )
    c.that(
        "a 200-token shared prefix caches 192 tokens per later request",
        lengths[1]["shared_tokens"] == 200 and lengths[1]["cached_per_later_request"] == 192,
        lengths[1],
    )
    c.that(
        "the hit rate grows with the shared-prefix length",
        all(a["hit_rate"] < b["hit_rate"] for a, b in itertools.pairwise(lengths)),
    )
    c.that(
        "the shared part after a per-request line: 0 hits",
        advice["per-request line first"].hits == 0,
        advice["per-request line first"].hits,
    )
    turns = advice["multi-turn"].cached_tokens
    c.that("multi-turn: cached tokens grow strictly every turn", all(a < b for a, b in itertools.pairwise(turns)), turns)
    c.that(
        "the block picture: blocks shared by two running requests, hashes evicted",
        demo.evictions > 0 and any(max(s.ref_counts) > 1 for s in demo.snapshots),
    )
    c.that(
        "scarce memory: round-robin hits nothing with less room than all the prefixes",
        all(r["hits"] == 0 for r in scarce if r["order"] == "round-robin" and r["num_blocks"] <= r["prefix_blocks"]),
    )
    c.that("scarce memory: less room never raises the hit rate, nor lowers the evictions", falls_with_capacity(scarce))
    if reuse is not None:  # reuse.reuse_study: measured on this machine, whatever it is
        c.that("on this machine, reusing the shared prefix's K/V cuts the median time to first token",
               reuse["warm_ttft_p50_ms"] < reuse["cold_ttft_p50_ms"],
               f"{reuse['cold_ttft_p50_ms']:.1f} ms cold, {reuse['warm_ttft_p50_ms']:.1f} ms warm")
        c.that("the reused K/V give every request the same next token, logits equal to float rounding (< 1e-3)",
               all(r["same_first_token"] and r["max_logit_diff"] < 1e-3 for r in reuse["rows"]),
               max(r["max_logit_diff"] for r in reuse["rows"]))
    c.live(
        seq,
        "vLLM's num_cached_tokens equals the simulator's, request by request, one request at a time",
        lambda rows: all(r["per_request_exact"] for r in rows),
        lambda rows: [r["verdict"] for r in rows if not r["per_request_exact"]],
    )
    c.live(
        seq,
        "vLLM's counter totals equal the simulator's, or hold exactly the first request's (vLLM 0.26 drops the stats "
        "of steps without outputs, PR #48668)",
        lambda rows: all(r["exact"] or counters_keep_only_the_first(r) for r in rows),
        lambda rows: [r["verdict"] for r in rows],
    )
    if batch is not None:
        c.live(batch, "32 at once, vLLM's counters equal the simulator's in total and request by request",
               lambda rows: all(r["exact"] for r in rows), lambda rows: [r["verdict"] for r in rows if not r["exact"]])
    c.live(
        seq,
        "vLLM hits nothing with a per-request line first",
        lambda rows: all(r["vllm_hits"] == 0 for r in rows if r["workload"].endswith(CONTROL)),
    )
    c.live(
        part(onoff, "runs"), "prefix caching cuts TTFT p50 on every shared-prefix set (synthetic 8B)", caching_cuts_ttft
    )
    if scarce_vllm is not None:  # scarce.scarce_vllm: vLLM with a pool of the simulator's capacity
        c.live(scarce_vllm, "vLLM's pool holds exactly the blocks asked for (the capacity and its null block)",
               pool_as_asked, lambda rows: [(r["num_blocks"], r["kv_blocks"]) for r in rows])
        c.live(scarce_vllm, "with too few blocks for every prefix (evictions), vLLM's num_cached_tokens equals the "
               "simulator's, request by request, in every order",
               lambda rows: all(r["per_request_exact"] for r in rows),
               lambda rows: [r["verdict"] for r in rows if not r["per_request_exact"]])
    if serve is not None:  # serving.serve: the server under Poisson load
        c.live(serve, "under Poisson load the server's prefix-cache counters equal the simulator's, at every rate",
               serve_hits_predicted,
               lambda rows: [{k: r[k] for k in ("rate", "hits", "predicted_hits", "queries", "predicted_queries",
                                                "errors")} for r in rows if r["caching"] == "on"])
        c.live(serve, "at the highest rate, caching on cuts the server's TTFT p50 (synthetic 8B)", serve_cuts_ttft,
               lambda rows: [(r["caching"], r["rate"], r["ttft_p50_s"]) for r in rows])
    c.done()
