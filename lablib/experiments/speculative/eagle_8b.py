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
about 110 s on an H200, so the grid is recorded in `PARTS`, one GPU command each, merged by the facts' keys.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ... import validate
from ...mechanisms.speculative import implied_draft_cost
from ...models.drafters import speculative_config
from ...models.synthetic import synthetic_eagle, synthetic_spec
from .acceptance import drafter_acceptance
from .synthetic import LABEL, TARGET
from .vllm_runs import Setting, vllm_spec_runs

KEY = "speculative-eagle-8b"  # facts[f"{KEY}-{part}"], one per part; scripts/record_reference.py --steps KEY-<part>
TAG = "8b-eagle"
KS = (1, 2, 3, 4, 5, 6)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
PARTS = {  # each one GPU command of ~10-12 minutes on an H200: the pinned bf16 baseline first in every part
    "a": {"ks": (1, 2, 3)},
    "b": {"ks": (4, 5, 6)},
    "c": {"ks": (4,), "defaults": True, "fp8": True},  # vLLM's defaults for both, and FP8 weights, at k = 4
}


def head_rates(ks: Sequence[int] = KS, n_prompts: int = 32, max_new_tokens: int = 64,
               threads: int = 1) -> dict[int, dict[str, Any]]:
    """The trained embedded EAGLE head's acceptance per k, from the greedy loop on the journey prompts: the
    per-position unconditional rates (non-increasing: a position is accepted only after all before it) and the
    mean acceptance length they make."""
    rows = drafter_acceptance(("eagle",), n_prompts=n_prompts, max_new_tokens=max_new_tokens, ks=ks, threads=threads)
    return {r["k"]: {"rates": [float(x) for x in r["measured_per_position"]], "length": float(r["measured_length"]),
                     "prompts": r["prompts"], "max_new_tokens": r["max_new_tokens"], "provenance": r["provenance"]}
            for r in rows}


def eagle_config(k: int, rates: Sequence[float], head: Any, target: Any) -> dict[str, Any]:
    """vLLM's speculative_config for the EAGLE head at k with the synthetic sampler at `rates` (one per position,
    each in [0, 1], non-increasing: what vLLM 0.26 accepts), refused here before an engine starts."""
    owner = "eagle_config"
    rates = [float(r) for r in rates]
    if len(rates) != k or not all(0.0 <= r <= 1.0 for r in rates) or any(b > a for a, b in zip(rates, rates[1:])):
        raise validate.refuse(owner, "rates", rates, f"{k} rates (one per drafted position) in [0, 1], non-increasing",
                              "take them from head_rates(ks) at the same k.")
    spec = speculative_config("eagle", k, draft=head, target=target)
    return {**spec, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}


def part_settings(part: str, rates: dict[int, dict[str, Any]], head: Any, target: Any) -> list[Setting]:
    """The engines of one part, the pinned bf16 baseline first (every speedup in the part is over it)."""
    validate.choice("part_settings", "part", part, tuple(PARTS))
    p = PARTS[part]
    missing = [k for k in p["ks"] if k not in rates]
    if missing:
        raise validate.refuse("part_settings", "rates", sorted(rates), f"rates for k in {p['ks']}",
                              f"measure them: head_rates(ks={tuple(p['ks'])}).")
    spec = {k: eagle_config(k, rates[k]["rates"], head, target) for k in p["ks"]}
    out = [Setting("baseline", None, None, True, TAG)]
    out += [Setting("eagle", k, spec[k], True, TAG) for k in p["ks"]]
    if p.get("defaults"):
        out += [Setting("baseline", None, None, False, TAG)] + [Setting("eagle", k, spec[k], False, TAG)
                                                                 for k in p["ks"]]
    if p.get("fp8"):
        out += [Setting("baseline", None, None, True, TAG, "fp8")] + [Setting("eagle", k, spec[k], True, TAG, "fp8")
                                                                       for k in p["ks"]]
    return out


def eagle_runs(part: str, *, batches: Sequence[int] = BATCHES, n_prompts: int = 64, max_new_tokens: int = 64,
               rates: dict[int, dict[str, Any]] | None = None, target: Any = None, head: Any = None,
               gpu_memory_utilization: float = 0.9, store: Any = None) -> dict[str, Any]:
    """One part of the grid on this GPU: the rows of `vllm_spec_runs` (tok/s, speedup, vLLM's counters, implied c)
    with LABEL, the rates set and vLLM's counted per-position rates beside them. FP8 rows' speedup and implied c are
    over the FP8 baseline, so c compares a head step with a step of the same weights. `target`/`head` default to
    the synthetic 8B and its synthetic head (made on first use); `rates` to `head_rates` measured now."""
    batches = validate.integers("eagle_runs", "batches", batches, "batch sizes, e.g. (1, 2, 4, 8, 16, 32, 64).")
    ks = PARTS[validate.choice("eagle_runs", "part", part, tuple(PARTS))]["ks"]
    rates = rates or head_rates(ks)
    target = target or synthetic_spec(TARGET)
    head = head or synthetic_eagle(TARGET)
    runs = part_settings(part, rates, head, target.path)  # every refusal before an engine starts
    failures: list[dict[str, Any]] = []
    t0 = time.time()
    rows = vllm_spec_runs(batches=batches, n_prompts=n_prompts, max_new_tokens=max_new_tokens, model=target,
                          gpu_memory_utilization=gpu_memory_utilization, store=store, runs=runs, failures=failures)
    over_fp8_baseline(rows)
    for r in rows:
        k = r["k"]
        r.update(label=LABEL, token_match=None, first_divergence=None,
                 set_rates=rates[k]["rates"] if k else None, set_length=rates[k]["length"] if k else None)
    return {"part": part, "rows": rows, "rates": {str(k): rates[k] for k in ks}, "failed": failures,
            "label": LABEL, "models": {"target": f"synthetic:{TARGET}", "head": f"synthetic:{TARGET}-eagle"},
            "workload": {"name": "journey", "requests": n_prompts, "max_new_tokens": max_new_tokens},
            "seconds": round(time.time() - t0, 1)}


def over_fp8_baseline(rows: list[dict[str, Any]]) -> None:
    """FP8 rows' speedup and implied c over the FP8 baseline at the same batch (in place); "speedup_over_bf16" keeps
    the speedup over the bf16 pinned baseline."""
    base = {r["batch"]: r["output_tok_s"] for r in rows if r["method"] == "baseline" and r.get("quantization")}
    for r in rows:
        if not r.get("quantization") or r["batch"] not in base:
            continue
        r["speedup_over_bf16"] = r["speedup"]
        r["speedup"] = r["output_tok_s"] / base[r["batch"]]
        if r["method"] != "baseline" and r.get("mean_acceptance_length") is not None:
            r["implied_c"] = implied_draft_cost(r["mean_acceptance_length"], r["k"], r["speedup"])

