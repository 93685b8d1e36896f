"""The online-serving experiment of lab 03: one server, a rate sweep, and vLLM's own client as referee.

Offline throughput says how fast the engine can go; a server is judged by what users feel
at the rate they arrive. The experiment, in the order a serving engineer runs it:

1. Start vLLM's OpenAI server (`lablib.engines.server.VLLMServer`, 127.0.0.1, API key).
2. Send the whole workload at once (`rate=inf`): the server's capacity C in requests/s.
3. Send it again as Poisson arrivals at fractions of C (by default 0.25, 0.5, 0.75, 1 and
   1.25): below C, TTFT is prefill time and stays flat; near and past C, requests queue
   (the `/metrics` gauges show the waiting queue and the KV cache filling) and the tail
   TTFT climbs, while TPOT barely moves.
4. Run `vllm bench serve` on the same requests at `rate=inf` and divide (lablib.bench.vllm_bench).

The workload is repeated (`Workload.repeated`) so a load test lasts long enough to reach a
steady state; the copies share prompts, so the server runs with prefix caching off. Before
the first measurement the whole workload goes through once, at most 8 tokens each: a server's
first full batch can pay one-time costs (kernels compiled or tuned for a batch shape not seen
yet), and those belong to no load test. (On the H200 the lab's first burst, after a single
warm-up request, came out 20% below `vllm bench serve`'s later one on the same server.)
Every Result goes to `store` as soon as it is measured.

`cross_check` repeats step 4 alone, alternating which client goes first, to show how far
single bursts scatter (one burst each is not enough to tell a 5% gap from noise).

`concurrency_sweep` asks the other classic question on the same kind of server: with at
most N requests in flight (N users, each sending the next request when the last returns),
how do throughput and latency trade? Concurrency is a client-side knob, so the whole sweep
reuses one server: no restart between points.
"""
from __future__ import annotations

import math
from .. import validate
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..bench.loadgen import run_online
from ..models import ModelSpec, embedded_path, resolve_model
from ..results.record import Result
from ..results.store import ResultStore
from ..config import ServerConfig
from ..engines.server import VLLMServer
from ..workloads import load_workload

FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.25)


def server_config(model: str | ModelSpec = "embedded", **knobs: Any) -> ServerConfig:
    """A ServerConfig for a lab model: a synthetic checkpoint takes the embedded tokenizer (it has none).

    Defaults: a free port, `gpu_memory_utilization=0.3`, prefix caching off (the load test
    repeats prompts); `knobs` override them (any ServerConfig field).
    """
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    tokenizer = str(embedded_path("target")) if spec.source == "synthetic" else None
    base = {"port": 0, "gpu_memory_utilization": 0.3, "enable_prefix_caching": False, "tokenizer": tokenizer,
            "served_model_name": spec.name}
    return ServerConfig(model=str(spec.path), **{**base, **knobs})


def check_fractions(fractions: Sequence[float]) -> list[float]:
    return validate.numbers("rate_sweep", "fractions", fractions,
                            "fractions of the measured capacity, e.g. [0.5, 1.0, 1.5].")


