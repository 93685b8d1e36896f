"""Lab 05's Checks cell, on the lab's object."""
from __future__ import annotations

from ...config import lab_id
from ...session import Checks
from . import runs
from .lab import ServingLab


def checks(lab: ServingLab) -> None:
    """Lab 05's Checks cell: the client's ceiling measured here; where the server ran live, more load more queueing,
    every request back, the client kept up, and the lab's client agreeing with `vllm bench serve`; the capacity
    search answered an interval; the tuning front trades tokens per GPU for tokens per user."""
    lab.require_all()
    online, verdict, ceiling = lab.online, lab.verdict, lab.ceiling
    c = Checks(lab_id("05"))
    c.that("the client's ceiling was measured on this machine",
           ceiling["cpu_us_per_event"] > 0 and ceiling["ceiling_events_s"] > 0, ceiling["library"])
    c.live(online, "more load, more queueing: median TTFT at the highest rate over 2x the lowest", runs.ttft_grows)
    c.live(online, "every request of every load test came back",
           lambda v: all(len(r.requests) == 256 and not r.notes for r in v["results"]))
    c.live(verdict, "the lab's client measured the server, not itself", lambda v: v["kept_up"] is not False,
           lambda v: v["verdict"])
    # one burst each: within what single bursts scatter on the embedded model; repeated rounds agree (tests/results)
    c.live(online, "lab / vllm bench serve output tok/s within 0.8-1.25",
           lambda v: 0.8 < v["compare"]["figures"]["output_tok_s"]["ratio"] < 1.25,
           lambda v: v["compare"]["figures"]["output_tok_s"])
    lo, hi = lab.found["interval_rps"]
    c.that(f"the capacity search bracketed the SLO: it held at the interval's low end, failed at its high end "
           f"[{lab.found_where}]", lo is not None and hi is not None and lo < hi, lab.found["verdict"])
    best = lab.tuned["front"]
    c.that(f"the tuning front trades one for the other: its busiest point ran more requests at once for over 2x the "
           f"tokens per GPU of its fastest point per user [{lab.tuned_where}]",
           len(best) >= 2 and best[-1]["concurrency"] > best[0]["concurrency"]
           and best[-1]["tok_s_per_gpu"] > 2 * best[0]["tok_s_per_gpu"],
           [(p["concurrency"], round(p["tok_s_per_gpu"]), round(p["tok_s_per_user"], 1)) for p in best])
    c.done()
