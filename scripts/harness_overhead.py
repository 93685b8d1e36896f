"""How much does the measuring cost? The harness's own work per request and per token, next to one decode step.

    python scripts/harness_overhead.py     # prints one JSON line

Times, on this machine: one memory-monitor sample (the background thread's cost per tick), one token time
stamp (the streamer's put), building one RequestRecord and summarising a run, and one decode step of the
embedded target (HF generate, batch 1, median TPOT over 8 journey requests of 64 tokens).
"""
from __future__ import annotations

import json
import time

from lablib import BenchConfig, HFEngine, load_workload, run
from lablib.engines.hf import _StepClock
from lablib.results import RequestRecord, summarise


def per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main() -> None:
    from lablib.hardware.memory import monitor_overhead_s

    clock = _StepClock(time.perf_counter())
    clock.put(None)  # the prompt
    stamp = per_call(lambda: clock.put(None), 200_000)
    record = per_call(lambda: RequestRecord("r", 100, 64, 0.0, 0.0, 0.01, 0.5, 0.5, [0.01] * 64), 20_000)
    recs = [RequestRecord(str(i), 100, 64, 0.0, 0.0, 0.01 * i, 0.5 + i, 0.5 + i, [0.01 * i + j * 1e-3 for j in range(64)])
            for i in range(64)]
    summary = per_call(lambda: summarise(recs, 10.0), 200) / len(recs)
    engine = HFEngine("embedded")
    r = run(engine, load_workload("journey", limit=8), BenchConfig(max_new_tokens=64, progress=False))
    step = r.summary["tpot_s"]["p50"]
    per_request = 64 * stamp + record + summary
    print(json.dumps({"monitor_sample_s": monitor_overhead_s(), "token_stamp_s": stamp, "record_s": record,
                      "summary_per_request_s": summary, "harness_per_request_64_tokens_s": per_request,
                      "decode_step_s": step, "harness_per_request_over_one_decode_step": per_request / step}))


if __name__ == "__main__":
    main()
