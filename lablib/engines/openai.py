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
import json
import time
from typing import Any

from ..results.record import RequestRecord

Prompt = str | list[int]


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
