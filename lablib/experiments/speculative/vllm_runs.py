"""Lab 08 on vLLM: the draft model, n-gram and the EAGLE head against a baseline on the SAME engine settings.

vLLM 0.26 moves draft_model and ngram to its V1 model runner with async scheduling off (EAGLE stays on V2
with async), so every run here pins both (VLLMConfig's `async_scheduling` and `model_runner_v2`), and a second
baseline at vLLM's defaults shows what the switch alone does (on the embedded model on the H200 the defaults were
the slower engine). The EAGLE rows are pinned too, so they measure vLLM's V1 proposer;
its V2 path (vLLM's defaults for EAGLE) is what tests/models/test_eagle.py's GPU test loads. `vllm_spec_runs` runs each setting (`settings`) at each batch size;
vLLM's counter deltas are read with the formula's definitions (`counters_from_delta`) and checked against the
CPU loop's alpha for the same drafter on the same prompts (`loop_acceptance`, `cross_check`): the embedded draft
against `greedy_speculative`, the EAGLE head (data/models/eagle, `lablib.models.eagle`) against `greedy_eagle`.
`gpu_study` is the notebook's call (live or recorded); `record.record` is the recording step `speculative`. Every bad
knob (k, a method vLLM 0.26 lacks or this lab does not run, n-gram lookups, a draft of another vocabulary, a head
made for another target, min_p/logit_bias) is refused before an engine starts (`lablib.models.drafters`).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import validate
from ...bench.offline import request_lengths, run
from ...config import BenchConfig, lab_id, VLLMConfig
from ...engines.together import one_by_one
from ...engines.vllm import runner_env, VLLMEngine
from ...hardware.device import device_facts
from ...mechanisms.speculative import (
    SpecCounters,
    estimate_alpha,
    expected_tokens_per_step,
    implied_draft_cost,
)
from ...models import ModelSpec, resolve_model
from ...models.drafters import METHODS, speculative_config
from ...results.compare import first_divergence
from ...results.reference import recorded_facts
from ...results.store import keep_if_recording
from ...session import Shown, live_label, live_or_recorded, stand_ins
from ...workloads import load_workload
from .acceptance import MODEL_DRAFTERS, counters_consistent, drafter_acceptance, length_gap_stderr

LAB = lab_id("08")
STEP = "speculative"  # the recording step: scripts/record_reference.py --steps speculative calls record.record

# ------------------------------------------------------------------------------------------------------------------
# vLLM: every run, baseline included, on the same engine settings
# ------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """One engine configuration of the comparison: what drafts, how many tokens, on which engine settings."""

    method: str  # "baseline" or one of METHODS
    k: int | None  # draft tokens per step; None for a baseline
    spec: dict[str, Any] | None  # vLLM's speculative_config; None for a baseline
    pinned: bool  # V1 runner and async scheduling off (True) or vLLM's defaults (False)
    tag: str = ""  # another study's runs, named apart (e.g. "8b": the synthetic 8B with a set acceptance)
    quantization: str | None = None  # the target's weights: None (as stored) or "fp8" (vLLM's dynamic FP8)

    @property
    def name(self) -> str:
        if self.method == "baseline":
            name = "baseline, pinned (V1, no async)" if self.pinned else "baseline, vLLM defaults"
        elif self.method == "ngram":
            name = f"n-gram k={self.k} (lookup {self.spec['prompt_lookup_min']}-{self.spec['prompt_lookup_max']})"
        else:
            name = f"{'EAGLE head' if self.method == 'eagle' else 'draft model'} k={self.k}"
            name += "" if self.pinned else ", vLLM defaults"
        name += f", {self.quantization.upper()} weights" if self.quantization else ""
        return f"{name} [{self.tag}]" if self.tag else name

    def step(self, batch: int) -> str:
        tail = "" if self.method == "baseline" else f"-k{self.k}"
        if self.method == "ngram":
            tail += f"-l{self.spec['prompt_lookup_min']}-{self.spec['prompt_lookup_max']}"
        tail += f"-{self.quantization}" if self.quantization else ""
        return f"spec-{self.tag + '-' if self.tag else ''}{self.method}{tail}{'' if self.pinned else '-defaults'}-b{batch}"

    def config(self, batch: int, gpu_memory_utilization: float) -> VLLMConfig:
        pin = False if self.pinned else None
        return VLLMConfig(gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=batch,
                          speculative_config=self.spec, async_scheduling=pin, model_runner_v2=pin,
                          quantization=self.quantization)


def settings(methods: Sequence[str] = METHODS, ks: Sequence[int] = (2, 4), prompt_lookup: tuple[int, int] = (2, 5),
             defaults_baseline: bool = True) -> list[Setting]:
    """The runs of one batch size, every knob checked: the pinned baseline, vLLM's default baseline, each method x k."""
    ks = validate.integers("settings", "ks", ks, "draft lengths, e.g. (2, 4).")
    if not methods:
        raise validate.refuse("settings", "methods", list(methods), f"one or more of {METHODS}", "e.g. ('ngram',).")
    out = [Setting("baseline", None, None, True)]
    if defaults_baseline:
        out.append(Setting("baseline", None, None, False))
    lookup = {"prompt_lookup_min": prompt_lookup[0], "prompt_lookup_max": prompt_lookup[1]}
    for m in methods:
        for k in ks:
            out.append(Setting(m, k, speculative_config(m, k, **(lookup if m == "ngram" else {})), True))
    return out


