"""Fixtures shared between test files in every folder under tests/: no GPU at all or a fake one
(hardware/test_device.py, hardware/test_memory.py, widgets/test_widgets.py), the embedded model on HF
naive generate (test_bench.py, engines/test_hf.py), the scripts as modules, chat-like request lengths
(mechanisms/test_kv.py, mechanisms/test_paging.py), and torch on one thread for the modules that run
the embedded model (pytestmark = pytest.mark.usefixtures("one_thread")).

The test folders mirror lablib's layer folders; each is a package (an __init__.py) so that files of
the same name in two folders (mechanisms/test_kv.py, plots/...) import as distinct modules."""

import os
import random
import sys
import tempfile
import types

import pytest

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


# Every store a test (or a lab under nbval, whose kernel inherits this) opens by default goes to a folder of its
# own, not the clone's results/: a developer's own runs never change a test, and a test never adds to them.
if "LABLIB_RESULTS" not in os.environ:
    os.environ["LABLIB_RESULTS"] = tempfile.mkdtemp(prefix="lablib-test-results-")
