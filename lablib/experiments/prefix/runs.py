"""Lab 07's experiments: what the prefix cache should hit, what vLLM says it hit, and what that buys.

The lab's claim to test is exact: on a workload where nothing is evicted, the hit tokens the
simulator predicts (`mechanisms.prefix.simulate` on the very token ids the engine is sent) equal
vLLM's own counters, per request (`RequestOutput.num_cached_tokens`, kept as
`RequestRecord.cached_tokens`) and in total (the run's deltas of `vllm:prefix_cache_queries` and
`vllm:prefix_cache_hits`). Requests run one at a time (`max_num_seqs=1`) for that comparison:
with many in flight the scheduler admits several in one step, and with chunked prefill a
request can look up a shared prompt whose later blocks another request has not been given yet,
so hits then depend on the schedule; the lab shows that case next to the sequential one and
says why they differ.
"""
from __future__ import annotations

import contextlib
from typing import Any

from ... import validate
from ...bench.offline import prepare, request_lengths, run
from ...config import BenchConfig, lab_id, VLLMConfig
from ...engines.together import one_by_one
from ...engines.vllm import VLLMEngine
from ...mechanisms.prefix import PrefixCacheResult, simulate
from ...models.synthetic import synthetic_spec
from ...results.compare import outputs_agree
from ...results.record import Result
from ...results.reference import recorded_facts
from ...session import live_label, live_or_recorded
from ...workloads import Workload, load_workload

from .workloads import BIG, LAB, LENGTHS, token_ids, lab_workloads, shared_set, shared_tokens, variant

NO_WARMUP = BenchConfig(warmup_requests=0)  # what a prediction prepares with: the workload's own output lengths


def on_off_pairs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and workload, caching on next to off: TTFT p50 and total throughput, on over off."""
    by = {(r["model"], r["workload"], r["caching"]): r for r in runs}
    rows = []
    for (model, wl, caching), on in by.items():
        off = by.get((model, wl, "off"))
        if caching != "on" or off is None:
            continue
        rows.append({"model": model, "workload": wl, "shared_tokens": on["shared_tokens"], "hit_rate": on["hit_rate"],
                     "ttft_p50_on_s": on["ttft_p50_s"], "ttft_p50_off_s": off["ttft_p50_s"],
                     "ttft_p50_on_over_off": on["ttft_p50_s"] / off["ttft_p50_s"],
                     "total_tok_s_on_over_off": on["total_tok_s"] / off["total_tok_s"]})
    return rows

def counters_keep_only_the_first(row: dict[str, Any]) -> bool:
    """vLLM 0.26's offline counters kept exactly the first request's stats (its prompt as queries, its cached tokens
    as hits) and none of the later ones'. `LLMEngine.step()` records the scheduler's stats only on a step that
    returns request outputs, and the scheduler resets its prefix-cache stats every step, so a request admitted on a
    step without outputs (one at a time, every request after the first) is never counted. Fixed after 0.26 (vLLM
    PR #48668); `vllm serve` (AsyncLLM) records every step and never had it."""
    first = row["per_request"][0] if row["per_request"] else None
    return (first is not None and len(row["per_request"]) > 1 and row["vllm_queries"] == first["prompt_tokens"]
            and row["vllm_hits"] == first["vllm"])


def predict(workload: Workload, engine: Any, *, block_size: int = 16, num_blocks: int | None = None,
            concurrency: int = 1, bench: BenchConfig = NO_WARMUP) -> PrefixCacheResult:
    """The simulator on exactly the token ids `engine` would be sent (any engine: HF on a CPU, vLLM on a GPU).

    With outputs given as lengths (the engines decode with ignore_eos), generated blocks stay unhashed."""
    prepared = prepare(workload, engine, bench)
    return simulate([(list(p.prompt_ids), p.max_new_tokens) for p in prepared], block_size=block_size,
                    num_blocks=num_blocks, concurrency=concurrency, keep_snapshots=False)


def advice(engine: Any, base: str = "shared-prefix-512") -> dict[str, PrefixCacheResult]:
    """The usual advice on one set: the shared part first, a per-request line first, a multi-turn chat."""
    tok = engine.tokenizer
    return {"shared part first": predict(load_workload(base), engine),
            "per-request line first": predict(variant("shared-after", base, tok), engine),
            "multi-turn": predict(variant("multi-turn", base, tok), engine)}


def measured_hits(result: Result) -> dict[str, Any]:
    """vLLM's own view of one run: cached tokens per request and the counters' deltas over the run."""
    delta = ((result.engine_facts or {}).get("last_run") or {}).get("metrics_delta") or {}
    return {"cached_tokens": [r.cached_tokens for r in result.requests],
            "queries": delta.get("vllm:prefix_cache_queries"), "hits": delta.get("vllm:prefix_cache_hits")}


def compare(predicted: PrefixCacheResult, result: Result) -> dict[str, Any]:
    """Predicted next to measured: per request, in total, and the verdict in a sentence (`judged`)."""
    got = measured_hits(result)
    per_request = [{"request_id": r.request_id, "prompt_tokens": r.prompt_tokens, "predicted": p, "vllm": m}
                   for r, p, m in zip(result.requests, predicted.cached_tokens, got["cached_tokens"])]
    return judged({"per_request": per_request, "predicted_hits": predicted.hits,
                   "predicted_queries": predicted.queries, "vllm_hits": got["hits"], "vllm_queries": got["queries"]})


def judged(row: dict[str, Any]) -> dict[str, Any]:
    """A comparison row (per request, the totals both ways) with its verdict: "exact", "differ" (the requests whose
    cached tokens differ), "per_request_exact", "counters_undercount" (`counters_keep_only_the_first`) and
    "verdict", a sentence. Recorded rows pass through it too, so they read as a live run reads today."""
    differ = [r for r in row["per_request"] if r["predicted"] != r["vllm"]]
    exact = not differ and (row["vllm_hits"], row["vllm_queries"]) == (row["predicted_hits"], row["predicted_queries"])
    undercount = not differ and not exact and counters_keep_only_the_first(row)
    cached = sum(r["vllm"] for r in row["per_request"] if r["vllm"] is not None)

    def n(x: Any) -> str:
        return "n/a" if x is None else f"{x:,.0f}"

    verdict = (f"vLLM hit {n(row['vllm_hits'])} of {n(row['vllm_queries'])} prompt tokens, the simulator predicted "
               f"{n(row['predicted_hits'])} of {n(row['predicted_queries'])}: " + (
                   "exactly equal, request by request" if exact else
                   f"every request's num_cached_tokens equals the simulator's ({cached:,} tokens in all); the "
                   f"counters kept only the first request's stats (vLLM 0.26 drops those of steps without outputs: "
                   f"PR #48668)" if undercount else f"{len(differ)} of {len(row['per_request'])} requests differ"))
    return {**row, "exact": exact, "differ": differ, "per_request_exact": not differ,
            "counters_undercount": undercount, "verdict": verdict}


def warm_then_reset(engine: Any, *, reset: bool = True) -> None:
    """Warm the engine on one journey request of 2 tokens (a prompt no lab workload shares), then, with `reset`,
    empty its prefix cache (`VLLMEngine.reset_prefix_cache`) so the next run's hits are its own."""
    run(engine, load_workload("journey", limit=1), BenchConfig(warmup_requests=0, max_new_tokens=2, progress=False))
    if reset and not engine.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache (blocks still in use): nothing should be running "
                           "between runs; restart the engine.")


