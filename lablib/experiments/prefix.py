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

The variants put the seeds' advice to the test on the same text:
- `shared-first`: the shipped set as it is (one N-token system prompt, then each request's own);
- `shared-after`: the same requests with a per-request line (a user and a date) put first, so
  every block's chained hash differs from the first token on and nothing is shared;
- `multi-turn`: a chat where each turn's prompt is the previous turn's plus a new message.

Every workload's token ids come from `bench.offline.prepare`, the function every engine run
uses, so the prediction and the measurement count the same tokens.
"""
from __future__ import annotations

from typing import Any

from .. import validate
from ..bench.offline import prepare, run
from ..config import BenchConfig
from ..mechanisms.prefix import PrefixCacheResult, simulate
from ..results.record import Result
from ..workloads import Request, Workload, load_workload

VARIANTS = ("shared-first", "shared-after", "multi-turn")
SHARED_SETS = ("shared-prefix-128", "shared-prefix-512", "shared-prefix-1024")


def variant(kind: str, base: str | Workload = "shared-prefix-512", tokenizer: Any = None,
            turns: int | None = None) -> Workload:
    """One of VARIANTS built from a shared-prefix set (see the module docstring).

    `tokenizer` (the served model's) counts each new prompt's tokens for its Request record; the
    embedded target's tokenizer when None. `turns` caps the multi-turn chat (default: every request)."""
    validate.choice("variant", "kind", kind, VARIANTS)
    wl = base if isinstance(base, Workload) else load_workload(base)
    if kind == "shared-first":
        return wl
    if tokenizer is None:
        from transformers import AutoTokenizer

        from ..models import embedded_path

        tokenizer = AutoTokenizer.from_pretrained(str(embedded_path("target")))

    def req(i: int, r: Request, prompt: str, suffix: str) -> Request:
        n = len(tokenizer(prompt)["input_ids"])
        return Request(f"{r.id}-{suffix}", prompt, ({"role": "user", "content": prompt},), r.max_new_tokens, n,
                       {**r.meta, "variant": kind})

    if kind == "shared-after":
        reqs = [req(i, r, f"# asked by user-{i:03d} on 2026-12-{1 + i % 28:02d}\n{r.prompt}", "after")
                for i, r in enumerate(wl.requests)]
    else:
        shared = _common_prefix_chars(wl)
        n = len(wl.requests) if turns is None else validate.integer("variant", "turns", turns, "e.g. 8 turns.")
        text, reqs = wl.requests[0].prompt[:shared], []
        for i, r in enumerate(wl.requests[:n]):
            text = f"{text}\n# turn {i + 1}\n{r.prompt[shared:]}"
            reqs.append(req(i, r, text, f"turn{i + 1}"))
    return Workload(f"{wl.name}-{kind}", wl.version, f"{wl.description} ({kind})", tuple(reqs),
                    {**wl.manifest, "num_requests": len(reqs), "variant": kind})


def _common_prefix_chars(wl: Workload) -> int:
    """Characters every prompt of the set shares at its start."""
    first = wl.requests[0].prompt
    n = len(first)
    for r in wl.requests[1:]:
        n = min(n, next((i for i, (a, b) in enumerate(zip(first, r.prompt)) if a != b), min(len(first), len(r.prompt))))
    return n


def predict(workload: Workload, engine: Any, *, block_size: int = 16, num_blocks: int | None = None,
            concurrency: int = 1, bench: BenchConfig = BenchConfig(warmup_requests=0)) -> PrefixCacheResult:
    """The simulator on exactly the token ids `engine` would be sent (any engine: HF on a CPU, vLLM on a GPU).

    With outputs given as lengths (the engines decode with ignore_eos), generated blocks stay unhashed."""
    prepared = prepare(workload, engine, bench)
    return simulate([(list(p.prompt_ids), p.max_new_tokens) for p in prepared], block_size=block_size,
                    num_blocks=num_blocks, concurrency=concurrency, keep_snapshots=False)


def measured_hits(result: Result) -> dict[str, Any]:
    """vLLM's own view of one run: cached tokens per request and the counters' deltas over the run."""
    delta = ((result.engine_facts or {}).get("last_run") or {}).get("metrics_delta") or {}
    return {"cached_tokens": [r.cached_tokens for r in result.requests],
            "queries": delta.get("vllm:prefix_cache_queries"), "hits": delta.get("vllm:prefix_cache_hits")}


def compare(predicted: PrefixCacheResult, result: Result) -> dict[str, Any]:
    """Predicted next to measured: per request, in total, and the verdict in a sentence."""
    got = measured_hits(result)
    per_request = [{"request_id": r.request_id, "prompt_tokens": r.prompt_tokens, "predicted": p, "vllm": m}
                   for r, p, m in zip(result.requests, predicted.cached_tokens, got["cached_tokens"])]
    differ = [row for row in per_request if row["predicted"] != row["vllm"]]
    exact = not differ and got["hits"] == predicted.hits and got["queries"] == predicted.queries
    verdict = (f"vLLM hit {got['hits']} of {got['queries']} prompt tokens, the simulator predicted {predicted.hits} of "
               f"{predicted.queries}: " + ("exactly equal, request by request" if exact else
                                          f"{len(differ)} of {len(per_request)} requests differ"))
    return {"per_request": per_request, "predicted_hits": predicted.hits, "predicted_queries": predicted.queries,
            "vllm_hits": got["hits"], "vllm_queries": got["queries"], "exact": exact, "differ": differ,
            "verdict": verdict}


def measure(engine: Any, workload: Workload, *, max_new_tokens: int | None = 8, lab: str = "07_prefix_caching",
            step: str | None = None, store: Any = None) -> dict[str, Any]:
    """One measured run from an empty prefix cache, next to the simulator's prediction for it.

    The engine is warmed first on a prompt the workload does not share, then its cache is reset
    (`VLLMEngine.reset_prefix_cache`), so the run's hits are its own; the prediction uses the
    engine's block size and concurrency (`max_num_seqs`)."""
    bench = BenchConfig(warmup_requests=0, max_new_tokens=max_new_tokens, progress=False)
    engine.start()
    warm = load_workload("journey", limit=1)
    run(engine, warm, BenchConfig(warmup_requests=0, max_new_tokens=2, progress=False))
    if not engine.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache (blocks still in use): nothing should be running "
                           "between runs; restart the engine.")
    result = run(engine, workload, bench, lab=lab, step=step or f"prefix-{workload.name}", store=store)
    predicted = predict(workload, engine, block_size=int(engine.facts.get("block_size") or 16),
                        concurrency=int(engine.facts.get("max_num_seqs") or 1), bench=bench)
    return {"result": result, "predicted": predicted, **compare(predicted, result)}
