"""vLLM's OpenAI-compatible server, started and ended from a notebook.

Offline `LLM.generate` (lablib.engines.vllm) is the throughput limit; a deployment is a
server that users reach over HTTP, one request at a time, whenever they like. Lab 03 runs
the real thing: `python -m vllm.entrypoints.openai.api_server` as a child process bound to
127.0.0.1 (never a public interface) behind a random API key, and drives it with the
Poisson load generator in `lablib.loadgen`.

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
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import _positive_int

HOST = "127.0.0.1"  # loopback only: the lab's server is never reachable from the network


@dataclass(frozen=True)
class ServerConfig:
    """How to start the server. None leaves vLLM's own default."""

    model: str  # local model folder (or hub id) passed as --model
    port: int = 8000  # TCP port on 127.0.0.1; 0 picks a free one when the server starts
    api_key: str | None = field(default=None, repr=False)  # bearer token clients must send; None: a random one
    tokenizer: str | None = None  # --tokenizer, when it is not in the model folder
    served_model_name: str | None = None  # the name clients put in "model"; None: the --model string
    max_num_seqs: int | None = None  # most sequences in one running batch
    gpu_memory_utilization: float | None = None  # fraction (0, 1] of GPU memory vLLM may take (weights + KV)
    max_model_len: int | None = None  # context length; shorter frees KV cache for more sequences
    enable_prefix_caching: bool | None = None  # True/False force it on/off
    dtype: str | None = None  # "auto", "float16", "bfloat16", ...
    extra_args: tuple[str, ...] = ()  # any other api_server flags, verbatim

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"ServerConfig.model={self.model!r}: give a model folder or hub id.")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"ServerConfig.port={self.port!r}: allowed integers 0-65535 (0: a free port).")
        if self.api_key is None:
            object.__setattr__(self, "api_key", secrets.token_urlsafe(24))
        elif not isinstance(self.api_key, str) or not self.api_key or any(c.isspace() for c in self.api_key):
            raise ValueError("ServerConfig.api_key: allowed a non-empty string without spaces, or None for a random key.")
        for name in ("max_num_seqs", "max_model_len"):
            if getattr(self, name) is not None:
                _positive_int("ServerConfig", name, getattr(self, name), "or None for vLLM's default.")
        g = self.gpu_memory_utilization
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 < g <= 1):
            raise ValueError(f"ServerConfig.gpu_memory_utilization={g!r}: allowed a fraction in (0, 1], e.g. 0.9.")
        if self.enable_prefix_caching not in (None, True, False):
            raise ValueError(f"ServerConfig.enable_prefix_caching={self.enable_prefix_caching!r}: allowed None, "
                             "True or False.")
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if not all(isinstance(a, str) for a in self.extra_args):
            raise ValueError(f"ServerConfig.extra_args={self.extra_args!r}: allowed a sequence of strings.")

    @property
    def name(self) -> str:
        """The model name clients send."""
        return self.served_model_name or self.model

    def to_dict(self) -> dict[str, Any]:
        """The knobs a Result records (the API key left out)."""
        d = asdict(self)
        d.pop("api_key")
        d["extra_args"] = list(self.extra_args)
        return d


def server_command(config: ServerConfig, port: int | None = None, python: str = sys.executable) -> list[str]:
    """The api_server command line for a config (pure: no process, no port check)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", config.model, "--host", HOST,
           "--port", str(config.port if port is None else port), "--api-key", str(config.api_key),
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


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the process that started it dies.

    The server runs in its own session (so stop() can end its whole group), which also
    shields it from the kernel's death: a notebook kernel killed with SIGKILL (a time limit,
    an out-of-memory kill) runs no atexit handler, and the server would hold its share of the
    GPU until someone finds it. The parent-death signal closes that hole; vLLM ends its engine
    core when the api_server exits. It fires when the *thread* that started the server ends,
    so start servers from a thread that lives as long as they do (a notebook's main thread).
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: stop() and atexit remain the only guards
        pass


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
                                         preexec_fn=_die_with_parent)
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
        for sig, wait in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)  # start_new_session: the group id is the child's pid
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=wait)
                if sig == signal.SIGTERM:
                    try:  # the leader is gone; end any engine-core or worker that outlived it
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
