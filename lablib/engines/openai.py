"""The OpenAI completions client: one streamed request to any OpenAI-compatible server, one RequestRecord.

Each request is one streaming `POST /v1/completions` (`stream: true`, `ignore_eos`, greedy,
a fixed `max_tokens`, with a final usage chunk); the client stamps every server-sent-event
chunk on arrival, as vLLM's own `benchmark_serving` does. The same function serves the
load generator (`lablib.bench.loadgen`, requests on a Poisson clock) and `ServerEngine`
(`lablib.engines.server`: every request at once, the engine call every engine answers), so
a server in front of one GPU or a cluster is measured by the same code.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from .. import validate
from ..results.record import RequestRecord

Prompt = str | list[int]
T = TypeVar("T")


def _completion_body(model: str, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0.0, "stream_options": {"include_usage": True}}


def _events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Split a byte buffer into complete server-sent events (blank-line separated) and the unfinished rest."""
    buf = buf.replace(b"\r\n", b"\n")
    *events, rest = buf.split(b"\n\n")
    return events, rest


async def stream_completion(session: Any, url: str, headers: dict[str, str], model: str, rid: str, prompt: Prompt,
                       max_tokens: int, arrival: float, t0: float, sem: asyncio.Semaphore | None,
                       count: list[int]) -> RequestRecord:
    await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
    if sem is not None:
        await sem.acquire()
    try:
        times: list[float] = []
        usage: dict[str, Any] = {}
        sent = time.perf_counter() - t0  # when this client began sending: later than `arrival` if it lagged
        async with session.post(url, json=_completion_body(model, prompt, max_tokens), headers=headers) as resp:
            if resp.status != 200:
                body = (await resp.read()).decode("utf-8", "replace")[:300]
                raise RuntimeError(f"HTTP {resp.status}: {body}")
            buf, done = b"", False
            async for data in resp.content.iter_any():  # whatever bytes arrived, as vLLM's own client reads
                now = time.perf_counter() - t0
                events, buf = _events(buf + data)
                for event in events:
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                            break
                        chunk = json.loads(payload)
                        count[0] += 1
                        if "error" in chunk and not chunk.get("choices"):
                            raise RuntimeError(f"server error in stream: {chunk['error']}")
                        if chunk.get("choices"):
                            times.append(now)
                        if chunk.get("usage"):
                            usage = chunk["usage"]
                if done:
                    break
        finished = time.perf_counter() - t0
    finally:
        if sem is not None:
            sem.release()
    if not times:
        raise RuntimeError("the stream ended without a token")
    prompt_tokens = usage.get("prompt_tokens") or (len(prompt) if isinstance(prompt, list) else 0)
    return RequestRecord(request_id=rid, prompt_tokens=int(prompt_tokens),
                         output_tokens=int(usage.get("completion_tokens") or len(times)), arrival=arrival,
                         start=sent, first_token=times[0], last_token=times[-1], finished=finished, token_times=times)


async def send_all(base_url: str, api_key: str | None, model: str, prompts: Sequence[Prompt],
                   max_tokens: Sequence[int], schedule: Sequence[float], *, request_ids: Sequence[str] | None = None,
                    max_concurrency: int | None = None, timeout_s: float = 600.0,
                    on_start: Callable[[float], None] | None = None, stats: dict[str, Any] | None = None
                    ) -> tuple[list[RequestRecord], list[str]]:
    """Send prompt i at `schedule[i]` seconds, streaming each; return (records, errors).

    Records are the requests that finished, in request order, with times in seconds since
    the test started: after the HTTP client exists (creating one takes ~0.2 s, which must not
    count as TTFT), when `on_start(t0)` is called with that `time.perf_counter()` origin
    (run_online starts the metrics scraper there, on the same clock). `max_concurrency`
    caps requests in flight on the client (the arrival still counts from the schedule, so
    a capped client's waiting shows up as TTFT). Each error line names the request.

    The client is aiohttp, as in `vllm bench serve`: one event loop on one thread reads every
    stream, at 11-14 us of CPU per event on a CI core (httpx, the first client here, took
    50-170 us, more with more streams open: scripts/client_overhead.py). A `stats` dict gets
    the client's own load: `events` read, `cpu_s` the loop thread's CPU time, `busy` =
    cpu_s / wall. Near 1 the client, not the server, sets the pace: events wait in socket
    buffers and are stamped late, so TPOT rises and throughput falls.
    """
    import aiohttp  # deferred: aiohttp

    if len(prompts) != len(max_tokens):
        raise ValueError(f"send_all: {len(prompts)} prompts but {len(max_tokens)} max_tokens: give one each.")
    validate.integers("send_all", "max_tokens", max_tokens, "one output length of at least 1 token per prompt.")
    validate.optional_integer("send_all", "max_concurrency", max_concurrency, "None for no cap, or e.g. 16.")
    ids = list(request_ids) if request_ids is not None else [f"req-{i:04d}" for i in range(len(prompts))]
    if len(schedule) != len(prompts):
        raise ValueError(f"send_all: {len(prompts)} prompts but {len(schedule)} send times: give one each.")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/v1/completions"
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    count = [0]
    # No connection cap and no proxies: a client-side queue would be measured as server TTFT.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=timeout_s), trust_env=False) as session:
        start, cpu0 = time.perf_counter(), time.thread_time()
        if on_start is not None:
            on_start(start)
        tasks = [stream_completion(session, url, headers, model, rid, p, n, a, start, sem, count)
                 for rid, p, n, a in zip(ids, prompts, max_tokens, schedule)]
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - start
    if stats is not None:
        stats.update(library=f"aiohttp {aiohttp.__version__}", events=count[0], cpu_s=cpu, wall_s=wall,
                     busy=cpu / wall if wall > 0 else None)
    records, errors = [], []
    for rid, a, out in zip(ids, schedule, outcomes):
        if isinstance(out, RequestRecord):
            records.append(out)
        elif isinstance(out, Exception):
            errors.append(f"{rid} (arrival {a:.3f}s): {type(out).__name__}: {out}")
        else:
            raise out  # KeyboardInterrupt, CancelledError: not a request failure
    return records, errors


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, also from inside Jupyter (whose loop is already running: then in a fresh thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
