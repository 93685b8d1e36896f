"""Goodput: the requests per second that met their latency targets, from the records every run keeps.

Peak throughput counts every token, however late. A deployment counts a request only when its user saw the first
token soon enough (TTFT) and the rest fast enough (TPOT; or no gap longer than a limit: ITL). Goodput is the rate
of those requests, as `vllm bench serve --goodput ttft:MS tpot:MS e2el:MS` defines it (after DistServe, Zhong et
al., OSDI 2024): a request is good when every figure with a target is within it (a request of one output token has
TPOT 0; a failed request is never good), and goodput = good requests / the run's duration.

An SLO also says how many requests must be good: `percentile=90` holds when at least 90% of the requests sent
met every target (failed requests count against it; the SLO is a share of requests, not an interpolated
percentile, so with one target the two can differ near the edge).

TTFT and E2E are counted from the request's scheduled arrival (the lab's clock: a request the client or the server
kept waiting is late for its user) or, as `vllm bench serve` counts them, from when it was sent (`clock="send"`).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import validate
from ..results.record import RequestRecord, Result
from ..stats import percentile_of

FIGURES = ("ttft", "tpot", "itl", "e2el")  # itl: a request's longest gap between two tokens
BENCH_FIGURES = ("ttft", "tpot", "e2el")  # what `vllm bench serve --goodput` accepts
CLOCKS = ("arrival", "send")


@dataclass(frozen=True)
class SLO:
    """Latency targets in milliseconds (None: no target on that figure) and the share of requests that must meet
    all of them, in percent."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None  # every gap between two of a request's tokens at most this (no stall longer)
    e2el_ms: float | None = None
    percentile: float = 90.0  # the SLO holds when at least this % of the requests sent met every target

    def __post_init__(self) -> None:
        for name in FIGURES:
            value = getattr(self, f"{name}_ms")
            if value is not None:
                validate.number("SLO", f"{name}_ms", value, "milliseconds, e.g. 20 for TPOT or 500 for TTFT; None "
                                "for no target.", 0.0, low_open=True)
        if not self.targets:
            raise validate.refuse("SLO", "ttft_ms/tpot_ms/itl_ms/e2el_ms", None, "at least one target",
                                  "give e.g. SLO(ttft_ms=500, tpot_ms=20).")
        validate.number("SLO", "percentile", self.percentile, "the share of requests that must meet the targets, "
                        "e.g. 90 or 99.", 0.0, 100.0, low_open=True, high_open=True)

    @property
    def targets(self) -> dict[str, float]:
        """{figure: ms} for the figures with a target."""
        return {f: getattr(self, f"{f}_ms") for f in FIGURES if getattr(self, f"{f}_ms") is not None}

    @property
    def label(self) -> str:
        names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "every gap", "e2el": "E2E"}
        return (", ".join(f"{names[f]} <= {ms:g} ms" for f, ms in self.targets.items())
                + f" for {self.percentile:g}% of requests")

    def bench_args(self) -> list[str]:
        """`vllm bench serve`'s `--goodput` values for these targets (it has no ITL target: one here is refused)."""
        if self.itl_ms is not None:
            raise validate.refuse("SLO", "itl_ms", self.itl_ms, f"targets vllm bench serve knows: {BENCH_FIGURES}",
                                  "referee an SLO without itl_ms (its TPOT target is the per-request mean gap).")
        return [f"{f}:{ms:g}" for f, ms in self.targets.items()]


def figures_ms(r: RequestRecord, clock: str = "arrival") -> dict[str, float | None]:
    """One request's TTFT, TPOT, longest gap and E2E in ms (None where it has no such figure: no first token)."""
    if r.first_token is None:
        return dict.fromkeys(FIGURES)
    zero = r.start if clock == "send" and r.start is not None else r.arrival
    end = r.finished if r.finished is not None else r.last_token
    gaps = r.itls
    return {"ttft": (r.first_token - zero) * 1e3,
            "tpot": (r.tpot or 0.0) * 1e3,  # vLLM's rule: one output token, TPOT 0
            "itl": max(gaps) * 1e3 if gaps else (0.0 if r.output_tokens < 2 else None),  # None: gaps unknown
            "e2el": None if end is None else (end - zero) * 1e3}


