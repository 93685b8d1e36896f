"""Fixtures shared by the labs' experiment tests: lab 08's embedded pair and its prompts (test_speculative.py,
test_speculative_sampling.py), the pinned runner on the fake vLLM (test_speculative.py,
test_speculative_synthetic.py), and an online-FP8 engine that dies (test_quantization.py,
test_quantization_live_recording.py). The fake vLLM itself is tests/conftest.py's."""
import os

import pytest

from lablib.config import VLLMConfig
from lablib.engines import vllm as vllm_engine
from lablib.experiments.speculative import loops
from lablib.workloads import load_workload


@pytest.fixture(scope="module")
def pair(one_thread):
    """Lab 08's embedded target, draft and tokenizer, loaded once per module."""
    return loops.load_pair()


@pytest.fixture(scope="module")
def prompts(pair) -> list[list[int]]:
    """3 journey prompts, as the pair's token ids."""
    return load_workload("journey", limit=3).prompt_ids(pair[2])


@pytest.fixture
def pinned_on_the_fake(start, monkeypatch):
    """The fake vLLM takes no async_scheduling (its EngineArgs list predates this lab): drop it in the parent, where
    VLLMEngine.start builds the kwargs; record what VLLM_USE_V2_MODEL_RUNNER was when each worker was spawned."""
    real_kwargs = VLLMConfig.llm_kwargs
    spawned = []

    def kwargs(self):  # VLLMEngine.start calls it just before it spawns the worker, inside runner_env
        kw = real_kwargs(self)
        env = os.environ.get(vllm_engine.RUNNER_ENV)
        spawned.append({"async_scheduling": kw.pop("async_scheduling", None), "env": env})
        return kw

    monkeypatch.setattr(VLLMConfig, "llm_kwargs", kwargs)
    monkeypatch.delenv(vllm_engine.RUNNER_ENV, raising=False)
    return spawned


@pytest.fixture
def fp8_engines_die(monkeypatch):
    """Every vLLM engine with online FP8 fails to start ("the engine core died"); the others start as ever."""
    import lablib.engines.vllm as engine

    real = engine.VLLMEngine.start

    def fp8_dies(self):
        if self.config.quantization == "fp8":
            raise RuntimeError("the engine core died")
        return real(self)

    monkeypatch.setattr(engine.VLLMEngine, "start", fp8_dies)
