"""Online serving under load: requests arrive on their own clock, not when the server is ready.

Offline benchmarks hand the engine every request at time 0 and measure throughput. A real
server sees users arrive independently of each other, which makes the gaps between
arrivals exponential (a Poisson process at `rate` requests per second): mostly short gaps
with occasional bursts. `arrival_times` draws that schedule from a seeded `random.Random`,
so every run of a sweep sends the same requests at the same offsets; `rate=inf` sends them
all at once (the offline limit, i.e. peak throughput).

Each request is one streaming `POST /v1/completions` (`stream: true`, `ignore_eos`, greedy,
a fixed `max_tokens`, with a final usage chunk); the client stamps every server-sent-event
chunk on arrival, as vLLM's own `benchmark_serving` does. TTFT under load is then measured
from the *scheduled* arrival: it includes the time the request queued in the server
because the running batch or the KV cache was full (and any lag of the client itself in sending it:
`start` is when it was actually sent), so as the rate approaches the server's
capacity TTFT climbs steeply while TPOT (one decode step per token) barely moves, and past
it the queue and TTFT grow for as long as the test runs.

A request that fails (HTTP error, refused connection, a broken stream) becomes a line in
the returned errors, never an exception mid-run: one bad request must not throw away a
sweep point's other measurements.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import validate
from ..engines.openai import Prompt, run_sync, send_all
from ..hardware.device import device_facts, library_versions
from ..results.record import RequestRecord, Result
from ..results.store import ResultStore
from ..workloads import Workload
from .prom import (
    DEFAULT_GAUGES,
    MetricsScraper,
    fetch_metrics,
    parse_prometheus,
    window_means,
)
from ..config import lab_id


def check_rate(rate: float, where: str) -> float:
    """An offered request rate, checked: requests per second > 0, or float('inf') for every request at once."""
    return validate.number(where, "rate", rate, "requests per second, e.g. 4.0, or float('inf') to send every "
                           "request at once.", 0.0, low_open=True, allow_inf=True)


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Scheduled send offsets (seconds) of n requests: the first at 0, then exponential gaps of mean 1/rate."""
    validate.integer("arrival_times", "n", n, "a request count, e.g. len(workload).", 0)
    if math.isinf(check_rate(rate, "arrival_times")):
        return [0.0] * n
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def load_test(base_url: str, api_key: str | None, model: str, prompts: Sequence[Prompt],
                    max_tokens: Sequence[int], rate: float, seed: int, *, request_ids: Sequence[str] | None = None,
                    max_concurrency: int | None = None, timeout_s: float = 600.0,
                    on_start: Callable[[float], None] | None = None, stats: dict[str, Any] | None = None
                    ) -> tuple[list[RequestRecord], list[str]]:
    """Send every prompt on a seeded Poisson schedule at `rate` (`arrival_times`), streaming; return (records, errors).

    The sending and reading is `lablib.engines.openai.send_all` (see it for the clock, the
    concurrency cap and the client's own load in `stats`).
    """
    return await send_all(base_url, api_key, model, prompts, max_tokens, arrival_times(len(prompts), rate, seed),
                          request_ids=request_ids, max_concurrency=max_concurrency, timeout_s=timeout_s,
                          on_start=on_start, stats=stats)


def _histograms(base_url: str, api_key: str | None) -> dict[str, float] | None:
    """The server's /metrics now (for the latency histograms' window means); None if it does not answer."""
    try:
        return parse_prometheus(fetch_metrics(base_url.rstrip("/") + "/metrics", api_key))
    except Exception:  # noqa: BLE001 - the server's own view is extra: its absence must not lose the load test
        return None


