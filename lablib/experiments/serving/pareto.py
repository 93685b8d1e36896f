"""Lab 05's tuning front: tokens per second per GPU against tokens per second per user, over the server's knobs.

A server can be tuned for the operator (most tokens per GPU: big batches) or for each user (fastest stream: small
ones), and every setting of `max_num_seqs`, `max_num_batched_tokens` and the weight scheme lands somewhere between.
`sweep` starts one server per setting and sends the workload at a few concurrency caps (`runs.concurrency_sweep`);
each load test is one point: output tok/s over the GPUs the engine uses (x), and one user's stream, 1000 / TPOT p50
in tok/s (y). `front` keeps the points no other point beats on both axes: the settings worth choosing between.
`on_simulator` draws the same front on lab 04's scheduler simulator (made-up step costs, `capacity.SIMULATOR`): the
trade-off's shape on any CPU, not a GPU's speeds.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from pathlib import Path
from typing import Any

from ... import validate
from ...config import lab_id
from ...mechanisms.batching import CostModel, continuous_batching
from ...models import ModelSpec
from ...results.record import RequestRecord, Result
from ...results.store import ResultStore
from ...workloads import load_workload
from .capacity import SIMULATOR
from .runs import check_levels, concurrency_sweep

SCHEMES = {"bf16": (), "fp8": ("--quantization", "fp8")}


def point(r: Result, setting: dict[str, Any], gpus: int = 1) -> dict[str, Any]:
    """One load test as a point on the front: per-GPU throughput and one user's token rate."""
    tpot = r.summary["tpot_s"]["p50"]
    return {**setting, "concurrency": r.config.get("max_concurrency"), "tok_s_per_gpu": r.summary["output_tok_s"] / gpus,
            "tok_s_per_user": 1.0 / tpot if tpot else None, "tpot_p50_ms": tpot * 1e3 if tpot else None,
            "ttft_p90_ms": None if r.summary["ttft_s"]["p90"] is None else r.summary["ttft_s"]["p90"] * 1e3, "step": r.step}


