"""Hardware facts: what machine ran this, and which libraries.

A benchmark number means little without the machine it came from, so every result
carries `device_facts()` (which GPU, how much memory, which driver) and
`library_versions()` (which torch / transformers / vLLM). Both are best effort and
never raise: on a laptop without a GPU you get {"gpu": None, ...} plus the CPU.

GPU facts come from NVIDIA's management library (the nvidia-ml-py package,
imported as `pynvml`), else from torch when it is already imported. How much
memory a run used is `lablib.hardware.memory.MemoryMonitor`'s question.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import sys
from typing import Any, Callable

from .roofline import lookup_gpu


def _text(value: object) -> str | None:
    """NVML returns bytes in old nvidia-ml-py releases and str in new ones."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def try_query(fn: Callable[..., Any], *args: object) -> Any:
    """fn(*args), or None when the driver does not support the query."""
    try:
        return fn(*args)
    except Exception:
        return None


def nvml_memory(index: int = 0) -> tuple[int, int, int] | None:
    """(used, free, total) bytes of GPU `index` right now, from NVML; None without a GPU or nvidia-ml-py.

    NVML, not torch.cuda: reading it creates no CUDA context, so the notebook's process can
    watch the GPU without holding any of it.
    """
    try:
        import pynvml  # deferred: pynvml

        pynvml.nvmlInit()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
        return int(info.used), int(info.free), int(info.total)
    except Exception:
        return None


def nvml_process_bytes(pids: set[int] | list[int], index: int = 0) -> int | None:
    """GPU memory (bytes) NVML lists for these processes on GPU `index`; 0 where it lists none of them, None without
    NVML or its per-process list (some containers and boards do not give one)."""
    try:
        import pynvml  # deferred: pynvml

        pynvml.nvmlInit()
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(index))
    except Exception:
        return None
    wanted = set(pids)
    return int(sum(p.usedGpuMemory or 0 for p in procs if p.pid in wanted))


def visible_gpus(count: int) -> int:
    """The GPUs a worker can use: `CUDA_VISIBLE_DEVICES`'s entries when it is set (NVML counts them all)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return count
    return len([d for d in env.split(",") if d.strip() and d.strip() != "-1"])


def usable_gpu_count(facts: dict | None = None) -> int:
    """How many GPUs a worker started here can use: NVML's count (`facts["gpu_count"]`, `device_facts()` when
    None) cut to `CUDA_VISIBLE_DEVICES`'s entries when it is set (`visible_gpus`), never more than NVML sees."""
    count = (device_facts() if facts is None else facts)["gpu_count"]
    return min(count, visible_gpus(count))


def _cpu_facts() -> dict:
    model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        import psutil  # deferred: psutil

        ram, physical = psutil.virtual_memory().total, psutil.cpu_count(logical=False)
    except ImportError:
        ram, physical = try_query(lambda: os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), None
    return {"cpu": model, "cpu_cores_logical": os.cpu_count(), "cpu_cores_physical": physical,
            "ram_bytes": ram, "platform": platform.platform()}


def device_facts(import_torch: bool = False) -> dict:
    """Describe the machine: GPUs through NVML, else through torch, plus the CPU. Never raises.

    Keys: gpu (first GPU's name or None), gpu_names, gpu_count, gpu_memory_bytes (total per GPU),
    driver_version, nvml_version, cuda_compute_capability ("9.0"), torch_cuda (CUDA version torch
    was built with), source ("nvml" | "torch" | None), notes (why something is missing), and the
    CPU: cpu, cpu_cores_logical, cpu_cores_physical, ram_bytes, platform.

    torch is consulted only when it is already imported, or when `import_torch=True`:
    importing it just to describe the machine costs seconds.
    """
    facts: dict = {"gpu": None, "gpu_names": [], "gpu_count": 0, "gpu_memory_bytes": [],
                   "driver_version": None, "nvml_version": None, "cuda_compute_capability": None,
                   "torch_cuda": None, "source": None, "notes": []}
    facts.update(_cpu_facts())
    try:
        import pynvml  # deferred: pynvml

        pynvml.nvmlInit()
        try:
            facts["driver_version"] = _text(try_query(pynvml.nvmlSystemGetDriverVersion))
            facts["nvml_version"] = _text(try_query(pynvml.nvmlSystemGetNVMLVersion))
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                facts["gpu_names"].append(_text(pynvml.nvmlDeviceGetName(handle)))
                facts["gpu_memory_bytes"].append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
            if facts["gpu_names"]:
                cc = try_query(pynvml.nvmlDeviceGetCudaComputeCapability, pynvml.nvmlDeviceGetHandleByIndex(0))
                facts["cuda_compute_capability"] = "{}.{}".format(*cc) if cc else None
            facts["source"] = "nvml" if facts["gpu_names"] else None
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        facts["notes"].append("nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    except Exception as e:  # NVMLError: no driver, no library, no permission
        facts["notes"].append(f"NVML unavailable: {type(e).__name__}: {e}")
    if "torch" in sys.modules or import_torch:
        try:
            import torch  # deferred: torch

            facts["torch_cuda"] = torch.version.cuda
            if torch.cuda.is_available() and not facts["gpu_names"]:
                props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
                facts["gpu_names"] = [p.name for p in props]
                facts["gpu_memory_bytes"] = [int(p.total_memory) for p in props]
                facts["source"] = "torch"
            if torch.cuda.is_available() and facts["cuda_compute_capability"] is None:
                facts["cuda_compute_capability"] = "{}.{}".format(*torch.cuda.get_device_capability(0))
        except Exception as e:
            facts["notes"].append(f"torch unavailable: {type(e).__name__}: {e}")
    facts["gpu_count"] = len(facts["gpu_names"])
    facts["gpu"] = facts["gpu_names"][0] if facts["gpu_names"] else None
    return facts


_VERSIONED = ("torch", "transformers", "vllm", "nvidia-ml-py", "plotly")


def library_versions() -> dict:
    """Versions of python and the libraries a result depends on; None where not installed.

    Read from package metadata, so nothing heavy is imported."""
    versions: dict = {"python": platform.python_version()}
    for dist in _VERSIONED:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def machine_summary() -> dict[str, Any]:
    """Device facts plus the roofline entry for this GPU (None when unknown or no GPU)."""
    facts = device_facts(import_torch=True)
    peak = lookup_gpu(facts["gpu"]) if facts["gpu"] else None
    return {**facts, "roofline_entry": peak.name if peak else None,
            "peak_bandwidth_TBps": peak.peak_bw / 1e12 if peak else None}


def torch_threads(n: int | None):
    """A context in which torch runs on n threads, restored after (None: as it is).

    On a shared CPU OpenMP threads spin against other processes', and a second thread makes the embedded models
    5-10x slower (tests/conftest.py's one_thread fixture does the same for the tests)."""
    @contextlib.contextmanager
    def pinned():
        import torch  # deferred: torch

        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    return contextlib.nullcontext() if n is None else pinned()
