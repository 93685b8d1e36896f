"""Interactive panels (ipywidgets), one file per lab topic; every handler is one call into lablib."""
from .batching import BatchingPanel
from .kv import KVCalculator, VRAMChart

__all__ = ["BatchingPanel", "KVCalculator", "VRAMChart"]