def measure(engine: Any, workload: Workload, *, max_new_tokens: int | None = 8, lab: str = lab_id("07"),
            step: str | None = None, store: Any = None) -> dict[str, Any]:
    """One measured run from an empty prefix cache, next to the simulator's prediction for it.

    The engine is warmed first on a prompt the workload does not share, then its cache is reset
    (`warm_then_reset`), so the run's hits are its own; the prediction uses the
    engine's block size and concurrency (`max_num_seqs`)."""
    bench = BenchConfig(warmup_requests=0, max_new_tokens=max_new_tokens, progress=False)
    engine.start()
    warm_then_reset(engine)
    result = run(engine, workload, bench, lab=lab, step=step or f"prefix-{workload.name}", store=store)
    predicted = predict(workload, engine, block_size=int(engine.facts.get("block_size") or 16),
                        concurrency=int(engine.facts.get("max_num_seqs") or 1), bench=bench)
    return {"result": result, "predicted": predicted, **compare(predicted, result)}


# The vLLM runs the recordings lack: hits from a reset cache per workload, TTFT and throughput with caching on and
# off, and the greedy tokens compared.

ON_OFF_KEY, ON_OFF_STEP = "prefix_on_off", "prefix-on-off"  # the facts key record.record_on_off writes, its step


def counter_rows(max_num_seqs: int = 1, *, store: Any = None, lab: str = LAB) -> list[dict[str, Any]]:
    """vLLM's hits against the simulator's on every lab workload, each from a reset cache (as `--steps prefix`)."""
    rows = []
    config = VLLMConfig(gpu_memory_utilization=0.3, max_num_seqs=max_num_seqs, enable_prefix_caching=True)
    with VLLMEngine("embedded", config) as eng:
        for wl in lab_workloads(eng.tokenizer):
            got = measure(eng, wl, lab=lab, step=f"prefix-{wl.name}-seqs-{max_num_seqs}", store=store)
            del got["result"], got["predicted"]
            rows.append({"workload": wl.name, "max_num_seqs": max_num_seqs, **got, "provenance": live_label()})
    return rows


def counters(max_num_seqs: int = 1, *, store: Any = None, force: bool | None = None) -> Any:
    """`counter_rows` live on a GPU with vLLM; else what `--steps prefix` (1 at a time) or `prefix-batch` (32)
    recorded."""
    validate.choice("counters", "max_num_seqs", max_num_seqs, (1, 32),
                    "1 (exact by construction) or 32 (the batch case).")
    step = "prefix" if max_num_seqs == 1 else "prefix-batch"
    return live_or_recorded(lambda: counter_rows(max_num_seqs, store=store),
                            lambda: [judged(r) for r in recorded_facts(f"prefix_seqs_{max_num_seqs}", step)],
                            force=force, asked={"max_num_seqs": max_num_seqs})


