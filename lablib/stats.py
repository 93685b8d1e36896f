"""Percentiles and distributions: how every latency in lablib is summarised.

One definition everywhere (a simulator's schedule, a live run, a recording): linear
interpolation between order statistics, numpy's default, so p50 of [1, 2] is 1.5 and a
figure's p99 means the same thing in every lab. Pure Python.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of a non-empty sequence, linearly interpolated (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values: pass at least one value.")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q!r}: allowed 0..100; Fix: e.g. 50 for the median, 99 for the tail.")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def percentile_of(values: Iterable[float | None], q: float) -> float | None:
    """The percentile of the values that are not None; None when there are none."""
    xs = [v for v in values if v is not None]
    return percentile(xs, q) if xs else None


def distribution(values: Iterable[float | None]) -> dict[str, float | None]:
    """Mean and the p50/p90/p99 of the values that are not None (all None when there are none)."""
    xs = [v for v in values if v is not None]
    out: dict[str, float | None] = {"mean": sum(xs) / len(xs) if xs else None}
    out.update({f"p{q}": percentile(xs, q) if xs else None for q in PERCENTILES})
    return out


def spread(values: Sequence[float]) -> float | None:
    """(max - min) / mean of a few repeated measurements: how far one repetition can be from another."""
    xs = list(values)
    if len(xs) < 2:
        return None
    mean = sum(xs) / len(xs)
    return (max(xs) - min(xs)) / mean if mean else None
