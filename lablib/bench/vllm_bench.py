"""vLLM's own benchmarks on the lab's workloads: the referee for the lab's numbers.

A harness that times itself can be wrong in ways it cannot see (a clock started too late,
a warm-up counted, tokens miscounted). vLLM ships its own client, `vllm bench serve`, and
the lab runs it against the same server on the same requests it measures itself, then
divides: a ratio within 0.97-1.03 says the two measure the same thing; a larger gap must
be explained. (The offline check, `vllm bench throughput`, has no dataset format that
carries per-request output lengths, so `scripts/record_reference.py` runs it on fixed
128/128 shapes next to the lab's run of the same shapes.)

"The same requests" means the workload written as vLLM's `custom` dataset, one JSON line
per request with its `prompt` and its `output_tokens`, sent without a chat template, in
order (`--disable-shuffle`), greedy, with `--ignore-eos` so every request produces exactly
its output length, as the lab's own runs do. At `rate=inf` both send every request at
once, so their throughputs are directly comparable; at a finite rate each draws its own
Poisson arrivals, so only distributions compare, not request by request.

The benchmark runs as a child process (it imports vLLM, which the notebook must not);
its JSON result file is read back. The server's API key travels as `OPENAI_API_KEY`,
the variable `vllm bench serve` reads.

The verdict on the two clients, steady-state rates over rounds, is `lablib.bench.referee`'s.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from .. import validate
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..stats import percentile_of as percentile
from .client import client_check, clumped_share
from .goodput import SLO, bench_goodput
from .referee import bench_token_times, lab_token_times, steady_rate
from .loadgen import check_rate
from ..results.record import Result
from ..workloads import Workload


def write_custom_dataset(workload: Workload, path: str | Path) -> Path:
    """The workload as vLLM's `custom` dataset: {"prompt", "output_tokens"} per line, in order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in workload.requests:
            f.write(json.dumps({"prompt": r.prompt, "output_tokens": r.max_new_tokens}) + "\n")
    return path


def _rate_arg(rate: float) -> str:
    return "inf" if math.isinf(check_rate(rate, "vllm bench serve")) else f"{float(rate):g}"


def bench_serve_command(base_url: str, model: str, tokenizer: str, dataset: str | Path, num_prompts: int,
                        rate: float, result_dir: str | Path, result_filename: str, *, seed: int = 0,
                        max_concurrency: int | None = None, slo: SLO | None = None,
                        python: str = sys.executable) -> list[str]:
    """`vllm bench serve` on a custom dataset against a running server (pure: builds the command only).

    `max_concurrency` caps the requests its client keeps in flight (`--max-concurrency`), as
    `run_online(max_concurrency=...)` caps the lab's; `slo` adds its targets as `--goodput`."""
    validate.integer("bench_serve_command", "num_prompts", num_prompts, "the number of requests in the dataset.")
    validate.optional_integer("bench_serve_command", "max_concurrency", max_concurrency, "None for no cap, or e.g. 256.")
    cap = ["--max-concurrency", str(max_concurrency)] if max_concurrency else []
    cap += ["--goodput", *slo.bench_args()] if slo is not None else []
    return [python, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
            "--base-url", base_url.rstrip("/"), "--endpoint", "/v1/completions", "--model", model,
            "--tokenizer", str(tokenizer), "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle",
            "--num-prompts", str(num_prompts), "--request-rate", _rate_arg(rate), "--seed", str(seed),
            "--ignore-eos", "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed",
            "--result-dir", str(result_dir),
            "--result-filename", result_filename, *cap]


def run_command(cmd: list[str], result_path: str | Path, log_path: str | Path, *, env: dict[str, str] | None = None,
                timeout_s: float = 900.0) -> dict[str, Any]:
    """Run a benchmark command, keep its output in `log_path`, return its JSON result plus the wall time.

    A non-zero exit, a timeout or a missing result file raises RuntimeError with the log's tail.
    """
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})})
        out, code = p.stdout + "\n" + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = f"{e.stdout or ''}\n{e.stderr or ''}\nTIMEOUT after {timeout_s:.0f}s"
        code = None
    Path(log_path).write_text(out if isinstance(out, str) else str(out))
    tail = "\n".join(str(out).splitlines()[-25:])
    if code != 0 or not Path(result_path).exists():
        raise RuntimeError(f"`{' '.join(cmd[2:6])} ...` failed (exit {code}); its log is {log_path}. Last lines:\n{tail}")
    result = json.loads(Path(result_path).read_text())
    result["wall_s"] = time.perf_counter() - t0
    return result


