"""The instructor's evening before a workshop: every lab run top to bottom, handed out as HTML that works offline.

`lablab-instructor --out DIR` (or `python -m lablib.instructor`) runs each lab with papermill and writes the
executed notebooks, one self-contained HTML per lab and an `index.html` of their status and wall time; it
exits 1 naming the notebook and the cell that failed (`run`). The HTML keeps every plotly figure with
plotly.js inline once, and shows widget panels as snapshots of their state (`export`). Every lab's
committed form, its Colab link, first cell and metadata, is written from one place (`notebooks`):
`python -m lablib.instructor.notebooks --repo origin` once the project is on GitHub.

This is the top layer, beside `report` and `cli`: it may import anything in lablib, nothing imports it.
Names load lazily (PEP 562), so `python -m lablib.instructor.notebooks` imports neither papermill nor run.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"colab_repo": "notebooks", "main": "run"}
__all__ = ["colab_repo", "main"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
