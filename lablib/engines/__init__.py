"""Engines: a workload in, one record per request out (see base.py). Every engine answers the same call.

Imported lazily, so `from lablib.engines import base` (the vLLM worker, the tests' fakes)
loads neither torch nor an HTTP client.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Engine": "base", "PreparedRequest": "base", "HFEngine": "hf", "VLLMEngine": "vllm",
            "ServerEngine": "server", "VLLMServer": "server"}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
