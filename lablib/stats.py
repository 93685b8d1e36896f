"""Percentiles and distributions: how every latency in lablib is summarised and printed; the chi-square test.

One definition everywhere (a simulator's schedule, a live run, a recording): linear
interpolation between order statistics, numpy's default, so p50 of [1, 2] is 1.5 and a
figure's p99 means the same thing in every lab. Pure Python.

The chi-square test (lab 08's "speculative sampling keeps p"), without scipy: `chi2_sf` is Numerical Recipes'
`gammq`; `goodness_of_fit` (counts against probabilities) and `homogeneity` (two samples, stratified) pool bins
whose expected count is below 5, as the test requires; `detectable_w` states a test's power as the effect size
(Cohen's w) it finds 9 times in 10, through the noncentral chi-square.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from . import validate

PERCENTILES = (50, 90, 99)
LEVEL = 0.01  # the chi-square tests' default level


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


def in_ms(dist: dict[str, float | None]) -> dict[str, float | None]:
    """A `distribution` of seconds in milliseconds (None stays None)."""
    return {k: None if v is None else v * 1e3 for k, v in dist.items()}


def spread(values: Sequence[float]) -> float | None:
    """(max - min) / mean of a few repeated measurements: how far one repetition can be from another."""
    xs = list(values)
    if len(xs) < 2:
        return None
    mean = sum(xs) / len(xs)
    return (max(xs) - min(xs)) / mean if mean else None


def latency_text(seconds: float | None) -> str:
    """A latency as a person reads it: ms below 10 s ("358 ms", "4.2 ms"), seconds above ("20.1 s", never
    "228,550 ms"); "—" for None."""
    if seconds is None:
        return "—"
    if seconds >= 10:
        return f"{seconds:,.1f} s"
    ms = seconds * 1e3
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms"


# --- the chi-square test ------------------------------------------------------------------------------------------

def gamma_q(a: float, x: float) -> float:
    """The regularized upper incomplete gamma Q(a, x) (Numerical Recipes' gammq): a series below x = a + 1, else
    a continued fraction (modified Lentz); both to 1e-15 relative."""
    validate.number("gamma_q", "a", a, "pass a > 0 (half the degrees of freedom).", 0.0, low_open=True)
    validate.number("gamma_q", "x", x, "pass x >= 0 (half the statistic).", 0.0, allow_inf=True)
    if x == 0 or math.isinf(x):
        return 1.0 if x == 0 else 0.0
    front = math.exp(-x + a * math.log(x) - math.lgamma(a))
    if x < a + 1:  # P(a, x) = front / a * sum_n x^n / ((a+1)...(a+n))
        term = total = 1.0 / a
        for n in range(1, 100_000):
            term *= x / (a + n)
            total += term
            if abs(term) < abs(total) * 1e-15:
                return max(0.0, 1.0 - front * total)
    else:
        tiny, b = 1e-300, x + 1 - a
        c, d = 1 / tiny, 1 / b
        h = d
        for i in range(1, 100_000):
            an, b = -i * (i - a), b + 2
            d, c = an * d + b, b + an / c
            d, c = 1 / (d if abs(d) > tiny else tiny), c if abs(c) > tiny else tiny
            h *= d * c
            if abs(d * c - 1) < 1e-15:
                return front * h
    raise ArithmeticError(f"gamma_q({a}, {x}) did not converge")  # pragma: no cover - never at a, x of a test


def chi2_sf(x: float, df: float) -> float:
    """P(chi-square with df degrees of freedom > x) = Q(df/2, x/2): a test's p-value."""
    return gamma_q(df / 2, x / 2)


def noncentral_chi2_sf(x: float, df: float, nc: float) -> float:
    """P(noncentral chi-square > x): central ones of df + 2j degrees mixed by Poisson(nc / 2) weights."""
    mean = nc / 2
    if mean == 0:
        return chi2_sf(x, df)
    terms = range(int(mean + 12 * math.sqrt(mean) + 30))
    return sum(math.exp(-mean + j * math.log(mean) - math.lgamma(j + 1)) * chi2_sf(x, df + 2 * j) for j in terms)


def _solve(f: Any, lo: float, hi: float) -> float:
    """The root of a function rising in [lo, hi], by bisection."""
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def detectable_w(df: int, n: float, alpha: float = LEVEL, power: float = 0.9) -> float:
    """The power statement: the effect size w = sqrt(sum (p1 - p0)^2 / p0) (Cohen's w; 0.1 small, 0.3 medium) that a
    chi-square test of df degrees on n samples (two samples: n_a n_b / (n_a + n_b)) rejects with `power` at `alpha`.
    The statistic is then noncentral chi-square with noncentrality n w^2."""
    crit = _solve(lambda c: alpha - chi2_sf(c, df), 0.0, df + 100 * math.sqrt(df) + 100)
    nc = _solve(lambda m: noncentral_chi2_sf(crit, df, m) - power, 0.0, 10 * (crit + 50))
    return math.sqrt(nc / n)


def _pool(expected: list[float], *observed: list[float]) -> list[list[float]]:
    """Bins whose expected count is below 5 summed into one bin (into the smallest other bin, if still below 5)."""
    rows = [expected, *observed]
    keep = [i for i, e in enumerate(expected) if e >= 5]
    rare = [i for i, e in enumerate(expected) if e < 5]
    out = [[r[i] for i in keep] for r in rows]
    if rare:
        pooled = [sum(r[i] for i in rare) for r in rows]
        if pooled[0] < 5 and keep:
            j = min(range(len(keep)), key=lambda m: out[0][m])
            for r, extra in zip(out, pooled):
                r[j] += extra
        elif pooled[0] > 0:
            for r, extra in zip(out, pooled):
                r.append(extra)
    return out


def _row(statistic: float, df: int, n: int, alpha: float, same: str, differs: str) -> dict[str, Any]:
    p_value = chi2_sf(statistic, df) if df else 1.0
    return {"statistic": statistic, "df": df, "p_value": p_value, "n": n,
            "verdict": same if p_value >= alpha else differs}


def goodness_of_fit(counts: Sequence[int], probs: Sequence[float], alpha: float = LEVEL) -> dict[str, Any]:
    """Pearson's chi-square of observed counts against probabilities (no parameter fitted: df = bins - 1)."""
    n = sum(counts)
    validate.integer("goodness_of_fit", "n", n, "pass counts of at least one observation.", 1)
    expected, observed = _pool([n * p for p in probs], list(counts))
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return {**_row(statistic, len(expected) - 1, n, alpha, "consistent with p", "rejected"), "bins": len(expected)}


def homogeneity(strata: Sequence[tuple[Counter, Counter]], alpha: float = LEVEL) -> dict[str, Any]:
    """Two samples from one distribution? Pearson's chi-square of a 2 x bins table per stratum, summed (df add up);
    n is the first samples' size."""
    statistic, df, n = 0.0, 0, 0
    for a, b in strata:
        na, nb = sum(a.values()), sum(b.values())
        cats = sorted(set(a) | set(b))
        share = [(a[c] + b[c]) / (na + nb) for c in cats]  # pooled on the smaller sample's expected counts
        _, obs_a, obs_b, share = _pool([min(na, nb) * s for s in share], [a[c] for c in cats], [b[c] for c in cats],
                                       share)
        exp_a, exp_b = [na * s for s in share], [nb * s for s in share]
        statistic += sum((o - e) ** 2 / e for o, e in zip(obs_a + obs_b, exp_a + exp_b))
        df, n = df + len(exp_a) - 1, n + na
    return _row(statistic, df, n, alpha, "same distribution", "differ")
