"""What one streamed token costs the load generator's CPU: lablib's client (aiohttp) vs an httpx reader.

A load generator is one Python event loop reading every stream; at tens of thousands of
tokens per second it can become the bottleneck and report its own limits as the server's.
This script serves pre-built SSE token events as fast as a local asyncio server can (in a
second process, so the client has its own core) to STREAMS concurrent streams and reports
the client thread's CPU time per event, and the events/s one core could read at that cost.

    python scripts/client_overhead.py [STREAMS] [TOKENS]

Measured on this project's 2-core CI machine (2026-11-29), 120 tokens per stream: lablib
(aiohttp) 11-14 us/event at 64 or 256 streams; the httpx reader lablib used before 47-52 us at
64 streams and 98-170 us at 256 (its cost grows with the streams open), i.e. one core reads at
most ~6-10k events/s through it, less than vLLM streams to 256 clients of a small model.
"""
from __future__ import annotations

import asyncio
import json
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lablib.loadgen import load_test  # noqa: E402

EVENT = ("data: " + json.dumps({"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m", "choices": [
    {"index": 0, "text": " tok", "logprobs": None, "finish_reason": None, "stop_reason": None}], "usage": None})
         + "\n\n").encode()


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length"))
            n = json.loads(await reader.readexactly(length))["max_tokens"]
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(n):  # one event per stream per turn of the loop, interleaved as an engine's steps are
                writer.write(_chunk(EVENT))
                await writer.drain()
                await asyncio.sleep(0)
            usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
            writer.write(_chunk(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()) + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def _serve(port: mp.Queue) -> None:
    async def main() -> None:
        server = await asyncio.start_server(_handle, "127.0.0.1", 0)
        port.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()
    asyncio.run(main())


async def _httpx_reader(url: str, streams: int, tokens: int) -> int:
    import httpx

    body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": tokens, "stream": True}
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
    q: mp.Queue = mp.Queue()
    server = mp.Process(target=_serve, args=(q,), daemon=True)
    server.start()
    base = f"http://127.0.0.1:{q.get()}"
    try:
        for _ in range(2):  # the second round is the one to read: connections and code warm
            stats: dict = {}
            asyncio.run(load_test(base, None, "m", [[1, 2, 3]] * streams, [tokens] * streams, math.inf, 0, stats=stats))
            print(f"lablib.loadgen ({stats['library']}): {stats['events']} events, "
                  f"{stats['cpu_s'] / stats['events'] * 1e6:.1f} us CPU/event, "
                  f"one core reads at most {stats['events'] / stats['cpu_s']:,.0f} events/s")
            try:
                c0 = time.thread_time()
                n = asyncio.run(_httpx_reader(base + "/v1/completions", streams, tokens))
                cpu = time.thread_time() - c0
                print(f"httpx reader: {n} events, {cpu / n * 1e6:.1f} us CPU/event, one core reads at most {n / cpu:,.0f} events/s")
            except ImportError:
                print("httpx reader: httpx is not installed (pip install httpx to compare)")
    finally:
        server.kill()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
