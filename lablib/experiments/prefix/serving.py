"""Lab 07 on a server: the prefix cache's hit rate from vLLM's `/metrics` under Poisson load, next to TTFT.

Offline (the lab's steps 6-7) every request of a set is handed to the engine at once. A server meets its users
one at a time, on a Poisson clock (`bench.loadgen`, as lab 05 drives it), and reports its cache on
`GET /metrics` as two counters since it started, in tokens: `vllm:prefix_cache_queries_total` (prompt tokens
looked up) and `vllm:prefix_cache_hits_total` (tokens found cached). Their deltas over one load test are that
test's hit rate. `serve_runs` sends the shared-system-prompt set to one server with caching on and one with it
off, at each rate, and puts the measured hit rate next to the simulator's prediction for the same token ids
(`prefix.predict`: the ids are the ones sent, `bench.offline.prepare`'s), with TTFT p50/p99 and output tok/s.

Every load test starts from an empty cache: `POST /reset_prefix_cache` before each, a development route of
vLLM's server, served only with `VLLM_SERVER_DEV_MODE=1` (set here for the caching-on server; like every lab
server it listens on 127.0.0.1 only, and vLLM does not put these routes behind the API key). Without it the
second test would find the first test's prompts whole and hit nearly everything: a load test repeats its
prompts. The warm-up (the whole set at most 8 tokens each, as lab 05 warms a server) runs before the first reset.

Does load lower the hit rate? A request that arrives while the first request's prefill is still running might
be expected to miss. In vLLM 0.26 it does not: the scheduler caches a block's hash when it hands the block to
the step that computes it (`KVCacheManager.allocate_slots` calls `cache_blocks`), so a request scheduled in
the same step or any later one finds it (in the same step it reads K/V the other request writes in that
forward pass). What can lower the hit rate under load is memory: a prefix that no running request holds is
evicted when new requests need its blocks (step 8), and a request looked up but not admitted (no free
blocks) is looked up, and counted, again in the next step. On these sets nothing is evicted, and every later
request shares the same whole blocks with every earlier one (the order of arrival does not matter), so the
claim is exact: at every rate the counters' hits equal the simulator's.

`serve` is the notebook's call: `serve_runs` live on a GPU with vLLM, else what `record.record_serve` recorded on
the H200 (`scripts/record_reference.py --steps prefix-serve`), or a line saying it is not recorded yet. `load_tests` is the
part that needs only a running server (any OpenAI-compatible one with vLLM's counters), which the tests drive.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import validate
from ...bench.loadgen import run_online
from ...bench.prom import fetch_metrics, parse_prometheus
from ...engines.server import ServerEngine, VLLMServer
from ...models import ModelSpec, resolve_model
from ...models.synthetic import synthetic_spec
from ...results.record import Result
from ...results.reference import recorded_facts
from ...results.store import results_dir
from ...session import live_or_recorded
from ...workloads import load_workload
from ..serving.runs import check_context, server_config
from .runs import predict, run_name
from .workloads import BIG, LAB, SHARED_SETS, token_ids, variant

KEY, STEP = "prefix_serve", "prefix-serve"  # the facts key record.record_serve writes, and its step's name
RATES = (2.0, 8.0, 32.0, 128.0)  # requests/s: one at a time, overlapping, queued (32 requests per test)
WORKLOADS = (*SHARED_SETS, "shared-prefix-512-shared-after")  # the shipped sets, and one that shares nothing
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"  # vLLM 0.26's names on /metrics
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}  # vLLM serves POST /reset_prefix_cache only then


def check(workload: str, rates: Sequence[float], limit: int | None = None) -> list[float]:
    """The asked workload, rates and request limit, refused before any server starts; the rates as a list."""
    validate.choice("prefix_serving", "workload", workload, WORKLOADS,
                    "'shared-prefix-512' (a 512-token system prompt), or its '-shared-after' variant (no hits).")
    validate.optional_integer("prefix_serving", "limit", limit, "None for the whole set (32), or e.g. 8.")
    return validate.numbers("prefix_serving", "rates", rates,
                            "requests per second, each > 0 and finite, e.g. [2, 8, 32, 128].")


def serve_workload(name: str, limit: int | None = None) -> Any:
    """A set of WORKLOADS by name (the shared-after variant built from shared-prefix-512), its first `limit`."""
    wl = variant("shared-after", "shared-prefix-512") if name.endswith("-shared-after") else load_workload(name)
    return wl.head(limit) if limit else wl


def cache_counters(base_url: str, api_key: str | None) -> dict[str, float | None]:
    """The server's prefix-cache counters now: {"queries", "hits"} in tokens (None where the page lacks one)."""
    page = parse_prometheus(fetch_metrics(base_url.rstrip("/") + "/metrics", api_key))
    return {"queries": page.get(QUERIES), "hits": page.get(HITS)}


