"""The memory monitor: how much memory a run needed, sampled while it runs.

Memory is a number you cannot read after the fact: the peak is gone once the run
ends. So `MemoryMonitor` starts a daemon thread that samples every `interval_s`
seconds while your code runs, and keeps the whole timeline:

    with MemoryMonitor() as mon:
        engine.generate(prompts)
    mon.peak_bytes - mon.baseline_bytes   # what the run added at its worst moment

Two sources, chosen when the monitor starts (`mon.source` says which one):

- "nvml": NVIDIA's management library (the nvidia-ml-py package, imported as
  `pynvml`) reports the memory used on the whole device, its utilisation %, and
  the memory of each process. The device total is what matters for "will it fit":
  it includes the CUDA context, the caching allocator's reserve and vLLM's
  pre-allocated KV cache, none of which `torch.cuda.memory_allocated()` shows.
  Per-process memory is kept for the worker process tree: this process, its
  children (vLLM runs the model in a worker process) and any pid passed to
  `watch_pid`, with theirs. Inside containers NVML may report host pids that match
  none of ours; the per-process series is then None.
- "rss": without NVML or a GPU, the resident set size of the same process tree
  (psutil). That is CPU memory, a stand-in so the labs run on a laptop; the monitor
  says so once per process (a RuntimeWarning), not once per monitor.

Sampling is a short poll, not a profiler: a spike shorter than `interval_s` can
slip between samples (the monitor also samples once at start and once at stop).
`monitor_overhead_s()` measures what one sample costs (about 15 us on an H200 host).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from .device import try_query

_PID_REFRESH_S = 0.5  # how often the set of child processes is re-read (it scans /proc)


class MemoryMonitor:
    """Sample memory in a background thread while a run goes (see the module docstring).

    interval_s: seconds between samples, > 0 (default 0.05 = 20 samples a second).
    device_index: which GPU NVML watches, >= 0.
    source: "auto" (NVML if a GPU answers, else RSS, the reason in `fallback`), "nvml" (raise if it
        cannot), or "rss" (always process memory).

    After (or during) a run: `samples` is a list of (t_seconds_since_start, used_bytes,
    util_percent or None); `process_bytes` runs alongside it with the memory of our own
    processes (None where NVML saw none of them); `baseline_bytes`, `peak_bytes`,
    `peak_process_bytes`; `error` holds the reason if sampling died mid-run.
    """

    def __init__(self, interval_s: float = 0.05, device_index: int = 0, source: str = "auto") -> None:
        try:
            import psutil  # deferred: psutil (child processes in both modes, RSS without a GPU)  # noqa: F401
        except ImportError as e:
            raise RuntimeError("MemoryMonitor needs psutil: pip install psutil") from e
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r}: must be > 0 seconds (0.05 samples 20 times a second)")
        if device_index < 0:
            raise ValueError(f"device_index={device_index!r}: must be >= 0 (0 is the first GPU)")
        if source not in ("auto", "nvml", "rss"):
            raise ValueError(f"source={source!r}: must be 'auto', 'nvml' or 'rss'")
        self.interval_s, self.device_index, self.requested_source = interval_s, device_index, source
        self.source: str | None = None  # "nvml" | "rss", decided by start()
        self.fallback: str | None = None  # why "auto" fell back to RSS (no NVML, no GPU), or None
        self.samples: list[tuple[float, int, float | None]] = []  # (t_s, used_bytes, util_percent)
        self.process_bytes: list[int | None] = []  # alongside samples: our processes' bytes
        self.baseline_bytes: int | None = None
        self.peak_bytes: int | None = None
        self.error: str | None = None  # why sampling stopped early, if it did
        self._extra_pids: set[int] = set()
        self._excluded_roots: set[int] = set()
        self._excluded: set[int] = set()  # the excluded roots and their children
        self.others_bytes: int | None = None  # NVML's bytes of the excluded processes at the first sample
        self._pids: set[int] = set()  # this process, its children, watched pids and theirs
        self._pids_at = float("-inf")  # when _pids was last re-read
        self._procs: dict = {}  # pid -> psutil.Process, for RSS
        self._nvml = self._handle = None
        self._unsupported: set[str] = set()  # NVML queries that failed once (utilisation, processes)
        self._thread: threading.Thread | None = None
        self._stop, self._t0 = threading.Event(), 0.0

    def watch_pid(self, pid: int) -> None:
        """Also count process `pid` (and its children), e.g. a vLLM worker we did not spawn."""
        self._extra_pids.add(int(pid))
        self._pids_at = float("-inf")

    def exclude_pid(self, pid: int) -> None:
        """Do not count process `pid` (nor its children) among ours: another engine of this process, idle while the
        measured one runs (`lablib.engines.together`). The device's `used_bytes` still holds its memory;
        `others_bytes` says how much that was when the monitor started."""
        self._excluded_roots.add(int(pid))
        self._pids_at = float("-inf")

    @property
    def peak_process_bytes(self) -> int | None:
        seen = [b for b in self.process_bytes if b is not None]
        return max(seen) if seen else None

    def _open(self, announce: bool = True) -> None:
        """Pick the source; set up NVML or psutil. Raises only when the caller's choice cannot be met."""
        reason = None
        if self.requested_source in ("auto", "nvml"):
            try:
                import pynvml  # deferred: pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml  # from here on, _close() shuts NVML down again
                count = pynvml.nvmlDeviceGetCount()
                if self.device_index >= count:
                    raise IndexError(f"device_index={self.device_index} but NVML sees {count} GPU(s)")
                self._handle, self.source = pynvml.nvmlDeviceGetHandleByIndex(self.device_index), "nvml"
                return
            except ImportError:
                reason = "nvidia-ml-py is not installed"
            except Exception as e:
                reason = f"{type(e).__name__}: {e}"
                self._close()
            if self.requested_source == "nvml":
                raise RuntimeError(f"MemoryMonitor(source='nvml') cannot read the GPU ({reason}); "
                                   "install nvidia-ml-py, check nvidia-smi works, or use source='auto'")
        self.source = "rss"
        # No warning: on a CPU machine this is the expected path, and a Result says so in its notes
        # ("memory is this process's resident set size"); the reason stays here for whoever asks.
        self.fallback = None if reason is None else f"no GPU through NVML ({reason}): measuring process RSS"

    def _refresh_pids(self) -> None:
        now = time.perf_counter()
        if now - self._pids_at < _PID_REFRESH_S:
            return
        self._pids_at = now
        import psutil  # deferred: psutil

        def tree(roots: set[int]) -> set[int]:
            out = set(roots)
            for root in roots:
                out.update(c.pid for c in try_query(lambda: psutil.Process(root).children(recursive=True)) or [])
            return out

        self._excluded = tree(self._excluded_roots)
        pids = tree({os.getpid(), *self._extra_pids}) - self._excluded
        self._procs = {pid: self._procs.get(pid) or try_query(psutil.Process, pid) for pid in pids}
        self._pids = pids

    def _read(self) -> tuple[int, float | None, int | None]:
        """One sample: (used_bytes, util_percent or None, our processes' bytes or None)."""
        self._refresh_pids()
        if self.source == "nvml":
            nv, h = self._nvml, self._handle
            used = int(nv.nvmlDeviceGetMemoryInfo(h).used)
            util = self._optional("util", nv.nvmlDeviceGetUtilizationRates, h)
            procs = self._optional("procs", nv.nvmlDeviceGetComputeRunningProcesses, h) or []
            ours = [p.usedGpuMemory or 0 for p in procs if p.pid in self._pids]
            if self.others_bytes is None and self._excluded:
                self.others_bytes = int(sum(p.usedGpuMemory or 0 for p in procs if p.pid in self._excluded))
            return used, (None if util is None else float(util.gpu)), (int(sum(ours)) if ours else None)
        # a child that exited since the last refresh reads as None and counts 0
        rss = sum(getattr(try_query(p.memory_info), "rss", 0) for p in self._procs.values() if p is not None)
        return rss, None, rss

    def _optional(self, query: str, fn: Callable[..., Any], *args: object) -> Any:
        """An NVML query some boards or sandboxes do not support: after its first failure, stop asking."""
        if query in self._unsupported:
            return None
        try:
            return fn(*args)
        except Exception:
            self._unsupported.add(query)
            return None

    def _record(self) -> None:
        used, util, ours = self._read()
        self.samples.append((time.perf_counter() - self._t0, used, util))
        self.process_bytes.append(ours)
        self.peak_bytes = used if self.peak_bytes is None else max(self.peak_bytes, used)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._record()
            except Exception as e:  # a dying driver must not kill the run being measured
                self.error = f"{type(e).__name__}: {e}"
                return

    def start(self) -> MemoryMonitor:
        """Take the baseline sample and start the sampling thread."""
        if self._thread is not None:
            raise RuntimeError("this MemoryMonitor was already started; create a new one per run")
        self._open()
        self._t0 = time.perf_counter()
        try:
            self._record()
        except Exception:
            self._close()
            raise
        self.baseline_bytes = self.samples[0][1]
        self._thread = threading.Thread(target=self._run, name="lablib-MemoryMonitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and join the thread, take a last sample, release NVML. Safe to call twice."""
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=max(1.0, 10 * self.interval_s))
        try:
            if self.error is None:
                self._record()
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self._close()

    def _close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> MemoryMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()  # returns None: an exception in the body propagates

    def timeline(self) -> dict:
        """Everything as plain lists and numbers, ready for json.dumps."""
        return {"source": self.source, "interval_s": self.interval_s,
                "t_s": [round(t, 6) for t, _, _ in self.samples],
                "used_bytes": [u for _, u, _ in self.samples],
                "util_percent": [p for _, _, p in self.samples],
                "process_bytes": list(self.process_bytes),
                "baseline_bytes": self.baseline_bytes, "peak_bytes": self.peak_bytes,
                "peak_process_bytes": self.peak_process_bytes, "error": self.error,
                **({"others_bytes": self.others_bytes} if self._excluded_roots else {})}


def monitor_overhead_s(n: int = 200, source: str = "auto") -> float:
    """Mean seconds one MemoryMonitor sample costs here (the thread pays it every interval_s)."""
    if n < 1:
        raise ValueError(f"n={n!r}: must be >= 1 samples to time")
    mon = MemoryMonitor(source=source)
    mon._open(announce=False)
    try:
        mon._read()  # first read fills the pid cache; do not time it
        t0 = time.perf_counter()
        for _ in range(n):
            mon._read()
        return (time.perf_counter() - t0) / n
    finally:
        mon._close()