def run_from_empty_cache(engine: Any, workload: Workload, caching: bool, lab: str, step: str,
                          store: Any = None) -> Result:
    """One run of the workload's own output lengths (its Result appended to `store`, when given); with caching on,
    from a reset cache after a warm-up."""
    warm_then_reset(engine, reset=caching)
    return run(engine, workload, BenchConfig(warmup_requests=0, progress=False), lab=lab, step=step, store=store)


def on_off_row(result: Result, workload: Workload, caching: bool, shared: int) -> dict[str, Any]:
    """One run's TTFT, throughput and vLLM's prefix-cache counters, as the lab's tables and figures read them."""
    s, got = result.summary, measured_hits(result)
    return {"model": result.model.get("name"), "workload": workload.name,
            "kind": workload.manifest.get("variant", "shared-first"), "shared_tokens": shared,
            "caching": "on" if caching else "off", "requests": s["requests"], "ttft_p50_s": s["ttft_s"]["p50"],
            "ttft_p99_s": s["ttft_s"]["p99"], "output_tok_s": s["output_tok_s"], "total_tok_s": s["total_tok_s"],
            "vllm_hits": got["hits"], "vllm_queries": got["queries"],
            "hit_rate": got["hits"] / got["queries"] if caching and got["queries"] else None, "step": result.step}


def on_off_runs(models: tuple[Any, ...] = ("embedded", BIG), *, lab: str = LAB, gpu_memory_utilization: float = 0.3
                ) -> tuple[dict[str, Any], list[Result]]:
    """Each model with prefix caching off, then on: the shared-prefix sets and the shared-after variant (0% hits).

    Every request arrives at once (vLLM's default scheduler), with the workload's own 32 output tokens. Returns
    {"runs": one on_off_row per run, "agreement": outputs_agree per model and workload} and the Results."""
    runs, agreement, results = [], [], []
    made = []  # every engine made first (its checks refuse a setting before any starts), then started together
    for i, model in enumerate(models):
        spec = synthetic_spec(model) if model == BIG else model
        for caching in (False, True):
            config = VLLMConfig(gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=caching,
                                max_model_len=4096 if model == BIG else None)
            eng = VLLMEngine(spec, config)
            wls = [shared_set(n, eng.tokenizer) for n in LENGTHS] + [variant("shared-after", "shared-prefix-512",
                                                                              eng.tokenizer)]
            made.append(((i, model), caching, eng, wls))
    lengths = [request_lengths(wl, eng.spec, BenchConfig()) for _, _, eng, wls in made for wl in wls]
    by_model: dict[int, dict[Any, list[Result]]] = {}  # per model: True, False, and "again" (caching off, run twice)
    with contextlib.closing(one_by_one([e for _, _, e, _ in made], runs=lengths)) as engines:
        for ((i, model), caching, _, wls), eng in zip(made, engines):
            if isinstance(eng, Exception):
                raise eng
            by_caching = by_model.setdefault(i, {})
            tag = model if isinstance(model, str) else model.name
            for wl in wls:
                step = f"prefix-{'on' if caching else 'off'}-{wl.name}-{tag}"
                r = run_from_empty_cache(eng, wl, caching, lab, step)
                runs.append(on_off_row(r, wl, caching, shared_tokens(token_ids(wl, eng))))
                by_caching.setdefault(caching, []).append(r)
                results.append(r)
                if not caching:  # the same run again on the same engine: how far greedy tokens move by themselves
                    by_caching.setdefault("again", []).append(run_from_empty_cache(eng, wl, False, lab, step))
    for by_caching in by_model.values():
        agreement += [{**outputs_agree(on, off), "off_twice": _identical(outputs_agree(again, off))}
                      for on, off, again in zip(by_caching[True], by_caching[False], by_caching["again"])]
    return {"runs": runs, "agreement": agreement}, results


def _identical(agree: dict[str, Any]) -> str:
    return f"{agree['identical']} of {agree['of']}"


def on_off(models: tuple[Any, ...] = ("embedded", BIG), *, store: Any = None, force: bool | None = None) -> Any:
    """`on_off_runs` live on a GPU with vLLM (its Results appended to `store`); else what step prefix-on-off recorded,
    every model's runs (and where the cell asked other models, the line under it says so)."""
    names = [run_name(m) for m in models]

    def live() -> dict[str, Any]:
        value, results = on_off_runs(models)
        for r in results if store is not None else ():
            store.append(r)
        return value

    return live_or_recorded(live, lambda: recorded_facts(ON_OFF_KEY, ON_OFF_STEP), force=force,
                            asked={"models": sorted(names)}, where={"models": "runs.model"})


def run_name(model: Any) -> str:
    """The name a Result of `on_off_runs` carries for `model`: BIG runs as its synthetic checkpoint."""
    return f"synthetic:{BIG}" if model == BIG else model if isinstance(model, str) else model.name
