"""What one streamed token costs the load generator's CPU: lablib's client (aiohttp) vs an httpx reader.

A load generator is one Python event loop reading every stream; at tens of thousands of
tokens per second it can become the bottleneck and report its own limits as the server's.
`lablib.bench.sse_stub` serves token events as fast as it can write them (in its own process, so
the client has a core to itself); this script reads STREAMS x TOKENS of them with the lab's
client (`lablib.bench.client.client_ceiling`) and with the httpx reader the lab used before, and
prints the client thread's CPU per event and the events/s one core could read at that cost.

    python scripts/client_overhead.py [STREAMS] [TOKENS]

Measured on this project's 2-core CI machine (2026-11-29), 120 tokens per stream: lablib
(aiohttp) 11-16 us/event at 64 or 256 streams; the httpx reader 47-52 us at 64 streams and
98-170 us at 256 (its cost grows with the streams open), i.e. one core reads at most ~6-10k
events/s through it, less than vLLM streams to 256 clients of a small model. On the H200 machine's host CPU
(2026-11-29, 256 streams): lablib 8.1 us/event (123k events/s a core), the httpx reader 51.7 us (19k events/s).
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lablib.bench import sse_stub  # noqa: E402
from lablib.bench.client import client_ceiling  # noqa: E402


async def _httpx_reader(url: str, streams: int, tokens: int) -> int:
    import httpx

    body = {"model": "stub", "prompt": [1, 2, 3], "max_tokens": tokens, "stream": True}
    count = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal count
        async with client.stream("POST", url, json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    json.loads(line[5:])
                    count += 1

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
        await asyncio.gather(*(one(client) for _ in range(streams)))
    return count


def main(streams: int = 256, tokens: int = 120) -> None:
    lab = client_ceiling(streams, tokens)
    print(f"lablib.bench.loadgen ({lab['library']}): {lab['events']} events, {lab['cpu_us_per_event']:.1f} us CPU/event, "
          f"one core reads at most {lab['ceiling_events_s']:,.0f} events/s")
    if importlib.util.find_spec("httpx") is None:
        print("httpx reader: httpx is not installed (pip install httpx to compare)")
        return
    with sse_stub.running() as base:
        for _ in range(2):  # the second round is the one to read: connections and code warm
            c0 = time.thread_time()
            n = asyncio.run(_httpx_reader(base + "/v1/completions", streams, tokens))
            cpu = time.thread_time() - c0
        print(f"httpx reader: {n} events, {cpu / n * 1e6:.1f} us CPU/event, one core reads at most {n / cpu:,.0f} events/s")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