def _metric(delta: dict[str, Any], name: str) -> Any:
    return delta.get(name, delta.get(f"{name}_total"))


def counters_from_delta(delta: dict[str, Any]) -> SpecCounters | None:
    """vLLM's speculative counters from one run's metrics_delta; None when it drafted nothing (or has none).

    `vllm:spec_decode_num_accepted_tokens_per_pos` is a Vector in `LLM.get_metrics()`; the worker keeps it as a list
    (its delta position by position), read when a list is there and left None otherwise.
    """
    drafts, tokens, accepted = (_metric(delta, f"vllm:spec_decode_num_{n}") for n in
                                ("drafts", "draft_tokens", "accepted_tokens"))
    if not drafts or tokens is None or accepted is None:
        return None
    per_pos = _metric(delta, "vllm:spec_decode_num_accepted_tokens_per_pos")
    per_pos = tuple(int(x) for x in per_pos) if isinstance(per_pos, (list, tuple)) else None
    return SpecCounters(int(drafts), int(tokens), int(accepted), per_pos)


def _log_facts(log_path: str | None, s: Setting) -> dict[str, Any]:
    """What the engine's log says ran: "Using V2 Model Runner", "Asynchronous scheduling is enabled/disabled"."""
    try:
        log = Path(log_path).read_text(errors="replace") if log_path else ""
    except OSError:
        log = ""
    runner = ("V2" if "Using V2 Model Runner" in log else "V1" if "using the V1 model runner" in log or
              (s.pinned and "Model Runner" not in log) else "unknown")
    found = re.findall(r"Asynchronous scheduling is (enabled|disabled)", log)
    return {"model_runner": runner, "async_scheduling": (found[-1] == "enabled") if found else None,
            "log_says_runner": "Model Runner" in log, "log_says_async": bool(found)}


