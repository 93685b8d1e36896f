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
from ..mechanisms.prefix import PrefixCacheResult, chain_hashes, simulate
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


# Lab 07's notebook: the simulator on the embedded tokenizer's real token ids (live on any machine), then the
# vLLM runs the recordings above lack: TTFT and throughput with caching on and off, and the greedy tokens compared.

LAB = "07_prefix_caching"
BLOCK = 16  # vLLM's default block size, the simulator's here
ODD_LENGTH = 200  # a shared prefix that is not a multiple of the block size: 12.5 blocks, so 192 tokens can hit
LENGTHS = (128, ODD_LENGTH, 512, 1024)  # the shipped sets and the odd one
ORDERS = ("grouped", "popular", "round-robin")  # how requests with distinct prefixes arrive (scarce_memory_rows)
BIG = "llama-3.1-8b"  # the synthetic checkpoint whose prefill is long enough for TTFT to show the saving
ON_OFF_KEY, ON_OFF_STEP = "prefix_on_off", "prefix-on-off"  # the facts key `record` writes, and its step's name


def _tokenizer(tokenizer: Any) -> Any:
    if tokenizer is not None:
        return tokenizer
    from ..models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("embedded"))


def shared_tokens(prompts: list[list[int]]) -> int:
    """How many leading token ids every prompt shares."""
    first = prompts[0]
    return min((next((i for i, (a, b) in enumerate(zip(first, p)) if a != b), min(len(first), len(p)))
                for p in prompts[1:]), default=len(first))


def shared_prefix_set(tokens: int, tokenizer: Any = None) -> Workload:
    """The shipped set with an N-token shared prefix for any N from 3 to 1024 (e.g. ODD_LENGTH, not a multiple of 16).

    Built as the shipped sets are (bos, the first N - 2 tokens of uu.py, a line break, then each request's own
    snippet), by cutting shared-prefix-1024's shared prompt at a token boundary; the result is checked token by
    token with the embedded tokenizer (`tokenizer`, when given, must be the same one)."""
    validate.integer("shared_prefix_set", "tokens", tokens,
                     "e.g. 200 (12.5 blocks of 16); 1024 is the longest shipped.", 3, 1024)
    tok, base = _tokenizer(tokenizer), load_workload("shared-prefix-1024")
    ids = tok(base.requests[0].prompt)["input_ids"]
    head = tok.decode(ids[1:1023])  # the 1024 set's shared text without bos and its closing line break
    if not all(r.prompt.startswith(head + "\n") for r in base.requests):
        raise RuntimeError("shared-prefix-1024's prompts do not start with its shared text: this tokenizer is not the "
                           "one the sets were built with. Fix: pass tokenizer=None (the embedded one).")
    cut = tok.decode(ids[1:tokens - 1])
    reqs = []
    for r in base.requests:
        prompt = cut + "\n" + r.prompt[len(head) + 1:]
        got = tok(prompt)["input_ids"]
        if got[:tokens] != ids[:tokens - 1] + tok("\n", add_special_tokens=False)["input_ids"]:
            raise RuntimeError(f"shared_prefix_set({tokens}): request {r.id} does not start with the {tokens} shared "
                               "tokens once tokenized (the cut merged with the line break). Fix: pick another length.")
        system, *rest = r.messages  # chat form: the header is the system message's code block, as in the shipped sets
        messages = ({"role": system["role"], "content": system["content"].replace(head, cut + "\n", 1)}, *rest)
        reqs.append(Request(r.id.replace("1024", str(tokens)), prompt, messages, r.max_new_tokens, len(got),
                            {**r.meta, "shared_prefix_tokens": tokens}))
    about = f"shared-prefix-1024's requests with the shared prompt cut to {tokens} tokens"
    keep = {k: v for k, v in base.manifest.items() if k in ("version", "num_requests", "provenance")}
    return Workload(f"shared-prefix-{tokens}", base.version, about, tuple(reqs),
                    {**keep, "description": about, "shared_prefix_tokens": tokens, "built_from": "shared-prefix-1024"})


def shared_set(tokens: int, tokenizer: Any = None) -> Workload:
    """shared-prefix-N: the shipped file for 128, 512 and 1024, else built by `shared_prefix_set`."""
    name = f"shared-prefix-{tokens}"
    return load_workload(name) if name in SHARED_SETS else shared_prefix_set(tokens, tokenizer)


def _ids(workload: Workload, engine: Any) -> list[list[int]]:
    return [list(p.prompt_ids) for p in prepare(workload, engine, BenchConfig(warmup_requests=0))]


