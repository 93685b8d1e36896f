"""Lab 08's speed at real size: a synthetic Llama-3.1-8B target and Llama-3.2-1B draft, acceptance set, speed real.

The embedded pair is trained, so its acceptance is real, but it is tiny: on a GPU both of its forwards are
launch overhead, a draft step costs what a target step does, and no speculative speedup can show. A random-
weight 8B target with a random-weight 1B draft has the opposite problem: its steps stream gigabytes (the regime
where a verify pass over k + 1 positions is nearly free), but a random draft agrees with a random target on
nothing. vLLM 0.26 has the tool for exactly this: its rejection sampler can be told to accept at a set rate
(`"rejection_sample_method": "synthetic"`, `"synthetic_acceptance_length": L`), so every engine cost is real (the
draft's forwards, the verify pass, the bookkeeping) and only the acceptance is set. L is set to what the
trained pair accepted (the torch loop's measured length at the same k), so the run answers: "with the embedded
pair's acceptance, what would a 1B draft buy an 8B target on an H200, batch by batch?". Every row says so:
LABEL. The tokens are noise (random weights) and are not compared.

`synthetic_config` builds vLLM's speculative_config (the draft's vocabulary checked against the target's, L in
1..k+1); `synthetic_speed_runs` runs the pinned baseline and the draft on one engine each over the batch sizes
(`vllm_spec_runs`, waves of b requests); `synthetic_study` is the notebook's call (recorded unless forced: two
engine starts of the 8B pair cost ~4 minutes); `record.record_8b` is the GPU session's step `speculative-8b`.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import validate
from ...models.architecture import architectures, parameter_count
from ...models.synthetic import synthetic_spec
from ...results.reference import NotRecorded, recorded_facts
from ...session import Shown, live_or_recorded
from .acceptance import drafter_acceptance
from .vllm_runs import Setting, speculative_config, vllm_spec_runs
from ...config import lab_id

TARGET, DRAFT = "llama-3.1-8b", "llama-3.2-1b"  # synthetic shapes of data/synthetic/architectures.json
LABEL = "synthetic acceptance: the speed is real, the acceptance rate is set"
STEP = KEY = "speculative-8b"  # scripts/record_reference.py --steps speculative-8b writes facts["speculative-8b"]
TAG = "8b"


def synthetic_config(k: int, length: float, target: str | Path, draft: str | Path) -> dict[str, Any]:
    """vLLM's speculative_config for the synthetic draft at a set mean acceptance length L (1 <= L <= k + 1)."""
    validate.integer("synthetic_config", "k", k, "draft tokens per step, e.g. 4.")
    validate.number("synthetic_config", "length", length, f"a mean acceptance length 1..{k + 1} (k + 1), e.g. the "
                    "loop's measured length at this k.", 1.0, k + 1.0)
    spec = speculative_config("draft_model", k, draft=draft, target=target)
    return {**spec, "rejection_sample_method": "synthetic", "synthetic_acceptance_length": float(length)}


def synthetic_speed_runs(length: float, k: int = 4, batches: Sequence[int] = (1, 4, 16, 64), *, n_prompts: int = 64,
                         max_new_tokens: int = 128, gpu_memory_utilization: float = 0.9, store: Any = None,
                         lab: str = lab_id("08")) -> list[dict[str, Any]]:
    """The pinned baseline and the synthetic 1B draft at acceptance length L on the synthetic 8B, per batch size.

    Both pinned (V1 runner, async off: what a draft model forces), one engine each serving every batch size. A
    row per run as `vllm_spec_runs` gives it, plus "label" (LABEL) and "set_length" (L): vLLM's counted mean
    acceptance length should come out near L (its synthetic sampler draws acceptances at that rate): "length_gap"
    is counted minus set, None for the baseline."""
    batches = validate.integers("synthetic_speed_runs", "batches", batches, "batch sizes, e.g. (1, 4, 16, 64).")
    target, draft = synthetic_spec(TARGET), synthetic_spec(DRAFT)
    spec = synthetic_config(k, length, target.path, draft.path)  # refused before any engine starts
    runs = [Setting("baseline", None, None, True, TAG), Setting("draft_model", k, spec, True, TAG)]
    rows = vllm_spec_runs(batches=batches, n_prompts=n_prompts, max_new_tokens=max_new_tokens, model=target,
                          gpu_memory_utilization=gpu_memory_utilization, store=store, lab=lab, runs=runs)
    for r in rows:  # the tokens are noise: not compared; the counted length beside the set one, so an ignored
        # setting cannot pass as set (vLLM's sampler has its own per-position schedule: alpha etc. describe it)
        got = r.get("mean_acceptance_length")
        r.update(label=LABEL, set_length=float(length), token_match=None, first_divergence=None,
                 length_gap=None if got is None else got - float(length))
    return rows