def _row(s: Setting, batch: int, result: Any, facts: dict[str, Any], logged: dict[str, Any]) -> dict[str, Any]:
    delta = ((result.engine_facts or {}).get("last_run") or {}).get("metrics_delta") or {}
    row: dict[str, Any] = {"name": s.name, "step": result.step, "method": s.method, "k": s.k, "batch": batch,
                           "pinned": s.pinned, "quantization": s.quantization, "prompt_lookup": None if s.method != "ngram" else
                           [s.spec["prompt_lookup_min"], s.spec["prompt_lookup_max"]], **logged,
                           "output_tok_s": result.summary["output_tok_s"], "wall_s": result.wall_s,
                           "recorded_at": result.recorded_at,  # which Result of this step the row is (pack_reference)
                           "back_to_baseline": facts.get("vram_back_to_baseline"),
                           # where an engine's minutes go: spawn and imports, vLLM's own start, closing
                           "startup_wall_s": facts.get("startup_wall_s"), "startup_s": facts.get("startup_s"),
                           "close_s": facts.get("close_s"),
                           # engines started at once with this one (1: alone), and how long their start took together
                           "started_together": (facts.get("together") or {}).get("engines", 1),
                           "group_start_s": (facts.get("together") or {}).get("group_start_s"),
                           "group_close_s": (facts.get("together") or {}).get("group_close_s"),  # all at once, after
                           "num_drafts": None, "num_draft_tokens": None, "num_accepted_tokens": None,
                           "accepted_per_pos": None, "mean_acceptance_length": None, "acceptance_rate": None,
                           "alpha": None, "formula_length": None, "counters_consistent": None,
                           "counters_note": "a baseline drafts nothing" if s.method == "baseline" else
                           "vLLM reported no drafts (no spec_decode counters in this run's metrics)"}
    c = None if s.method == "baseline" else counters_from_delta(delta)
    if c is not None:
        ok, note = counters_consistent(c, s.k, every_draft_k=s.method in MODEL_DRAFTERS)
        alpha = None  # n-gram drafts up to k tokens (fewer where no match is long enough), and vLLM exports no
        # per-position draft counts, so its alpha (every draft k long) is not defined by these counters
        if s.method in MODEL_DRAFTERS and (c.accepted_per_pos is not None or c.num_draft_tokens % c.num_drafts == 0):
            alpha = estimate_alpha(c)
        row.update({"num_drafts": c.num_drafts, "num_draft_tokens": c.num_draft_tokens,
                    "num_accepted_tokens": c.num_accepted_tokens, "accepted_per_pos": c.accepted_per_pos and
                    list(c.accepted_per_pos), "mean_acceptance_length": c.mean_acceptance_length,
                    "acceptance_rate": c.acceptance_rate, "alpha": alpha,
                    "formula_length": None if alpha is None else float(expected_tokens_per_step(alpha, s.k)),
                    "counters_consistent": ok, "counters_note": note if alpha is not None else
                    note + ("; alpha: n-gram drafts vary in length and vLLM exports no per-position draft "
                            "counts" if s.method not in MODEL_DRAFTERS else
                            "; alpha: drafts of varying length need the per-position counters")})
    return row


