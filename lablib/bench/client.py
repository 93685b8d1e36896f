"""The load generator's own instrument checks: did the client keep up with the server, and how fast can it read?

A harness that times a server can end up timing itself: one Python event loop reads every
stream, and when events arrive faster than it reads them they wait in the socket, are
stamped late, and the "server" looks slower. Two checks catch it: the client's request
latency against the server's own (`client_check`, from `/metrics` histograms), and the
share of token events read in clumps. `client_ceiling` measures the client alone against a
stub server that streams as fast as it can write (`lablib.bench.sse_stub`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .. import validate
from ..results.record import Result
from . import sse_stub
from .loadgen import load_test, run_sync


def client_ceiling(streams: int = 256, tokens: int = 120) -> dict[str, Any]:
    """How many token events per second this machine's client can read at most: the load generator's own limit.

    Starts `lablib.bench.sse_stub` (a server that streams as fast as it can write) in its own process,
    runs the lab's load test against it twice (the second, warm, counts) with `streams`
    requests at once of `tokens` events each, and returns {"library", "streams", "events",
    "cpu_us_per_event", "ceiling_events_s"}: one core's worth of events at that cost. A server
    that streams faster than `ceiling_events_s` (vLLM with a small model, a burst of hundreds
    of requests) is measured by a client that cannot keep up.
    """
    validate.integer("client_ceiling", "streams", streams, "e.g. 256 streams at once.")
    validate.integer("client_ceiling", "tokens", tokens, "e.g. 120 token events per stream.")
    stats: dict[str, Any] = {}
    with sse_stub.running() as base:
        for _ in range(2):
            stats.clear()
            _, errors = run_sync(load_test(base, None, "stub", [[1, 2, 3]] * streams, [tokens] * streams, math.inf, 0,
                                           stats=stats))
            if errors:
                raise RuntimeError(f"client_ceiling: {len(errors)} requests to the stub failed: {errors[0]}")
    per_event = stats["cpu_s"] / stats["events"]
    return {"library": stats["library"], "streams": streams, "events": stats["events"],
            "cpu_us_per_event": per_event * 1e6, "ceiling_events_s": 1 / per_event}


CLUMP_S = 2e-4  # two token events read closer than this arrived in one read: the client was reading a backlog


def read_gaps(result: Result) -> list[float]:
    """Every gap between consecutive token events of each stream of a load test, as the client read them (s)."""
    return [b - a for r in result.requests for a, b in zip(r.token_times or [], (r.token_times or [])[1:])]


def clumped_share(gaps: Sequence[float]) -> float | None:
    """The share of gaps between a stream's token events under CLUMP_S (0.2 ms).

    The server sends each stream at most one event per engine step (milliseconds apart); two
    events read within 0.2 ms of each other waited in the socket for the client. A client that
    keeps up reads almost none that way (vLLM's own client: 0.1-0.4% on the H200); one that
    falls behind reads many.
    """
    return sum(g < CLUMP_S for g in gaps) / len(gaps) if gaps else None


def client_check(result: Result, max_lag: float = 1.2, max_clumped: float = 0.05,
                 reference_clumped: float | None = None) -> dict[str, Any]:
    """Did the load generator keep up with the server? Its own request latency next to the server's, and its reads.

    The server times every request twice, and `/metrics` read before and after the test
    (`engine_facts["server_latency"]`, `prom.window_means`) gives both means over exactly this
    test: the API server's, from the HTTP request reaching it to its last chunk handed to the
    socket (`http_request_duration_seconds`), and the engine's, from the request's arrival at
    the engine to its last token (`e2e_request_latency_seconds`). Their difference is the API
    server's own share: tokenizing, queueing for the engine, streaming out; at a fast model's
    burst it is a tenth or more of the latency, and every client sees it. The client's mean
    runs from sending to reading the last token; a client that keeps up reads it as the API
    server sends it, so `lag` (client over API server; over the engine on servers without
    the HTTP histogram) stays near 1, plus a network hop.

    The second sign needs no server: a client that falls behind finds two or more of a
    stream's token events waiting in the socket and reads them in one go. `clumped` is the
    share of such gaps (`clumped_share`); a client that keeps up reads almost none (vLLM's own
    client, 0.1-0.4% on the H200). The client kept up when lag <= `max_lag` and clumped <=
    `max_clumped`; otherwise its TTFT, TPOT and throughput describe the client, not the server.

    A server can clump events itself: when its own event loop is saturated (a tiny model's
    hundreds of streams) it writes several of a stream's events at once, and every client reads
    them together. `reference_clumped`, the share another client (`vllm bench serve`) read in
    clumps from the same server under the same load, separates the two: then only the lab's
    clumps beyond the reference's (`excess_clumped`) count against it.
    `tokens_per_event` above 1 says the server merged a stream's tokens into one event (vLLM does
    when its API server falls behind: ~3 at a tiny model's 256 streams on the H200), so `client_itl_ms`,
    a gap between events, is then longer than the server's per-token `server_itl_ms`.
    `busy` is the client thread's CPU time over the test's wall time (in a notebook other
    threads share the GIL, so a client can fall behind well below busy = 1).
    """
    recs = [r for r in result.requests if r.start is not None and r.last_token is not None]
    client_e2e = sum(r.last_token - r.start for r in recs) / len(recs) if recs else None
    gapped = [r for r in recs if r.token_times and len(r.token_times) > 1]
    n = sum(len(r.token_times) - 1 for r in gapped)
    client_itl = sum(r.last_token - r.first_token for r in gapped) / n if n else None
    events = sum(len(r.token_times) for r in recs if r.token_times)
    tokens_per_event = sum(r.output_tokens for r in recs if r.token_times) / events if events else None
    clumped = clumped_share(read_gaps(result))
    server = (result.engine_facts or {}).get("server_latency") or {}
    server_e2e, server_itl, server_http = server.get("e2e_s"), server.get("itl_s"), server.get("http_s")
    reference = server_http or server_e2e
    lag = client_e2e / reference if client_e2e and reference else None
    api_share = (server_http - server_e2e) / server_http if server_http and server_e2e else None
    client = (result.engine_facts or {}).get("client") or {}
    busy = client.get("busy")
    # clumped reads alone are enough to say the client fell behind; keeping up needs the server's latencies too
    excess = None if clumped is None else clumped - (reference_clumped or 0.0)
    if excess is not None and excess > max_clumped:
        kept_up: bool | None = False
    else:
        kept_up = None if lag is None else bool(lag <= max_lag)
    ms = lambda x: None if x is None else x * 1e3  # noqa: E731
    parts = []
    if lag is None:
        parts.append(("the client FELL BEHIND (it read its token events in clumps; its latencies and throughput "
                      "describe the client, not the server); " if kept_up is False else "") +
                     "no server-side latencies to compare with: the server's /metrics was not read during this "
                     "test (or the run predates this check)")
    else:
        who = "the API server" if server_http else "the engine (no HTTP histogram in this run)"
        parts.append(("the client kept up" if kept_up else "the client FELL BEHIND (its latencies and throughput "
                      "describe the client, not the server)") + f": mean request latency {client_e2e * 1e3:,.1f} ms "
                     f"as read, {reference * 1e3:,.1f} ms as {who} timed it (lag {lag:.2f})")
        if api_share is not None:
            parts.append(f"the engine's part {server_e2e * 1e3:,.1f} ms, the API server's own {api_share:.0%}")
        if busy:
            parts.append(f"the client's thread was busy {busy:.0%} of the test")
    if clumped is not None and reference_clumped is None:
        parts.append(f"{clumped:.1%} of the gaps between tokens were read in clumps (events that waited for the client)")
    elif clumped is not None:
        parts.append(f"{clumped:.1%} of the gaps between tokens were read in clumps, the reference client "
                     f"{reference_clumped:.1%} on the same server (the server's own bursts): {excess:+.1%} the "
                     f"client's own (allowed {max_clumped:.0%})")
    verdict = "; ".join(parts)
    return {"client_e2e_ms": ms(client_e2e), "server_e2e_ms": ms(server_e2e), "server_http_ms": ms(server_http),
            "lag": lag, "api_share": api_share, "tokens_per_event": tokens_per_event, "client_itl_ms": ms(client_itl), "server_itl_ms": ms(server_itl),
            "clumped": clumped, "reference_clumped": reference_clumped, "excess_clumped": excess, "busy": busy, "events": client.get("events"), "library": client.get("library"),
            "kept_up": kept_up, "verdict": verdict}
