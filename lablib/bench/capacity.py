"""The SLO capacity search: the highest Poisson arrival rate at which an SLO still holds, answered as an interval.

Well below a server's capacity every request is served at the pace of a small batch; past it the queue, and TTFT
with it, grows for as long as the test runs. In between, the share of requests meeting their targets falls with
the rate, and the search brackets where it crosses the SLO's percentile:

1. `low` must hold and `high` must fail (both measured first; where `high` holds, it grows fourfold up to `grow`
   times; where one still does not, the answer lies outside the bounds and says which way);
2. then bisect (geometrically: rates span decades) for at most `rounds` probes, or until high / low <= 1 + rel_tol.

Each probe is one load test of N requests (`measure(rate, seed) -> Result`) judged by `goodput.goodput`. Its
attainment is a share of N, so it carries binomial noise: a probe holds when the Wilson interval (95%) of its
attainment lies above the percentile and fails when it lies below. One that straddles it is measured again with
the next seed, up to `repeats` times, pooling the requests; still straddling, it counts as failing and is marked
`uncertain`, so the interval errs low. Latency is assumed never to improve with load (bisection cannot see a
rate that holds above one that failed). The interval treats requests as independent; under load, misses come in
runs while a queue lasts, so the true uncertainty is wider than Wilson's.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from .. import validate
from ..results.record import Result
from .goodput import SLO, goodput

Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


def wilson(good: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a share good / n (sound near 0 and 1, unlike p +- z*se)."""
    if n == 0:
        return 0.0, 1.0
    p, z2 = good / n, z * z
    centre, half = (p + z2 / (2 * n)) / (1 + z2 / n), z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def requests_to_decide(percentile: float, z: float = Z95) -> int:
    """The fewest requests whose all-good attainment the Wilson interval puts above `percentile`: a probe smaller than
    this can never hold (n > z^2 p / (1 - p))."""
    p = percentile / 100
    return math.floor(z * z * p / (1 - p)) + 1


def check_search(slo: SLO, low: float, high: float, requests: int, rounds: int, repeats: int, rel_tol: float) -> None:
    """Refuse a search that cannot answer, before any server starts."""
    validate.number("capacity_search", "low", low, "requests per second > 0, e.g. 0.5.", 0.0, low_open=True)
    validate.number("capacity_search", "high", high, f"a rate above low={low:g}, e.g. {low * 16:g}.", low,
                    low_open=True)
    validate.integer("capacity_search", "rounds", rounds, "bisection probes after the bounds, e.g. 6.", 0)
    validate.integer("capacity_search", "repeats", repeats, "re-measurements of a probe too close to call, e.g. 2.", 0)
    validate.number("capacity_search", "rel_tol", rel_tol, "stop when high / low <= 1 + rel_tol, e.g. 0.1.", 0.0, 1.0,
                    low_open=True, high_open=True)
    need = requests_to_decide(slo.percentile)
    if requests * (1 + repeats) < need:
        raise validate.refuse("capacity_search", "requests", requests,
                              f">= {need} requests a probe (with repeats) for a {slo.percentile:g}% target",
                              f"send more requests per probe or allow repeats (requests x (1 + repeats) >= {need}), "
                              "or a lower percentile.")


def capacity_search(measure: Callable[[float, int], Result], slo: SLO, low: float, high: float, *, requests: int,
                    rounds: int = 6, repeats: int = 2, rel_tol: float = 0.1, seed: int = 0, grow: int = 0,
                    on_probe: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Bracket the highest arrival rate (req/s) at which `slo` holds; `measure(rate, seed)` runs one load test of
    `requests` requests at that rate. Returns the interval, every probe (rate, attainment, its interval, goodput,
    seconds), and a verdict; `on_probe` gets each probe as it is judged."""
    check_search(slo, low, high, requests, rounds, repeats, rel_tol)
    validate.integer("capacity_search", "grow", grow, "times `high` may grow fourfold while it holds, e.g. 3.", 0)
    probes: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def probe(rate: float) -> bool:
        good = sent = 0
        runs: list[dict[str, Any]] = []
        for r in range(1 + repeats):
            judged = goodput(measure(rate, seed + r), slo)
            runs.append(judged)
            good, sent = good + judged["good"], sent + judged["sent"]
            lo, hi = wilson(good, sent)
            if lo * 100 >= slo.percentile or hi * 100 < slo.percentile:
                break
        held = lo * 100 >= slo.percentile
        row = {"rate": rate, "holds": held, "uncertain": not held and hi * 100 >= slo.percentile,
               "attainment": good / sent if sent else 0.0, "interval": (lo, hi), "requests": sent, "runs": len(runs),
               "goodput_rps": sum(j["goodput_rps"] for j in runs) / len(runs),
               "at_percentile_ms": runs[-1]["at_percentile_ms"], "duration_s": sum(j["duration_s"] for j in runs)}
        probes.append(row)
        if on_probe is not None:
            on_probe(row)
        return held

    low_holds = probe(low)
    high_holds = probe(high) if low_holds else None
    for _ in range(grow):
        if not high_holds:
            break
        low, high = high, high * 4
        high_holds = probe(high)
    lo, hi = (low, high) if low_holds and not high_holds else (None, low) if not low_holds else (high, None)
    for _ in range(rounds if lo is not None and hi is not None else 0):
        if hi / lo <= 1 + rel_tol:
            break
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if probe(mid) else (lo, mid)
    if lo is None:
        verdict = (f"the SLO ({slo.label}) fails even at low={low:g} req/s: lower the bound, or the targets cannot "
                   "be met on this server at any rate (see the probe's percentiles)")
    elif hi is None:
        verdict = f"the SLO ({slo.label}) holds even at high={high:g} req/s: the capacity is above it; raise high"
    else:
        verdict = (f"the SLO ({slo.label}) holds at {lo:.3g} req/s and fails at {hi:.3g}: capacity in "
                   f"[{lo:.3g}, {hi:.3g}] req/s, after {len(probes)} probes of {requests} requests")
    return {"slo": slo.label, "interval_rps": (lo, hi), "capacity_rps": lo, "probes": probes,
            "probe_count": len(probes), "requests_per_probe": requests, "repeats": repeats, "rel_tol": rel_tol,
            "seconds": time.perf_counter() - t0,
            "noise": f"each probe's attainment with its Wilson 95% interval; a probe straddling {slo.percentile:g}% "
                     f"is re-measured up to {repeats} times, then counted as failing",
            "verdict": verdict}