def vllm_spec_runs(methods: Sequence[str] = METHODS, ks: Sequence[int] = (2, 4),
                   batches: Sequence[int] = (1, 4, 16, 64), *, prompt_lookup: tuple[int, int] = (2, 5),
                   n_prompts: int = 64, max_new_tokens: int = 64, defaults_baseline: bool = True,
                   gpu_memory_utilization: float = 0.3, model: Any = "embedded", store: Any = None,
                   lab: str = LAB, runs: Sequence[Setting] | None = None,
                   failures: list[dict[str, Any]] | None = None,
                   after_start: Callable[[], Any] | None = None) -> list[dict[str, Any]]:
    """The draft model, n-gram and the EAGLE head on vLLM against a baseline on the same engine settings, per batch.

    One engine per setting (`settings`), started in its own worker with max_num_seqs = the largest batch, runs
    every batch size b as waves of b requests (`BenchConfig.max_concurrency`: b in flight, all arriving at t=0),
    then closes: an engine start costs about a minute on the H200, so 4 batch sizes cost no extra starts, and the
    settings' engines start together, as many as the GPU and the host's cores hold
    (`lablib.engines.together.one_by_one`), each measured while the others sit idle.
    The price: each wave is one call into the worker, whose round trip (milliseconds) lands between waves, in
    every setting alike; it lowers batch 1's tok/s a little and pulls its speedups slightly towards 1. And a
    wave waits for its slowest request where max_num_seqs=b would refill the freed slot: with every request's
    length fixed a baseline's wave ends together, but under speculation requests accept different numbers of
    tokens per step and finish apart, so at batches between 1 and n_prompts the speculative rows read somewhat
    low (at b=1 and b=n_prompts, one request per wave or one wave, nothing is lost).
    The settings: the pinned baseline (V1 runner, async scheduling off: what vLLM falls back to
    for draft_model and ngram), vLLM's default baseline (V2 runner, async on: what the switch alone does),
    and each method x k, pinned. Every run decodes the first n_prompts journey prompts greedily to exactly
    max_new_tokens (EOS ignored). A row per run: tok/s, the speedup over the pinned baseline at that batch,
    vLLM's counter deltas (`counters_from_delta`) read as the formula reads them (alpha, E(alpha, k)), the
    runner and async setting the engine's log reports, the greedy tokens against the baseline's (match
    rate, first divergence: vLLM's verify pass is not bit-identical), VRAM back to baseline. Each row's
    "result" is the Result (stored in `store` as it is made). `runs` replaces `settings(...)` with settings built
    elsewhere (the synthetic 8B study's), the pinned baseline first; `model` is a name or a ModelSpec. Given a
    `failures` list, a setting whose engine raises is appended there (its name, the error, the batches it finished
    and its log) and the next setting runs; the pinned baseline's failure always raises (nothing to compare with).
    `after_start` is called once each engine is up and before its first timed wave: CPU work started before this
    call (the loop's acceptance, `measure_grid`) overlaps the engine's start and is waited for there, never timed
    beside a run.
    """
    owner = "vllm_spec_runs"
    batches = validate.integers(owner, "batches", batches, "batch sizes (requests in flight), e.g. (1, 4, 16, 64).")
    validate.integer(owner, "n_prompts", n_prompts, "journey prompts per run, e.g. 64.", 1, 64)
    if max(batches) > n_prompts:
        raise validate.refuse(owner, "batches", list(batches), f"batch sizes <= n_prompts={n_prompts} (a batch of "
                              f"{max(batches)} from {n_prompts} requests is one wave of {n_prompts})",
                              f"n_prompts={min(64, max(batches))}, or smaller batches.")
    validate.integer(owner, "max_new_tokens", max_new_tokens, "new tokens per request, e.g. 64.")
    runs = list(runs) if runs is not None else settings(methods, ks, prompt_lookup, defaults_baseline)  # refusals first
    wl = load_workload("journey", limit=n_prompts)
    bench = BenchConfig(warmup_requests=1, max_new_tokens=max_new_tokens, progress=False,
                        tags={"speculative": True})
    by_batch: dict[int, list[tuple[Setting, Any, dict[str, Any]]]] = {b: [] for b in batches}
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    built: list[Any] = []
    for s in runs:  # made first (their checks: a setting's refusal is its own), started together, measured one by one
        try:
            built.append(VLLMEngine(spec, s.config(max(batches), gpu_memory_utilization)))
        except Exception as e:  # noqa: BLE001 - handed over at its turn, as a failed start is
            built.append(e)
    engines = one_by_one(built, runs=[request_lengths(wl, spec, bench)])
    ran = []
    # the defaults baseline too is vLLM's own choice, whatever this shell exported; a pinned run's launch sets
    # VLLM_USE_V2_MODEL_RUNNER=0 for its own worker
    with runner_env(None), contextlib.closing(engines):
        for s, engine in zip(runs, engines):  # one engine per setting serves every batch size: waves of b requests
            done = []
            try:  # a setting refused or failed at its start is handed over as its error: the others' runs go on
                if isinstance(engine, Exception):
                    raise engine
                if after_start is not None:
                    after_start()
                for b in batches:
                    # b warm-up requests: kernels specialised on the batch size compile before the timed wave
                    done.append((b, run(engine, wl, dataclasses.replace(bench, max_concurrency=b, warmup_requests=b),
                                        lab=lab, step=s.step(b), store=store)))
            except Exception as e:  # one setting's engine failing keeps the others' runs (never the pinned baseline's)
                if failures is None or s is runs[0]:
                    raise
                failures.append({"name": s.name, "method": s.method, "k": s.k, "error": f"{type(e).__name__}: {e}",
                                 "batches_done": [b for b, _ in done], "log": getattr(engine, "log_path", None)})
            ran.append((s, engine, done))
    for s, engine, done in ran:  # after every close: the row says whether VRAM came back
        facts = getattr(engine, "facts", {})
        logged = _log_facts(getattr(engine, "log_path", None), s)
        for b, result in done:
            by_batch[b].append((s, result, _row(s, b, result, facts, logged)))
    rows = []
    for b, here in by_batch.items():
        base = here[0][1]  # the pinned baseline's Result: every speedup is over it
        ids = {r.request_id: r.output_ids for r in base.requests}
        for s, result, row in here:
            firsts = [None if r.output_ids is None or ids.get(r.request_id) is None else  # None: not comparable
                      first_divergence(r.output_ids, ids[r.request_id]) for r in result.requests]
            same = [f is None for f in firsts]
            row.update({"speedup": row["output_tok_s"] / base.summary["output_tok_s"],
                        "token_match": sum(same) / len(same),
                        "first_divergence": min((f for f in firsts if f is not None), default=None),
                        "implied_c": None if row["mean_acceptance_length"] is None or s.method not in
                        MODEL_DRAFTERS else
                        implied_draft_cost(row["mean_acceptance_length"], s.k,
                                           row["output_tok_s"] / base.summary["output_tok_s"]),
                        "result": result, "provenance": live_label()})
            rows.append(row)
    return rows