def _prepare(model: str | ModelSpec, workload: str, repeat: int, out_dir: str | Path, knobs: dict[str, Any]
             ) -> tuple[Any, ServerConfig, Path, dict[str, Any]]:
    """The repeated workload, the server's config, the output folder (all checked, none started), and what every
    load test on that server records about it (run_online's `server` and `model_info`)."""
    wl = load_workload(workload).repeated(repeat)
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    cfg = server_config(spec, **knobs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return wl, cfg, out, {"server": cfg.to_dict(), "model_info": {**spec.describe(), "name": cfg.name}}


@contextmanager
def _started(cfg: ServerConfig, out_dir: Path, out: dict[str, Any]) -> Iterator[VLLMServer]:
    """The server, running; its start-up time goes into out["server"]; ended on exit, whatever happened."""
    with VLLMServer(cfg, log_path=out_dir / "server.log") as server:
        out["server"]["startup_s"] = server.startup_s
        yield server


def rate_sweep(model: str | ModelSpec = "embedded", workload: str = "journey", repeat: int = 4,
               fractions: Sequence[float] = FRACTIONS, *, seed: int = 0, cross_check: bool = True,
               out_dir: str | Path = "results/serve", store: ResultStore | None = None, lab: str = "03_serving",
               on_metrics: Callable[[float, dict[str, float | None]], None] | None = None,
               on_result: Callable[[Result], None] | None = None, metrics_interval_s: float = 0.25,
               **knobs: Any) -> dict[str, Any]:
    """Steps 1-4 above on one server; returns {"results", "capacity_rps", "server", "bench_serve", "compare"}.

    Inputs are checked before the server starts. `knobs` go to the ServerConfig
    (e.g. `max_num_seqs=32`). `cross_check=False` skips `vllm bench serve`.
    """
    from ..bench.vllm_bench import bench_serve, compare_serve

    fractions = check_fractions(fractions)
    wl, cfg, out_dir, recorded = _prepare(model, workload, repeat, out_dir, knobs)
    common = dict(seed=seed, lab=lab, store=store, on_metrics=on_metrics, on_result=on_result,
                  metrics_interval_s=metrics_interval_s, **recorded)
    out: dict[str, Any] = {"results": [], "server": cfg.to_dict()}
    with _started(cfg, out_dir, out) as server:
        burst = run_online(server.base_url, server.api_key, server.model, wl, [math.inf],
                           warmup_requests=len(wl.requests), **common)
        out["results"] += burst
        capacity = burst[0].summary["requests_s"]
        out["capacity_rps"] = capacity
        rates = [round(f * capacity, 2) for f in fractions]
        out["results"] += run_online(server.base_url, server.api_key, server.model, wl, rates, warmup_requests=0,
                                     **common)
        if cross_check:
            bench = bench_serve(server.base_url, server.api_key, server.model, cfg.tokenizer or cfg.model, wl,
                                math.inf, out_dir, seed=seed)
            out["bench_serve"] = bench
            out["compare"] = compare_serve(burst[0], bench)
    return out


def check_levels(levels: Sequence[int]) -> list[int]:
    return validate.integers("concurrency_sweep", "levels", levels, "requests in flight, e.g. [1, 4, 16, 64].")


def concurrency_sweep(model: str | ModelSpec = "embedded", workload: str = "journey", repeat: int = 2,
                      levels: Sequence[int] = (1, 4, 16, 64), *, seed: int = 0, out_dir: str | Path = "results/serve",
                      store: ResultStore | None = None, lab: str = "03_serving",
                      on_result: Callable[[Result], None] | None = None, **knobs: Any) -> dict[str, Any]:
    """One server, the workload sent with at most N requests in flight for each N in `levels`.

    Returns {"results" (one per level, step "serve-rate-inf-conc-N"), "server"}; inputs are
    checked before the server starts. Every request is due at t=0, so TTFT includes the wait
    for a free client slot (the queue moved from the server to the client); each record's
    `start` is when it was sent, so `first_token - start` is the server's own share.
    """
    levels = check_levels(levels)
    wl, cfg, out_dir, recorded = _prepare(model, workload, repeat, out_dir, knobs)
    out: dict[str, Any] = {"results": [], "server": cfg.to_dict()}
    with _started(cfg, out_dir, out) as server:
        for i, n in enumerate(levels):
            out["results"] += run_online(server.base_url, server.api_key, server.model, wl, [math.inf], seed=seed,
                                         max_concurrency=n, warmup_requests=len(wl.requests) if i == 0 else 0, lab=lab,
                                         store=store, on_result=on_result, **recorded)
    return out


def cross_check(model: str | ModelSpec = "embedded", workload: str = "journey", repeat: int = 4, times: int = 3, *,
                seed: int = 0, out_dir: str | Path = "results/serve-check", store: ResultStore | None = None,
                lab: str = "03_serving", **knobs: Any) -> dict[str, Any]:
    """The lab's burst and `vllm bench serve`'s on one server, `times` rounds, the first client alternating.

    Returns {"rounds": [compare_serve dicts, with "lab_first"], "results", "output_tok_s_ratios",
    "agreement", "server"}: the ratios' spread is the run-to-run noise any single comparison
    carries, and `agreement` (`vllm_bench.agreement`) weighs the mean gap against it.
    """
    from ..bench.vllm_bench import agreement, bench_serve, compare_serve

    validate.integer("cross_check", "times", times, "rounds of lab + vllm bench serve, e.g. 3.")
    wl, cfg, out_dir, recorded = _prepare(model, workload, repeat, out_dir, knobs)
    out: dict[str, Any] = {"rounds": [], "results": [], "server": cfg.to_dict()}
    with _started(cfg, out_dir, out) as server:
        def lab_burst(i: int) -> Result:
            return run_online(server.base_url, server.api_key, server.model, wl, [math.inf], seed=seed,
                              warmup_requests=len(wl.requests) if i == 0 else 0, lab=lab, store=store,
                              step_prefix=f"check{i}", **recorded)[0]

        def vllm_burst(i: int) -> dict[str, Any]:
            return bench_serve(server.base_url, server.api_key, server.model, cfg.tokenizer or cfg.model, wl,
                               math.inf, out_dir / f"round{i}", seed=seed)

        for i in range(times):  # round 0's lab burst warms the server first (the whole workload, 8 tokens each)
            if i % 2 == 0:
                result, bench = lab_burst(i), vllm_burst(i)
            else:
                bench, result = vllm_burst(i), lab_burst(i)
            out["results"].append(result)
            out["rounds"].append({**compare_serve(result, bench), "lab_first": i % 2 == 0})
    out["output_tok_s_ratios"] = [r["figures"]["output_tok_s"]["ratio"] for r in out["rounds"]]
    out["agreement"] = agreement(out["rounds"])
    return out
