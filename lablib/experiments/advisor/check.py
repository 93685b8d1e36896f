"""Lab 10's advisor checked under its own load: the advised engine on this GPU, the goal's arrivals, predicted
against measured.

`check(goal)` starts vLLM's OpenAI server with the advice (`plan.engine_kwargs`: weights, KV dtype, TP size,
max_num_seqs, prefix caching; no speculation: the latency model does not price it) on a synthetic checkpoint of
the goal's model, and sends the goal's requests as token ids: every prompt `prompt_tokens` long, its first
`shared_prefix_tokens` the same in all, `output_tokens` out (ignore_eos), as Poisson arrivals at the goal's rate
(`load.little_rate`; one engine gets its share where the advice has replicas). Then it sets TTFT, TPOT and ITL at
p50/p90/p99 and the goodput beside `load.under_load`'s prediction for the same arrivals, both over the steady
middle of the run (`load.steady_middle`: not the ramp up, not the drain).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from ...bench.goodput import SLO, goodput
from ...bench.loadgen import run_online
from ...config import lab_id
from ...results.store import ResultStore, results_dir
from ...stats import in_ms
from ...workloads import Request, Workload
from ..serving.runs import server_config, started
from .load import TARGET, little_rate, steady_middle, under_load
from .plan import Goal, engine_kwargs, plan

FIGURES = ("ttft", "tpot", "itl")
PCTS = ("p50", "p90", "p99")
TOKEN_IDS = (100, 1000)  # ids every tokenizer and model the lab serves knows (the embedded vocabulary is the least)


def goal_workload(goal: Goal, requests: int, seed: int = 0) -> tuple[Workload, list[list[int]]]:
    """The goal's requests: a Workload (ids, lengths) and the prompts as token ids, the shared prefix identical."""
    rng = random.Random(seed)
    shared = [rng.randrange(*TOKEN_IDS) for _ in range(goal.shared_prefix_tokens)]
    prompts = [shared + [rng.randrange(*TOKEN_IDS) for _ in range(goal.prompt_tokens - len(shared))]
               for _ in range(requests)]
    reqs = tuple(Request(id=f"goal-{i}", prompt=f"{goal.prompt_tokens} token ids",
                         messages=({"role": "user", "content": "token ids"},),
                         max_new_tokens=goal.output_tokens, prompt_tokens=goal.prompt_tokens) for i in range(requests))
    return Workload(name="advisor-goal", version=1, description="the advisor's goal as token ids", requests=reqs), prompts


def server_knobs(goal: Goal, advice: dict[str, Any]) -> dict[str, Any]:
    """The advice as the OpenAI server's settings (`serving.runs.server_config` knobs)."""
    kw = engine_kwargs(goal, advice)
    extra = ["--tensor-parallel-size", str(kw["tensor_parallel_size"])]
    extra += ["--quantization", kw["quantization"]] if kw["quantization"] else []
    extra += ["--kv-cache-dtype", "fp8"] if kw["kv_cache_dtype"] == "fp8" else []
    return {"max_num_seqs": kw["max_num_seqs"], "max_model_len": kw["max_model_len"], "gpu_memory_utilization": 0.9,
            "enable_prefix_caching": bool(kw["enable_prefix_caching"]), "extra_args": tuple(extra)}




def error_of(table: list[dict[str, Any]], figure: str, percentile: str) -> float | None:
    """The prediction's error (predicted / measured - 1) for one figure and percentile of `rows`."""
    return next(r["error"] for r in table if r["figure"] == figure and r["percentile"] == percentile)


def target_line(table: list[dict[str, Any]]) -> str:
    """Whether TPOT p90 is within `TARGET` of the measurement, and by how much it misses where it does not."""
    e = error_of(table, "TPOT", "p90")
    if e is None:
        return "TPOT p90: no figure"
    miss = abs(e) - TARGET
    return (f"TPOT p90 off by {e:+.1%}: within the {TARGET:.0%} aim" if miss <= 0 else
            f"TPOT p90 off by {e:+.1%}: misses the {TARGET:.0%} aim by {miss:.1%}")


def gap_reasons(table: list[dict[str, Any]]) -> list[str]:
    """Where the prediction misses, read from the rows: the inter-token gaps split the steps that only decode (ITL p50)
    from those that also carry new prompts (ITL p90/p99); TTFT against the prefill and the queue the model counts."""
    out = []
    itl50, itl90, ttft50 = (error_of(table, "ITL", "p50"), error_of(table, "ITL", "p90"),
                            error_of(table, "TTFT", "p50"))
    if itl50 is not None and itl50 < -TARGET:
        out.append(f"steps that only decode cost more than priced (ITL p50 {itl50:+.0%}): the cost model's step at "
                   "this batch and context is too cheap (attention over a long context reads its KV below peak)")
    if itl90 is not None and itl90 < -TARGET and (itl50 is None or itl90 < itl50 - TARGET):
        out.append(f"steps that also prefill new prompts cost more than priced (ITL p90 {itl90:+.0%}"
                   + (f", against ITL p50 {itl50:+.0%}" if itl50 is not None else "") + ")")
    if ttft50 is not None and ttft50 < -2 * TARGET:
        out.append(f"TTFT is {ttft50:+.0%} off: the queue, the prefill steps and the server's own time per request at "
                   "low load (lab 05's recording) fall short of what this load measured")
    return out