def loop_acceptance(n_prompts: int = 64, max_new_tokens: int = 64, ks: Sequence[int] = (2, 4), threads: int = 1,
                    pair: tuple[Any, Any, Any] | None = None,
                    drafters: Sequence[str] = ("draft_model",), workers: int = 1) -> list[dict[str, Any]]:
    """The torch loops' acceptance (this machine's CPU, float32) on the prompts and lengths vLLM is given.

    Greedy and deterministic: per drafter (the embedded draft, the EAGLE head) and k, what the same drafter
    drafts and accepts on the same text, the reference vLLM's counters are checked against (`cross_check`).
    `workers`: processes the prompts are split over (`drafter_acceptance`; the rows are the same)."""
    return drafter_acceptance(drafters, n_prompts, max_new_tokens, ks, threads, pair, workers=workers)


def loop_workers() -> int:
    """Processes for the loop beside a starting engine: half this machine's cores (the engine's compile has the
    rest), at most 8, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores // 2))  # the cores this process may use (a container's share), not the host's


@contextlib.contextmanager
def beside(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[concurrent.futures.Future]:
    """fn(*args, **kwargs) in a thread while the block runs (CPU work beside an engine's start or a checkpoint's
    making); yields its future. Leaving the block never waits for it: an error or an interrupt surfaces at once."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        yield pool.submit(fn, *args, **kwargs)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def cross_check(rows: Sequence[dict[str, Any]], loop: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's mean acceptance length per model-drafter run against the loop's on the same prompts (same drafter, k).

    Both decode the same target and drafter greedily on the same prompts, so vLLM's length should be the loop's
    measured length up to noise: `stderr` combines the loop's (its length_stderr) and vLLM's, the loop's per-step
    spread over sqrt(vLLM's num_drafts) (the per-step counts are not in vLLM's counters). The gap is taken against
    the loop's measurement, not against E(alpha_loop, k): the i.i.d. formula's own error on these prompts (the
    loop's `length_gap`, e.g. -1.9 standard errors for the EAGLE head at k=4) is a finding of the loop, not of
    vLLM, and is kept beside it (`formula_length`, `formula_gap`). vLLM's bf16 verify can flip near-tied
    argmaxes, so small gaps are expected; over 3 standard errors is a finding.
    """
    by_key = {(r.get("drafter", "draft_model"), r["k"]): r for r in loop}  # a row without "drafter": the draft model
    out = []
    for r in rows:
        ref = by_key.get((r["method"], r["k"]))
        if r["method"] not in MODEL_DRAFTERS or r.get("mean_acceptance_length") is None or ref is None:
            continue
        se = length_gap_stderr(ref, r["num_drafts"])
        gap = r["mean_acceptance_length"] - ref["measured_length"]
        out.append({"name": r["name"], "drafter": r["method"], "batch": r["batch"], "k": r["k"],
                    "vllm_length": r["mean_acceptance_length"],
                    "vllm_acceptance_rate": r["acceptance_rate"], "loop_alpha": ref["alpha"],
                    "formula_length": ref["predicted_length"], "loop_length": ref["measured_length"], "gap": gap,
                    "formula_gap": r["mean_acceptance_length"] - ref["predicted_length"],
                    "stderr": se, "gap_in_stderrs": gap / se if se else math.inf,
                    "within_3_stderrs": abs(gap) <= 3 * se,
                    "provenance": r.get("provenance")})
    return out


def measure_grid(batches: Sequence[int], ks: Sequence[int], methods: Sequence[str], prompt_lookup: tuple[int, int],
                 n_prompts: int, max_new_tokens: int, store: Any) -> dict[str, Any]:
    """Every setting at every batch on vLLM, the loop's acceptance on the same prompts, the cross-check, the settings.

    The loop (about 2 minutes of one CPU core for the defaults) runs in `loop_workers()` processes while the first
    engine starts, and that engine's first timed wave waits for it (`vllm_spec_runs`' `after_start`): on the H200's
    host the loop no longer adds its minutes after the engines, and never runs beside a timed wave."""
    drafters = [m for m in methods if m in MODEL_DRAFTERS] or ["draft_model"]
    loop_ks = sorted({k for m in methods if m in MODEL_DRAFTERS for k in ks}) or sorted(ks)
    failed: list[dict[str, Any]] = []
    with beside(loop_acceptance, n_prompts, max_new_tokens, loop_ks, drafters=drafters,
                workers=loop_workers()) as loop_future:
        rows = vllm_spec_runs(methods, ks, batches, prompt_lookup=prompt_lookup, n_prompts=n_prompts,
                              max_new_tokens=max_new_tokens, store=store, failures=failed,
                              after_start=loop_future.result)
        loop = loop_future.result()
    results = [r.pop("result") for r in rows]
    return {"rows": rows, "loop": loop, "cross_check": cross_check(rows, loop), "results": results, "failed": failed,
            "workload": {"name": "journey", "requests": n_prompts, "max_new_tokens": max_new_tokens},
            "settings": {"batches": list(batches), "ks": list(ks), "methods": list(methods),
                         "prompt_lookup": list(prompt_lookup)}}


def as_facts(got: dict[str, Any]) -> dict[str, Any]:
    """`measure_grid`'s value as the recording keeps it: without the Results, with the GPU and the date."""
    results = got["results"]
    gpu = next((r.hardware.get("gpu") for r in results if r.hardware.get("gpu")), None) or device_facts().get("gpu")
    date = min((r.recorded_at[:10] for r in results), default=time.strftime("%Y-%m-%d", time.gmtime()))  # UTC
    return {**{k: v for k, v in got.items() if k != "results"}, "gpu": gpu, "date": date}


