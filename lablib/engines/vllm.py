"""vLLM, run in a worker process so the notebook never holds the GPU.

Why a worker: a CUDA context cannot be handed back without ending its process, and a
notebook that imported vLLM keeps gigabytes of GPU memory until the kernel restarts. Here
each engine configuration lives in its own spawned process: `close()` ends it and the
GPU returns to its baseline (checked with NVML and recorded in the engine's facts), so
every step of a lab starts from clean VRAM. Kernel → Interrupt ends the worker too. A
crash in the worker (out of memory, a bad option) comes back as a RuntimeError carrying
the worker's own message; records that finished before it are already with the caller.

Before the worker starts, every check that needs no GPU time runs: vLLM installed, a GPU
present, the dtype supported by its compute capability, and the memory budget
(`lablib.hardware.fit`): a configuration that cannot fit is refused with the knob to change.
The worker itself starts in `start()` (or the first `generate`), so `lablib.bench.offline.run`
can refuse a request longer than the context before a minute of start-up is spent.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import multiprocessing as mp
import os
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from ..config import VLLMConfig
from ..hardware.device import nvml_memory, nvml_process_bytes, visible_gpus
from ..hardware.fit import check_fit
from ..hardware.tiers import vllm_refusal
from ..models import ModelSpec, embedded_path, prompt_tokenizer, resolve_model
from ..results.record import RequestRecord
from .base import OnRecord, PreparedRequest
from .hf import progress_bar
from .process import children, environ, kill_tree
from .vllm_worker import spare_main, worker_main

SETTLE_S = 60.0  # how long close() waits for the GPU to return to its baseline
SETTLE_SLACK = 256 * 2**20  # bytes above baseline still counted as "back"


SPARE_ENV = "LABLIB_VLLM_SPARE"  # "1": each engine's start also makes the next engine's worker (`Spare`)
SPARE_WAIT_S = 120.0  # how long a started engine waits for its spare's imports before it says ready

nvml_used = nvml_memory  # this module's name for it: the engine tests replace it with a fake GPU's
STARTED: "weakref.WeakSet[Any]" = weakref.WeakSet()  # engines launched and not yet closed, in this process (vLLM's
# offline engines and the OpenAI servers this process started: lablib.engines.server.ServerEngine)
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # vLLM 0.26 reads its model runner from here (VLLMConfig.model_runner_v2)


def others_than(engine: Any) -> list[Any]:
    """The engines of this process, other than `engine`, still up (`STARTED`, alive)."""
    return [e for e in list(STARTED) if e is not engine and e.alive()]


def released(facts: dict[str, Any], baseline: Any, others: bool, pids: set[int], held: int | None) -> None:
    """An engine's processes have ended: did their GPU memory come back? Into `facts`. Alone on the GPU: the whole
    GPU back to `baseline` (its reading before the start). With other engines up (`others`): none of its own
    processes (`pids`, which held `held` bytes before the close) left on NVML's list; where NVML named none of them
    (a container showing the host's pids) it cannot tell: None, and once the group has closed the whole GPU is
    checked against the baseline they share (`together._whole_gpu_verdict`)."""
    if not others:
        if baseline:
            used = settled(nvml_used, lambda u: not u or u[0] <= baseline[0] + SETTLE_SLACK)
            facts["vram_after_close_bytes"] = used[0] if used else None
            facts["vram_back_to_baseline"] = bool(used and used[0] <= baseline[0] + SETTLE_SLACK)
        return
    if not held:
        facts["vram_back_to_baseline"] = None
        facts["vram_check"] = ("not per process here: the whole GPU is checked once the engines started with it have "
                               "closed")
        return
    left = settled(lambda: nvml_process_bytes(pids), lambda b: not b)
    used = nvml_used()
    facts.update({"vram_after_close_bytes": used[0] if used else None, "vram_held_before_close_bytes": held,
                  "vram_back_to_baseline": not left,
                  "vram_check": "its own processes (other engines started with it were still up)"})


def settled(read: Any, done: Any) -> Any:
    """`read()` again every half second until `done` says so of its value or SETTLE_S has passed; the last value."""
    deadline = time.monotonic() + SETTLE_S
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.5)
        value = read()
    return value


def runner_env(v2: bool | None) -> contextlib.AbstractContextManager[None]:
    """VLLM_USE_V2_MODEL_RUNNER set to 1/0 (None: unset, vLLM decides) while a worker is spawned; restored after."""
    return environ(RUNNER_ENV, None if v2 is None else "1" if v2 else "0")


class Spare:
    """The next engine's worker, made while this one starts (LABLIB_VLLM_SPARE=1; off by default).

    Every engine's worker is a fresh spawned process that imports vLLM before vLLM's own start begins: 20-31 s of
    each engine's start on the H200's host (lab 08's recorded startup_wall_s - startup_s). A lab that starts engines
    one after another pays it every time. With a spare, an engine's `start` spawns the next worker beside its own
    start (the minute when nothing is measured), waits for its imports before it says ready (so they never run
    beside a measurement), and the next `start` hands that worker its engine instead of spawning one. One spare at
    a time, per process; one not taken is ended when Python exits."""

    current: "Spare | None" = None

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.log_path = tempfile.NamedTemporaryFile(prefix="lablib-vllm-spare-", suffix=".log", delete=False).name
        self.proc = ctx.Process(target=spare_main, args=(child, self.log_path), name="lablib-vllm-spare", daemon=False)
        self.proc.start()  # not a daemon: once it is an engine's worker it has vLLM's engine core as a child
        self.import_s: float | None = None
        atexit.register(self.end)

    @classmethod
    def make(cls) -> None:
        """Start one for the next engine, where asked for (SPARE_ENV) and none is alive."""
        if os.environ.get(SPARE_ENV) == "1" and not (cls.current and cls.current.proc.is_alive()):
            cls.current = Spare()

    @classmethod
    def take(cls) -> "Spare | None":
        """The spare, imported and alive, for the engine starting now (None: spawn one as usual)."""
        spare, cls.current = cls.current, None
        if spare is None or not spare.ready(0) or not spare.proc.is_alive():
            if spare is not None:
                spare.end()
            return None
        atexit.unregister(spare.end)  # the engine that takes it owns it now
        return spare

    def ready(self, timeout_s: float) -> bool:
        """Whether it has imported vLLM, waiting up to timeout_s for it."""
        if self.import_s is None and self.proc.is_alive() and self.conn.poll(timeout_s):
            try:
                kind, *rest = self.conn.recv()
            except EOFError:
                return False
            if kind != "spare_ready":
                return False
            self.import_s = rest[0]
        return self.import_s is not None

    def end(self) -> None:
        if self.proc.is_alive():
            kill_tree(self.proc.pid)
            self.proc.join(10)


def preflight(spec: ModelSpec, config: VLLMConfig) -> dict[str, Any]:
    """Every check that needs no GPU time; raises ValueError naming the fix. Returns the fit report."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("vLLM is not installed in this environment. Fix: pip install 'lablib[gpu]' on a machine "
                         "with an NVIDIA GPU; without one, the labs show runs recorded on an H200 (data/reference/).")
    mem = nvml_used()
    if mem is None:
        raise ValueError("no NVIDIA GPU is visible (NVML found none), and vLLM needs one. Fix: run on a GPU machine "
                         "(Colab: Runtime → Change runtime type → GPU); without one, the labs show recorded runs.")
    import pynvml  # deferred: pynvml (NVML, not torch.cuda: the notebook's process creates no CUDA context)

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    gpu_name = pynvml.nvmlDeviceGetName(handle)
    refusal = vllm_refusal((major, minor), gpu_name, dtype=config.dtype, quantization=config.quantization,
                           kv_cache_dtype=config.kv_cache_dtype)
    if refusal:
        raise ValueError(refusal)
    if config.gpus > 1 and config.distributed_executor_backend != "ray":  # a Ray cluster may span more machines
        count = visible_gpus(pynvml.nvmlDeviceGetCount())
        nodes = f" over nnodes={config.nnodes} ({config.gpus_per_node} each)" if (config.nnodes or 1) > 1 else ""
        if config.gpus_per_node > count:
            raise ValueError(f"tensor_parallel_size={config.tensor_parallel_size} x pipeline_parallel_size="
                             f"{config.pipeline_parallel_size} needs {config.gpus} GPUs{nodes}; this machine has {count}. "
                             "Fix: lower them to fit its GPUs; for more GPUs than one machine has, start a Ray cluster "
                             "(`ray start` on each node) and pass distributed_executor_backend='ray', or run vLLM's "
                             "multiprocess executor on each machine (distributed_executor_backend='mp', nnodes, "
                             "node_rank, master_addr).")
    if config.distributed_executor_backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("distributed_executor_backend='ray' needs Ray, which is not installed. Fix: pip install "
                         "'ray[default]' on every node and `ray start` them, or use 'mp' on one machine.")
    if spec.config:
        arch = spec.architecture()
        t, heads, kv = config.tensor_parallel_size, arch.get("heads"), arch.get("kv_heads")
        if t > 1 and heads and heads % t:
            raise ValueError(f"tensor_parallel_size={t} does not divide {spec.name}'s {heads} attention heads "
                             f"(vLLM refuses it). Fix: a divisor of {heads}.")
        if t > 1 and kv and kv % t and t % kv:  # vLLM splits KV heads t ways, or replicates them: one divides the other
            allowed = [d for d in range(1, heads + 1) if heads % d == 0 and (kv % d == 0 or d % kv == 0)]
            raise ValueError(f"tensor_parallel_size={t} neither divides {spec.name}'s {kv} KV heads nor is a multiple "
                             f"of them (vLLM refuses it). Fix: one of {allowed}.")
        if arch.get("layers") and config.pipeline_parallel_size > arch["layers"]:
            raise ValueError(f"pipeline_parallel_size={config.pipeline_parallel_size} is more stages than "
                             f"{spec.name}'s {arch['layers']} layers. Fix: at most {arch['layers']}.")
    _, free, total = mem
    if not spec.config:
        return {"fits": None, "why": "hub preset: shape known only after download"}
    report = check_fit(spec, config, total, free)
    if not report.fits:
        raise ValueError(report.advice)
    return report.to_dict()


class VLLMEngine:
    """vLLM's offline engine (`LLM`) in a worker process, answering the common engine call."""

    def __init__(self, model: str | ModelSpec = "embedded", config: VLLMConfig = VLLMConfig(),
                 start_timeout_s: float = 900.0):
        """Every check that needs no GPU time (see `preflight`); the worker starts in `start()`."""
        if (config.node_rank or 0) > 0:  # vLLM's other nodes run workers only, no engine core to send requests to
            raise ValueError(
                f"VLLMConfig.node_rank={config.node_rank}: allowed 0 in VLLMEngine (node 0 runs the engine; the "
                f"other nodes of nnodes={config.nnodes} run only vLLM's workers); Fix: on that machine start "
                f"`vllm serve MODEL --headless --nnodes {config.nnodes} --node-rank {config.node_rank} --master-addr "
                f"{config.master_addr} --tensor-parallel-size {config.tensor_parallel_size} --pipeline-parallel-size "
                f"{config.pipeline_parallel_size}`, and VLLMEngine with node_rank=0 on node 0.")
        self.config = config
        self.spec = model if isinstance(model, ModelSpec) else resolve_model(model)
        self.name = "vllm"
        self.start_timeout_s = start_timeout_s
        synthetic = self.spec.source == "synthetic"
        fit = preflight(self.spec, config)
        self.tokenizer = prompt_tokenizer(self.spec)
        self._proc: Any = None
        self._descendants: list = []
        self.facts: dict[str, Any] = {
            "context": config.max_model_len or self.spec.architecture()["context"], "fit_estimate": fit,
            "kv_bytes_per_token": self.spec.kv_bytes_per_token(1 if config.kv_cache_dtype.startswith("fp8") else 2),
            "weight_bytes": fit.get("weight_bytes"), "synthetic": synthetic, "ignore_eos": True, "started": False}

    def start(self) -> "VLLMEngine":
        """Spawn the worker and wait until vLLM is ready (a minute or more); a no-op once started."""
        if self.facts.get("started"):
            if not self._proc.is_alive():
                raise RuntimeError("this vLLM engine is closed. Fix: make a new VLLMEngine.")
            return self
        return self.launch().wait_ready()

    def launch(self) -> "VLLMEngine":
        """Spawn the worker and hand it the engine's start (a second or two); `wait_ready` waits for vLLM.

        Apart so that several engines can start at once (`lablib.engines.together`): each is launched in turn,
        with its own environment (the model runner), then all are waited for."""
        if self._proc is not None:
            if not self._proc.is_alive():
                raise RuntimeError("this vLLM engine is closed. Fix: make a new VLLMEngine.")
            return self
        synthetic = self.spec.source == "synthetic"
        self.baseline = nvml_used()
        self.log_path = tempfile.NamedTemporaryFile(prefix="lablib-vllm-", suffix=".log", delete=False).name
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        tok_path = None if synthetic else self.spec.path
        v2 = self.config.model_runner_v2  # None: this process's environment as it is (vLLM decides)
        with runner_env(v2) if v2 is not None else contextlib.nullcontext():  # the worker and engine core inherit it
            kwargs = self.config.llm_kwargs()
            if self.spec.source == "embedded" and self.config.speculative_config:
                kwargs["speculative_config"] = {"model": str(embedded_path("draft")), **self.config.speculative_config}
            t0 = time.perf_counter()
            spare = Spare.take()
            if spare is not None:  # a worker that imported vLLM while the engine before this one started
                self._proc, self._conn = spare.proc, spare.conn
                env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}  # runner_env's setting too
                self._conn.send(("start", self.spec.path, tok_path, kwargs, self.log_path, synthetic, env))
            else:
                self._proc = ctx.Process(target=worker_main, args=(child, self.spec.path, tok_path, kwargs,
                                                                   self.log_path, synthetic), name="lablib-vllm",
                                         daemon=False)
                self._proc.start()
            Spare.make()  # the next engine's worker imports beside this start, never beside a measurement
        atexit.register(self._at_exit)  # the worker is not a daemon (it has children): end it when Python exits
        self._t0, self._spare = t0, spare
        STARTED.add(self)
        return self

    def wait_ready(self) -> "VLLMEngine":
        """Wait until the launched worker's vLLM is ready; its start-up facts go into `facts`."""
        if self.facts.get("started"):
            return self
        if self._proc is None:
            self.launch()
        t0, spare = self._t0, self._spare
        kind, payload = self._receive(self.start_timeout_s, expect=("ready",))
        self._descendants = children(self._proc.pid)
        if Spare.current is not None:
            Spare.current.ready(SPARE_WAIT_S)  # its imports end before this engine's first measurement
        self.facts.update({**payload, "startup_wall_s": time.perf_counter() - t0, "context": payload.get("max_model_len"),
                           "vram_baseline_bytes": self.baseline[0] if self.baseline else None, "started": True,
                           "worker": "spare" if spare is not None else "spawned"})
        return self

    def _at_exit(self) -> None:
        self.close(force=True)

    def vllm_config(self) -> VLLMConfig:
        """The engine's settings as `lablib.engines.together` sizes them."""
        return self.config

    def resized(self, config: VLLMConfig) -> "VLLMEngine":
        """A new engine of this model with `config` (`together` starts it beside others), not started."""
        return VLLMEngine(self.spec, config, start_timeout_s=self.start_timeout_s)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def worker_pids(self) -> list[int]:
        return [self._proc.pid] if self.alive() else []

    def others(self) -> list[Any]:
        """The other engines of this process whose workers are alive (engines started together, idle while this one
        runs): a memory reading of the whole GPU holds theirs too."""
        return others_than(self)

    def _pids(self) -> set[int]:
        """The worker and every process under it (vLLM's engine core), as seen when it became ready and now."""
        pids = {p.pid for p in self._descendants}
        if self._proc is not None:
            pids.add(self._proc.pid)
            if self._proc.is_alive():
                pids.update(p.pid for p in children(self._proc.pid))
        return pids

    def _log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _receive(self, timeout_s: float, expect: tuple[str, ...]) -> tuple[str, Any]:
        """The next message; errors and a dead worker become a RuntimeError with the worker's own words."""
        deadline = time.monotonic() + timeout_s

        def died() -> RuntimeError:
            return RuntimeError(f"the vLLM worker died (exit code {self._proc.exitcode}) without a message. "
                                f"Its log ({self.log_path}) ends:\n{self._log_tail()}")

        try:
            while not self._conn.poll(0.2):
                if not self._proc.is_alive() and not self._conn.poll(0):  # (what it sent before dying is read first)
                    raise died()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the vLLM worker sent nothing for {timeout_s:.0f} s. Log tail:\n{self._log_tail()}")
            try:
                msg = self._conn.recv()
            except EOFError:  # its end of the pipe closed: the worker is gone
                self._proc.join(10)
                raise died() from None
        except KeyboardInterrupt:
            self.close(force=True)
            raise
        except BaseException:
            self.close(force=True)
            raise
        if msg[0] == "error":
            self.close(force=True)
            raise RuntimeError(f"vLLM worker failed: {msg[1]}\n{msg[2]}\nLog tail:\n{self._log_tail()}")
        if msg[0] not in expect:
            raise RuntimeError(f"vLLM worker protocol: got {msg[0]!r}, expected one of {expect}")
        return msg[0], msg[1]

    def generate(self, requests: list[PreparedRequest], on_record: OnRecord | None = None,
                 progress: bool = True) -> list[RequestRecord]:
        self.start()
        self._conn.send(("generate", [{"request_id": r.request_id, "prompt_ids": list(r.prompt_ids),
                                       "max_new_tokens": r.max_new_tokens} for r in requests]))
        bar = progress_bar(len(requests), progress, "vllm")
        got: dict[str, RequestRecord] = {}
        try:
            while True:
                kind, payload = self._receive(3600, expect=("record", "done"))
                if kind == "done":
                    self.facts["last_run"] = payload
                    break
                rec = RequestRecord(**payload)
                got[rec.request_id] = rec
                if on_record:
                    on_record(rec)
                if bar:
                    bar.update(1)
        except BaseException:  # an interrupt or error in on_record: the worker is mid-run, its pipe holds stale records
            if self._proc.is_alive():
                self.close(force=True)
            raise
        finally:
            if bar:
                bar.close()
        return [got[r.request_id] for r in requests]

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        """Each token-id prompt's log-probability of its every token after the first, scored by the model (vLLM's
        `prompt_logprobs`): what perplexity is made of (`experiments.quantization.from_logprobs`). vLLM skips
        prefix-cache reads for such requests, so the cache cannot change the score. Starts the engine if needed."""
        self.start()
        self._conn.send(("prompt_logprobs", [list(p) for p in prompts]))
        return self._receive(3600, expect=("logprobs",))[1]

    def reset_prefix_cache(self) -> bool:
        """Empty vLLM's prefix cache (`LLM.reset_prefix_cache()`), so the next run's hits are its own.

        False when vLLM refused (blocks still in use). Starts the engine if it has not started."""
        self.start()
        self._conn.send(("reset_prefix_cache",))
        return bool(self._receive(120, expect=("reset",))[1])

    def close(self, force: bool = False, beside: bool | None = None) -> None:
        """End the worker (and vLLM's engine-core process under it), then wait for VRAM to return to baseline.
        `beside`: other engines are up or closing with this one (None: whether any other is alive now), so its
        own processes must let go of their memory rather than the whole GPU come back to its baseline."""
        if self._proc is None or self.facts.get("closed"):  # never started, or closed: nothing holds the GPU
            return
        t0 = time.perf_counter()
        others = self.others() if beside is None else beside
        pids = self._pids()
        held = nvml_process_bytes(pids) if others else None  # None: NVML names none of its processes
        if self._proc.is_alive() and not force:
            try:
                self._conn.send(("close",))
                self._proc.join(60)
            except (BrokenPipeError, OSError):
                pass
        if self._proc.is_alive():
            kill_tree(self._proc.pid)
            self._proc.join(10)
        for p in self._descendants:  # vLLM's engine core outliving a crashed worker would keep the GPU
            try:
                p.kill()
            except Exception:
                pass
        atexit.unregister(self._at_exit)
        STARTED.discard(self)
        self.facts = getattr(self, "facts", {})
        self.facts["closed"] = True
        released(self.facts, self.baseline, bool(others), pids, held)
        self.facts["close_s"] = time.perf_counter() - t0  # the worker's exit and VRAM's return

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