def repeat_rows(engine: Any, lengths: tuple[int, ...] = (15, 16, 17, 48, 63, 64, 65, 100)) -> list[dict[str, Any]]:
    """The last-token rule on real token ids: a shipped prompt's first n tokens sent twice, what the second hits."""
    ids = _ids(load_workload("shared-prefix-1024").head(1), engine)[0]
    validate.integers("repeat_rows", "lengths", lengths, f"prompt lengths up to {len(ids)} tokens.", 1, len(ids))
    rows = []
    for n in lengths:
        cached = simulate([ids[:n], ids[:n]], block_size=BLOCK).cached_tokens[1]
        rows.append({"prompt_tokens": n, "full_blocks": n // BLOCK, "cached_second_time": cached,
                     "recomputed": n - cached})
    return rows


def chain_rows(engine: Any, blocks: int = 10, base: str = "shared-prefix-128") -> list[dict[str, Any]]:
    """The chained hashes (first 8 hex digits) of two requests' first blocks, shared part first and line first.

    Shared part first, the two agree block for block over the shared prompt and differ after it; with a
    per-request line first they differ from block 0, and so in every later block, however much text they share."""
    wl = load_workload(base).head(2)
    first = [chain_hashes(p, BLOCK) for p in _ids(wl, engine)]
    after = [chain_hashes(p, BLOCK) for p in _ids(variant("shared-after", wl, engine.tokenizer), engine)]
    rows = []
    for i in range(blocks):
        a, b, c, d = (h[i][:8] if i < len(h) else None for h in (*first, *after))
        rows.append({"block": i, "tokens": f"{i * BLOCK}-{(i + 1) * BLOCK - 1}", "request 0": a, "request 1": b,
                     "shared": a is not None and a == b, "request 0, line first": c, "request 1, line first": d,
                     "shared, line first": c is not None and c == d})
    return rows


