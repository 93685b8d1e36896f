"""`lablab`: the lab's main job. Runs the journey on this machine and writes the report.

The report (default reports/journey.html, one file that opens offline) shows the whole road:
the rungs run here next to those recorded on the H200 (data/reference/), then the numbers.

    lablab                          # journey workload, every step this machine can run: on a CPU the embedded
                                    # model; on an NVIDIA GPU the largest synthetic shape it holds (8B from 40 GB)
    lablab --requests 16 --batch-sizes 1,8
    lablab --model embedded         # the 4.7M model on a GPU too (its speed numbers are launch overhead there)
    lablab --model synthetic:llama-3.2-1b   # any synthetic shape; a preset (needs the hub) or a folder

Torch computes the HF rungs on one thread, as the notebooks do (--threads to change it). The run checks that it
had its core to itself: a share of it well under 1 means other work ran on the same cores, and the summary's `cpu`
field and the report's first lines say so, with the figures (lablib.hardware.contention says how it is judged).

The last line printed is one JSON document (the summary), so scripts can read it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .config import BenchConfig
from .experiments.journey import (best_on_road, default_batch_sizes, default_model, default_store, engine_start, road,
                                  run_journey)
from .hardware.contention import ADVICE, CpuMeter
from .hardware.tiers import tier_of


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,4,16") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lablab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="auto", help="auto (a GPU's real-size synthetic shape, else embedded), "
                    "embedded, synthetic:<architecture>, a preset name, or a local model folder")
    ap.add_argument("--workload", default="journey")
    ap.add_argument("--requests", type=int, default=None, help="use the first N requests (default: all)")
    ap.add_argument("--batch-sizes", type=_int_list, default=None,
                    help="static batch sizes (default 1,4,16 on the embedded model, 1,64 at real size)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="override every request's output length")
    ap.add_argument("--results", type=Path, default=None,
                    help="folder for the JSONL results (default: the repository's results/, or $LABLIB_RESULTS)")
    ap.add_argument("--report", type=Path, default=Path("reports/journey.html"))
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the HF rungs (default 1, as in the notebooks: on a shared CPU a second "
                         "OpenMP thread spins against other work and a run comes out several times slower; one "
                         "thread measures the same thing steadily, and the contention check is calibrated for it)")
    args = ap.parse_args(argv)

    from .report import write_report  # deferred: plotly (through lablib.report)

    t0 = time.time()
    try:
        if args.requests is not None and args.requests < 1:
            raise ValueError(f"--requests={args.requests}: allowed integers >= 1 (the first N requests of the "
                             "workload). Fix: e.g. --requests 8, or leave it out to run them all.")
        if args.threads < 1:
            raise ValueError(f"--threads={args.threads}: allowed integers >= 1 (torch threads for the HF rungs). "
                             "Fix: --threads 1 on a shared CPU, or up to the cores of a machine of your own.")
        model = default_model() if args.model == "auto" else args.model
        batch_sizes = args.batch_sizes or default_batch_sizes(model)
        tier = tier_of()
        if tier is not None:
            print("\n".join(tier.lines()), file=sys.stderr)
        bench = BenchConfig(max_new_tokens=args.max_new_tokens)
        store = default_store(args.results)
        meter = CpuMeter(args.threads)
        results, skipped = run_journey(model, args.workload, args.requests, batch_sizes, store, bench,
                                       cpu_threads=args.threads, cpu=meter)
    except ValueError as e:
        print(f"lablab: {e}", file=sys.stderr)
        return 2
    shown = road(results, batch_sizes)  # the live rungs and the H200's recorded ones, in the ladder's order
    cpu = meter.result()
    if cpu.contended:
        print(f"lablab: {ADVICE}: the HF rungs got {cpu.figures()}.", file=sys.stderr)
    report = write_report(shown, args.report, skipped=skipped, cpu=cpu)
    best = best_on_road(results, args.workload)  # live, this workload, no side road: like with like
    naive = next((r for r in results if r.step == "hf-naive" and r.workload.get("name") == args.workload), None)
    summary = {
        "results": str(store.path), "report": str(report), "wall_s": round(time.time() - t0, 1),
        "steps": {r.step: round(r.summary["output_tok_s"], 2) for r in results},
        "step_wall_s": {r.step: round(r.wall_s, 1) for r in results},  # each rung's measured run
        "engine_starts": {r.step: start for r in results if (start := engine_start(r))},  # vLLM's, where they went
        "best": best.step if best else None, "speedup_over_naive":
        round(best.summary["output_tok_s"] / naive.summary["output_tok_s"], 2) if best and naive else None,
        "contended": cpu.contended, "cpu": cpu.to_dict(), "skipped": skipped,
        "hardware": results[0].hardware.get("gpu") or "CPU",
        "recorded": {r.step: round(r.summary["output_tok_s"], 2) for r in shown if r.provenance == "recorded"}}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
