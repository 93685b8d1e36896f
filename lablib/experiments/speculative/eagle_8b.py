"""Lab 08 at real size with an EAGLE head: a synthetic Llama-3.1-8B target, a random-weight EAGLE-1 head of its
shape, the acceptance set to what the trained embedded head measured, position by position.

The 1B draft model of `synthetic` costs 0.33-0.44 of a target step: at the embedded pair's acceptance it never pays.
An EAGLE head is one decoder layer that reads the target's features and drafts through the target's own embedding
and lm_head (`lablib.models.eagle`), so its step streams a few percent of the 8B's bytes. Its random weights agree
with the target on nothing, so vLLM 0.26's synthetic rejection sampler sets the acceptance
(`"synthetic_acceptance_rates"`: per position, the unconditional chance that the first i + 1 drafts are all
accepted, the form `AcceptanceReport` measures as `measured_per_position`). The rates are the trained embedded
head's, measured by the greedy loop on this machine's CPU (`head_rates`) for each k: every cost is real, only the
acceptance is set, and every row says so (LABEL).

The grid is k = 1..6 x batches 1..64, every EAGLE run pinned like lab 08's (V1 runner, async off) against the pinned
baseline, with EAGLE at vLLM's defaults (V2 runner, async on) and FP8 weights beside them. One 8B engine starts in
about 110 s on an H200, so the grid is recorded in `PARTS` of 3-4 engines, one GPU command each, merged by the
facts' keys.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ... import validate
from ...mechanisms.speculative import implied_draft_cost
from ...models.drafters import check_rate_list, synthetic_eagle_config
from ...models.synthetic import synthetic_eagle, synthetic_spec
from ...results.reference import NotRecorded, load_reference, recorded_facts
from ...session import Shown, live_or_recorded
from .acceptance import drafter_acceptance
from .synthetic import LABEL, TARGET
from .vllm_runs import Setting, beside, loop_workers, vllm_spec_runs

KEY = "speculative-eagle-8b"  # facts[f"{KEY}-{part}"], one per part; scripts/record_reference.py --steps KEY-<part>
TAG = "8b-eagle"
KS = (1, 2, 3, 4, 5, 6)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
PARTS = {  # each one GPU command of 3-4 engines (6-9 minutes on an H200): the pinned bf16 baseline first in every part
    "a": {"ks": (1, 2, 3)},
    "b": {"ks": (4, 5, 6)},
    "c": {"ks": (4,), "defaults": True, "pinned": False},  # vLLM's defaults (V2 runner, async), baseline and head
    "d": {"ks": (4,), "fp8": True, "pinned": False},  # FP8 weights, baseline and head, pinned
}


def head_rates(ks: Sequence[int] = KS, n_prompts: int = 32, max_new_tokens: int = 64,
               threads: int = 1, workers: int = 1) -> dict[int, dict[str, Any]]:
    """The trained embedded EAGLE head's acceptance per k, from the greedy loop on the journey prompts: the
    per-position unconditional rates (non-increasing: a position is accepted only after all before it) and the
    mean acceptance length they make (`workers`: processes the prompts are split over; the same rates)."""
    rows = drafter_acceptance(("eagle",), n_prompts=n_prompts, max_new_tokens=max_new_tokens, ks=ks, threads=threads,
                              workers=workers)
    return {r["k"]: {"rates": [float(x) for x in r["measured_per_position"]], "length": float(r["measured_length"]),
                     "prompts": r["prompts"], "max_new_tokens": r["max_new_tokens"], "provenance": r["provenance"]}
            for r in rows}


def check_rates(ks: Sequence[int], rates: dict[Any, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """`rates` keyed by int k (a recording's JSON keys are strings), one entry of k valid rates for each of `ks`."""
    rates = {int(k): v for k, v in rates.items()}
    missing = [k for k in ks if k not in rates]
    if missing:
        raise validate.refuse("part_settings", "rates", sorted(rates), f"rates for k in {tuple(ks)}",
                              f"measure them: head_rates(ks={tuple(ks)}).")
    for k in ks:
        check_rate_list(k, rates[k]["rates"])
    return rates


def part_settings(part: str, rates: dict[Any, dict[str, Any]], head: Any, target: Any) -> list[Setting]:
    """The engines of one part, the pinned bf16 baseline first (every speedup in the part is over it)."""
    validate.choice("part_settings", "part", part, tuple(PARTS))
    p = PARTS[part]
    rates = check_rates(p["ks"], rates)
    spec = {k: synthetic_eagle_config(k, rates[k]["rates"], head, target) for k in p["ks"]}
    tag = f"{TAG}-{part}"  # each part's own steps: its pinned baseline is recorded apart from the other parts'
    out = [Setting("baseline", None, None, True, tag)]
    if p.get("pinned", True):
        out += [Setting("eagle", k, spec[k], True, tag) for k in p["ks"]]
    if p.get("defaults"):
        out += [Setting("baseline", None, None, False, tag)] + [Setting("eagle", k, spec[k], False, tag)
                                                                 for k in p["ks"]]
    if p.get("fp8"):
        out += [Setting("baseline", None, None, True, tag, "fp8")] + [Setting("eagle", k, spec[k], True, tag, "fp8")
                                                                       for k in p["ks"]]
    return out


def eagle_runs(part: str, *, batches: Sequence[int] = BATCHES, n_prompts: int = 64, max_new_tokens: int = 64,
               rates: dict[int, dict[str, Any]] | None = None, target: Any = None, head: Any = None,
               gpu_memory_utilization: float = 0.9, store: Any = None) -> dict[str, Any]:
    """One part of the grid on this GPU: the rows of `vllm_spec_runs` (tok/s, speedup, vLLM's counters, implied c)
    with LABEL and the rates set. FP8 and vLLM-defaults rows' speedup and implied c are over the baseline of the same
    weights and runner (`over_own_baseline`). `target`/`head` default to
    the synthetic 8B and its synthetic head (made on first use); `rates` to `head_rates` measured now."""
    batches = validate.integers("eagle_runs", "batches", batches, "batch sizes, e.g. (1, 2, 4, 8, 16, 32, 64).")
    ks = PARTS[validate.choice("eagle_runs", "part", part, tuple(PARTS))]["ks"]
    if rates is not None:
        rates = check_rates(ks, rates)  # refused before the 16 GB checkpoint is made
    # measured rates: the loop runs while the checkpoints are made (`beside`: a failure never waits on it)
    with contextlib.nullcontext() if rates is not None else beside(head_rates, ks, workers=loop_workers()) as measuring:
        target = target or synthetic_spec(TARGET)
        head = head or synthetic_eagle(TARGET)
        rates = rates if measuring is None else check_rates(ks, measuring.result())
    runs = part_settings(part, rates, head, target.path)  # every refusal before an engine starts
    failures: list[dict[str, Any]] = []
    t0 = time.time()
    rows = vllm_spec_runs(batches=batches, n_prompts=n_prompts, max_new_tokens=max_new_tokens, model=target,
                          gpu_memory_utilization=gpu_memory_utilization, store=store, runs=runs, failures=failures)
    over_own_baseline(rows)
    for r in rows:
        k = r["k"]
        r.update(label=LABEL, token_match=None, first_divergence=None,
                 set_rates=rates[k]["rates"] if k else None, set_length=rates[k]["length"] if k else None)
    return {"part": part, "rows": rows, "rates": {str(k): rates[k] for k in ks}, "failed": failures,
            "label": LABEL, "models": {"target": f"synthetic:{TARGET}", "head": f"synthetic:{TARGET}-eagle"},
            "workload": {"name": "journey", "requests": n_prompts, "max_new_tokens": max_new_tokens},
            "seconds": round(time.time() - t0, 1)}


def over_own_baseline(rows: list[dict[str, Any]]) -> None:
    """Rows with FP8 weights or at vLLM's defaults read over the baseline of the same weights and runner at the same
    batch (in place), so c compares a head step with a step of the same engine; "speedup_over_pinned_bf16" keeps the
    speedup over the part's first baseline. Where that baseline's engine failed, speedup and c are None."""
    base = {(r["batch"], r["pinned"], r.get("quantization")): r["output_tok_s"] for r in rows
            if r["method"] == "baseline"}
    for r in rows:
        if r["pinned"] and not r.get("quantization"):
            continue
        r["speedup_over_pinned_bf16"] = r["speedup"]
        own = base.get((r["batch"], r["pinned"], r.get("quantization")))
        r["speedup"] = None if own is None else r["output_tok_s"] / own
        r["implied_c"] = (None if own is None or r["method"] == "baseline" or r.get("mean_acceptance_length") is None
                          else implied_draft_cost(r["mean_acceptance_length"], r["k"], r["speedup"]))



# ---------------------------------------------------------------------------------------------------------------
# What the grid says: c per batch, the formula's speedup with it, the best k per batch, where it stops paying
# ---------------------------------------------------------------------------------------------------------------

def joined(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The recorded parts as one study: every row tagged with its part (each part has its own pinned baseline),
    the rates per k, the GPU and dates, which parts are still to record, and batch 1 against the bandwidth
    ceilings (`batch1_roofline`)."""
    rows = [{**r, "part": p} for p, got in sorted(parts.items()) for r in got["rows"]]
    rates = {k: v for got in parts.values() for k, v in got.get("rates", {}).items()}
    study = {"rows": rows, "rates": rates, "parts": sorted(parts), "missing": sorted(set(PARTS) - set(parts)),
             "label": LABEL, "gpu": sorted({got.get("gpu") for got in parts.values()} - {None}),
             "dates": sorted({got.get("date") for got in parts.values()} - {None}),
             "max_new_tokens": sorted({(got.get("workload") or {}).get("max_new_tokens") for got in parts.values()}
                                      - {None})}
    return {**study, "batch1": batch1_roofline(study)}  # batch 1 against the ceilings, for the lines and figure


def head_rows(study: dict[str, Any], *, pinned: bool = True, quantization: str | None = None) -> list[dict]:
    """The EAGLE rows of one runner and weight scheme, ordered by batch then k."""
    return sorted((r for r in study["rows"] if r["method"] == "eagle" and r["pinned"] == pinned
                   and r.get("quantization") == quantization), key=lambda r: (r["batch"], r["k"]))


def surface(study: dict[str, Any]) -> list[dict[str, Any]]:
    """Per batch and k (pinned, bf16): the measured speedup, the c it implies, and the formula's speedup
    E / (k c + 1) with c = the median implied c of that batch over every k (a draft step's cost should not depend on
    k; where the two speedups part, it does), E the acceptance length vLLM counted."""
    by_batch: dict[int, list[dict]] = {}
    for r in head_rows(study):
        by_batch.setdefault(r["batch"], []).append(r)
    out = []
    for b, rs in sorted(by_batch.items()):
        cs = [r["implied_c"] for r in rs if r.get("implied_c") is not None]
        c = statistics.median(cs) if cs else None
        for r in rs:
            e = r.get("mean_acceptance_length")
            out.append({"batch": b, "k": r["k"], "set_length": r.get("set_length"), "counted_length": e,
                        "output_tok_s": r["output_tok_s"], "speedup": r["speedup"], "implied_c": r.get("implied_c"),
                        "batch_c": c, "formula_speedup": None if c is None or e is None else e / (r["k"] * c + 1),
                        "part": r.get("part")})
    return out


TIE = 0.01  # speedups within 1% of the batch's best are one result: one run each, baselines part by more


def best_k(study: dict[str, Any]) -> list[dict[str, Any]]:
    """Per batch (pinned, bf16): the smallest k whose measured speedup is within TIE of the best (a larger k that
    is no faster only drafts more), that speedup, whether it pays, and the ks tied with it."""
    by_batch: dict[int, list[dict]] = {}
    for r in head_rows(study):
        by_batch.setdefault(r["batch"], []).append(r)
    out = []
    for b, rs in sorted(by_batch.items()):
        top = max(r["speedup"] for r in rs)
        tied = sorted((r for r in rs if r["speedup"] >= top * (1 - TIE)), key=lambda r: r["k"])
        r = tied[0]
        out.append({"batch": b, "best_k": r["k"], "speedup": r["speedup"], "implied_c": r.get("implied_c"),
                    "pays": r["speedup"] > 1, "tied_ks": [x["k"] for x in tied]})
    return out


def stops_paying(study: dict[str, Any]) -> int | None:
    """The smallest batch from which no k pays at that batch or any larger one measured (None: it pays throughout)."""
    best = best_k(study)
    for i, row in enumerate(best):
        if all(not r["pays"] for r in best[i:]):
            return row["batch"]
    return None


def _ceiling(row: dict[str, Any]) -> float | None:
    """The bandwidth ceiling of a row's run (tok/s): its Result's roofline (the H200's spec-sheet bandwidth over the
    bytes one plain decode step of those weights reads), live from the row, recorded from data/reference."""
    result = row.get("result")
    if result is None:
        try:
            result = load_reference(row["step"])[0]
        except (KeyError, ValueError, OSError):  # no step, a step not recorded, no reference files
            return None
    ceiling = (getattr(result, "roofline", None) or {}).get("ceiling_tok_s")
    return float(ceiling) if isinstance(ceiling, (int, float)) else None


def batch1_roofline(study: dict[str, Any]) -> list[dict[str, Any]]:
    """Batch 1 against the bandwidth roofline: each batch-1 row (baselines and heads, per weights and runner), its
    tok/s, the ceiling of its weights and its share of it. Plain decoding reads every weight once per token, so it
    cannot pass its ceiling; a verify pass reads them once for up to k + 1 tokens, so speculation can (a share over
    1). The ceiling is the baseline's of the same weights at batch 1 (bf16 or FP8: FP8 halves the Linears' bytes)."""
    ones, seen = [], set()
    for r in (r for r in study["rows"] if r["batch"] == 1):  # every part has its pinned baseline: the first is kept
        key = (r["method"], r["k"], r.get("quantization"), r["pinned"])
        if r["method"] != "baseline" or key not in seen:
            ones.append(r)
            seen.add(key)
    ceilings: dict[str, float] = {}
    for r in ones:
        w = r.get("quantization") or "bf16"
        if r["method"] == "baseline" and w not in ceilings and (c := _ceiling(r)) is not None:
            ceilings[w] = c
    out = []
    for r in ones:
        ceiling = ceilings.get(r.get("quantization") or "bf16")
        out.append({"name": r.get("name"), "weights": r.get("quantization") or "bf16", "k": r["k"],
                    "pinned": r["pinned"], "output_tok_s": r["output_tok_s"], "ceiling_tok_s": ceiling,
                    "share_of_ceiling": None if not ceiling else r["output_tok_s"] / ceiling, "part": r.get("part")})
    return out


def head_against_draft(study: dict[str, Any], draft: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per batch, the head's draft-step cost c (the median over k of `surface`) beside the 1B draft model's (the
    synthetic study's implied c, k=4) where both were measured: why one pays and the other does not."""
    head = {r["batch"]: r["batch_c"] for r in surface(study) if r["batch_c"] is not None}
    drafts = {r["batch"]: r["implied_c"] for r in (draft or {}).get("rows", [])
              if r.get("method") == "draft_model" and r.get("implied_c") is not None and r.get("pinned", True)
              and not r.get("quantization")}
    return [{"batch": b, "head_c": head[b], "draft_model_c": drafts[b]} for b in sorted(head) if b in drafts]


def eagle_lines(shown: Shown, draft: dict[str, Any] | None = None) -> str:
    """What the grid says, every number from it (or which steps record it); `draft`: the synthetic study's value
    (the 1B draft model on the same target), whose c is set beside the head's."""
    if shown.value is None:
        return f"[{shown.label}]"
    v = shown.value
    best = best_k(v)
    ks = sorted({r["k"] for r in head_rows(v)})
    text = (f"EAGLE head on the synthetic 8B (pinned, bf16; k {', '.join(map(str, ks))} recorded), best k per batch: "
            if ks else "EAGLE head on the synthetic 8B: ") + ", ".join(
        f"batch {r['batch']}: k={r['best_k']} {r['speedup']:.2f}x" + (
            f" (k {', '.join(map(str, r['tied_ks']))} within {TIE:.0%})" if len(r["tied_ks"]) > 1 else "")
        for r in best) + ". "
    stop = stops_paying(v)
    text += (f"From batch {stop} no k pays. " if stop is not None else
             ("It pays at every batch measured. " if best else "No EAGLE rows yet. "))
    roof = [r for r in v["batch1"] if r["pinned"] and r["weights"] == "bf16" and r["share_of_ceiling"]]
    base = next((r for r in roof if r["k"] is None), None)
    top = max((r for r in roof if r["k"] is not None), key=lambda r: r["output_tok_s"], default=None)
    if base and top:
        text += (f"At batch 1 the bf16 bandwidth ceiling is {base['ceiling_tok_s']:,.0f} tok/s: plain decoding "
                 f"reached {base['output_tok_s']:,.0f} ({base['share_of_ceiling']:.0%}), the head at k={top['k']} "
                 f"{top['output_tok_s']:,.0f} ({top['share_of_ceiling']:.0%}). ")
    pair = head_against_draft(v, draft)
    if pair:
        tokens = "/".join(map(str, v.get("max_new_tokens") or [])) or "?"
        theirs = ((draft or {}).get("workload") or {}).get("max_new_tokens") or "?"
        text += ("A head step costs c = " + ", ".join(f"{r['head_c']:.2f}" for r in pair) + " of a target step at batch "
                 + ", ".join(str(r["batch"]) for r in pair) + "; the 1B draft model's, " + ", ".join(
                     f"{r['draft_model_c']:.2f}" for r in pair) + f" (two recordings, each over its own baseline: "
                 f"{tokens}- and {theirs}-token outputs, prefill inside both). ")
    fp8 = head_rows(v, quantization="fp8")
    if fp8:
        one = [r for r in fp8 if r["batch"] == 1]
        fp8_ceiling = next((r["ceiling_tok_s"] for r in v["batch1"] if r["weights"] == "fp8"
                            and r["ceiling_tok_s"]), None)
        text += "".join(f"FP8 weights with the head at batch 1, k={r['k']}: {r['output_tok_s']:,.0f} tok/s ("
                        + (f"{r['speedup']:.2f}x over FP8 alone, " if r["speedup"] is not None else
                           "no FP8 baseline measured, ")
                        + f"{r['speedup_over_pinned_bf16']:.2f}x over bf16"
                        + (f"; {r['output_tok_s'] / fp8_ceiling:.0%} of the FP8 ceiling, {fp8_ceiling:,.0f}"
                           if fp8_ceiling else "") + "). " for r in one)
    if v["missing"]:
        text += f"Parts still to record: {', '.join(v['missing'])} (record_reference.py --steps " + ",".join(
            f"{KEY}-{p}" for p in v["missing"]) + "). "
    where = shown.label if shown.live else (f"recorded on {', '.join(v['gpu']) or 'a GPU'}, "
                                            f"{', '.join(v['dates']) or 'date unknown'}")
    return text + f"[{v['label']}; {where}]"


def eagle_study(force: bool | None = False) -> Shown[dict | None]:
    """Lab 08's EAGLE-at-size step: the recorded grid's parts joined (live it is four GPU commands of 8B engines,
    ~30 minutes: `record_reference.py --steps speculative-eagle-8b-a,...`), or a label naming the steps."""
    def recorded() -> dict[str, Any]:
        parts = {}
        for p in PARTS:
            try:
                got = recorded_facts(f"{KEY}-{p}", f"{KEY}-{p}")
            except NotRecorded:
                continue
            where = f"recorded on {got.get('gpu') or 'a GPU'}, {got.get('date') or 'date unknown'}"
            parts[p] = {**got, "rows": [{**r, "provenance": where} for r in got["rows"]]}  # not "live": shown here
        if not parts:
            raise NotRecorded(KEY, ",".join(f"{KEY}-{p}" for p in PARTS))
        return joined(parts)

    return live_or_recorded(lambda: joined({p: eagle_runs(p) for p in PARTS}), recorded, force=force)
