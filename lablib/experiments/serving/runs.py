"""The online-serving experiment of lab 05: one server, a rate sweep, and vLLM's own client as referee.

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

`cross_check` is the referee proper: step 4 alone, in several longer rounds alternating which
client goes first, both clients reduced to the same steady-state statistic and their ratio
weighed against a bound from their own round-to-round spread (see its docstring; single
bursts scatter too far to tell a 5% gap from noise).

`concurrency_sweep` asks the other classic question on the same kind of server: with at
most N requests in flight (N users, each sending the next request when the last returns),
how do throughput and latency trade? Concurrency is a client-side knob, so the whole sweep
reuses one server: no restart between points.
"""
from __future__ import annotations

import math
from ... import validate
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...bench.client import client_check
from ...bench.loadgen import run_online
from ...bench.referee import agreement, referee
from ...bench.vllm_bench import bench_serve, compare_serve
from ...models import ModelSpec, embedded_path, resolve_model
from ...results.record import Result
from ...results.reference import load_reference, reference_facts
from ...results.store import ResultStore, results_dir
from ...config import lab_id, ServerConfig
from ...engines.server import VLLMServer
from ...session import live_or_recorded
from ...workloads import load_workload

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


def check_context(workload: Any, spec: ModelSpec, cfg: ServerConfig) -> int:
    """Refuse, before a server's minute of start-up, a request whose prompt plus output exceeds its context.

    The context is `max_model_len` where the config sets one, else the architecture's own; prompts
    are counted by the served tokenizer as the server will count them (completions add the special
    tokens). vLLM would only say so per request once running, as an HTTP 400 for each. Returns the
    context."""
    from transformers import AutoTokenizer  # deferred: transformers

    context = cfg.max_model_len or spec.architecture()["context"]
    tok = AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.model)
    for r in workload.requests:
        need = len(tok(r.prompt)["input_ids"]) + r.max_new_tokens
        if need > context:
            raise validate.refuse(
                "ServerConfig", "max_model_len", cfg.max_model_len,
                f"a context of at least {need} tokens for request {r.id} of workload {workload.name!r} (its prompt "
                f"{need - r.max_new_tokens} + {r.max_new_tokens} output tokens; the context now is {context})",
                f"max_model_len={need} or more (None for the model's own {spec.architecture()['context']}), or "
                "a workload without that request.")
    return context


def prepare(model: str | ModelSpec, workload: str, repeat: int, out_dir: str | Path | None, knobs: dict[str, Any],
             folder: str = "serve") -> tuple[Any, ServerConfig, Path, dict[str, Any]]:
    """The repeated workload, the server's config, the output folder (all checked, none started), and what every
    load test on that server records about it (run_online's `server` and `model_info`). The folder defaults to
    `<results_dir()>/<folder>`: the one results folder."""
    base = load_workload(workload)
    wl = base.repeated(repeat)
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    cfg = server_config(spec, **knobs)
    check_context(base, spec, cfg)
    out = Path(out_dir) if out_dir is not None else results_dir() / folder
    out.mkdir(parents=True, exist_ok=True)
    return wl, cfg, out, {"server": cfg.to_dict(), "model_info": {**spec.describe(), "name": cfg.name}}


@contextmanager
def started(cfg: ServerConfig, out_dir: Path, out: dict[str, Any]) -> Iterator[VLLMServer]:
    """The server, running; its start-up time goes into out["server"]; ended on exit, whatever happened."""
    with VLLMServer(cfg, log_path=out_dir / "server.log") as server:
        out["server"]["startup_s"] = server.startup_s
        yield server


