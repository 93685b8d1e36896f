"""The memory monitor on a CPU-only machine (RSS), and its NVML branch on a fake pynvml."""

import json
import subprocess
import sys
import time
import warnings

import pytest

from lablib.hardware.memory import MemoryMonitor, monitor_overhead_s

MB = 2**20


def test_rss_monitor_catches_an_allocation():
    def samples_after(n: int, timeout_s: float = 10.0) -> None:  # on a busy CPU the sampler runs late, not never
        deadline = time.monotonic() + timeout_s
        while len(mon.samples) < n and time.monotonic() < deadline:
            time.sleep(0.01)

    with MemoryMonitor(interval_s=0.01, source="rss") as mon:
        samples_after(3)
        blob = b"\x01" * (200 * MB)  # bytes filled with 1s: every page is touched
        samples_after(len(mon.samples) + 3)  # held until the monitor has sampled it a few times
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


def test_auto_falls_back_to_rss_quietly_and_says_why(no_gpu):
    """On a CPU machine the fallback is the expected path: no warning (a lab cell would show it in pink), the
    reason kept on the monitor, and the Result's notes say the memory is RSS."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with MemoryMonitor() as mon:
            pass
    assert mon.source == "rss" and "no GPU through NVML" in mon.fallback and "RSS" in mon.fallback
    with MemoryMonitor(source="rss") as chosen:
        pass
    assert chosen.fallback is None  # asked for RSS: nothing fell back


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


def test_nvml_monitor_with_a_fake_pynvml(fake_pynvml):
    nv = fake_pynvml
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


def test_the_package_still_exports_the_monitor():
    import lablib

    assert lablib.MemoryMonitor is MemoryMonitor