def front(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points no other beats on both tok/s per GPU and tok/s per user (ties kept), by tok/s per GPU."""
    ok = [p for p in points if p["tok_s_per_user"]]
    dominated = lambda p: any(q["tok_s_per_gpu"] >= p["tok_s_per_gpu"] and q["tok_s_per_user"] >= p["tok_s_per_user"]  # noqa: E731
                              and (q["tok_s_per_gpu"], q["tok_s_per_user"]) != (p["tok_s_per_gpu"], p["tok_s_per_user"])
                              for q in ok)
    return sorted((p for p in ok if not dominated(p)), key=lambda p: p["tok_s_per_gpu"])


def sweep(model: str | ModelSpec = "embedded", *, max_num_seqs: Sequence[int] = (16, 64, 256),
          max_num_batched_tokens: Sequence[int] = (2048, 8192), schemes: Sequence[str] = ("bf16", "fp8"),
          levels: Sequence[int] = (1, 8, 64, 256), workload: str = "journey", repeat: int = 4,
          out_dir: str | Path | None = None, store: ResultStore | None = None, lab: str = lab_id("05"),
          **knobs: Any) -> dict[str, Any]:
    """One server per setting (every input checked before the first starts), a concurrency sweep on each; returns
    {"points", "front", "settings"}. `knobs` go to every ServerConfig (e.g. gpu_memory_utilization)."""
    for s in schemes:
        validate.choice("pareto.sweep", "schemes", s, tuple(SCHEMES), "bf16 or fp8 (lab 06's schemes vLLM makes at load).")
    levels = check_levels(levels)
    settings = settings_of(max_num_seqs, max_num_batched_tokens, schemes, "pareto.sweep")
    points, results, base_extra = [], [], tuple(knobs.pop("extra_args", ()))
    for i, setting in enumerate(settings):
        extra = (*SCHEMES[setting["scheme"]], "--max-num-batched-tokens", str(setting["max_num_batched_tokens"]))
        got = concurrency_sweep(model, workload, repeat, levels, store=store, lab=lab, max_num_seqs=setting[
            "max_num_seqs"], extra_args=(*base_extra, *extra), step_prefix=f"pareto-{setting['scheme']}-"
            f"s{setting['max_num_seqs']}-b{setting['max_num_batched_tokens']}",
            out_dir=None if out_dir is None else Path(out_dir) / f"setting{i}", **knobs)
        results += got["results"]
        points += [point(r, setting) for r in got["results"]]
    return {"points": points, "front": front(points), "settings": settings, "results": results}


def settings_of(max_num_seqs: Sequence[int], max_num_batched_tokens: Sequence[int], schemes: Sequence[str],
                where: str) -> list[dict[str, Any]]:
    """Every setting of the grid, each input checked (`where` names the caller in the error); a token budget below
    max_num_seqs is left out (vLLM refuses it)."""
    if not schemes:
        raise validate.refuse(where, "schemes", list(schemes), "at least one weight scheme", "e.g. ['bf16'].")
    seqs = validate.integers(where, "max_num_seqs", max_num_seqs, "sequences per step, e.g. [16, 64, 256].")
    budgets = validate.integers(where, "max_num_batched_tokens", max_num_batched_tokens,
                                "tokens per step, e.g. [2048, 8192].")
    settings = [{"scheme": s, "max_num_seqs": n, "max_num_batched_tokens": b} for s, n, b in
                product(schemes, seqs, budgets) if b >= n]
    if not settings:
        raise validate.refuse(where, "max_num_batched_tokens", list(budgets), f"at least one >= the smallest "
                              f"max_num_seqs ({min(seqs)})", "a token budget of at least max_num_seqs, e.g. 2048.")
    return settings


def on_simulator(max_num_seqs: Sequence[int] = (16, 64, 256), max_num_batched_tokens: Sequence[int] = (512, 2048),
                 levels: Sequence[int] = (1, 4, 16, 64, 256), workload: str = "journey", repeat: int = 4,
                 cost: CostModel | None = None) -> dict[str, Any]:
    """The front on lab 04's simulator: per setting and concurrency cap N, the workload (repeated `repeat` times) due
    at t=0 with at most min(N, max_num_seqs) in flight, as a closed-loop client holds it (a run already made at that
    many in flight and token budget is not made again); {"points", "front", "settings"} as `sweep` returns, every
    point's speeds the simulator's made-up milliseconds (SIMULATOR)."""
    levels = check_levels(levels)
    settings = settings_of(max_num_seqs, max_num_batched_tokens, ("simulated",), "pareto.on_simulator")
    wl = load_workload(workload).repeated(validate.integer("pareto.on_simulator", "repeat", repeat,
                                                           "times the workload is sent, e.g. 2.", 1))
    pairs = [(r.prompt_tokens, r.max_new_tokens) for r in wl.requests]
    points, seen = [], set()
    for setting in settings:
        for n in levels:
            in_flight = min(n, setting["max_num_seqs"], len(pairs))
            if (setting["max_num_batched_tokens"], in_flight) in seen:
                continue  # the same run as a point already made: the server's cap, not the client's, holds it
            seen.add((setting["max_num_batched_tokens"], in_flight))
            sim = continuous_batching(pairs, max_num_seqs=in_flight,
                                      max_num_batched_tokens=setting["max_num_batched_tokens"], cost=cost)
            records = [RequestRecord(f"sim-{r.request_id}", r.prompt_len, r.output_len, arrival=0.0,
                                     start=r.start / 1e3, first_token=r.first_token / 1e3, last_token=r.finish / 1e3)
                       for r in sim.records]
            step = f"pareto-sim-s{setting['max_num_seqs']}-b{setting['max_num_batched_tokens']}-conc-{n}"
            r = Result(lab=lab_id("05"), step=step, engine="simulator",
                       config={"max_num_seqs": setting["max_num_seqs"], "max_concurrency": n,
                               "max_num_batched_tokens": setting["max_num_batched_tokens"],
                               "cost": vars(cost or CostModel())},
                       model={"name": "simulator", "synthetic": True}, workload={"name": wl.name, "requests": len(pairs)},
                       requests=records, wall_s=max(r.finish for r in sim.records) / 1e3, notes=[SIMULATOR])
            points.append(point(r, setting))
    return {"points": points, "front": front(points), "settings": settings}
