"""Engines: a workload in, one record per request out (see base.py)."""
from .base import Engine, PreparedRequest
from .hf import HFEngine
from .vllm import VLLMEngine

__all__ = ["Engine", "PreparedRequest", "HFEngine", "VLLMEngine"]