def reset_prefix_cache(base_url: str, api_key: str | None, timeout_s: float = 30.0) -> None:
    """Empty the server's prefix cache (`POST /reset_prefix_cache`), retrying while vLLM says blocks are in use."""
    req = urllib.request.Request(base_url.rstrip("/") + "/reset_prefix_cache", data=b"", method="POST",
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1: never via a proxy
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with opener.open(req, timeout=10) as resp:
                if json.loads(resp.read() or b"{}").get("success"):
                    return
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise RuntimeError(f"{base_url} has no POST /reset_prefix_cache: vLLM serves it only with "
                                   "VLLM_SERVER_DEV_MODE=1. Fix: start the server with that variable set "
                                   "(serve_runs does).") from None
            raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base_url} refused to reset its prefix cache for {timeout_s:.0f} s (blocks still in "
                               "use): nothing should run between load tests. Fix: restart the server.")
        time.sleep(0.2)


def load_tests(base_url: str, api_key: str | None, served: str, workload: Any, ids: list[list[int]],
               rates: Sequence[float], predicted: Any = None, *, caching: bool, seed: int = 0, lab: str = LAB,
               limit: int | None = None, recorded: dict[str, Any] | None = None
               ) -> tuple[list[dict[str, Any]], list[Result]]:
    """One Poisson load test per rate on a running server, the token ids `ids` sent; (one row per rate, Results).

    The whole set goes through once first (8 tokens each); with `caching` the cache is reset before every test,
    so each test's counter deltas are its own, from an empty cache. `predicted` (a PrefixCacheResult for the
    same ids) goes next to them; `limit` (the set's first N, None for all) is noted in each row."""
    name = "on" if caching else "off"
    run_online(base_url, api_key, served, workload, [], prompts=ids, warmup_requests=len(ids))
    rows, results = [], []
    for rate in rates:
        if caching:
            reset_prefix_cache(base_url, api_key)
        before = cache_counters(base_url, api_key)
        result = run_online(base_url, api_key, served, workload, [rate], prompts=ids, warmup_requests=0, seed=seed,
                            timeline=False, lab=lab, step_prefix=f"prefix-serve-{name}-{workload.name}",
                            **(recorded or {}))[0]
        after = cache_counters(base_url, api_key)
        rows.append({**row(result, workload, rate, caching, before, after, predicted if caching else None),
                     "limit": limit})
        results.append(result)
    return rows, results


def _delta(before: dict[str, float | None], after: dict[str, float | None], key: str) -> int | None:
    a, b = before.get(key), after.get(key)
    return None if a is None or b is None else int(b - a)


def row(result: Result, workload: Any, rate: float, caching: bool, before: dict[str, float | None],
        after: dict[str, float | None], predicted: Any = None) -> dict[str, Any]:
    """One load test as the lab's table and figure read it: the counters' deltas, the prediction, TTFT, tok/s."""
    s = result.summary
    queries, hits = _delta(before, after, "queries"), _delta(before, after, "hits")
    return {"model": result.model.get("name"), "workload": workload.name, "caching": "on" if caching else "off",
            "rate": rate, "requests": s["requests"], "errors": max(0, len(result.notes) - 1),  # "N of M failed", then each
            "queries": queries, "hits": hits, "hit_rate": hits / queries if queries and hits is not None else None,
            "predicted_queries": predicted.queries if predicted else None,
            "predicted_hits": predicted.hits if predicted else None,
            "predicted_hit_rate": predicted.hit_rate if predicted else None,
            "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p99_s": s["ttft_s"]["p99"], "output_tok_s": s["output_tok_s"],
            "step": result.step}


