"""Lab 10's latency under load: decode steps shared with the prefill of new arrivals, as percentiles.

`latency.predicted_tpot_ms` prices a decode step with every request decoding together. A server under load also
admits new requests, and vLLM's scheduler puts their prompt tokens (chunks of at most `max_num_batched_tokens`
minus the decodes) into the same steps: a step carrying a chunk takes longer, and every request decoding through it
waits. `under_load` runs the goal's own arrival process through lab 04's continuous-batching simulator
(`mechanisms.batching`) with each step priced as

    step(prefill P, decodes n) = predicted_tpot_ms(goal, batch n) + P x prefill_ms_per_token(step of P + n tokens)

`prefill_ms_per_token` is one prompt token's compute (2 x parameters per GPU / peak FLOP/s) over the efficiency the
8B's largest recorded prefill reached on the H200 (lab 07's runs with prefix caching off: every prompt prefilled,
the time to the last first token over the prompt tokens). Prompt tokens in whole blocks every request shares are
cached after the first request and cost nothing. Arrivals are Poisson at the goal's rate: by default 80% of the rate
at which the engines' max_num_seqs would all be busy (`little_rate`). TTFT, TPOT and every
gap (ITL) come from the simulated requests in the steady middle of the run (`steady_middle`); a request that a step
skipped (the token budget ran out) has no gaps recorded, so ITL's tail can read low. A model, checked against a real
server by `check` on a GPU, and against every server the H200 recorded by `served`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from ... import validate
from ...bench.goodput import SLO, goodput
from ...bench.loadgen import arrival_times
from ...mechanisms.batching import continuous_batching
from ...results.record import RequestRecord, Result
from ...stats import in_ms
from .latency import cached_tokens, loaded_tpot_ms, predicted_tpot_ms, prefill_ms_per_token, server_overhead_ms
from .plan import Goal, plan

# vLLM 0.26's OpenAI server on a GPU of 70 GiB or more (not an A100): engine/arg_utils.py's defaults
SERVER_MAX_NUM_BATCHED_TOKENS = 8192
TARGET = 0.10  # the advisor's aim: its TPOT p90 within 10% of the measured one (`check`, `served`)


class StepCost:
    """The simulator's step price for one engine of the goal (ms): decode at that batch plus the prefill chunk."""

    def __init__(self, goal: Goal, scheme: str, t: int, kv: str) -> None:
        self.goal, self.scheme, self.t, self.kv = goal, scheme, t, kv
        self._decode = lru_cache(maxsize=None)(lambda n: predicted_tpot_ms(goal, scheme, t, max(n, 1), kv))
        self._per_token = lru_cache(maxsize=None)(lambda n: prefill_ms_per_token(goal, scheme, t, n))

    def step_time(self, prefill_tokens: int, decode_seqs: int) -> float:
        """A step's time (ms): its decodes, and its prompt tokens at the price of a step of its size (FP8's gain over
        bf16 grows with the tokens a step carries: `latency.fp8_prefill_speedup`)."""
        if not prefill_tokens:
            return self._decode(decode_seqs)
        return self._decode(decode_seqs) + prefill_tokens * self._per_token(prefill_tokens + decode_seqs)


UTILISATION = 0.8  # the goal's arrivals load each engine to this share of what would keep its max_num_seqs all busy


def little_rate(goal: Goal, advice: dict[str, Any], utilisation: float = UTILISATION) -> float:
    """The goal's arrival rate (requests/s, all engines): `utilisation` x the rate at which every engine's
    max_num_seqs would be busy (Little's law: in flight / the predicted E2E, its prefill then its tokens at the loaded
    TPOT). Below 1, a queue forms in bursts and drains; at 1 it would grow for as long as the run lasts."""
    n = advice["max_num_seqs"]
    tpot = loaded_tpot_ms(goal, advice["scheme"], advice["t"], n, advice["kv"])
    e2e_ms = (goal.prompt_tokens * prefill_ms_per_token(goal, advice["scheme"], advice["t"], goal.prompt_tokens)
              + goal.output_tokens * tpot)
    return utilisation * n * advice["replicas"] / (e2e_ms / 1e3)


