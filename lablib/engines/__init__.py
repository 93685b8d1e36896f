"""Engines: a workload in, one record per request out (see base.py)."""
from .base import Engine, PreparedRequest
from .hf import HFEngine

__all__ = ["Engine", "PreparedRequest", "HFEngine"]