def bench_serve(base_url: str, api_key: str | None, model: str, tokenizer: str, workload: Workload, rate: float,
                out_dir: str | Path, *, seed: int = 0, max_concurrency: int | None = None, slo: SLO | None = None,
                timeout_s: float = 900.0) -> dict[str, Any]:
    """`vllm bench serve` with the workload at `rate` against a running server; its result dict
    (large per-request lists dropped, their steady-state rate `steady` and the command kept). With `slo`, vLLM's
    `request_goodput` and `goodput`: the lab's rule (`goodput.bench_goodput`) on vLLM's own records."""
    out_dir = Path(out_dir)
    dataset = write_custom_dataset(workload, out_dir / f"{workload.name}.custom.jsonl")
    name = f"bench-serve-{workload.name}-rate-{_rate_arg(rate)}.json"
    cmd = bench_serve_command(base_url, model, tokenizer, dataset, len(workload), rate, out_dir, name, seed=seed,
                              max_concurrency=max_concurrency, slo=slo)
    env = {"OPENAI_API_KEY": api_key} if api_key else {}
    result = run_command(cmd, out_dir / name, out_dir / (name[:-5] + ".log"), env=env, timeout_s=timeout_s)
    return {**summary_of(result, slo), "command": cmd, "rate": rate,  # the key travels in env, never in cmd
            "workload": workload.label}


PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "generated_texts",
               "errors")


def summary_of(bench: dict[str, Any], slo: SLO | None = None) -> dict[str, Any]:
    """A bench result without its per-request lists (kept small enough to ship with the reference data); with
    `slo`, the lab's goodput of those lists (`goodput`) beside vLLM's `request_goodput`."""
    out = {k: v for k, v in bench.items() if k not in PER_REQUEST}
    if slo is not None and bench.get("ttfts") is not None:
        out["goodput"] = bench_goodput(bench, slo)
    errors = [e for e in bench.get("errors", []) if e]
    out["errors"] = errors[:5]
    starts = bench.get("start_times") or []
    if starts:  # how long vLLM's client took to send everything (a burst is not sent in one instant)
        out["send_spread_s"] = max(starts) - min(starts)
    itls = bench.get("itls")
    if itls:  # how often vLLM's client read two token events at once (loadgen.clumped_share)
        out["clumped"] = clumped_share([g for per_request in itls for g in per_request])
    if starts and bench.get("ttfts") is not None and itls is not None:  # the referee's statistic, before the lists go
        out["steady"] = steady_rate(bench_token_times(bench))
    return out


def compare_serve(result: Result, bench: dict[str, Any]) -> dict[str, Any]:
    """The lab's load test next to `vllm bench serve` on the same workload and rate: each figure and lab/vLLM.

    `client` is `client_check` of the lab's run: whether the lab's client kept up with the
    server, the first suspect when the two clients disagree, its clumped reads judged against
    vLLM's client's on the same server (`reference_clumped`: a saturated server clumps for
    both); `clumped` puts the share of token events each client read in clumps side by side.
    """
    s = result.summary
    sends = [r.first_token - r.start for r in result.requests if r.start is not None and r.first_token is not None]
    pairs = {
        "output_tok_s": (s["output_tok_s"], bench.get("output_throughput")),
        "requests_s": (s["requests_s"], bench.get("request_throughput")),
        "ttft_p50_ms": (_ms(s["ttft_s"]["p50"]), bench.get("median_ttft_ms")),
        "ttft_p99_ms": (_ms(s["ttft_s"]["p99"]), bench.get("p99_ttft_ms")),
        # vllm bench counts TTFT from when its client sent each request; the lab from when it was due
        "ttft_from_send_p50_ms": (_ms(percentile(sends, 50)), bench.get("median_ttft_ms")),
        "tpot_p50_ms": (_ms(s["tpot_s"]["p50"]), bench.get("median_tpot_ms")),
    }
    rows = {k: {"lab": lab, "vllm_bench": v, "ratio": (lab / v) if lab and v else None} for k, (lab, v) in pairs.items()}
    lag = [r.start - r.arrival for r in result.requests if r.start is not None]
    check = client_check(result, reference_clumped=bench.get("clumped"))
    return {"rate": bench.get("rate"), "workload": bench.get("workload"), "figures": rows,
            "completed": {"lab": len(result.requests), "vllm_bench": bench.get("completed")},
            "send_spread_s": {"lab": max(lag) if lag else None, "vllm_bench": bench.get("send_spread_s")},
            "clumped": {"lab": check["clumped"], "vllm_bench": bench.get("clumped")},
            # the referee's statistic (`steady_rate`) and the work each client saw delivered
            "steady": {"lab": steady_rate(lab_token_times(result)), "vllm_bench": bench.get("steady")},
            "output_tokens": {"lab": s["output_tokens"], "vllm_bench": bench.get("total_output_tokens")},
            "client": check}


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3
