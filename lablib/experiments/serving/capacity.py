"""Lab 05's SLO capacity: the highest arrival rate at which a latency target still holds (`bench.capacity`).

Two servers answer the same search:

- `on_server`: vLLM's OpenAI server on this GPU, each probe one Poisson load test of the lab's client (`run_online`),
  every probe's Result kept in the store;
- `on_simulator`: lab 04's continuous-batching simulator (`mechanisms.batching`) under the same Poisson arrivals, in
  milliseconds on any CPU: the mechanism (queueing past capacity, TTFT climbing, the SLO failing) with made-up step
  costs, labelled so. Its speeds are not a GPU's.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...bench.capacity import capacity_search, check_search
from ...bench.goodput import SLO, goodput
from ...bench.loadgen import arrival_times, run_online
from ...config import lab_id
from ...mechanisms.batching import CostModel, continuous_batching
from ...models import ModelSpec
from ...results.record import RequestRecord, Result
from ...results.store import ResultStore
from ...workloads import load_workload
from .runs import prepare, started

SIMULATOR = "simulated by lab 04's continuous batching with made-up step costs (ms), not on a GPU"


def simulated_run(pairs: list[tuple[int, int]], rate: float, seed: int, *, cost: CostModel | None = None,
                  max_num_seqs: int = 32, max_num_batched_tokens: int = 2048, lab: str = lab_id("05")) -> Result:
    """One Poisson load test on the simulator: (prompt, output) token pairs arriving at `rate` per second; a Result
    whose times are the simulator's milliseconds read as seconds / 1000."""
    sim = continuous_batching(pairs, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              arrivals=[t * 1e3 for t in arrival_times(len(pairs), rate, seed)], cost=cost)
    records = [RequestRecord(f"sim-{r.request_id}", r.prompt_len, r.output_len, arrival=r.arrival / 1e3,
                             start=r.start / 1e3, first_token=r.first_token / 1e3, last_token=r.finish / 1e3)
               for r in sim.records]
    wall = (max(r.finish for r in sim.records) - min(r.arrival for r in sim.records)) / 1e3
    return Result(lab=lab, step=f"capacity-sim-rate-{rate:g}", engine="simulator",
                  config={"rate": rate, "seed": seed, "max_num_seqs": max_num_seqs,
                          "max_num_batched_tokens": max_num_batched_tokens, "cost": vars(cost or CostModel())},
                  model={"name": "simulator", "synthetic": True}, workload={"name": "pairs", "requests": len(pairs)},
                  requests=records, wall_s=wall, notes=[SIMULATOR])


def on_simulator(slo: SLO, low: float = 1.0, high: float = 64.0, *, workload: str = "journey", repeat: int = 2,
                 cost: CostModel | None = None, max_num_seqs: int = 32, max_num_batched_tokens: int = 2048,
                 **search: Any) -> dict[str, Any]:
    """`capacity_search` on the simulator, the workload's own prompt and output lengths (repeated `repeat` times)."""
    wl = load_workload(workload).repeated(repeat)
    pairs = [(r.prompt_tokens, r.max_new_tokens) for r in wl.requests]
    measure = lambda rate, seed: simulated_run(pairs, rate, seed, cost=cost, max_num_seqs=max_num_seqs,  # noqa: E731
                                               max_num_batched_tokens=max_num_batched_tokens)
    return {**capacity_search(measure, slo, low, high, requests=len(pairs), **search), "server": SIMULATOR}


def on_server(slo: SLO, low: float | None = None, high: float | None = None, model: str | ModelSpec = "embedded",
              workload: str = "journey", repeat: int = 2, *, seed: int = 0, out_dir: str | Path | None = None,
              store: ResultStore | None = None, lab: str = lab_id("05"),
              on_probe: Callable[[dict[str, Any]], None] | None = None, rounds: int = 6, repeats: int = 2,
              rel_tol: float = 0.1, **knobs: Any) -> dict[str, Any]:
    """`capacity_search` on vLLM's OpenAI server: every input checked before it starts, one warm-up pass, then one
    load test per probe (Results to `store`, steps `capacity-rate-*`). Bounds left None come from the server's
    burst capacity C (everything sent at once): low C/16, high 2C, growing fourfold (3 times at most) while it holds.
    Where even the burst meets the SLO, no rate fails with this many requests: the answer says so, without a search.
    `knobs` go to the ServerConfig."""
    wl, cfg, out_dir, recorded = prepare(model, workload, repeat, out_dir, knobs, folder="capacity")
    lo = low if low is not None else high / 2 if high is not None else 1.0  # what can be checked before the burst
    check_search(slo, lo, high if high is not None else 2 * lo, len(wl.requests), rounds, repeats, rel_tol)
    out: dict[str, Any] = {"server": cfg.to_dict()}
    common = dict(lab=lab, store=store, step_prefix="capacity", **recorded)
    with started(cfg, out_dir, out) as server:
        burst = run_online(server.base_url, server.api_key, server.model, wl, [float("inf")], seed=seed,
                           warmup_requests=len(wl.requests), timeline=False, **common)[0]
        out["burst_capacity_rps"] = c = burst.summary["requests_s"]
        out["burst"] = judged = goodput(burst, slo)
        if judged["holds"]:
            return {"slo": slo.label, "interval_rps": (None, None), "capacity_rps": None, "probes": [], **out, "verdict": f"even everything at once meets the SLO ({slo.label}): "
                    f"{len(wl.requests)} requests cannot load this server past it; send more, or tighten the target"}
        grow = 3 if high is None else 0
        low = low if low is not None else round(c / 16, 3)
        high = high if high is not None else round(2 * c, 3)

        def measure(rate: float, probe_seed: int) -> Result:
            return run_online(server.base_url, server.api_key, server.model, wl, [rate], seed=seed + probe_seed,
                              warmup_requests=0, timeline=False,
                              **{**common, "step_prefix": f"capacity-seed{probe_seed}"})[0]

        found = capacity_search(measure, slo, low, high, requests=len(wl.requests), rounds=rounds, repeats=repeats,
                                rel_tol=rel_tol, grow=grow, on_probe=on_probe)
    return {**found, **out}


def probe_rows(found: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per probe, in the order measured: the rate, the verdict, the attainment and its interval, goodput."""
    return [{"rate": p["rate"], "holds": p["holds"], "uncertain": p["uncertain"], "attainment": p["attainment"],
             "low_95": p["interval"][0], "high_95": p["interval"][1], "requests": p["requests"],
             "goodput_rps": p["goodput_rps"], **{f"{f}_p_ms": v for f, v in p["at_percentile_ms"].items()}}
            for p in found["probes"]]

