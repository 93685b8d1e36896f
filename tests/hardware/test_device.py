"""Device facts and library versions, on a CPU-only machine; the NVML branch runs on a fake pynvml."""

import json

from lablib.hardware.device import device_facts, library_versions


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


def test_device_facts_with_a_fake_pynvml(fake_pynvml):
    facts = device_facts()
    assert facts["gpu"] == "NVIDIA H200" and facts["gpu_count"] == 1 and facts["source"] == "nvml"
    assert facts["gpu_memory_bytes"] == [141 * 2**30] and facts["cuda_compute_capability"] == "9.0"
    assert facts["driver_version"] == "570.1" and facts["nvml_version"] == "12.570.1"
    assert fake_pynvml.state["inits"] == 0  # device_facts shut NVML down again


def test_usable_gpu_count_is_nvmls_count_cut_to_cuda_visible_devices(monkeypatch, fake_pynvml):
    from lablib.hardware.device import usable_gpu_count

    eight = {"gpu_count": 8}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert usable_gpu_count(eight) == 8 and usable_gpu_count() == 1  # unset: all NVML sees (the fake: one H200)
    for env, want in (("0,1", 2), ("3", 1), ("GPU-5c7f,GPU-9a1e", 2), ("-1", 0), ("", 0)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
        assert usable_gpu_count(eight) == want, env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert usable_gpu_count({"gpu_count": 1}) == usable_gpu_count() == 1  # never more than NVML sees
    assert usable_gpu_count({"gpu_count": 0}) == 0