def loop_length(k: int = 4, facts: dict[str, Any] | None = None) -> float:
    """L: the trained pair's mean acceptance length at k from the speculative recording's loop (this recording
    session's `facts`, else the shipped recording), else the loop run now on this machine's CPU."""
    loop = (facts or {}).get("speculative", {}).get("loop")
    if loop is None:
        try:
            loop = recorded_facts("speculative", "speculative").get("loop", [])
        except NotRecorded:
            loop = []
    for row in loop:
        if row.get("k") == k and row.get("drafter", "draft_model") == "draft_model":
            return float(row["measured_length"])
    (row,) = drafter_acceptance(("draft_model",), n_prompts=64, max_new_tokens=64, ks=(k,))
    return float(row["measured_length"])


def measure_8b(k: int, batches: Sequence[int], n_prompts: int, max_new_tokens: int, store: Any,
               facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The 8B pair at acceptance length `loop_length(k, facts)`, batch by batch, with the Results and the setting."""
    length = loop_length(k, facts)
    rows = synthetic_speed_runs(length, k, batches, n_prompts=n_prompts, max_new_tokens=max_new_tokens, store=store)
    results = [r.pop("result") for r in rows]
    return {"rows": rows, "results": results, "k": k, "set_length": length, "label": LABEL,
            "workload": {"name": "journey", "requests": n_prompts, "max_new_tokens": max_new_tokens},
            "models": {"target": f"synthetic:{TARGET}", "draft": f"synthetic:{DRAFT}"}}


def synthetic_study(k: int = 4, batches: Sequence[int] = (1, 4, 16, 64), *, n_prompts: int = 64,
                    max_new_tokens: int = 128, store: Any = None, force: bool | None = False) -> Shown[dict | None]:
    """Lab 08's 8B speed step. Recorded by default (`force=False`): live it starts two 8B engines (~4 min on an
    H200) beside the lab's other five; `force=True` runs it live on a GPU with vLLM, None lets the machine decide."""
    validate.integer("synthetic_study", "k", k, "draft tokens per step, e.g. 4.")
    validate.integers("synthetic_study", "batches", batches, "batch sizes, e.g. (1, 4, 16, 64).")

    return live_or_recorded(lambda: measure_8b(k, batches, n_prompts, max_new_tokens, store),
                            lambda: dict(recorded_facts(KEY, STEP)), force=force,
                            asked={"k": k, "batches": sorted(batches)}, where={"batches": "rows.batch"})


def synthetic_lines(shown: Shown) -> str:
    """What the 8B speed runs say, every number from them: the speedup per batch, the draft cost c that would break
    even at the set acceptance length ((L - 1) / k, the verify pass costing one step), the c the runs imply, and what
    the weights alone would predict (c = the draft's parameters over the target's)."""
    if shown.value is None:
        return f"[{shown.label}]"
    v = shown.value
    drafts = [r for r in v["rows"] if r["method"] != "baseline"]
    k, length = v["k"], v["set_length"]
    arch = architectures()
    p_draft, p_target = parameter_count(arch[DRAFT]), parameter_count(arch[TARGET])
    c_weights = p_draft / p_target
    implied = [r["implied_c"] for r in drafts if r.get("implied_c") is not None]
    speedups = ", ".join(f"{r['speedup']:.2f}x at batch {r['batch']}" for r in drafts)
    paid = [r["batch"] for r in drafts if r["speedup"] > 1]
    text = (f"synthetic {TARGET} target, synthetic {DRAFT} draft, k = {k}, acceptance length set to {length:.2f}: "
            f"{speedups}; " + (f"it paid at batch {', '.join(map(str, paid))}. " if paid else
                               "below 1 at every batch. ")
            + f"At L = {length:.2f} a draft breaks even below c = (L - 1) / k = {(length - 1) / k:.2f} of a target "
              f"step")
    if implied:
        text += (f"; these runs imply c = {min(implied):.2f}-{max(implied):.2f}, where the weights alone "
                 f"({p_draft / 1e9:.2f}B of {p_target / 1e9:.2f}B "
                 f"parameters) give c = {c_weights:.2f} and would predict {length / (k * c_weights + 1):.2f}x: the "
                 f"draft's step costs more than its share of the weights' bytes (what else it pays, its own "
                 f"kernel launches, attention and KV, is not separated by these runs)")
    return text + f". [{v['label']}; {shown.label}]"
