"""Fixtures shared between test files in every folder under tests/: no GPU at all or a fake one
(hardware/test_device.py, hardware/test_memory.py, widgets/test_widgets.py), the embedded model on HF
naive generate (test_bench.py, engines/test_hf.py), the scripts as modules, chat-like request lengths
(mechanisms/test_kv.py, mechanisms/test_paging.py), torch on one thread for the modules that run
the embedded model (pytestmark = pytest.mark.usefixtures("one_thread")), the instructor's run of real labs
(test_instructor.py, test_export.py), and the fake vLLM on a fake GPU
(fake_gpu, with_fake_vllm, start: engines/test_vllm.py and the labs' vLLM steps in experiments/; its other
helpers are tests/fake_vllm_support.py).

The test folders mirror lablib's layer folders; each is a package (an __init__.py) so that files of
the same name in two folders (mechanisms/test_kv.py, plots/...) import as distinct modules."""

import functools
import os
import random
import shutil
import sys
import tempfile
import types
import uuid
from pathlib import Path

import pytest

from tests.fake_vllm_support import BASE_USED, CORE_BYTES, FAKE, GiB, cores, wait_gone

MB = 2**20


@pytest.fixture(scope="module")
def one_thread():
    """A 4.7M-parameter model at batch <= 4 gains nothing from a second thread, and on a shared 2-core
    machine OpenMP threads spin against other processes' (5-10x slower); restored after the module."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def hf_naive_cpu(one_thread):
    """The embedded model on HF naive generate, on the CPU: one per test module, closed after it."""
    from lablib import HFConfig, HFEngine

    engine = HFEngine("embedded", HFConfig(device="cpu"))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def load_script():
    """load_script("pack_reference") → scripts/pack_reference.py as a module (the scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture(scope="session")
def run_labs():
    """run_labs(*labs) → (exit code, output folder) of `lablab-instructor --out <tmp> --labs *labs`, run once per
    set of labs in a pytest process: test_instructor.py checks the run, test_export.py reads its HTML."""
    from lablib.instructor import run as instructor

    outs = []

    @functools.cache
    def run(*labs: str) -> tuple[int, Path]:
        out = Path(tempfile.mkdtemp(prefix="instructor-"))
        outs.append(out)
        return instructor.main(["--out", str(out), "--labs", *labs]), out

    yield run
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture
def unrecorded(monkeypatch):
    """unrecorded(*keys): the shipped recordings as if facts[key] had not been recorded yet, so a test can check
    what a lab says before a GPU session records its step (the real recordings are tested where they are shown)."""
    from lablib.results import reference

    shipped = reference.reference_facts

    def drop(*keys: str) -> None:
        monkeypatch.setattr(reference, "reference_facts", lambda: {k: v for k, v in shipped().items() if k not in keys})
    return drop


@pytest.fixture
def no_gpu(monkeypatch):
    """Hide nvidia-ml-py and torch, as on a laptop without them."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    monkeypatch.setitem(sys.modules, "torch", None)


def _fake_pynvml(our_pid: int) -> types.ModuleType:
    """Enough of nvidia-ml-py for device_facts and MemoryMonitor: one H200 whose memory grows."""
    nv = types.ModuleType("pynvml")
    state = {"used": 1000 * MB, "inits": 0}
    ns = types.SimpleNamespace

    class NVMLError(Exception):
        pass

    def get_memory_info(handle):
        state["used"] += 10 * MB
        return ns(total=141 * 2**30, used=state["used"], free=0)

    nv.NVMLError = NVMLError
    nv.nvmlInit = lambda: state.__setitem__("inits", state["inits"] + 1)
    nv.nvmlShutdown = lambda: state.__setitem__("inits", state["inits"] - 1)
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"handle{i}"
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # old releases return bytes
    nv.nvmlDeviceGetMemoryInfo = get_memory_info
    nv.nvmlSystemGetDriverVersion = lambda: "570.1"
    nv.nvmlSystemGetNVMLVersion = lambda: "12.570.1"
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nv.nvmlDeviceGetUtilizationRates = lambda h: ns(gpu=87, memory=40)
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [ns(pid=our_pid, usedGpuMemory=500 * MB),
                                                         ns(pid=999_999_999, usedGpuMemory=123 * MB)]
    nv.state = state
    return nv


@pytest.fixture
def fake_pynvml(monkeypatch):
    """A fake nvidia-ml-py in place of the real one; this process is one of the GPU's processes."""
    nv = _fake_pynvml(os.getpid())
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


def _chat_lengths(n: int = 200, seed: int = 0) -> list[tuple[int, int]]:
    """Chat-like lengths: log-normal prompts and outputs, a few hundred tokens on average."""
    rng = random.Random(seed)
    draw = lambda: min(1000, max(1, int(rng.lognormvariate(5.0, 1.0))))  # noqa: E731
    return [(draw(), draw()) for _ in range(n)]


@pytest.fixture
def chat_lengths():
    """The chat-like (prompt_len, output_len) generator: chat_lengths(n=200, seed=0)."""
    return _chat_lengths


@pytest.fixture
def fake_gpu(monkeypatch):
    """Patch pynvml into one GPU; returns a setter for its name, compute capability and memory."""
    import pynvml

    gpu = {"name": "NVIDIA H200", "cc": (9, 0), "total": 140 * GiB, "free": None, "marker": None, "count": 1}

    def memory(handle):
        used = BASE_USED + CORE_BYTES * (len(cores(gpu["marker"])) if gpu["marker"] else 0)
        free = gpu["free"] if gpu["free"] is not None else gpu["total"] - used
        return type("Memory", (), {"used": used, "free": free, "total": gpu["total"]})()

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: f"gpu{i}")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCudaComputeCapability", lambda h: gpu["cc"])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: gpu["name"])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: gpu["count"])
    # NVML's per-process list: each live fake EngineCore holds CORE_BYTES (none where no marker is set)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: [
        type("Process", (), {"pid": pid, "usedGpuMemory": CORE_BYTES})()
        for pid in (cores(gpu["marker"]) if gpu["marker"] else [])])

    def set_gpu(**kw):
        gpu.update(kw)

    set_gpu.gpu = gpu
    return set_gpu