def simulate(goal: Goal, advice: dict[str, Any], rate: float, requests: int, seed: int = 0,
             max_num_batched_tokens: int = SERVER_MAX_NUM_BATCHED_TOKENS) -> Result:
    """One engine's share of the load (rate / replicas) through the simulator; a Result with every token's time (s),
    the ramp up and the drain (the first and last `concurrency` requests) left out."""
    cost = StepCost(goal, advice["scheme"], advice["t"], advice["kv"])
    cached = cached_tokens(goal)
    requests_ = [(goal.prompt_tokens, cached if i else 0, goal.output_tokens) for i in range(requests)]
    arrivals = list(arrival_times(requests, rate / advice["replicas"], seed))
    records = replay(cost, requests_, arrivals, advice["max_num_seqs"], max_num_batched_tokens)
    wall = max(r.last_token for r in records) - min(r.arrival for r in records)
    return steady_middle(Result(lab="10_the_whole_journey", step="advisor-under-load", engine="simulator", config={
        "rate": rate, "replicas": advice["replicas"], "max_num_seqs": advice["max_num_seqs"],
        "max_num_batched_tokens": max_num_batched_tokens, "seed": seed}, model={"name": goal.model, "synthetic": True},
        workload={"name": "goal", "requests": len(records)}, requests=records, wall_s=wall,
        notes=["a model: lab 04's simulator priced by lab 09's cost model and lab 06's and 07's recorded runs"]),
        goal.concurrency)


def replay(cost: StepCost, requests: Sequence[tuple[int, int, int]], arrivals: Sequence[float], max_num_seqs: int,
           max_num_batched_tokens: int = SERVER_MAX_NUM_BATCHED_TOKENS) -> list[RequestRecord]:
    """Requests (prompt tokens, of which cached, new tokens) arriving at `arrivals` (s) through lab 04's scheduler
    simulator, each step priced by `cost`: one RequestRecord each, every token stamped with its step's end (s)."""
    pairs = [(prompt - cached, out) for prompt, cached, out in requests]
    sim = continuous_batching(pairs, max_num_seqs=max_num_seqs, arrivals=[t * 1e3 for t in arrivals], cost=cost,
                              max_num_batched_tokens=max_num_batched_tokens)
    ends = [s.end for s in sim.steps]
    index = {e: i for i, e in enumerate(ends)}
    records = []
    for r in sim.records:
        times = [e / 1e3 for e in ends[index[r.first_token]:index[r.finish] + 1]]
        records.append(RequestRecord(f"sim-{r.request_id}", requests[r.request_id][0], r.output_len,
                                     arrival=r.arrival / 1e3, start=r.start / 1e3, first_token=r.first_token / 1e3,
                                     last_token=r.finish / 1e3,
                                     token_times=times if len(times) == r.output_len else None))  # None: a step
        # skipped it (the token budget ran out), so its gaps are not one step each
    return records


def steady_middle(result: Result, concurrency: int) -> Result:
    """The run without its ramp up and its drain: requests by arrival, the first and last `concurrency` left out (a
    quarter each where that would leave less than a third), over the time the rest took."""
    reqs = sorted(result.requests, key=lambda r: r.arrival)
    ramp = concurrency if len(reqs) > 3 * concurrency else len(reqs) // 4
    kept = reqs[ramp:len(reqs) - ramp]
    ends = [r.last_token for r in kept if r.last_token is not None]
    wall = (max(ends) - min(r.arrival for r in kept)) if ends else result.wall_s
    return replace(result, requests=kept, wall_s=wall, summary={}, workload={**result.workload, "requests": len(kept)})


def under_load(goal: Goal, advice: dict[str, Any] | None = None, *, rate: float | None = None,
               requests: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Predicted TTFT, TPOT and ITL (ms, p50/p90/p99) of the advised engine under the goal's arrivals, beside the steady
    all-decoding TPOT `plan` reports, and the goodput against the goal's TPOT target (p90). TTFT carries the server's
    own time per request (`latency.server_overhead_ms`), which the simulated engine does not see."""
    advice = advice or plan(goal)
    rate = little_rate(goal, advice) if rate is None else validate.number(
        "under_load", "rate", rate, "requests per second > 0, or None for the goal's own (Little's law).", 0.0,
        low_open=True)
    requests = requests or max(8 * goal.concurrency, 400)
    result = simulate(goal, advice, rate, requests, seed)
    s = result.summary
    overhead = server_overhead_ms()[0]  # the server's own time per request, outside the simulated engine
    out = {"rate_rps": rate, "requests": requests, "server_overhead_ms": overhead,
           "ttft_ms": {k: v + overhead for k, v in in_ms(s["ttft_s"]).items()}, "tpot_ms": in_ms(s["tpot_s"]),
           "alone_tpot_ms": predicted_tpot_ms(goal, advice["scheme"], advice["t"], 1, advice["kv"]),
           "itl_ms": in_ms(s["itl_s"]), "steady_tpot_ms": predicted_tpot_ms(goal, advice["scheme"], advice["t"],
                                                                        advice["max_num_seqs"], advice["kv"]),
           "result": result}
    if goal.tpot_slo_ms is not None:
        out["goodput"] = goodput(result, SLO(tpot_ms=goal.tpot_slo_ms, percentile=90))
    return out