def _recorded() -> dict[str, Any]:
    facts = dict(recorded_facts("speculative", STEP))
    label = f"recorded on {facts.get('gpu') or 'a GPU'}, {facts.get('date') or 'date unknown'}"
    for part in ("rows", "loop", "cross_check"):
        facts[part] = [{**r, "provenance": label} for r in facts.get(part, [])]
    return facts


# The grid the recording holds (record.record's, and gpu_study's defaults): 2 baselines + 3 methods x 2 k, 4 batches
RECORD_GRID = {"batches": (1, 4, 16, 64), "ks": (2, 4), "methods": METHODS, "prompt_lookup": (2, 5), "n_prompts": 64,
               "max_new_tokens": 64}
# where a recording says what it ran of each of gpu_study's knobs (`session.recorded_as`)
RECORDED_AS = {"batches": "rows.batch", "ks": "settings.ks", "methods": "settings.methods",
               "prompt_lookup": "settings.prompt_lookup", "n_prompts": "workload.requests",
               "max_new_tokens": "workload.max_new_tokens"}


def gpu_study(batches: Sequence[int] = (1, 4, 16, 64), ks: Sequence[int] = (2, 4), methods: Sequence[str] = METHODS, *,
              prompt_lookup: tuple[int, int] = (2, 5), n_prompts: int = 64, max_new_tokens: int = 64,
              store: Any = None, force: bool | None = None) -> Shown[dict[str, Any] | None]:
    """Lab 08's vLLM step: live on a GPU with vLLM (`measure_grid`: `vllm_spec_runs` + the loop on the same prompts +
    `cross_check`), otherwise step speculative's recording, whole (batches 1, 4, 16, 64 and k 2, 4), or "not recorded
    yet".

    With the recording's grid (RECORD_GRID, the defaults), a `store` and no failed setting, a live run is also kept
    as step speculative's recording (`keep_if_recording`): lab 08 run live on the GPU is its own recording, eight
    engine starts made once. Any other grid stays this user's run."""
    settings(methods, ks, prompt_lookup)  # refuse bad knobs on every machine, before the mode decides
    asked = {"batches": sorted(batches), "ks": sorted(ks), "methods": sorted(methods),
             "prompt_lookup": list(prompt_lookup), "n_prompts": n_prompts, "max_new_tokens": max_new_tokens}

    def live() -> dict[str, Any]:
        got = measure_grid(batches, ks, methods, prompt_lookup, n_prompts, max_new_tokens, store)
        differs = [*stand_ins(asked, RECORD_GRID), *(f"{f['name']} failed" for f in got["failed"])]
        keep_if_recording(store, STEP, as_facts(got), differs)
        return got

    return live_or_recorded(live, _recorded, force=force, asked=asked, where=RECORDED_AS)


