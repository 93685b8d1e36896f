"""Lab 05's GPU recording steps for goodput and the SLO capacity (scripts/record_reference.py calls them; the
notebook never does).

`record_pareto` is step `pareto`: the tuning front (`pareto.sweep`) on the synthetic 8B. `record_capacity` is step
`capacity`: the lab's own search (`capacity.on_server`, the embedded model, 8 sequences at
once, TTFT <= 1 s for 90%), every probe kept. `record_goodput` is step `goodput-referee`: on one server, `times`
rounds of the lab's burst and `vllm bench serve --goodput`'s on the same requests and SLO, the first client
alternating; per round vLLM's `request_goodput` beside the lab's rule on vLLM's own records (the same arithmetic:
equal) and the two clients' attainments with a two-proportion z test (the same server: equal within the noise).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from ...bench.goodput import SLO, goodput
from ...bench.loadgen import run_online
from ...bench.vllm_bench import bench_serve
from ...hardware.device import device_facts
from ...results.record import Result
from ...results.store import ResultStore
from .capacity import on_server, probe_rows
from .pareto import sweep
from .runs import prepare, started

CAPACITY_SLO = SLO(ttft_ms=1000, percentile=90)  # the lab's cell
REFEREE_SLO = SLO(ttft_ms=2000, tpot_ms=20, percentile=90)
Z99 = 2.575829  # two-sided 99%


class _Recorded:
    """A store that keeps every Result appended to it as a recording."""

    def __init__(self, store: ResultStore) -> None:
        self.store = store

    def append(self, result: Result) -> Result:
        return self.store.append_recorded(result)


def _write(out_dir: Path, name: str, facts: dict[str, Any]) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"{name}.json").write_text(json.dumps(facts, indent=1, default=str))


def record_capacity(out_dir: Path, store: ResultStore, facts: dict[str, Any], *, model: str = "embedded",
                    slo: SLO = CAPACITY_SLO, max_num_seqs: int = 8) -> None:
    """Step `capacity`: the lab's capacity search on this GPU, its probes' Results recorded, facts["capacity"]."""
    found = on_server(slo, None, None, model, out_dir=Path(out_dir) / "capacity", store=_Recorded(store),
                      max_num_seqs=max_num_seqs)
    facts["capacity"] = {**{k: v for k, v in found.items() if k not in ("probes", "burst")}, "rows": probe_rows(found),
                         "burst": found.get("burst"), "gpu": device_facts().get("gpu"),
                         "date": time.strftime("%Y-%m-%d")}
    _write(out_dir, "capacity", facts["capacity"])


def two_proportions(good_a: int, n_a: int, good_b: int, n_b: int) -> dict[str, Any]:
    """Are two shares the same? The pooled two-proportion z statistic at 99% (two-sided)."""
    pooled = (good_a + good_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    z = 0.0 if se == 0 else (good_a / n_a - good_b / n_b) / se
    return {"lab": good_a / n_a, "vllm": good_b / n_b, "z": z, "agree": abs(z) <= Z99}


def record_goodput(out_dir: Path, store: ResultStore, facts: dict[str, Any], *, model: str = "embedded",
                   slo: SLO = REFEREE_SLO, times: int = 3, repeat: int = 4, max_num_seqs: int = 8) -> None:
    """Step `goodput-referee` (see the module): facts["goodput_referee"] holds every round and the verdict."""
    out_dir = Path(out_dir) / "goodput-referee"
    wl, cfg, out_dir, recorded = prepare(model, "journey", repeat, out_dir, {"max_num_seqs": max_num_seqs},
                                         folder="goodput-referee")
    rounds: list[dict[str, Any]] = []
    server_facts: dict[str, Any] = {"server": cfg.to_dict()}
    with started(cfg, out_dir, server_facts) as server:
        run_online(server.base_url, server.api_key, server.model, wl, [math.inf], warmup_requests=len(wl.requests),
                   timeline=False, step_prefix="goodput-warmup", **recorded)  # one-time costs, kept by no round
        for i in range(times):
            def lab_run() -> Result:
                return run_online(server.base_url, server.api_key, server.model, wl, [math.inf], warmup_requests=0,
                                  timeline=False, step_prefix=f"goodput{i}", store=_Recorded(store), **recorded)[0]

            def vllm_run() -> dict[str, Any]:
                return bench_serve(server.base_url, server.api_key, server.model, cfg.tokenizer or cfg.model, wl,
                                   math.inf, out_dir / f"round{i}", slo=slo)

            lab_first = i % 2 == 0
            first = lab_run() if lab_first else vllm_run()
            second = vllm_run() if lab_first else lab_run()
            lab, bench = (first, second) if lab_first else (second, first)
            mine, theirs = goodput(lab, slo, clock="send"), bench["goodput"]
            rounds.append({"lab_first": lab_first, "vllm_request_goodput": bench.get("request_goodput"),
                           "lab_rule_on_vllm_records": theirs["goodput_rps"], "lab_goodput": mine["goodput_rps"],
                           "attainment": two_proportions(mine["good"], mine["sent"], theirs["good"], theirs["sent"]),
                           "lab": mine, "vllm": theirs})
    same_rule = all(r["vllm_request_goodput"] is not None and math.isclose(
        r["vllm_request_goodput"], r["lab_rule_on_vllm_records"], rel_tol=1e-9) for r in rounds)
    agree = all(r["attainment"]["agree"] for r in rounds)
    facts["goodput_referee"] = {
        "slo": slo.label, "rounds": rounds, "same_rule": same_rule, "attainments_agree": agree, **server_facts,
        "verdict": (f"vLLM's request_goodput {'equals' if same_rule else 'DIFFERS FROM'} the lab's rule on its records "
                    f"in {times} rounds; the two clients' attainments "
                    f"{'agree' if agree else 'DIFFER'} (two-proportion z, 99%)"),
        "gpu": device_facts().get("gpu"), "date": time.strftime("%Y-%m-%d")}
    _write(out_dir.parent, "goodput-referee", facts["goodput_referee"])


BIG = "synthetic:llama-3.1-8b"


def record_pareto(out_dir: Path, store: ResultStore, facts: dict[str, Any], *, model: str = BIG,
                  max_num_seqs: tuple[int, ...] = (32, 256), max_num_batched_tokens: tuple[int, ...] = (2048, 8192),
                  schemes: tuple[str, ...] = ("bf16", "fp8"), levels: tuple[int, ...] = (1, 16, 64, 256),
                  repeat: int = 4) -> None:
    """Step `pareto`: the tuning front on the synthetic 8B (8 servers of ~100 s start-up each by default),
    facts["pareto"] holds every point and the front."""
    got = sweep(model, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, schemes=schemes,
                levels=levels, repeat=repeat, out_dir=Path(out_dir) / "pareto", store=_Recorded(store), gpu_memory_utilization=0.9,
                max_model_len=4096)
    got.pop("results")
    facts["pareto"] = {**got, "model": model, "gpu": device_facts().get("gpu"), "date": time.strftime("%Y-%m-%d")}
    _write(out_dir, "pareto", facts["pareto"])