def serve_runs(model: Any = BIG, workload: str = "shared-prefix-512", rates: Sequence[float] = RATES, *,
               caching: Sequence[bool] = (False, True), limit: int | None = None, seed: int = 0,
               max_num_seqs: int | None = None, gpu_memory_utilization: float = 0.3,
               out_dir: str | Path | None = None, lab: str = LAB) -> tuple[list[dict[str, Any]], list[Result]]:
    """The set on vLLM's OpenAI server, caching off then on (one server each), a load test per rate; (rows, Results).

    Inputs, every prompt's length against the context included, are checked before the first server starts."""
    rates = check(workload, rates, limit)
    wl = serve_workload(workload, limit)
    spec = synthetic_spec(model) if model == BIG else model if isinstance(model, ModelSpec) else resolve_model(model)
    knobs = {"max_num_seqs": max_num_seqs, "gpu_memory_utilization": gpu_memory_utilization,
             "max_model_len": 4096 if model == BIG else None}
    configs = {on: server_config(spec, enable_prefix_caching=on, **knobs) for on in caching}
    for cfg in configs.values():
        check_context(wl, spec, cfg)
    out = Path(out_dir) if out_dir is not None else results_dir() / "prefix-serve"
    out.mkdir(parents=True, exist_ok=True)
    rows, results = [], []
    for on, cfg in configs.items():
        server = VLLMServer(cfg, log_path=out / f"server-caching-{'on' if on else 'off'}.log",
                            env=DEV_MODE if on else None)
        eng = ServerEngine(spec, base_url=server.base_url, api_key=server.api_key, served_model_name=server.model)
        ids = token_ids(wl, eng)
        recorded = {"server": cfg.to_dict(), "model_info": {**eng.spec.describe(), "name": cfg.name}}
        with server:
            got, done = load_tests(server.base_url, server.api_key, server.model, wl, ids, rates,
                                   predict(wl, eng) if on else None, caching=on, seed=seed, lab=lab,
                                   limit=limit, recorded=recorded)
        rows += got
        results += done
    return rows, results


def serve(model: Any = BIG, workload: str = "shared-prefix-512", rates: Sequence[float] = RATES, *,
          limit: int | None = None, store: Any = None, force: bool | None = None) -> Any:
    """`serve_runs` live on a GPU with vLLM (its Results appended to `store`); else what step prefix-serve recorded,
    every rate (where the cell asked others, the line under it says so), or a Shown with no value whose label says
    it is not recorded yet and which step records it."""
    rates = check(workload, rates, limit)

    def live() -> list[dict[str, Any]]:
        rows, results = serve_runs(model, workload, rates, limit=limit)
        for r in results if store is not None else ():
            store.append(r)
        return rows

    return live_or_recorded(live, lambda: recorded_facts(KEY, STEP), force=force,
                            asked={"model": run_name(model), "workload": workload, "rates": rates, "limit": limit},
                            where={"rates": "rate"})


def serve_lines(shown: Any) -> str:
    """Per rate, the server's hit rate next to the simulator's and the TTFT with caching on and off, labelled."""
    if shown.value is None:
        return f"[{shown.label}]"
    by = {(r["rate"], r["caching"]): r for r in shown.value}
    out = []
    for rate in dict.fromkeys(r["rate"] for r in shown.value):
        on, off = by.get((rate, "on")), by.get((rate, "off"))
        text = f"{rate:g} req/s:"
        if on is not None:
            measured = "n/a" if on["hit_rate"] is None else f"{on['hit_rate']:.1%}"
            text += (f" hit rate {measured} ({on['hits']} of {on['queries']} tokens), simulator "
                     f"{on['predicted_hit_rate']:.1%}; TTFT p50 on {1e3 * on['ttft_p50_s']:.1f} ms")
        if off is not None:
            text += f"{',' if on else ''} TTFT p50 off {1e3 * off['ttft_p50_s']:.1f} ms"
        out.append(text)
    return "\n".join(out) + f"\n[{shown.label}]"
