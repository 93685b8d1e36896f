"""vLLM's OpenAI-compatible server, started and ended from a notebook.

Offline `LLM.generate` (lablib.engines.vllm) is the throughput limit; a deployment is a
server that users reach over HTTP, one request at a time, whenever they like. Lab 03 runs
the real thing: `python -m vllm.entrypoints.openai.api_server` as a child process bound to
127.0.0.1 (never a public interface) behind a random API key, and drives it with the
Poisson load generator in `lablib.bench.loadgen`.

`VLLMServer` is a context manager because a forgotten server holds the whole GPU: it starts
the process in its own process group (vLLM spawns engine-core and worker processes), sends
its output to a log file, waits until `GET /health` answers, and on exit ends the whole group
(SIGTERM, then SIGKILL after a grace period). A server that dies during start-up (bad
option, out of memory, a model that does not load) or never gets healthy raises a
RuntimeError carrying the tail of its log, which names the cause.

Request logging is not switched off by a flag: it is off by default since vLLM 0.10, and
`--disable-log-requests` was removed in 0.12, where passing it stops the server at start-up.
"""
from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..config import ServerConfig
from ..models import embedded_path, ModelSpec, prompt_tokenizer, resolve_model
from .process import die_with_parent, end_group

HOST = "127.0.0.1"  # loopback only: the lab's server is never reachable from the network