def rate_sweep(model: str | ModelSpec = "embedded", workload: str = "journey", repeat: int = 4,
               fractions: Sequence[float] = FRACTIONS, *, seed: int = 0, cross_check: bool = True,
               out_dir: str | Path | None = None, store: ResultStore | None = None, lab: str = lab_id("05"),
               on_metrics: Callable[[float, dict[str, float | None]], None] | None = None,
               on_result: Callable[[Result], None] | None = None, metrics_interval_s: float = 0.25,
               **knobs: Any) -> dict[str, Any]:
    """Steps 1-4 above on one server; returns {"results", "capacity_rps", "server", "bench_serve", "compare"}.

    Inputs are checked before the server starts. `knobs` go to the ServerConfig
    (e.g. `max_num_seqs=32`). `cross_check=False` skips `vllm bench serve`.
    """
    fractions = check_fractions(fractions)
    wl, cfg, out_dir, recorded = prepare(model, workload, repeat, out_dir, knobs)
    common = dict(seed=seed, lab=lab, store=store, on_metrics=on_metrics, on_result=on_result,
                  metrics_interval_s=metrics_interval_s, **recorded)
    out: dict[str, Any] = {"results": [], "server": cfg.to_dict()}
    with started(cfg, out_dir, out) as server:
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
                      levels: Sequence[int] = (1, 4, 16, 64), *, seed: int = 0, out_dir: str | Path | None = None,
                      store: ResultStore | None = None, lab: str = lab_id("05"),
                      on_result: Callable[[Result], None] | None = None, step_prefix: str = "serve",
                      **knobs: Any) -> dict[str, Any]:
    """One server, the workload sent with at most N requests in flight for each N in `levels`.

    Returns {"results" (one per level, step "serve-rate-inf-conc-N"), "server"}; inputs are
    checked before the server starts. Every request is due at t=0, so TTFT includes the wait
    for a free client slot (the queue moved from the server to the client); each record's
    `start` is when it was sent, so `first_token - start` is the server's own share.
    """
    levels = check_levels(levels)
    wl, cfg, out_dir, recorded = prepare(model, workload, repeat, out_dir, knobs)
    out: dict[str, Any] = {"results": [], "server": cfg.to_dict()}
    with started(cfg, out_dir, out) as server:
        for i, n in enumerate(levels):
            out["results"] += run_online(server.base_url, server.api_key, server.model, wl, [math.inf], seed=seed,
                                         max_concurrency=n, warmup_requests=len(wl.requests) if i == 0 else 0, lab=lab,
                                         store=store, on_result=on_result, step_prefix=step_prefix, **recorded)
    return out


def cross_check(model: str | ModelSpec = "embedded", workload: str = "journey", repeat: int = 4, times: int = 3, *,
                max_concurrency: int | None = None, seed: int = 0, out_dir: str | Path | None = None,
                store: ResultStore | None = None, lab: str = lab_id("05"), confidence: float | None = None,
                max_cv: float | None = None, max_bound: float | None = None, min_window_s: float | None = None,
                timeline: bool = False, **knobs: Any) -> dict[str, Any]:
    """The referee: the lab's client and `vllm bench serve` on one server, `times` rounds, the first client alternating.

    Each round sends the workload repeated `repeat` times (`repeat` x 64 requests for the journey set) from
    each client in turn, every request due at t=0 and at most `max_concurrency` in flight on either client
    (None: all at once), so the server runs a closed loop at that concurrency. Round i puts the lab first
    when i is even (L V, V L, L V, V L: a slow drift of the server cancels between the clients). Round 0's
    lab run warms the server first (the whole workload, 8 tokens each). The lab's client reads `/metrics`
    before and after each of its tests (the server's own latencies, for `client_check`) but not during
    it (`timeline=False`): `vllm bench serve` scrapes nothing, and a scrape costs the API server's event
    loop a page render and the client a fetch and parse, so both clients meet the same server.
    `timeline=True` runs the lab's client as the lab does, its scraper on (the instrument under test).

    The verdict is `bench.referee.referee` on the rounds: each client reduced to its steady-state output rate
    (tokens delivered between the times 10% and 90% of the round's tokens had arrived), the ratio of the
    two means against a Welch bound at `confidence` (default 99%) from both clients' round-to-round
    standard errors; it agrees only if each client's own spread is below `max_cv` (3%), the bound below
    `max_bound` (5%), every window at least `min_window_s` (2 s) long, and both clients delivered the
    workload's exact output tokens. A noisy or too-short measurement fails; it never widens the bound.

    Returns {"rounds": [compare_serve dicts, with "lab_first" and "output_tokens"["expected"]], "results",
    "referee", "output_tok_s_ratios" and "agreement" (whole-burst figures, descriptive only), "server"}.
    """
    validate.integer("cross_check", "times", times, "rounds of lab + vllm bench serve, e.g. 3.")
    validate.optional_integer("cross_check", "max_concurrency", max_concurrency, "None for all at once, or e.g. 256.")
    rules = {k: v for k, v in (("confidence", confidence), ("max_cv", max_cv), ("max_bound", max_bound),
                                ("min_window_s", min_window_s)) if v is not None}
    wl, cfg, out_dir, recorded = prepare(model, workload, repeat, out_dir, knobs, folder="serve-check")
    out: dict[str, Any] = {"rounds": [], "results": [], "server": cfg.to_dict()}
    with started(cfg, out_dir, out) as server:
        _referee_rounds(out, server.base_url, server.api_key, server.model, cfg.tokenizer or cfg.model, wl, times,
                        out_dir, max_concurrency=max_concurrency, seed=seed, timeline=timeline, lab=lab, store=store,
                        recorded=recorded)
    return _judged(out, rules)