def served_goal(got: dict[str, Any], fallback: Goal) -> Goal:
    """The goal a check (live, or recorded) served: its own, as recorded with it; `fallback` where it carries none."""
    g = got.get("goal")
    return g if isinstance(g, Goal) else Goal(**g) if isinstance(g, dict) else fallback


def compared(goal: Goal, got: dict[str, Any]) -> dict[str, Any]:
    """A check's measurement (`check`, live or recorded) against what the advisor's model predicts now for the same
    goal, engine, rate and requests (the goal the check served, where it carries one: `served_goal`): the rows, the
    verdict on the aim, and where the model misses."""
    goal = served_goal(got, goal)
    advice = got["advice"]
    predicted = under_load(goal, advice, rate=got["rate_rps"] * advice["replicas"], requests=got["requests"])
    table = rows(predicted, got["measured"])
    return {"rows": table, "target": target_line(table), "why": gap_reasons(table),
            "predicted_goodput": predicted.get("goodput"), "goodput": got.get("goodput")}


def rows(predicted: dict[str, Any], measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Predicted against measured (ms), one row per figure and percentile, with the error of the prediction."""
    out = []
    for f in FIGURES:
        for p in PCTS:
            pred, meas = predicted[f"{f}_ms"][p], measured[f"{f}_ms"][p]
            out.append({"figure": f.upper(), "percentile": p, "predicted_ms": pred, "measured_ms": meas,
                        "error": None if not (pred and meas) else pred / meas - 1})
    return out


def check(goal: Goal, *, requests: int | None = None, seed: int = 0, store: ResultStore | None = None,
          out_dir: str | Path | None = None, lab: str = lab_id("10"), served: str | None = None) -> dict[str, Any]:
    """The advised engine under the goal's arrivals on this GPU; predicted against measured (see the module).
    `served`: the checkpoint to serve (default: the synthetic one of the goal's model)."""
    advice = plan(goal)  # every refusal (a goal no GPU count meets) comes here, before a server starts
    requests = requests or max(4 * goal.concurrency, 200)
    rate = little_rate(goal, advice) / advice["replicas"]
    predicted = under_load(goal, advice, rate=rate * advice["replicas"], requests=requests, seed=seed)
    wl, prompts = goal_workload(goal, requests, seed)
    cfg = server_config(served or f"synthetic:{goal.model}", **server_knobs(goal, advice))
    out_dir = Path(out_dir) if out_dir is not None else results_dir() / "advisor-check"
    out_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"server": cfg.to_dict()}
    with started(cfg, out_dir, out) as server:
        result = run_online(server.base_url, server.api_key, server.model, wl, [rate], seed=seed, prompts=prompts,
                            warmup_requests=2, timeline=False, lab=lab, store=store, server=out["server"],
                            step_prefix=f"advisor-check-{goal.model}-c{goal.concurrency}")[0]
    middle = steady_middle(result, goal.concurrency)  # the same requests the prediction counts
    measured = {f"{f}_ms": in_ms(middle.summary[f"{f}_s"]) for f in FIGURES}
    slo = SLO(tpot_ms=goal.tpot_slo_ms, percentile=90) if goal.tpot_slo_ms is not None else None
    table = rows(predicted, measured)
    tpot90 = next(r for r in table if r["figure"] == "TPOT" and r["percentile"] == "p90")
    judged = goodput(middle, slo) if slo else None
    verdict = ((f"TPOT p90 predicted {tpot90['predicted_ms']:.2f} ms, measured {tpot90['measured_ms']:.2f} ms "
                f"({tpot90['error']:+.1%})" if tpot90["error"] is not None else "TPOT p90: no figure (one token?)")
               + (f"; {judged['verdict']}" if judged else ""))
    return {"goal": goal, "advice": {k: advice[k] for k in ("scheme", "t", "kv", "max_num_seqs", "replicas")},
            "rate_rps": rate, "requests": requests, "answered": len(result.requests),
            "failures": [n for n in result.notes if "failed" in n], "predicted": predicted, "measured": measured,
            "rows": table,
            "goodput": judged, "predicted_goodput": predicted.get("goodput"), "verdict": verdict, "result": result,
            **out}
