"""The fake model's prompt scores, in a file of its own (no imports), so a test can load it by path and compute
what the fake returns without importing `vllm` into the test process (tests/engines/test_vllm.py: `fake_scores`)."""


def fake_logprob(previous: int, token: int) -> float:
    """The fake model's log-probability of `token` after `previous` (deterministic, in [-3, -0.1])."""
    return -0.1 - ((previous * 31 + token) % 30) / 10