def cross_check_endpoint(base_url: str, api_key: str | None, model: str, tokenizer: str, workload: str = "journey",
                         repeat: int = 4, times: int = 3, *, max_concurrency: int | None = None, seed: int = 0,
                         out_dir: str | Path | None = None, store: ResultStore | None = None, lab: str = lab_id("05"),
                         confidence: float | None = None, max_cv: float | None = None, max_bound: float | None = None,
                         min_window_s: float | None = None, timeline: bool = False) -> dict[str, Any]:
    """`cross_check`'s referee against a server somebody else runs: any OpenAI-compatible endpoint.

    The lab's client and `vllm bench serve` take turns on `base_url` exactly as in `cross_check` (same rounds,
    same verdict), and nothing is started or stopped here: this is how the lab measures a vLLM engine it does
    not launch itself, such as one spread over several machines (a Ray cluster with
    `distributed_executor_backend="ray"`, behind `vllm serve` on its head node) or behind a load balancer.
    `model` is the name the server serves, `tokenizer` a local folder or hub id with its tokenizer (what
    `vllm bench serve --tokenizer` takes). The returned dict's "server" is {"base_url", "model"}.
    """
    validate.integer("cross_check_endpoint", "times", times, "rounds of lab + vllm bench serve, e.g. 3.")
    validate.optional_integer("cross_check_endpoint", "max_concurrency", max_concurrency,
                              "None for all at once, or e.g. 256.")
    if (not isinstance(base_url, str) or not base_url.startswith(("http://", "https://"))
            or base_url.rstrip("/").endswith("/v1")):
        raise validate.refuse("cross_check_endpoint", "base_url", base_url, "an http(s) address",
                              "pass the server's root, e.g. 'http://10.0.0.5:8000' (without /v1).")
    rules = {k: v for k, v in (("confidence", confidence), ("max_cv", max_cv), ("max_bound", max_bound),
                                ("min_window_s", min_window_s)) if v is not None}
    wl = load_workload(workload).repeated(repeat)
    out_path = Path(out_dir) if out_dir is not None else results_dir() / "serve-check-endpoint"
    out_path.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"rounds": [], "results": [], "server": {"base_url": base_url, "model": model}}
    _referee_rounds(out, base_url.rstrip("/"), api_key, model, tokenizer, wl, times, out_path,
                    max_concurrency=max_concurrency, seed=seed, timeline=timeline, lab=lab, store=store,
                    recorded={"server": out["server"], "model_info": {"name": model}})
    return _judged(out, rules)


def _referee_rounds(out: dict[str, Any], base_url: str, api_key: str | None, model: str, tokenizer: str, wl: Any,
                    times: int, out_dir: Path, *, max_concurrency: int | None, seed: int, timeline: bool, lab: str,
                    store: ResultStore | None, recorded: dict[str, Any]) -> None:
    """The referee's rounds on one running endpoint, the first client alternating; appended to `out`."""
    expected = sum(r.max_new_tokens for r in wl.requests)

    def lab_run(i: int) -> Result:
        return run_online(base_url, api_key, model, wl, [math.inf], seed=seed, max_concurrency=max_concurrency,
                          warmup_requests=len(wl.requests) if i == 0 else 0, timeline=timeline,
                          lab=lab, store=store, step_prefix=f"check{i}", **recorded)[0]

    def vllm_run(i: int) -> dict[str, Any]:
        return bench_serve(base_url, api_key, model, tokenizer, wl, math.inf, out_dir / f"round{i}", seed=seed,
                           max_concurrency=max_concurrency)

    for i in range(times):
        if i % 2 == 0:
            result, bench = lab_run(i), vllm_run(i)
        else:
            bench, result = vllm_run(i), lab_run(i)
        out["results"].append(result)
        rnd = {**compare_serve(result, bench), "lab_first": i % 2 == 0}
        rnd["output_tokens"]["expected"] = expected
        out["rounds"].append(rnd)


def _judged(out: dict[str, Any], rules: dict[str, Any]) -> dict[str, Any]:
    out["referee"] = referee(out["rounds"], **rules)
    out["output_tok_s_ratios"] = [r["figures"]["output_tok_s"]["ratio"] for r in out["rounds"]]
    out["agreement"] = agreement(out["rounds"])
    return out


# --- lab 05 in a notebook: one call per cell, live on a GPU with vLLM, else the H200's recordings (labelled) ---


# The server knobs that change what a load test measures (a port, a key or a tokenizer path do not): a recorded
# sweep stands in for asked values of these, and says so. Never the API key: the stand-in line is printed.
MEASURED_SERVER_KNOBS = ("max_num_seqs", "gpu_memory_utilization", "max_model_len", "enable_prefix_caching", "dtype",
                         "extra_args")


