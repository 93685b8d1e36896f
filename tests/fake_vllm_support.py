"""What the tests on the fake vLLM share besides its fixtures (those are in conftest.py: fake_gpu, with_fake_vllm,
start): where the fake lives, the VRAM the fake GPU reports, finding and waiting out the fake's processes, and the
fake model's scores. A plain module, so that no test module imports another."""
import importlib.util
import os
import time

import psutil

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_vllm")  # the folder holding the fake `vllm`
GiB = 2**30
BASE_USED = 1 * GiB  # VRAM in use before any engine (driver, other processes)
CORE_BYTES = 8 * GiB  # what each live fake EngineCore "holds"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def cores(marker: str) -> list[int]:
    """Live fake EngineCores of this test, found by the marker on their command line (orphans too)."""
    pids = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in (p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                pids.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def fake_scores():
    """The fake model's fake_logprob, loaded by path: importing it as `vllm.llm` would put vLLM in this process."""
    spec = importlib.util.spec_from_file_location("fake_vllm_scores", os.path.join(FAKE, "vllm", "scores.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fake_logprob