def gpu_table(shown: Shown, part: str = "rows", columns: list[str] | None = None) -> Any:
    """One part of `gpu_study`'s value ("rows", "loop", "cross_check") as a table with its provenance column."""
    validate.choice("gpu_table", "part", part, ("rows", "loop", "cross_check"))
    value = None if shown.value is None else shown.value[part]
    table = Shown(value, shown.live, shown.label, shown.why).table()
    return table if columns is None or shown.value is None else table[[c for c in columns if c in table] +
                                                                       ["provenance"]]


MODEL_DRAFTERS_C = 0.5  # a launch-bound draft step costs about a target step: at least half of one


def model_drafters_never_pay(value: dict[str, Any]) -> bool:
    """`gpu_study`'s claim on the embedded pair: a model drafter's step (draft model, EAGLE head) costs about a target
    step (implied c at least `MODEL_DRAFTERS_C`: both are launch-bound on a GPU), so neither beats plain decoding at
    any batch. How the speedup moves with batch is not claimed here: at this size it is launch noise (the H200's
    runs have gone both ways); the batch model and the 8B study show the trend."""
    rows = [r for r in value["rows"] if r["method"] in MODEL_DRAFTERS]
    return bool(rows) and all(r["implied_c"] is not None and r["implied_c"] >= MODEL_DRAFTERS_C and r["speedup"] < 1
                              for r in rows)