def rate_sweep_or_recorded(model: str | ModelSpec = "embedded", repeat: int = 4, *, lab: str = lab_id("05"),
                           force: bool | None = None, **kw: Any):
    """`rate_sweep` live on a GPU with vLLM; otherwise the one recorded on the H200 (the synthetic 8B).

    Returns a `session.Shown` of rate_sweep's dict (recorded: `facts["serve"]` and the
    'serve-rate-*' Results) plus `model_name` (the served checkpoint's folder) and
    `burst_output_tok_s` (the rate=inf test's output tokens/s). `kw` go to `rate_sweep`.
    """
    check_fractions(kw.get("fractions", FRACTIONS))

    def described(out: dict[str, Any]) -> dict[str, Any]:
        return {**out, "model_name": str(out["server"]["model"]).rstrip("/").split("/")[-1],
                "burst_output_tok_s": burst(out["results"]).summary["output_tok_s"]}

    server_knobs = {k: v for k, v in kw.items() if k in MEASURED_SERVER_KNOBS}
    workload = kw.get("workload", "journey")

    def repeated(value: dict[str, Any]) -> tuple[str, int]:
        name = value["results"][0].workload["name"]  # e.g. "journeyx4": the base set, repeated
        base, _, times = name.rpartition("x")
        return (base, int(times)) if times.isdigit() and base else (name, 1)

    return live_or_recorded(lambda: described(rate_sweep(model, repeat=repeat, lab=lab, **kw)),
                            lambda: described({**reference_facts()["serve"],
                                               "results": load_reference(prefix="serve-rate-")}), force=force,
                            asked={"model": model if isinstance(model, str) else model.name, "workload": workload,
                                   "repeat": repeat, **server_knobs},
                            where={"model": lambda v: v["server"].get("served_model_name") or v["model_name"],
                                   "workload": lambda v: repeated(v)[0], "repeat": lambda v: repeated(v)[1],
                                   **{k: (lambda v, k=k: v["server"].get(k)) for k in server_knobs}})


def burst(results: list[Result]) -> Result:
    """The load test that sent everything at once (rate=inf): the server's capacity."""
    return next(r for r in results if r.config["rate"] == math.inf)


def results_of(shown: Any):
    """The load tests of a rate sweep as a Shown of their own (same label), for `.table(...)`."""
    return shown.derived(shown.value["results"])


def client_verdict(shown: Any):
    """`bench.client.client_check` on the sweep's burst, carrying the sweep's label (live or recorded)."""
    return shown.derived(client_check(burst(shown.value["results"])))


def compare_rows(shown: Any):
    """The burst's lab / `vllm bench serve` figures (one row per figure), carrying the sweep's label."""
    figures = shown.value["compare"]["figures"]
    return shown.derived([{"figure": k, **v} for k, v in figures.items()])


def ttft_grows(value: dict[str, Any], factor: float = 2.0) -> bool:
    """More load, more queueing: median TTFT at the highest finite rate over `factor` times the lowest's."""
    finite = sorted((r for r in value["results"] if r.config["rate"] != math.inf), key=lambda r: r.config["rate"])
    return finite[-1].summary["ttft_s"]["p50"] > factor * finite[0].summary["ttft_s"]["p50"]


def recorded_agreements():
    """Every lab-vs-vLLM comparison recorded on the H200, one row each: the repeated serve cross-checks (per
    round, with the mean's verdict) and the offline `bench.run` against `vllm bench throughput`."""
    def rows() -> list[dict[str, Any]]:
        facts = reference_facts()
        out = []
        for key, model in (("serve_check", "synthetic 8B"), ("serve_check_embedded", "embedded")):
            check = facts[key]
            for i, r in enumerate(check["rounds"]):
                out.append({"comparison": f"serve burst, round {i}", "model": model, "lab_first": r["lab_first"],
                            "lab_over_vllm_output_tok_s": r["figures"]["output_tok_s"]["ratio"],
                            "lab_over_vllm_ttft_p50": r["figures"]["ttft_p50_ms"]["ratio"],
                            "lab_over_vllm_tpot_p50": r["figures"]["tpot_p50_ms"]["ratio"],
                            "clumped_lab": r["clumped"]["lab"], "clumped_vllm": r["clumped"]["vllm_bench"]})
            out.append({"comparison": "serve burst, mean of rounds", "model": model,
                        "lab_over_vllm_output_tok_s": check["agreement"]["ratio"],
                        "agree": check["agreement"]["agree"]})
        head = facts["headline"]
        out.append({"comparison": "offline, bench.run / vllm bench throughput (total tok/s)", "model": "synthetic 8B",
                    "lab_over_vllm_output_tok_s": None, "lab_over_vllm_total_tok_s": head["lab_over_vllm_bench_total_tok_s"],
                    "lab_over_vllm_requests_s": head["lab_over_vllm_bench_requests_s"]})
        return out

    return live_or_recorded(rows, rows, force=False)
