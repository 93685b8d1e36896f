"""A stand-in for a streaming server that costs the client nothing to wait for: the load generator's own ceiling.

A load generator is itself a program with a speed limit: one Python event loop reads every
stream, and each token event costs it some microseconds of CPU. When a server streams more
events per second than the client can read, the client measures itself. This module serves
pre-built OpenAI-style completion events (`POST /v1/completions`, chunked SSE, a usage chunk,
`[DONE]`) as fast as one asyncio loop can write them, one event per stream per turn of the
loop (interleaved, as an engine's steps are), so the client is the only bottleneck left.

    python -m lablib.bench.sse_stub          # prints "port N", then serves on 127.0.0.1:N

`running()` starts it in its own process for the length of a `with` block;
`lablib.bench.loadgen.client_ceiling` measures the lab's client against it.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

EVENT = ("data: " + json.dumps({"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "stub", "choices": [
    {"index": 0, "text": " tok", "logprobs": None, "finish_reason": None, "stop_reason": None}], "usage": None})
         + "\n\n").encode()


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:  # keep-alive: one request after another on the connection
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length"))
            n = json.loads(await reader.readexactly(length))["max_tokens"]
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(n):
                writer.write(_chunk(EVENT))
                await writer.drain()
                await asyncio.sleep(0)  # let the other streams have their event: interleaved, as engine steps are
            usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
            writer.write(_chunk(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()) + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def _serve() -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", 0)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


@contextmanager
def running() -> Iterator[str]:
    """The stub in its own process (so the client keeps a core to itself) for a `with` block; yields its base URL."""
    stub = subprocess.Popen([sys.executable, "-m", "lablib.bench.sse_stub"], stdout=subprocess.PIPE, text=True)
    try:
        line = stub.stdout.readline() if stub.stdout else ""
        if not line.startswith("port "):
            raise RuntimeError(f"lablib.bench.sse_stub did not start (it printed {line!r}); run `python -m lablib.bench.sse_stub` "
                               "to see why.")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        stub.terminate()
        stub.wait(timeout=10)


if __name__ == "__main__":
    try:
        asyncio.run(_serve())
    except KeyboardInterrupt:
        sys.exit(0)