def good(figures: dict[str, float | None], slo: SLO) -> bool:
    """Whether one request's figures meet every target of `slo`."""
    return all(figures.get(f) is not None and figures[f] <= ms for f, ms in slo.targets.items())


def judge(per_request: Sequence[dict[str, float | None]], sent: int, duration_s: float, slo: SLO) -> dict[str, Any]:
    """Goodput and attainment from per-request figures (ms); `sent` counts failed requests too."""
    validate.integer("goodput", "sent", sent, "the number of requests sent (completed and failed).", 0)
    validate.number("goodput", "duration_s", duration_s, "the run's duration in seconds.", 0.0, low_open=True)
    if sent < len(per_request):
        raise validate.refuse("goodput", "sent", sent, f">= the {len(per_request)} completed requests",
                              "count every request sent, failed ones included.")
    n_good, completed = sum(good(f, slo) for f in per_request), sum(f.get("ttft") is not None for f in per_request)
    missed = {f: sum(1 for x in per_request if x.get(f) is None or x[f] > ms) for f, ms in slo.targets.items()}
    attainment = n_good / sent if sent else 0.0
    at = {f: percentile_of((x.get(f) for x in per_request), slo.percentile) for f in slo.targets}
    holds = sent > 0 and attainment * 100 >= slo.percentile
    return {"slo": slo.label, "targets_ms": slo.targets, "percentile": slo.percentile, "sent": sent,
            "completed": completed, "good": n_good, "attainment": attainment, "holds": holds,
            "goodput_rps": n_good / duration_s, "requests_s": completed / duration_s, "duration_s": duration_s,
            "at_percentile_ms": at, "missed": missed,
            "verdict": (f"{n_good} of {sent} requests ({attainment:.1%}) met {slo.label.rsplit(' for ', 1)[0]}: "
                        f"goodput {n_good / duration_s:.2f} req/s of {completed / duration_s:.2f}; the SLO "
                        + ("holds" if holds else f"fails (needs {slo.percentile:g}%)"))}


def goodput(result: Result, slo: SLO, *, clock: str = "arrival") -> dict[str, Any]:
    """`judge` of one run: its requests against `slo`, over its wall time; requests it sent that failed (the
    workload's count beyond the records) count as not good."""
    validate.choice("goodput", "clock", clock, CLOCKS, "'arrival' (the lab's: from when each request was due) or "
                    "'send' (vllm bench serve's).")
    sent = max(int(result.workload.get("requests") or 0), len(result.requests))
    return judge([figures_ms(r, clock) for r in result.requests], sent, result.wall_s, slo)


def bench_figures_ms(bench: dict[str, Any]) -> list[dict[str, float | None]]:
    """Per-request figures (ms) from `vllm bench serve --save-detailed`'s lists, by vLLM's own rules: TTFT and E2E
    from when its client sent the request, TPOT (latency - ttft) / (output_len - 1), 0 for one token; a failed
    request has none."""
    out = []
    for ttft, lat, n, gaps, err in zip(bench["ttfts"], bench["latencies"], bench["output_lens"],
                                       _each(bench.get("itls"), len(bench["ttfts"])),
                                       _each(bench.get("errors"), len(bench["ttfts"]))):
        if err or not n:
            out.append(dict.fromkeys(FIGURES))
            continue
        out.append({"ttft": ttft * 1e3, "tpot": (lat - ttft) / (n - 1) * 1e3 if n > 1 else 0.0,
                    "itl": max(gaps) * 1e3 if gaps else (0.0 if n < 2 else None), "e2el": lat * 1e3})
    return out


def bench_goodput(bench: dict[str, Any], slo: SLO) -> dict[str, Any]:
    """`judge` of a `vllm bench serve --save-detailed` result by the lab's rule, over its own duration: on the same
    records, the lab's arithmetic and vLLM's `request_goodput` must give the same number."""
    return judge(bench_figures_ms(bench), len(bench["ttfts"]), bench["duration"], slo)


def _each(values: Iterable[Any] | None, n: int) -> list[Any]:
    return list(values) if values is not None else [None] * n
