"""What every figure shares: trace names, the recorded/synthetic labels, and the checks on its input.

A figure reads only Results (or rows made from them). A run recorded on the H200 says so in
its trace name (`Result.label`), and a synthetic-weights run carries the synthetic label,
wherever it is drawn: the one formatter is here.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import plotly.graph_objects as go

from ..models.architecture import LABEL as SYNTHETIC_LABEL

from ..results.record import Result


ROOFLINE_UNKNOWN = "roofline unknown for this hardware (CPU or GPU not in the table)"


def series_name(r: Result, base: str | None = None) -> str:
    """A trace name for r: `base` (default the step) plus, for a recorded run, where it was recorded."""
    return r.label if base is None else base + r.label[len(r.step):]


def is_synthetic(r: Result) -> bool:
    """Whether r ran a synthetic checkpoint (random weights of a real architecture)."""
    return bool(r.model.get("synthetic")) or str(r.model.get("name", "")).startswith("synthetic:")


def synthetic_line(synthetic: bool) -> str:
    """The title line that says a figure shows synthetic weights ('' when it does not)."""
    return f"<br><sup>{SYNTHETIC_LABEL}</sup>" if synthetic else ""


def synthetic_note(results: list[Result]) -> str:
    """synthetic_line for a figure of these runs: shown when any of them used synthetic weights."""
    return synthetic_line(any(is_synthetic(r) for r in results))


def _recorded_note(results: list[Result]) -> str:
    gpus = sorted({r.hardware.get("gpu") or "CPU" for r in results if r.provenance == "recorded"})
    note = f"<br><sup>includes runs recorded on {', '.join(gpus)}, not measured here</sup>" if gpus else ""
    return note + synthetic_note(results)


def _require(results: list[Result], what: str) -> list[Result]:
    results = list(results)
    if not results:
        raise ValueError(f"{what}: no Results to draw. Fix: pass the list bench.run returned or load_results(...).")
    return results


def _unique_labels(results: list[Result]) -> list[str]:
    """Result labels as bar categories; a repeated label gets ' #2', ' #3' so bars do not merge."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for r in results:
        seen[r.label] += 1
        out.append(r.label if seen[r.label] == 1 else f"{r.label} #{seen[r.label]}")
    return out


def _batch(r: Result, keys: tuple[str, ...]) -> int | None:
    return next((r.config[k] for k in keys if isinstance(r.config.get(k), int)), None)


def _note(fig: go.Figure, text: str, y: float = 1.02) -> None:
    fig.add_annotation(text=text, xref="paper", yref="paper", x=0.5, y=y, showarrow=False,
                       font={"size": 11, "color": "gray"})


def _synthetic(rows: list[dict[str, Any]]) -> str:
    return synthetic_line(any(str(r.get("model", "")).startswith("synthetic:") for r in rows))