def run_online(base_url: str, api_key: str | None, model: str, workload: Workload, rates: Sequence[float], *,
               seed: int = 0, prompts: Sequence[Prompt] | None = None, max_tokens: int | Sequence[int] | None = None,
               max_concurrency: int | None = None, warmup_requests: int = 1, metrics: Sequence[str] | None =
               DEFAULT_GAUGES, metrics_interval_s: float = 0.5, timeline: bool = True, lab: str = lab_id("05"),
               server: dict[str, Any] | None = None, store: ResultStore | None = None,
               on_metrics: Callable[[float, dict[str, float | None]], None] | None = None,
               on_result: Callable[[Result], None] | None = None,
               model_info: dict[str, Any] | None = None, step_prefix: str = "serve") -> list[Result]:
    """One load test per rate against a running server; one Result each (engine "vllm-server").

    `prompts` overrides the workload's completion-form text (e.g. chat-templated token ids
    for an instruct model); `max_tokens` overrides its output lengths (one int for all).
    `metrics=None` skips `/metrics` altogether; otherwise the page is read before and after each
    test (the server's own latency means over exactly that test, `engine_facts["server_latency"]`)
    and, with `timeline=True`, every `metrics_interval_s` during it, the gauges' timeline kept in
    `engine_facts["server_metrics"]`. A scrape during the test is not free: the API server renders
    the page on the event loop that streams the tokens, and the scraper thread parses it under the
    client's GIL (~5-11 ms a page); `timeline=False` measures without it, as `vllm bench serve` does.
    `server` (e.g. `ServerConfig.to_dict()`) joins the config;
    `model_info` (e.g. `ModelSpec.describe()`) joins the Result's model record. Steps are
    named `{step_prefix}-rate-{rate}` (plus `-conc-{N}` with a concurrency cap).
    Live figures: `on_metrics(rate, sample)` gets every scrape as it happens (from the
    scraper's thread), `on_result(result)` each rate's Result as soon as it is stored.
    """
    texts = list(prompts) if prompts is not None else [r.prompt for r in workload.requests]
    if isinstance(max_tokens, int):
        lengths = [max_tokens] * len(texts)
    else:
        lengths = list(max_tokens) if max_tokens is not None else [r.max_new_tokens for r in workload.requests]
    ids = [r.id for r in workload.requests]
    if warmup_requests:
        n = min(warmup_requests, len(texts))
        _, errors = run_sync(load_test(base_url, api_key, model, texts[:n], [min(8, x) for x in lengths[:n]],
                                       float("inf"), seed, request_ids=[f"warmup-{i}" for i in ids[:n]]))
        if errors:
            raise RuntimeError(f"the warm-up request failed, so the server is not ready to measure: {errors[0]}")
    hardware, versions, results = device_facts(), library_versions(), []
    for rate in rates:
        hook = (lambda sample, rate=rate: on_metrics(rate, sample)) if on_metrics is not None else None
        scraper = (MetricsScraper(base_url, metrics, metrics_interval_s, api_key, on_sample=hook)
                   if metrics and timeline else None)
        t0: list[float] = []

        def on_start(t: float) -> None:
            t0.append(t)
            if scraper is not None:
                scraper.t0 = t
                scraper.start()

        stats: dict[str, Any] = {}
        before = _histograms(base_url, api_key) if metrics else None
        try:
            records, errors = run_sync(load_test(base_url, api_key, model, texts, lengths, rate, seed,
                                                 request_ids=ids, max_concurrency=max_concurrency,
                                                 on_start=on_start, stats=stats))
        finally:
            wall = time.perf_counter() - (t0[0] if t0 else time.perf_counter())
            if scraper is not None:
                scraper.stop()
        after = _histograms(base_url, api_key) if before is not None else None
        notes = [f"{len(errors)} of {len(texts)} requests failed"] + errors if errors else []
        result = Result(
            lab=lab, step=f"{step_prefix}-rate-{rate:g}" + (f"-conc-{max_concurrency}" if max_concurrency else ""),
            engine="vllm-server",
            config={"rate": rate, "seed": seed, "ignore_eos": True, "max_concurrency": max_concurrency,
                    "warmup_requests": warmup_requests, "metrics_during_test": scraper is not None, **(server or {})},
            model={"name": model, **(model_info or {})}, workload={"name": workload.name, "version": workload.version,
                                              "requests": len(texts)},
            requests=records, wall_s=wall, engine_facts={
                "base_url": base_url, "server_metrics": scraper.timeline() if scraper else None, "client": stats,
                "server_latency": window_means(before, after) if before is not None and after is not None else None},
            hardware=hardware, versions=versions, notes=notes)
        if store is not None:
            store.append(result)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