def server_command(config: ServerConfig, port: int | None = None, python: str = sys.executable) -> list[str]:
    """The api_server command line for a config (pure: no process, no port check)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", config.model, "--host", HOST,
           "--port", str(config.port if port is None else port),
           f"--api-key={config.api_key}",  # one argument: a generated key may start with "-" (argparse then refused it)
           "--served-model-name", config.name]
    if config.tokenizer:
        cmd += ["--tokenizer", config.tokenizer]
    for flag, value in (("--max-num-seqs", config.max_num_seqs), ("--max-model-len", config.max_model_len),
                        ("--gpu-memory-utilization", config.gpu_memory_utilization), ("--dtype", config.dtype)):
        if value is not None:
            cmd += [flag, str(value)]
    if config.enable_prefix_caching is not None:
        cmd.append("--enable-prefix-caching" if config.enable_prefix_caching else "--no-enable-prefix-caching")
    return cmd + list(config.extra_args)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) == 0


def log_tail(path: str | Path, lines: int = 40) -> str:
    """The last lines of a log file ('' when there is none)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class VLLMServer:
    """The api_server as a child process group: `with VLLMServer(cfg) as srv: run_online(srv.base_url, ...)`.

    `command` replaces the command line (tests start a fake server with it); `log_path`
    defaults to a temporary file, kept after exit so a failure can be read in full.
    """

    def __init__(self, config: ServerConfig, *, log_path: str | Path | None = None, startup_timeout_s: float = 900.0,
                 stop_timeout_s: float = 30.0, command: list[str] | None = None, env: dict[str, str] | None = None):
        self.config = config
        self.port = config.port or free_port()
        self.command = list(command) if command is not None else server_command(config, self.port)
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def api_key(self) -> str:
        return str(self.config.api_key)

    @property
    def model(self) -> str:
        return self.config.name

    def healthy(self) -> bool:
        """True once `GET /health` answers 200."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.base_url + "/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def start(self) -> VLLMServer:
        if port_in_use(self.port):
            raise RuntimeError(f"port {self.port} on {HOST} is already in use (another server, or one left over "
                               "from an earlier run). Fix: ServerConfig(port=0) for a free port, or stop the other one.")
        log = open(self.log_path, "ab")
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env={**os.environ, **(self.env or {})},
                                         preexec_fn=die_with_parent)
        finally:
            log.close()  # the child holds its own descriptor
        atexit.register(self.stop)
        while True:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                raise RuntimeError(f"the server exited with code {code} during start-up. Last lines of "
                                   f"{self.log_path}:\n{log_tail(self.log_path)}")
            if self.healthy():
                self.startup_s = time.perf_counter() - t0
                return self
            if time.perf_counter() - t0 > self.startup_timeout_s:
                self.stop()
                raise RuntimeError(f"the server did not answer GET /health within {self.startup_timeout_s:.0f}s "
                                   f"(stopped). Last lines of {self.log_path}:\n{log_tail(self.log_path)}")
            time.sleep(0.5)

    def stop(self) -> None:
        """End the whole process group: SIGTERM, then SIGKILL after `stop_timeout_s`; wait for it."""
        proc, self.proc = self.proc, None
        atexit.unregister(self.stop)
        if proc is None:
            return
        end_group(proc, self.stop_timeout_s)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerEngine:
    """An OpenAI-compatible server answering the engine call: every request sent at once, each one streamed.

    With a `ServerConfig` the engine owns a `VLLMServer` (started by `start()`, ended by
    `close()`); with `base_url` it measures a server that is already running (one in front of
    a cluster included) and leaves it running. Either way `generate` sends all requests at
    t=0, token ids in (`prompt` as a list), exact lengths out (`ignore_eos`), greedy, and
    returns one RequestRecord per request stamped as the client read each token event, so a
    server is a rung of the journey like any other engine (`lablib.bench.offline.run`).
    """

    def __init__(self, model: str | Any = "embedded", config: ServerConfig | None = None, *,
                 base_url: str | None = None, api_key: str | None = None, served_model_name: str | None = None,
                 log_path: str | Path | None = None, timeout_s: float = 600.0):
        if config is not None and base_url is not None:
            raise ValueError("ServerEngine: config and base_url given; allowed one of them; Fix: config= to start a "
                             "server here, base_url= (and api_key=) to measure one that is already running.")
        self.spec = model if isinstance(model, ModelSpec) else resolve_model(model)
        self.tokenizer = prompt_tokenizer(self.spec)
        if config is None and base_url is None:
            # prefix caching off, as VLLMConfig's default: the journey's rungs compare the same work
            config = ServerConfig(model=str(self.spec.path), port=0, served_model_name=self.spec.name,
                                  enable_prefix_caching=False,
                                  tokenizer=str(embedded_path()) if self.spec.source == "synthetic" else None)
        self.config = config if config is not None else ServerConfig(model=served_model_name or self.spec.name)
        self.name = "vllm-server"
        self.server = VLLMServer(config, log_path=log_path) if config is not None and base_url is None else None
        self.base_url = base_url.rstrip("/") if base_url else None
        self.api_key = api_key if base_url else str(self.config.api_key)
        self.model = served_model_name or self.config.name
        self.timeout_s = timeout_s
        context = self.config.max_model_len or self.spec.architecture()["context"]
        self.facts: dict[str, Any] = {"context": context, "ignore_eos": True, "base_url": self.base_url,
                                      "owns_server": self.server is not None, "started": False}

    def start(self) -> "ServerEngine":
        """Start the owned server (until `GET /health` answers); a no-op when attached or already started."""
        if self.server is not None and self.server.proc is None and not self.facts["started"]:
            self.server.start()
            self.base_url = self.server.base_url
            self.facts.update(base_url=self.base_url, startup_s=self.server.startup_s)
        self.facts["started"] = True
        return self

    def worker_pids(self) -> list[int]:
        proc = self.server.proc if self.server is not None else None
        return [proc.pid] if proc is not None and proc.poll() is None else []

    def generate(self, requests: list[Any], on_record: Any = None, progress: bool = True) -> list[Any]:
        """Every request at once; a failed request raises (an offline-style run has no partial Result)."""
        from .openai import run_sync, send_all  # deferred: asyncio (through lablib.engines.openai)

        self.start()
        records, errors = run_sync(send_all(self.base_url, self.api_key, self.model,
                                            [list(r.prompt_ids) for r in requests],
                                            [r.max_new_tokens for r in requests], [0.0] * len(requests),
                                            request_ids=[r.request_id for r in requests], timeout_s=self.timeout_s))
        if errors:
            raise RuntimeError(f"{len(errors)} of {len(requests)} requests to {self.base_url} failed; the first: "
                               f"{errors[0]}")
        for rec in records:
            if on_record is not None:
                on_record(rec)
        return records

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