def model_drafter_costs(value: dict[str, Any]) -> dict[str, float | None]:
    """What `model_drafters_never_pay` read: the lowest implied c and the best speedup of the model drafters."""
    rows = [r for r in value["rows"] if r["method"] in MODEL_DRAFTERS]
    cs = [r["implied_c"] for r in rows if r["implied_c"] is not None]
    return {"lowest_c": round(min(cs), 2) if cs else None,
            "best_speedup": round(max(r["speedup"] for r in rows), 2) if rows else None}


def engine_lines(shown: Shown) -> str:
    """What the runs say, every number from them: what vLLM's engine switch alone does to plain decoding (its
    defaults, V2 runner with async scheduling, against the pinned V1 runner without it), and where each method's
    best speedup is. Which way the switch goes is read from the runs, never assumed."""
    if shown.value is None:
        return f"[{shown.label}]"
    rows = shown.value["rows"]
    by_batch: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_batch.setdefault(r["batch"], {})[r["name"]] = r
    parts = []
    for b, here in sorted(by_batch.items()):
        pinned = next((r for r in here.values() if r["method"] == "baseline" and r["pinned"]), None)
        free = next((r for r in here.values() if r["method"] == "baseline" and not r["pinned"]), None)
        if pinned and free:
            ratio = free["output_tok_s"] / pinned["output_tok_s"]
            parts.append(f"batch {b}: {free['output_tok_s']:,.0f} vs {pinned['output_tok_s']:,.0f} tok/s "
                         f"({'+' if ratio >= 1 else ''}{(ratio - 1) * 100:.0f}%)")
    text = ("vLLM's defaults (V2 runner, async scheduling) against the pinned baseline (V1, no async), plain "
            "decoding: " + ("; ".join(parts) if parts else "no defaults baseline in these runs") + ". ")
    spec = [r for r in rows if r["method"] != "baseline"]
    best: dict[str, dict[str, Any]] = {}
    for r in spec:
        if r["name"] not in best or r["speedup"] > best[r["name"]]["speedup"]:
            best[r["name"]] = r
    if not best:
        return text + f"No speculative setting in these runs. [{shown.label}]"
    paid = [r for r in best.values() if r["speedup"] > 1]
    text += "Best speedup over the pinned baseline per setting: " + ", ".join(
        f"{n} {r['speedup']:.2f}x (batch {r['batch']})" for n, r in best.items()) + ". "
    text += (f"{len(paid)} of {len(best)} settings beat plain decoding at some batch" if paid else
             "No setting beats plain decoding at any batch here")
    return text + ". " + engine_time_line(rows) + f"[{shown.label}]"


def engine_time_line(rows: Sequence[dict[str, Any]]) -> str:
    """Where the engines' minutes went (median per engine): the worker's spawn and imports, vLLM's own start,
    closing; "" for rows recorded before these were kept."""
    engines = {r["name"]: r for r in rows if r.get("startup_wall_s") is not None and r.get("startup_s") is not None}
    if not engines:
        return ""
    median = statistics.median
    spawn = median([r["startup_wall_s"] - r["startup_s"] for r in engines.values()])
    start = median([r["startup_s"] for r in engines.values()])
    closes = [r["close_s"] for r in engines.values() if r.get("close_s") is not None]
    line = (f"{len(engines)} engines, a median of {spawn:.0f} s spawning the worker and importing vLLM, {start:.0f} s "
            "in vLLM's own start" + (f", {median(closes):.0f} s closing" if closes else "") + ". ")
    groups = {r["group_start_s"]: r["started_together"] for r in engines.values()
              if (r.get("started_together") or 1) > 1 and r.get("group_start_s") is not None}
    if groups:  # each engine's own figures above then count the others' starts beside it
        line += (f"They started up to {max(groups.values())} at once, side by side: {sum(groups):.0f} s of starting "
                 f"for the {sum(groups.values())} engines started together (lablib.engines.together)")
        shut = {r["group_start_s"]: r["group_close_s"] for r in engines.values()
                if r.get("group_close_s") is not None and r["group_start_s"] in groups}
        line += f", {sum(shut.values()):.0f} s closing them, each group at once. " if shut else ". "
    return line
