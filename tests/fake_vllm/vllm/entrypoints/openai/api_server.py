"""A fake `python -m vllm.entrypoints.openai.api_server` (test support only).

Speaks the slice of the OpenAI API that lablib's serving code uses: `GET /health`,
`GET /metrics` (running / waiting / KV-cache gauges; TTFT, inter-token and end-to-end histograms' `_sum`
and `_count`, timed where the server writes each token, as vLLM's engine core stamps them, and the HTTP
request duration, from the request's start to its last chunk, as prometheus-fastapi-instrumentator times it in
vLLM's API server), and streaming `POST /v1/completions`
that checks the bearer key and the body lablib sends (stream, ignore_eos, a usage chunk
asked for), streams one SSE chunk per token, then a usage chunk and `[DONE]`. It caches prefixes as vLLM
0.26 does (on unless `--no-enable-prefix-caching`; `--block-size`, default 16): a request admitted to a slot
looks its prompt up (token ids, or a text prompt's words) in the engine's `PrefixCache` and registers its
full blocks, and `/metrics` shows vLLM's counters `vllm:prefix_cache_queries_total` and
`vllm:prefix_cache_hits_total` (tokens). With `VLLM_SERVER_DEV_MODE=1`, as in vLLM, `POST /reset_prefix_cache`
empties the cache (`{"success": false}` while a request runs). It has room
for `--max-num-seqs` sequences (default 8); later requests wait for a slot, so TTFT grows
with the offered load as on a real server. Each token takes FAKE_VLLM_TOKEN_DELAY seconds
(default 0.001). FAKE_VLLM_FRONTEND_DELAY seconds (default 0) pass before a request reaches the "engine"
(as tokenizing does in vLLM's API server): in the HTTP duration, not in the engine's histograms.

`make_server(...)` builds the same server for a test to run in a thread (stdlib only, so
it loads without the fake `vllm` package); its `received` list holds the
`time.perf_counter()` of every authorised completion request.
"""
import argparse
import json
import os
import socket
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class PrefixCache:
    """vLLM's automatic prefix caching in miniature: the fake server's, and the fake LLM's engine's (vllm/llm.py
    imports it from here: this file must load on its own, stdlib only, so the one copy lives where both reach it).

    Full blocks only, and never a prompt's last token (vLLM's `max_cache_hit_length = num_tokens - 1`, floored to
    whole blocks). A prompt's full blocks are registered when it is admitted: vLLM 0.26 caches a block's hash in
    `KVCacheManager.allocate_slots`, when the scheduler gives the block to the step that computes it, so a request
    scheduled in the same step or later finds it. Nothing is evicted. The counters are vLLM's, in tokens:
    `queries` adds each admitted prompt's length, `hits` its cached tokens (both stay 0 while disabled).
    """

    def __init__(self, block_size: int = 16, enabled: bool = True):
        self.block_size, self.enabled = block_size, enabled
        self.queries = self.hits = 0
        self._prefixes: set[tuple] = set()  # every full-block prefix computed

    def admit(self, prompt: Sequence) -> int | None:
        """Look a prompt up and register its full blocks; its cached tokens (None with caching off)."""
        if not self.enabled:
            return None
        block, prompt = self.block_size, tuple(prompt)
        top = (len(prompt) - 1) // block * block
        cached = next((n for n in range(top, 0, -block) if prompt[:n] in self._prefixes), 0)
        self._prefixes.update(prompt[:n] for n in range(block, len(prompt) + 1, block))
        self.queries += len(prompt)
        self.hits += cached
        return cached

    def reset(self) -> None:
        self._prefixes.clear()


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a burst of hundreds of connections, as uvicorn's backlog takes them

    def __init__(self, host: str, port: int, api_key: str | None, max_num_seqs: int, delay: float,
                 frontend_delay: float = 0.0, prefix_caching: bool = True, block_size: int = 16,
                 dev_mode: bool = False):
        super().__init__((host, port), _Handler)
        self.api_key, self.max_num_seqs, self.delay, self.frontend_delay = api_key, max_num_seqs, delay, frontend_delay
        self.cache = PrefixCache(block_size, prefix_caching)
        self.dev_mode = dev_mode  # VLLM_SERVER_DEV_MODE: the development endpoints (here /reset_prefix_cache)
        self.slots = threading.Semaphore(max_num_seqs)
        self.lock = threading.Lock()
        self.running = self.waiting = 0
        self.ttft_sum = self.itl_sum = self.e2e_sum = self.http_sum = 0.0
        self.ttft_count = self.itl_count = self.e2e_count = self.http_count = 0
        self.received: list[float] = []
        self.scrapes = 0  # GET /metrics served

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def setup(self):
        super().setup()
        # every token leaves at once, as from vLLM's server (asyncio sets TCP_NODELAY): without it Nagle's
        # algorithm holds small writes for the client's delayed ACK, and tokens reach the client in clumps
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        srv = self.server
        if self.path == "/health":
            return self._send(200, "")
        if self.path == "/metrics":
            with srv.lock:
                srv.scrapes += 1
                r, w = srv.running, srv.waiting
                hist = (f"vllm:time_to_first_token_seconds_sum {srv.ttft_sum}\n"
                        f"vllm:time_to_first_token_seconds_count {srv.ttft_count}.0\n"
                        f"vllm:inter_token_latency_seconds_sum {srv.itl_sum}\n"
                        f"vllm:inter_token_latency_seconds_count {srv.itl_count}.0\n"
                        f"vllm:e2e_request_latency_seconds_sum {srv.e2e_sum}\n"
                        f"vllm:e2e_request_latency_seconds_count {srv.e2e_count}.0\n"
                        f'http_request_duration_seconds_sum{{handler="/v1/completions",method="POST"}} {srv.http_sum}\n'
                        f'http_request_duration_seconds_count{{handler="/v1/completions",method="POST"}} '
                        f"{srv.http_count}.0\n")
                for name, value in (("queries", srv.cache.queries), ("hits", srv.cache.hits)):
                    hist += (f"# TYPE vllm:prefix_cache_{name}_total counter\n"
                             f'vllm:prefix_cache_{name}_total{{engine="0"}} {value}.0\n')
            page = hist + (f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine="0"}} {r}.0\n'
                    f'vllm:num_requests_waiting{{engine="0"}} {w}.0\n'
                    f'vllm:kv_cache_usage_perc{{engine="0"}} {r / srv.max_num_seqs}\n')
            return self._send(200, page, "text/plain; version=0.0.4")
        self._send(404, "{}")

    def _chunk(self, payload: str) -> None:
        data = payload.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _reset_prefix_cache(self):
        srv = self.server
        with srv.lock:  # vLLM refuses while blocks are held by running requests
            ok = srv.running == 0
            if ok:
                srv.cache.reset()
        return self._send(200, json.dumps({"success": ok}))

    def do_POST(self):
        srv = self.server
        began = time.perf_counter()
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.split("?")[0] == "/reset_prefix_cache" and srv.dev_mode:
            return self._reset_prefix_cache()
        if self.path != "/v1/completions":
            return self._send(404, json.dumps({"detail": "Not Found"}))
        body = json.loads(raw)
        if srv.api_key and self.headers.get("Authorization") != f"Bearer {srv.api_key}":
            return self._send(401, json.dumps({"error": "Unauthorized"}))
        if not (body.get("stream") and body.get("ignore_eos") and body.get("stream_options") == {"include_usage": True}):
            return self._send(400, json.dumps({"error": f"expected a streaming, ignore_eos request with usage: {body}"}))
        time.sleep(srv.frontend_delay)
        arrived = time.perf_counter()
        with srv.lock:
            srv.received.append(arrived)
            srv.waiting += 1
        srv.slots.acquire()
        prompt = body["prompt"]
        with srv.lock:  # admitted: the scheduler looks the prompt up and registers its blocks
            srv.waiting -= 1
            srv.running += 1
            srv.cache.admit(prompt if isinstance(prompt, list) else prompt.split())
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            n = body["max_tokens"]
            last = None
            for i in range(n):
                time.sleep(srv.delay)
                now = time.perf_counter()
                with srv.lock:
                    if last is None:
                        srv.ttft_sum, srv.ttft_count = srv.ttft_sum + now - arrived, srv.ttft_count + 1
                    else:
                        srv.itl_sum, srv.itl_count = srv.itl_sum + now - last, srv.itl_count + 1
                last = now
                chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}], "usage": None}
                self._chunk(f"data: {json.dumps(chunk)}\n\n")
            usage = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else len(prompt.split()),
                     "completion_tokens": n}
            self._chunk(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            end = time.perf_counter()
            with srv.lock:  # from arrival to the end of the stream, as vLLM's e2e_request_latency_seconds
                srv.e2e_sum, srv.e2e_count = srv.e2e_sum + end - arrived, srv.e2e_count + 1
                srv.http_sum, srv.http_count = srv.http_sum + end - began, srv.http_count + 1
        finally:
            with srv.lock:
                srv.running -= 1
            srv.slots.release()


def make_server(host: str = "127.0.0.1", port: int = 0, api_key: str | None = None, max_num_seqs: int = 8,
                delay: float | None = None, frontend_delay: float | None = None, prefix_caching: bool = True,
                block_size: int = 16, dev_mode: bool | None = None) -> FakeServer:
    """The fake server, bound and not yet serving (call `serve_forever`, e.g. in a thread); `dev_mode` None reads
    VLLM_SERVER_DEV_MODE, as vLLM does."""
    if delay is None:
        delay = float(os.environ.get("FAKE_VLLM_TOKEN_DELAY", "0.001"))
    if frontend_delay is None:
        frontend_delay = float(os.environ.get("FAKE_VLLM_FRONTEND_DELAY", "0"))
    if dev_mode is None:
        dev_mode = bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))
    return FakeServer(host, port, api_key, max_num_seqs, delay, frontend_delay, prefix_caching, block_size, dev_mode)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key")
    ap.add_argument("--served-model-name")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)  # vLLM's default
    args, _ = ap.parse_known_args()
    server = make_server(args.host, args.port, args.api_key, args.max_num_seqs,
                         prefix_caching=args.enable_prefix_caching, block_size=args.block_size)
    print(f"fake api_server for {args.model} on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
