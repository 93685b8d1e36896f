"""A fake `python -m vllm.entrypoints.openai.api_server` (test support only).

Speaks the slice of the OpenAI API that lablib's serving code uses: `GET /health`,
`GET /metrics` (running / waiting / KV-cache gauges), and streaming `POST /v1/completions`
that checks the bearer key, streams one SSE chunk per token, then a usage chunk and
`[DONE]`. It has room for `--max-num-seqs` sequences (default 8); later requests wait for a
slot, so TTFT grows with the offered load as on a real server. Each token takes
FAKE_VLLM_TOKEN_DELAY seconds (default 0.001).
"""
import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key")
    ap.add_argument("--served-model-name")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    args, _ = ap.parse_known_args()
    delay = float(os.environ.get("FAKE_VLLM_TOKEN_DELAY", "0.001"))
    slots = threading.Semaphore(args.max_num_seqs)
    state = {"running": 0, "waiting": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code, body, ctype="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, "")
            if self.path == "/metrics":
                with lock:
                    r, w = state["running"], state["waiting"]
                page = (f'vllm:num_requests_running{{engine="0"}} {r}.0\nvllm:num_requests_waiting{{engine="0"}} {w}.0\n'
                        f'vllm:kv_cache_usage_perc{{engine="0"}} {r / args.max_num_seqs}\n')
                return self._send(200, page, "text/plain; version=0.0.4")
            self._send(404, "{}")

        def _chunk(self, payload: str) -> None:
            data = payload.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if args.api_key and self.headers.get("Authorization") != f"Bearer {args.api_key}":
                return self._send(401, json.dumps({"error": "Unauthorized"}))
            with lock:
                state["waiting"] += 1
            slots.acquire()
            with lock:
                state["waiting"] -= 1
                state["running"] += 1
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                n, prompt = body["max_tokens"], body["prompt"]
                for i in range(n):
                    time.sleep(delay)
                    chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}], "usage": None}
                    self._chunk(f"data: {json.dumps(chunk)}\n\n")
                usage = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else len(prompt.split()),
                         "completion_tokens": n}
                self._chunk(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
            finally:
                with lock:
                    state["running"] -= 1
                slots.release()

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024  # a burst of hundreds of connections, as uvicorn's backlog takes them

    server = Server((args.host, args.port), Handler)
    print(f"fake api_server for {args.model} on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
