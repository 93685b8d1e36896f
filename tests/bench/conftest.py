"""Fixtures the bench tests share."""
import os

import pytest

from tests.fake_vllm_support import FAKE


@pytest.fixture
def fake_vllm_cli(monkeypatch):
    """`python -m vllm...` in a child process finds the fake package."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FAKE, *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("FAKE_VLLM_TOKEN_DELAY", "0.0005")
    monkeypatch.delenv("FAKE_VLLM_BENCH_FAIL", raising=False)
