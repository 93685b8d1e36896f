"""Device facts and the memory monitor, on a CPU-only machine; the NVML branch runs on a fake pynvml."""

import json
import os
import subprocess
import sys
import time
import types
import warnings

import pytest

from lablib import gpu
from lablib.gpu import MemoryMonitor, device_facts, library_versions, monitor_overhead_s

MB = 2**20


@pytest.fixture
def no_gpu(monkeypatch):
    """Hide nvidia-ml-py and torch, as on a laptop without them."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    monkeypatch.setitem(sys.modules, "torch", None)


def test_device_facts_without_gpu(no_gpu):
    facts = device_facts()
    json.dumps(facts)
    assert facts["gpu"] is None and facts["gpu_count"] == 0 and facts["gpu_names"] == []
    assert facts["source"] is None and facts["notes"]
    assert facts["cpu_cores_logical"] >= 1 and facts["ram_bytes"] > 0
    assert isinstance(facts["cpu"], str) and facts["cpu"]


def test_device_facts_never_raises_on_this_machine():
    facts = device_facts()
    assert facts["gpu_count"] == len(facts["gpu_names"])
    assert (facts["gpu"] is None) == (facts["gpu_count"] == 0)


def test_library_versions():
    versions = library_versions()
    assert set(versions) == {"python", "torch", "transformers", "vllm", "nvidia-ml-py", "plotly"}
    assert versions["python"].count(".") == 2
    assert all(v is None or isinstance(v, str) for v in versions.values())


def test_rss_monitor_catches_an_allocation():
    with MemoryMonitor(interval_s=0.01, source="rss") as mon:
        time.sleep(0.05)
        blob = b"\x01" * (200 * MB)  # bytes filled with 1s: every page is touched
        time.sleep(0.1)
        del blob
    assert mon.source == "rss"
    assert len(mon.samples) >= 5
    assert mon.baseline_bytes == mon.samples[0][1] > 0
    assert mon.peak_bytes >= mon.baseline_bytes
    assert mon.peak_bytes - mon.baseline_bytes >= 150 * MB
    assert not mon.running and not mon._thread.is_alive() and mon._thread.daemon
    times = [t for t, _, _ in mon.samples]
    assert times == sorted(times) and times[0] == pytest.approx(0, abs=0.01)


def test_monitor_stops_when_the_body_raises():
    with pytest.raises(KeyError):
        with MemoryMonitor(interval_s=0.01, source="rss") as mon:
            time.sleep(0.03)
            raise KeyError("boom")
    assert not mon._thread.is_alive()
    assert mon.samples and mon.error is None
    mon.stop()  # a second stop is harmless


def test_rss_monitor_counts_child_processes():
    code = "import time; b = b'x' * (120 * 2**20); print('ready', flush=True); time.sleep(10)"
    with MemoryMonitor(interval_s=0.02, source="rss") as mon:
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + 3
            while mon.peak_bytes - mon.baseline_bytes < 100 * MB and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            child.kill()
            child.wait()
    assert mon.peak_bytes - mon.baseline_bytes >= 100 * MB


def test_auto_falls_back_to_rss_and_warns_once(no_gpu, monkeypatch):
    monkeypatch.setattr(gpu, "_rss_warned", False)
    with pytest.warns(RuntimeWarning, match="RSS"):
        MemoryMonitor().start().stop()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with MemoryMonitor() as mon:
            pass
    assert mon.source == "rss"


def test_explicit_nvml_without_gpu_raises(no_gpu):
    with pytest.raises(RuntimeError, match="nvidia-ml-py"):
        MemoryMonitor(source="nvml").start()


def test_timeline_is_plain_json():
    with MemoryMonitor(interval_s=0.01, source="rss") as mon:
        time.sleep(0.03)
    tl = mon.timeline()
    json.loads(json.dumps(tl))
    assert len(tl["t_s"]) == len(tl["used_bytes"]) == len(tl["util_percent"]) == len(tl["process_bytes"])
    assert tl["source"] == "rss" and tl["peak_bytes"] == max(tl["used_bytes"])


@pytest.mark.parametrize("kwargs, field", [({"interval_s": 0}, "interval_s"), ({"device_index": -1}, "device_index"),
                                           ({"source": "cuda"}, "source")])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MemoryMonitor(**kwargs)


def test_monitor_overhead_is_small():
    assert 0 < monitor_overhead_s(n=50, source="rss") < 0.005


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


def test_nvml_branch_with_a_fake_pynvml(monkeypatch):
    nv = _fake_pynvml(os.getpid())
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    facts = device_facts()
    assert facts["gpu"] == "NVIDIA H200" and facts["gpu_count"] == 1 and facts["source"] == "nvml"
    assert facts["gpu_memory_bytes"] == [141 * 2**30] and facts["cuda_compute_capability"] == "9.0"
    assert facts["driver_version"] == "570.1" and facts["nvml_version"] == "12.570.1"

    nv.state["used"] = 1000 * MB  # each memory query adds 10 MB
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RSS fallback warning on the NVML path
        with MemoryMonitor(interval_s=0.01) as mon:
            time.sleep(0.05)
    assert mon.source == "nvml"
    assert mon.baseline_bytes == 1010 * MB and mon.peak_bytes > mon.baseline_bytes
    assert all(util == 87.0 for _, _, util in mon.samples)
    assert set(mon.process_bytes) == {500 * MB}  # only our pid, not the stranger's 123 MB
    assert nv.state["inits"] == 0  # every nvmlInit was matched by nvmlShutdown
    assert monitor_overhead_s(n=10) < 0.005