def prefix_length_rows(engine: Any, lengths: tuple[int, ...] = LENGTHS) -> list[dict[str, Any]]:
    """The simulator's hit rate against the shared-prefix length, each set as the engine would be sent it.

    `best_hit_rate` is what every shared token of every later request would give if partial blocks could be
    shared; the simulator's rate is lower by the partial block at the shared prompt's end (none when the shared
    prefix is a whole number of blocks)."""
    rows = []
    for n in lengths:
        wl = shared_set(n, getattr(engine, "tokenizer", None))
        ids = _ids(wl, engine)
        got = simulate([(p, 1) for p in ids], block_size=BLOCK, keep_snapshots=False)
        shared = shared_tokens(ids)
        later = sorted(got.cached_tokens[1:])
        rows.append({"workload": wl.name, "shared_tokens": shared, "shared_full_blocks": shared // BLOCK,
                     "requests": len(ids), "cached_per_later_request": later[len(later) // 2],
                     "queries": got.queries, "hits": got.hits, "hit_rate": got.hit_rate,
                     "best_hit_rate": shared * (len(ids) - 1) / got.queries})
    return rows


def advice(engine: Any, base: str = "shared-prefix-512") -> dict[str, PrefixCacheResult]:
    """The seeds' advice on one set: the shared part first, a per-request line first, a multi-turn chat."""
    tok = engine.tokenizer
    return {"shared part first": predict(load_workload(base), engine),
            "per-request line first": predict(variant("shared-after", base, tok), engine),
            "multi-turn": predict(variant("multi-turn", base, tok), engine)}


def distinct_prefix_prompts(prefixes: int = 8, per_prefix: int = 4, prefix_tokens: int = 128,
                            order: str = "round-robin", tokenizer: Any = None) -> list[list[int]]:
    """`prefixes` different system prompts (the first prefix_tokens token ids of distinct evaluation windows), each
    followed by per-request snippets (shared-prefix-128's own parts), prefixes x per_prefix requests in `order`:

    - "grouped": every request of prefix 0, then of prefix 1, ... (each prefix reused at once);
    - "popular": every other request uses prefix 0, the rest take the others in turn;
    - "round-robin": prefix 0, 1, ..., then 0 again (each reused only after every other prefix)."""
    validate.choice("distinct_prefix_prompts", "order", order, ORDERS)
    validate.integer("distinct_prefix_prompts", "prefixes", prefixes, "2 to 64 (the evaluation windows).", 2, 64)
    validate.integer("distinct_prefix_prompts", "per_prefix", per_prefix, "e.g. 4.", 1)
    validate.integer("distinct_prefix_prompts", "prefix_tokens", prefix_tokens, "1 to 511 tokens (a window's).", 1, 511)
    n = prefixes * per_prefix
    if order == "grouped":
        which = [k // per_prefix for k in range(n)]
    elif order == "popular":
        which = [0 if k % 2 == 0 else 1 + (k // 2) % (prefixes - 1) for k in range(n)]
    else:
        which = [k % prefixes for k in range(n)]
    return _prefixed(which, prefix_tokens, _tokenizer(tokenizer))


def _prefixed(which: list[int], prefix_tokens: int, tok: Any) -> list[list[int]]:
    """Request k: evaluation window which[k]'s first prefix_tokens ids, then shared-prefix-128's k-th own snippet."""
    evaluation = load_workload("evaluation").requests[:max(which) + 1]
    windows = [tok(r.prompt)["input_ids"][:prefix_tokens] for r in evaluation]
    own = [tok(r.prompt)["input_ids"][128:] for r in load_workload("shared-prefix-128").requests]
    return [windows[i] + own[k % len(own)] for k, i in enumerate(which)]


def scarce_memory_rows(capacities: tuple[int, ...] = tuple(range(16, 161, 16)), prefixes: int = 8,
                       per_prefix: int = 4, prefix_tokens: int = 128, orders: tuple[str, ...] = ORDERS,
                       tokenizer: Any = None) -> list[dict[str, Any]]:
    """Hit rate and evictions against the cache's capacity (blocks), for each arrival order of distinct prefixes.

    One request at a time. `prefix_blocks` is what all the prefixes take together: with less room than that
    plus one request's own blocks, LRU evicts, and a prefix reused only after every other one (round-robin) is
    gone before it comes back."""
    tok, rows = _tokenizer(tokenizer), []
    for order in orders:
        prompts = distinct_prefix_prompts(prefixes, per_prefix, prefix_tokens, order, tok)
        for cap in capacities:
            got = simulate([(p, 1) for p in prompts], block_size=BLOCK, num_blocks=cap, keep_snapshots=False)
            rows.append({"order": order, "num_blocks": cap, "prefix_blocks": prefixes * (prefix_tokens // BLOCK),
                         "queries": got.queries, "hits": got.hits, "hit_rate": got.hit_rate,
                         "evictions": got.evictions})
    return rows


def falls_with_capacity(rows: list[dict[str, Any]]) -> bool:
    """The scarce-memory claim: for every order, less room never raises the hit rate nor lowers the evictions."""
    for order in dict.fromkeys(r["order"] for r in rows):
        mine = sorted((r for r in rows if r["order"] == order), key=lambda r: r["num_blocks"])
        if any(a["hit_rate"] > b["hit_rate"] or a["evictions"] < b["evictions"] for a, b in zip(mine, mine[1:])):
            return False
    return True


def eviction_demo(num_blocks: int = 20, order: tuple[int, ...] = (0, 0, 1, 2, 0, 3, 1, 0, 2, 0),
                  tokenizer: Any = None) -> PrefixCacheResult:
    """A pool small enough to evict: prefixes of 48 tokens (3 blocks), request k using prefix order[k], two at a time,
    4 tokens out each. Prefix 0 is popular: its blocks are shared while two requests hold them and stay cached
    between its uses; the rare ones are evicted before they come back."""
    validate.integers("eviction_demo", "order", order, "prefix indices 0..63, e.g. (0, 0, 1, 2, 0).", 0, 63)
    prompts = _prefixed(list(order), 48, _tokenizer(tokenizer))
    return simulate([(p, 4) for p in prompts], block_size=BLOCK, num_blocks=num_blocks, concurrency=2)


def lab_workloads(tokenizer: Any = None) -> list[Workload]:
    """What the lab runs on vLLM: the shipped sets, the odd-length set, the shared-after and multi-turn variants."""
    return ([load_workload(n) for n in SHARED_SETS] + [shared_prefix_set(ODD_LENGTH, tokenizer)]
            + [variant(k, "shared-prefix-512", tokenizer) for k in ("shared-after", "multi-turn")])


def counter_rows(max_num_seqs: int = 1, *, store: Any = None, lab: str = LAB) -> list[dict[str, Any]]:
    """vLLM's hits against the simulator's on every lab workload, each from a reset cache (as `--steps prefix`)."""
    from ..config import VLLMConfig
    from ..engines.vllm import VLLMEngine
    from ..session import live_label

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
    from ..results.reference import recorded_facts
    from ..session import live_or_recorded

    validate.choice("counters", "max_num_seqs", max_num_seqs, (1, 32),
                    "1 (exact by construction) or 32 (the batch case).")
    step = "prefix" if max_num_seqs == 1 else "prefix-batch"
    return live_or_recorded(lambda: counter_rows(max_num_seqs, store=store),
                            lambda: recorded_facts(f"prefix_seqs_{max_num_seqs}", step), force=force)


def _run_from_empty_cache(engine: Any, workload: Workload, caching: bool, lab: str, step: str) -> Result:
    """One run of the workload's own output lengths; with caching on, from a reset cache after a warm-up."""
    run(engine, load_workload("journey", limit=1), BenchConfig(warmup_requests=0, max_new_tokens=2, progress=False))
    if caching and not engine.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache (blocks still in use): restart the engine.")
    return run(engine, workload, BenchConfig(warmup_requests=0, progress=False), lab=lab, step=step)


def on_off_row(result: Result, workload: Workload, caching: bool, shared: int) -> dict[str, Any]:
    """One run's TTFT, throughput and vLLM's prefix-cache counters, as the lab's tables and figures read them."""
    s, got = result.summary, measured_hits(result)
    return {"model": result.model.get("name"), "workload": workload.name,
            "kind": workload.manifest.get("variant", "shared-first"), "shared_tokens": shared,
            "caching": "on" if caching else "off", "requests": s["requests"], "ttft_p50_s": s["ttft_s"]["p50"],
            "ttft_p99_s": s["ttft_s"]["p99"], "output_tok_s": s["output_tok_s"], "total_tok_s": s["total_tok_s"],
            "vllm_hits": got["hits"], "vllm_queries": got["queries"],
            "hit_rate": got["hits"] / got["queries"] if caching and got["queries"] else None, "step": result.step}


def outputs_agree(on: Result, off: Result) -> dict[str, Any]:
    """Greedy tokens with caching on against off, request by request: how many are identical, and where others part."""
    off_ids = {r.request_id: r.output_ids for r in off.requests}
    diverged = []
    for r in on.requests:
        a, b = r.output_ids or [], off_ids.get(r.request_id) or []
        unequal = None if len(a) == len(b) else min(len(a), len(b))
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), unequal)
        if at is not None or r.output_ids is None:
            diverged.append({"request_id": r.request_id, "first_divergence": at, "output_tokens": len(a)})
    return {"model": on.model.get("name"), "workload": on.workload.get("name"),
            "identical": len(on.requests) - len(diverged), "of": len(on.requests), "diverged": diverged}


def on_off_runs(models: tuple[Any, ...] = ("embedded", BIG), *, lab: str = LAB, gpu_memory_utilization: float = 0.3
                ) -> tuple[dict[str, Any], list[Result]]:
    """Each model with prefix caching off, then on: the shared-prefix sets and the shared-after variant (0% hits).

    Every request arrives at once (vLLM's default scheduler), with the workload's own 32 output tokens. Returns
    {"runs": one on_off_row per run, "agreement": outputs_agree per model and workload} and the Results."""
    from ..config import VLLMConfig
    from ..engines.vllm import VLLMEngine
    from ..models.synthetic import synthetic_spec

    runs, agreement, results = [], [], []
    for model in models:
        spec = synthetic_spec(model) if model == BIG else model
        by_caching: dict[bool, list[Result]] = {}
        for caching in (False, True):
            config = VLLMConfig(gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=caching,
                                max_model_len=4096 if model == BIG else None)
            with VLLMEngine(spec, config) as eng:
                wls = [shared_set(n, eng.tokenizer) for n in LENGTHS] + [variant("shared-after", "shared-prefix-512",
                                                                                  eng.tokenizer)]
                tag = model if isinstance(model, str) else model.name
                for wl in wls:
                    step = f"prefix-{'on' if caching else 'off'}-{wl.name}-{tag}"
                    r = _run_from_empty_cache(eng, wl, caching, lab, step)
                    runs.append(on_off_row(r, wl, caching, shared_tokens(_ids(wl, eng))))
                    by_caching.setdefault(caching, []).append(r)
                    results.append(r)
        agreement += [outputs_agree(on, off) for on, off in zip(by_caching[True], by_caching[False])]
    return {"runs": runs, "agreement": agreement}, results


def on_off(models: tuple[Any, ...] = ("embedded", BIG), *, store: Any = None, force: bool | None = None) -> Any:
    """`on_off_runs` live on a GPU with vLLM (its Results appended to `store`); else what `record` recorded."""
    from ..results.reference import recorded_facts
    from ..session import live_or_recorded

    def live() -> dict[str, Any]:
        value, results = on_off_runs(models)
        for r in results if store is not None else ():
            store.append(r)
        return value

    return live_or_recorded(live, lambda: recorded_facts(ON_OFF_KEY, ON_OFF_STEP), force=force)


def part(shown: Any, key: str, then: Any = None) -> Any:
    """One part of a Shown dict (e.g. on_off's "runs"), passed through `then` if given, still labelled; no value
    stays no value."""
    from ..session import Shown

    value = None if shown.value is None else shown.value[key] if then is None else then(shown.value[key])
    return Shown(value, shown.live, shown.label, shown.why)


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


def caching_cuts_ttft(runs: list[dict[str, Any]], model: str = f"synthetic:{BIG}") -> bool:
    """The lab's claim: on every shared-first set, caching on gives `model` a lower TTFT p50 than off."""
    pairs = [p for p in on_off_pairs(runs) if p["model"] == model and not p["workload"].endswith("-shared-after")]
    return bool(pairs) and all(p["ttft_p50_on_s"] < p["ttft_p50_off_s"] for p in pairs)


def record(out_dir: Any, store: Any, facts: dict[str, Any], models: tuple[Any, ...] = ("embedded", BIG)) -> None:
    """The GPU session's step (`--steps prefix-on-off`): on_off_runs into facts[ON_OFF_KEY], its Results recorded."""
    import dataclasses

    value, results = on_off_runs(models, lab="reference")
    for r in results:
        store.append(dataclasses.replace(r, provenance="recorded"))
    facts[ON_OFF_KEY] = value
    for a in value["agreement"]:
        print(f"prefix on/off {a['model']} {a['workload']}: {a['identical']} of {a['of']} greedy outputs identical")
    for p in on_off_pairs(value["runs"]):
        print(f"prefix on/off {p['model']} {p['workload']}: TTFT p50 on/off {p['ttft_p50_on_over_off']:.2f}, "
              f"total tok/s on/off {p['total_tok_s_on_over_off']:.2f}, hit rate {p['hit_rate']}")


def checks(idea: Any, chain: Any, lengths: Any, advice: Any, demo: Any, scarce: Any, seq: Any, onoff: Any) -> str:
    """Lab 07's Checks cell: the simulator's exact cases asserted on this run, vLLM's claims when measured live.

    Takes what the lab's cells computed: the repeat table, the hash chain, the prefix-length rows, the advice
    runs, the eviction demo, the scarce-memory rows, the sequential counters and the on/off runs."""
    from ..session import Checks

    c = Checks("07_prefix_caching")
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
        all(a["hit_rate"] < b["hit_rate"] for a, b in zip(lengths, lengths[1:])),
    )
    c.that(
        "the shared part after a per-request line: 0 hits",
        advice["per-request line first"].hits == 0,
        advice["per-request line first"].hits,
    )
    turns = advice["multi-turn"].cached_tokens
    c.that("multi-turn: cached tokens grow strictly every turn", all(a < b for a, b in zip(turns, turns[1:])), turns)
    c.that(
        "the block picture: blocks shared by two running requests, hashes evicted",
        demo.evictions > 0 and any(max(s.ref_counts) > 1 for s in demo.snapshots),
    )
    c.that(
        "scarce memory: round-robin hits nothing with less room than all the prefixes",
        all(r["hits"] == 0 for r in scarce if r["order"] == "round-robin" and r["num_blocks"] <= r["prefix_blocks"]),
    )
    c.that("scarce memory: less room never raises the hit rate, nor lowers the evictions", falls_with_capacity(scarce))
    c.live(
        seq,
        "vLLM's hits equal the simulator's, request by request, one request at a time",
        lambda rows: all(r["exact"] for r in rows),
        lambda rows: [r["verdict"] for r in rows if not r["exact"]],
    )
    c.live(
        seq,
        "vLLM hits nothing with a per-request line first",
        lambda rows: all(r["vllm_hits"] == 0 for r in rows if r["workload"].endswith("shared-after")),
    )
    c.live(
        part(onoff, "runs"), "prefix caching cuts TTFT p50 on every shared-prefix set (synthetic 8B)", caching_cuts_ttft
    )
    c.live(
        part(onoff, "agreement"),
        "greedy tokens identical with caching on and off (embedded model)",
        lambda rows: all(a["identical"] == a["of"] for a in rows if a["model"] == "embedded"),
        lambda rows: [a for a in rows if a["diverged"]],
    )
    return c.done()
