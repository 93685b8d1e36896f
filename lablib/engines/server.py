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
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import ServerConfig, VLLMConfig
from ..hardware.device import nvml_process_bytes
from ..models import embedded_path, ModelSpec, prompt_tokenizer, resolve_model
from .process import children, die_with_parent, end_group
from . import vllm as engines_vllm
from .vllm import STARTED, others_than, released

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


SERVER_MAX_NUM_SEQS = 1024  # vLLM 0.26's api_server default for max_num_seqs on a GPU of 70 GiB or more (arg_utils.py)


def server_flag(args: list[str] | tuple[str, ...], name: str) -> str | None:
    """The value of api_server flag `name` in `args` ("--name value" or "--name=value"; the last one given, as
    argparse takes it), or None."""
    value = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def without_flag(args: list[str] | tuple[str, ...], name: str) -> list[str]:
    """`args` without flag `name` and its value, in either form."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


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
        """Start the server and wait until `GET /health` answers."""
        return self.launch().wait_ready()

    def launch(self) -> VLLMServer:
        """Start the server's process (a second); `wait_ready` waits for it to answer. Apart so that it can start
        beside vLLM's offline engines (`lablib.engines.together`)."""
        if self.proc is not None:
            return self
        if port_in_use(self.port):
            raise RuntimeError(f"port {self.port} on {HOST} is already in use (another server, or one left over "
                               "from an earlier run). Fix: ServerConfig(port=0) for a free port, or stop the other one.")
        log = open(self.log_path, "ab")
        self._t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env={**os.environ, **(self.env or {})},
                                         preexec_fn=die_with_parent)
        finally:
            log.close()  # the child holds its own descriptor
        atexit.register(self.stop)
        return self

    def wait_ready(self) -> VLLMServer:
        """Wait until the launched server answers `GET /health` (stopped, with its log's tail, if it dies first or
        takes longer than `startup_timeout_s`)."""
        if self.startup_s is not None:
            return self
        if self.proc is None:
            self.launch()
        t0 = self._t0
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

    def stop(self, grace_s: float | None = None) -> None:
        """End the whole process group: SIGTERM, then SIGKILL after `grace_s` (None: `stop_timeout_s`); wait for it."""
        proc, self.proc = self.proc, None
        atexit.unregister(self.stop)
        if proc is None:
            return
        end_group(proc, self.stop_timeout_s if grace_s is None else grace_s)

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
        self.baseline: Any = None  # the GPU's memory (nvml_used) before the owned server started
        self._descendants: list = []  # vLLM's engine core and workers under the server, as seen when it was ready

    def start(self) -> "ServerEngine":
        """Start the owned server (until `GET /health` answers); a no-op when attached or already started."""
        return self.launch().wait_ready()

    def launch(self) -> "ServerEngine":
        """Start the owned server's process without waiting for it (`wait_ready` does): so that it can start beside
        vLLM's offline engines (`lablib.engines.together`). A no-op when attached or already launched."""
        if self.server is not None and self.server.proc is None and not self.facts["started"]:
            self.baseline = engines_vllm.nvml_used()  # (the module's name: tests replace it with a fake GPU's)
            self.server.launch()
            STARTED.add(self)
        return self

    def wait_ready(self) -> "ServerEngine":
        """Wait until the launched server answers; its start-up time and processes into `facts`."""
        if self.server is not None and not self.facts["started"]:
            self.launch()
            try:
                self.server.wait_ready()
            except BaseException:
                STARTED.discard(self)
                raise
            self._descendants = children(self.server.proc.pid)
            self.base_url = self.server.base_url
            self.facts.update(base_url=self.base_url, startup_s=self.server.startup_s,
                              startup_wall_s=self.server.startup_s,  # (one figure: its launch to /health)
                              vram_baseline_bytes=self.baseline[0] if self.baseline else None)
        self.facts["started"] = True
        return self

    def vllm_config(self) -> VLLMConfig:
        """The owned server's settings as `lablib.engines.together` sizes them: an offline engine's, with what the
        server leaves to vLLM at the server's defaults (max_num_seqs SERVER_MAX_NUM_SEQS)."""
        self._owned("vllm_config")
        c, args = self.config, self.config.extra_args
        kv = server_flag(args, "--kv-cache-memory-bytes")
        return VLLMConfig(max_num_seqs=c.max_num_seqs or SERVER_MAX_NUM_SEQS, max_model_len=c.max_model_len,
                          enable_prefix_caching=bool(c.enable_prefix_caching),
                          gpu_memory_utilization=c.gpu_memory_utilization or VLLMConfig().gpu_memory_utilization,
                          quantization=server_flag(args, "--quantization"),
                          kv_cache_dtype=server_flag(args, "--kv-cache-dtype") or "auto",
                          kv_cache_memory_bytes=int(kv) if kv else None)

    def resized(self, config: VLLMConfig) -> "ServerEngine":
        """A new owned server of this model with `config`'s max_num_seqs, length, memory gate and exact KV cache
        (`together` starts it beside offline engines), not started."""
        self._owned("resized")
        extra = without_flag(self.config.extra_args, "--kv-cache-memory-bytes")
        if config.kv_cache_memory_bytes:
            extra += ["--kv-cache-memory-bytes", str(config.kv_cache_memory_bytes)]
        sized = replace(self.config, port=0, max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len,
                        gpu_memory_utilization=config.gpu_memory_utilization, extra_args=tuple(extra))
        return ServerEngine(self.spec, sized, timeout_s=self.timeout_s)

    def _owned(self, call: str) -> None:
        if self.server is None:
            raise ValueError(f"ServerEngine.{call}: this engine is attached to a server already running "
                             f"({self.base_url}); allowed only for one it starts (ServerConfig). Fix: start it here, "
                             "or measure the running one alone, outside lablib.engines.together.")

    def alive(self) -> bool:
        return self.server is not None and self.server.proc is not None and self.server.proc.poll() is None

    def others(self) -> list[Any]:
        """The other engines of this process still up (engines started with it, idle while it runs)."""
        return others_than(self)

    def worker_pids(self) -> list[int]:
        return [self.server.proc.pid] if self.alive() else []

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

    def close(self, force: bool = False, beside: bool | None = None) -> None:
        """End the owned server's whole process group (SIGTERM, then SIGKILL after its grace; `force`: SIGKILL at
        once); then, as an offline engine does (`vllm.released`), whether its GPU memory came back: the whole GPU to
        its baseline, or where other engines are up (`beside`; None: whether any is alive now) its own processes.
        An attached server is left running."""
        if self.server is None or self.server.proc is None or self.facts.get("closed"):
            if self.server is not None:
                self.server.stop()
            return
        t0 = time.perf_counter()
        others = bool(self.others()) if beside is None else beside
        pid = self.server.proc.pid
        pids = {pid, *(p.pid for p in self._descendants), *(p.pid for p in children(pid))}
        held = nvml_process_bytes(pids) if others else None
        self.server.stop(grace_s=0.0 if force else None)
        STARTED.discard(self)
        self.facts["closed"] = True
        if self.facts.get("started"):  # a start that failed measured no baseline worth a verdict
            released(self.facts, self.baseline, others, pids, held)
        self.facts["close_s"] = time.perf_counter() - t0