@pytest.fixture
def with_fake_vllm(monkeypatch):
    """The fake `vllm` (tests/fake_vllm) importable here (so preflight finds it) and in the worker.

    A spawned worker starts with this process's sys.path, so sys.path carries it there;
    PYTHONPATH does the same for anything the worker starts with a fresh interpreter.
    """
    monkeypatch.syspath_prepend(FAKE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FAKE, *filter(None, [os.environ.get("PYTHONPATH")])]))
    for var in ("FAKE_VLLM_FAIL_START", "FAKE_VLLM_CRASH_AFTER", "FAKE_VLLM_GPU_BLOCKS", "FAKE_VLLM_ORPHAN_WATCH"):
        monkeypatch.delenv(var, raising=False)
    from lablib import session

    session.mode.cache_clear()  # decided once per process: not while the fake GPU and fake vLLM stand in
    yield
    session.mode.cache_clear()  # a later test (the main job) must not inherit "live" from the fakes


@pytest.fixture
def start(with_fake_vllm, fake_gpu, monkeypatch):
    """start(config, model, **FAKE_VLLM_env) → a started VLLMEngine on the fake; every engine is closed at the end.

    `start.new(...)` makes one without starting it (the constructor runs only the preflight and the tokenizer)."""
    from lablib.config import VLLMConfig
    from lablib.engines import vllm as vllm_engine
    from lablib.engines.vllm import VLLMEngine

    marker = f"fake-vllm-core-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("FAKE_VLLM_MARKER", marker)
    monkeypatch.setenv("FAKE_VLLM_STEP_SLEEP", "0.002")
    monkeypatch.setattr(vllm_engine, "SETTLE_S", 5.0)
    fake_gpu(marker=marker)
    engines = []

    def _new(config=VLLMConfig(), model="embedded", **env):
        for k, v in env.items():
            monkeypatch.setenv(k, str(v))
        engine = VLLMEngine.__new__(VLLMEngine)  # so teardown can close it even if __init__ fails half-way
        engines.append(engine)
        engine.__init__(model, config, start_timeout_s=60)
        return engine

    def _start(config=VLLMConfig(), model="embedded", **env):
        return _new(config, model, **env).start()

    _start.marker, _start.new = marker, _new
    yield _start
    for e in engines:
        if getattr(e, "_proc", None) is not None:
            e.close()  # the polite close a `with` block does (a dead worker makes it a no-op)
        if getattr(e, "log_path", None):
            os.unlink(e.log_path)
    assert wait_gone(cores(marker)) == []


# Every store a test (or a lab under nbval, whose kernel inherits this) opens by default goes to a folder of its
# own, not the clone's results/: a developer's own runs never change a test, and a test never adds to them.
if "LABLIB_RESULTS" not in os.environ:
    os.environ["LABLIB_RESULTS"] = tempfile.mkdtemp(prefix="lablib-test-results-")


@pytest.fixture
def fake_vllm_cli(monkeypatch):
    """`python -m vllm...` in a child process finds the fake package."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FAKE, *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("FAKE_VLLM_TOKEN_DELAY", "0.0005")
    monkeypatch.delenv("FAKE_VLLM_BENCH_FAIL", raising=False)
