"""Record the reference runs the labs show on machines without a GPU (run on the H200).

Every run goes through the same lablib code a notebook uses (lablib.bench.offline.run on an engine) and is
stored as a Result with provenance "recorded", the GPU, the versions and the date, so a
CPU user sees exactly what the GPU user would have measured, labelled as recorded.

    PYTHONPATH=/tmp/site python scripts/record_reference.py --out $OUT --steps smoke,startup,big
    PYTHONPATH=/tmp/site python scripts/record_reference.py --out $OUT --steps hf-big,sweep

Steps:
  smoke    vLLM on the embedded model, the journey workload; greedy tokens compared with HF
  startup  a second start of the same engine (warm compile cache) next to the first (cold)
  big      synthetic Llama-3.1-8B: the journey on vLLM, single-stream decode (MBU), and the
           lab's throughput next to `vllm bench throughput` on the same shapes
  hf-big   HF static batching on the same synthetic 8B and the journey (the journey ratio)
  sweep    gpu_memory_utilization sweep on the embedded model: KV capacity, throughput, VRAM
           after each of the configurations (back to baseline each time)
  knobs    max_num_seqs and max_num_batched_tokens sweeps on the synthetic 8B (knobs-budget: the token budget only)
  serve    the OpenAI server with the synthetic 8B under Poisson load at fractions of its capacity, /metrics
           scraped, and `vllm bench serve` on the same requests (serve-wide: up to 3x the burst's capacity)
  serve-check  the lab's client against `vllm bench serve`, three rounds on one server (synthetic 8B;
           serve-check-embedded: the embedded model, whose small steps stream tokens fastest)
  prefix   lab 07: prefix caching on the embedded model, each shared-prefix set and variant from a reset cache,
           vLLM's cached tokens against the simulator's (prefix-batch: 32 requests at once instead of one;
           prefix-on-off: TTFT with caching on and off, and greedy outputs compared; prefix-serve: the hit rate
           from the server's /metrics under Poisson load, caching on and off, next to TTFT; prefix-scarce: pools
           of 48 and 80 blocks, every arrival order, vLLM's cached tokens against the simulator's evictions)
  speculative  lab 08: vLLM draft model, n-gram and the project's EAGLE head against a pinned baseline, batches
           1-64 (one engine per setting, the batches as waves), counters vs the formula (speculative-8b: the
           synthetic 8B target and 1B draft with vLLM's synthetic sampler at the loop's acceptance: speed at size;
           speculative-eagle-8b-a/-b/-c/-d: a synthetic EAGLE head of the 8B at the trained head's per-position
           acceptance, k 1-3 / 4-6 pinned, then vLLM's defaults, then FP8 weights, at k 4; 6-9 min each)
  tp1      lab 09: TP=1 on one H200 (synthetic 8B bf16, 70B FP8 where disk allows) next to the cost model
  tp-scaling  lab 09: TP=1/2/4, then NCCL's all-reduce against vLLM's and PP at 2 and 4 GPUs (needs 2-4 GPUs of one
           host; the runs a machine has too few GPUs for are rows that say so; facts kept after every run). The
           whole grid is 16 engines, past one 10-minute command: record it in parts, each a step of at most three
           engines (tp-scaling-8b, tp-scaling-8b-x2, tp-scaling-8b-x4, tp-scaling-70b-bf16, tp-scaling-70b-fp8,
           tp-scaling-70b-fp8-x2, tp-scaling-70b-fp8-x4, tp-scaling-70b-fp8-x4-compared; x4: 4 GPUs), whose rows
           merge into facts["tp_scaling"] here and in pack_reference
  attention  lab 02: the attention microbenchmark, HF eager/sdpa/flex prefill on the synthetic 8B, vLLM's backends
  quantization  lab 06: speed and memory per scheme on the synthetic 8B, every scheme that can run (its checkpoints
           first: quantization-prepare, prepare_checkpoints() through the quantizer's environment, LABLIB_QUANT_SITE);
           the same split over two commands: quantization-a (bf16, bf16-kv-fp8, fp8: vLLM switches, no checkpoint)
           and quantization-b (gptq-w4a16, w8a8-int8, awq-w4a16; facts key quantization-2); the lab shows both
           (lablib.experiments.quantization.record.record); quantization-quality: the embedded target's checkpoints made
           there, perplexity through vLLM beside the CPU's
  journey-fp8  the journey's quantized rung: vLLM with FP8 weights on the synthetic 8B, as `big` runs bf16
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lablib.bench.offline import run  # noqa: E402
from lablib.config import BenchConfig, HFConfig, VLLMConfig  # noqa: E402
from lablib.engines.hf import HFEngine  # noqa: E402
from lablib.engines.vllm import VLLMEngine  # noqa: E402
from lablib.experiments.parallel.grid import SCALING_PARTS  # noqa: E402 (lab 09's grid, a step per part)
from lablib.experiments.quantization.recording import QUANT_A, QUANT_B  # noqa: E402 (lab 06's speed engines, 2 steps)
from lablib.experiments.serving.runs import FRACTIONS  # noqa: E402 (what the lab runs live)
from lablib.experiments.speculative.eagle_8b import PARTS as EAGLE_PARTS  # noqa: E402 (the EAGLE grid, a step per part)
from lablib.results import Result, ResultStore  # noqa: E402
from lablib.results.compare import first_divergence  # noqa: E402
from lablib.workloads import Request, Workload, load_workload  # noqa: E402

LAB = "reference"
BIG = "llama-3.1-8b"


def fixed_workload(n: int, prompt_len: int, output_len: int) -> Workload:
    """n prompts of prompt_len tokens (held-out code cut from the evaluation set), output_len tokens out each."""
    from lablib.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model("embedded"))
    windows = [tok(r.prompt).input_ids[1:] for r in load_workload("evaluation").requests]
    reqs = []
    for start in range(0, 511, prompt_len):
        for w in windows:
            text = tok.decode(w[start:start + prompt_len - 1])
            ids = tok(text).input_ids
            if len(ids) == prompt_len and len(reqs) < n:
                reqs.append(Request(id=f"fixed-{len(reqs):03d}", prompt=text, messages=({"role": "user", "content": text},),
                                    max_new_tokens=output_len, prompt_tokens=prompt_len))
    if len(reqs) < n:
        raise ValueError(f"only {len(reqs)} prompts of exactly {prompt_len} tokens; asked for {n}")
    return Workload(f"fixed-{prompt_len}x{output_len}", 1, "held-out code cut to a fixed token length", tuple(reqs))


def log(out: Path, msg: str) -> None:
    print(msg, flush=True)
    with open(out / "log.txt", "a") as f:
        f.write(msg + "\n")


def step_smoke(out: Path, store: ResultStore, facts: dict) -> None:
    journey = load_workload("journey")
    from lablib.experiments.kv import COLD_START_GMU

    with VLLMEngine("embedded", VLLMConfig(gpu_memory_utilization=COLD_START_GMU)) as eng:
        facts["cold_start"] = eng.facts
        r = store.append_recorded(run(eng, journey, BenchConfig(progress=False), lab=LAB, step="vllm-embedded"))
    facts["smoke_close"] = {k: eng.facts.get(k) for k in ("vram_baseline_bytes", "vram_after_close_bytes", "vram_back_to_baseline")}
    log(out, f"smoke: {r.summary['output_tok_s']:.0f} tok/s, facts {json.dumps(eng.facts, default=str)[:600]}")
    hf = HFEngine("embedded", HFConfig(mode="static", batch_size=16, dtype="bfloat16"))
    h = run(hf, journey.head(16), BenchConfig(progress=False), lab=LAB, step="hf-static-b16-embedded-bf16")
    hf.close()
    pairs = [(a.output_ids, b.output_ids) for a, b in zip(h.requests, r.requests[:16])]
    firsts = [first_divergence(x, y) for x, y in pairs]
    prefix = [(len(x) if at is None else at) / len(x) for (x, _), at in zip(pairs, firsts)]
    facts["greedy_agreement"] = {"identical_requests": sum(at is None for at in firsts), "of": len(firsts),
                                 "mean_matching_prefix_fraction": sum(prefix) / len(prefix)}
    log(out, f"greedy HF vs vLLM: {facts['greedy_agreement']}")


def step_startup(out: Path, store: ResultStore, facts: dict) -> None:
    with VLLMEngine("embedded", VLLMConfig(gpu_memory_utilization=0.3)) as eng:
        facts["warm_start"] = {k: eng.facts[k] for k in ("startup_s", "startup_wall_s")}
    log(out, f"startup warm: {facts['warm_start']}, cold: "
             f"{ {k: facts.get('cold_start', {}).get(k) for k in ('startup_s', 'startup_wall_s')} }")


def step_big(out: Path, store: ResultStore, facts: dict, bench_cli: bool = True) -> None:
    from lablib.models.synthetic import synthetic_spec

    t0 = time.time()
    spec = synthetic_spec(BIG)
    facts["synthetic_made_s"] = time.time() - t0
    cfg = VLLMConfig(max_model_len=4096)
    with VLLMEngine(spec, cfg) as eng:
        facts["big_start"] = {k: eng.facts.get(k) for k in ("startup_s", "startup_wall_s", "kv_tokens", "max_concurrency",
                                                           "attention_backend", "kv_blocks", "block_size")}
        for wl, step in ((load_workload("journey"), "vllm-8b-journey"), (fixed_workload(1, 128, 512), "vllm-8b-single"),
                         (fixed_workload(256, 128, 128), "vllm-8b-256x128x128")):
            r = store.append_recorded(run(eng, wl, BenchConfig(progress=False), lab=LAB, step=step))
            log(out, f"{step}: {r.summary['output_tok_s']:.0f} out tok/s, {r.summary['total_tok_s']:.0f} total tok/s, "
                     f"MBU {r.roofline.get('mbu')}, wall {r.wall_s:.2f}s")
    facts["big_close"] = {k: eng.facts.get(k) for k in ("vram_baseline_bytes", "vram_after_close_bytes", "vram_back_to_baseline")}
    if not bench_cli:
        return
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "throughput", "--model", spec.path,
           "--tokenizer", str(Path(__file__).resolve().parent.parent / "data/models/target"),
           "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "128",
           "--num-prompts", "256", "--max-model-len", "4096", "--output-json", str(out / "bench_throughput.json")]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    (out / "bench_throughput.log").write_text(p.stdout[-6000:] + "\n" + p.stderr[-6000:])
    facts["bench_throughput_wall_s"] = time.time() - t0
    log(out, f"vllm bench throughput rc={p.returncode}: {p.stdout[-400:]}")


def step_hf_big(out: Path, store: ResultStore, facts: dict, compile: bool = False) -> None:
    """HF static batching of the journey in one batch of 64 on the synthetic 8B (sdpa); `compile`: again with the
    static cache and the compiled decode step (journey.hf_compile_steps' rung), its compile time in the facts."""
    from lablib.models.synthetic import synthetic_spec

    spec = synthetic_spec(BIG)
    journey = load_workload("journey")
    for b in (64,):
        t0 = time.time()
        eng = HFEngine(spec, HFConfig(mode="static", batch_size=b, compile=compile))
        tail = "-compile" if compile else ""
        r = run(eng, journey, BenchConfig(progress=False), lab=LAB, step=f"hf-static-b{b}{tail}-8b-journey")
        eng.close()
        store.append_recorded(r)
        facts[f"hf-static-b{b}{tail}-8b-journey"] = {"step_s": round(time.time() - t0, 1),
                                                     **({"compile": r.engine_facts["compile"]} if compile else {})}
        log(out, f"hf static b{b}{tail} 8b journey: {r.summary['output_tok_s']:.1f} tok/s wall {r.wall_s:.1f}s")


def keep_sweep(out: Path, store: ResultStore, facts: dict, key: str, rows: list[dict], results: list[Result]) -> None:
    """Store a sweep's Results as recorded, log its rows, add the rows to the facts under `key`."""
    for r in results:
        store.append_recorded(r)
    for row in rows:
        log(out, f"{key} {json.dumps(row, default=str)}")
    facts.setdefault(key, []).extend(rows)


def step_sweep(out: Path, store: ResultStore, facts: dict) -> None:
    from lablib.experiments.kv import gpu_memory_utilization_sweep

    values = [0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    keep_sweep(out, store, facts, "sweep", *gpu_memory_utilization_sweep(values, lab=LAB))


KNOBS = ((8, None), (64, None), (256, None), (256, 512))
WIDE = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0)  # past a burst's capacity, where the 8B server saturates (it had not by 1.25)
KNOBS_BUDGET = ((256, 512), (256, 2048))  # the step-token budget alone (the first GPU session ran out of time here)


def step_knobs(out: Path, store: ResultStore, facts: dict, configs=KNOBS) -> None:
    """Scheduler knobs on the synthetic 8B, one engine per (max_num_seqs, max_num_batched_tokens)."""
    from lablib.experiments.scheduling import scheduler_sweep
    from lablib.models.synthetic import synthetic_spec

    spec = synthetic_spec(BIG)
    for seqs, toks in configs:  # one at a time: each kept as it ends
        keep_sweep(out, store, facts, "scheduler_sweep",
                   *scheduler_sweep([seqs], [toks], model=spec, lab=LAB, max_model_len=4096))


BIG_SERVER = dict(gpu_memory_utilization=0.9, max_model_len=4096)  # the synthetic 8B's server: most of the GPU for KV


def step_serve(out: Path, store: ResultStore, facts: dict, fractions: tuple[float, ...] = FRACTIONS) -> None:
    """vLLM's OpenAI server with the synthetic 8B (127.0.0.1, API key): the journey x4 at fractions of its measured
    capacity, /metrics scraped, then `vllm bench serve` on the same requests (lablib.experiments.serving.runs.rate_sweep)."""
    from lablib.experiments.serving.runs import rate_sweep
    from lablib.models.synthetic import synthetic_spec

    online = rate_sweep(synthetic_spec(BIG), repeat=4, fractions=fractions, out_dir=out / "serve", lab=LAB,
                        **BIG_SERVER)
    online["fractions"] = list(fractions)
    for r in online.pop("results"):
        store.append_recorded(r)
        log(out, f"{r.step}: {r.summary['output_tok_s']:.0f} out tok/s, TTFT p50/p99 {r.summary['ttft_s']['p50']}/"
                 f"{r.summary['ttft_s']['p99']}, TPOT p50 {r.summary['tpot_s']['p50']}, notes {r.notes[:2]}")
    facts["serve"] = online
    log(out, f"serve: capacity {online['capacity_rps']:.2f} req/s, compare {json.dumps(online.get('compare'))}")


def step_serve_check(out: Path, store: ResultStore, facts: dict, model: str = BIG) -> None:
    """The lab's burst against `vllm bench serve`'s, three rounds on one server, the first client alternating."""
    from lablib.bench.client import client_check
    from lablib.experiments.serving.runs import cross_check
    from lablib.models.synthetic import synthetic_spec

    big = model == BIG
    check = cross_check(synthetic_spec(BIG) if big else model, repeat=4, times=3, lab=LAB,
                        out_dir=out / ("serve-check" if big else f"serve-check-{model}"),
                        **(BIG_SERVER if big else {}))
    for r in check.pop("results"):
        store.append_recorded(dataclasses.replace(r, step=r.step if big else f"{model}-{r.step}"))
        log(out, f"{r.step} ({model}): {client_check(r)['verdict']}")
    facts["serve_check" if big else f"serve_check_{model}"] = check
    log(out, f"serve-check ({model}): lab / vllm bench serve output tok/s per round {check['output_tok_s_ratios']}")


def step_prefix(out: Path, store: ResultStore, facts: dict, max_num_seqs: int = 1) -> None:
    """Lab 07: the embedded model with prefix caching on, each workload from a reset cache, vLLM's num_cached_tokens and
    counter deltas next to the simulator's prediction (lablib.experiments.prefix.runs.measure); one request at a time
    (exact by construction) or, as prefix-batch, 32 at once (where the schedule decides what is cached when)."""
    from lablib.experiments.prefix import runs, workloads

    rows = []
    with VLLMEngine("embedded", VLLMConfig(gpu_memory_utilization=0.3, max_num_seqs=max_num_seqs,
                                           enable_prefix_caching=True)) as eng:
        sets = [load_workload(n) for n in workloads.SHARED_SETS]
        sets += [workloads.variant(k, "shared-prefix-512", eng.tokenizer) for k in ("shared-after", "multi-turn")]
        for wl in sets:
            got = runs.measure(eng, wl, lab=LAB, step=f"prefix-{wl.name}-seqs-{max_num_seqs}")
            store.append_recorded(got.pop("result"))
            got.pop("predicted")
            rows.append({"workload": wl.name, "max_num_seqs": max_num_seqs, **got})
            log(out, f"prefix {wl.name} (max_num_seqs {max_num_seqs}): {got['verdict']}")
    facts[f"prefix_seqs_{max_num_seqs}"] = rows


def step_journey_fp8(out: Path, store: ResultStore, facts: dict) -> None:
    """The quantized rung of the journey (lab 06's): vLLM with FP8 weights on the synthetic 8B, as step_big runs bf16."""
    from lablib.experiments.journey import FP8_RECORDED
    from lablib.models.synthetic import synthetic_spec

    with VLLMEngine(synthetic_spec(BIG), VLLMConfig(max_model_len=4096, quantization="fp8")) as eng:
        r = store.append_recorded(run(eng, load_workload("journey"), BenchConfig(progress=False), lab=LAB,
                                      step=FP8_RECORDED))
        log(out, f"{FP8_RECORDED}: {r.summary['output_tok_s']:.0f} out tok/s, MBU {r.roofline.get('mbu')}")


def _lab(lab: str, name: str = "record", **kw):
    """A lab's own recording step, `lablib.experiments.<lab>.record.<name>(out, store, facts, **kw)`."""
    def step(out: Path, store: ResultStore, facts: dict) -> None:
        import importlib

        getattr(importlib.import_module(f"lablib.experiments.{lab}.record"), name)(out, store, facts, **kw)
    return step




STEPS = {"smoke": step_smoke, "startup": step_startup, "big": step_big, "big-lab": lambda o, s, f: step_big(o, s, f, bench_cli=False), "hf-big": step_hf_big,
         "hf-compile-big": lambda o, s, f: step_hf_big(o, s, f, compile=True), "sweep": step_sweep,
         "knobs": step_knobs, "knobs-budget": lambda o, s, f: step_knobs(o, s, f, KNOBS_BUDGET), "serve": step_serve,
         "serve-wide": lambda o, s, f: step_serve(o, s, f, WIDE), "serve-check": step_serve_check,
         "serve-check-embedded": lambda o, s, f: step_serve_check(o, s, f, "embedded"), "prefix": step_prefix,
         "prefix-batch": lambda o, s, f: step_prefix(o, s, f, 32), "prefix-on-off": _lab("prefix", "record_on_off"),
         "prefix-serve": _lab("prefix", "record_serve"), "prefix-scarce": _lab("prefix", "record_scarce"),
         "speculative": _lab("speculative"), "speculative-8b": _lab("speculative", "record_8b"),
         **{f"speculative-eagle-8b-{p}": _lab("speculative", "record_eagle_8b", part=p) for p in EAGLE_PARTS},
         "tp1": _lab("parallel"),
         "tp-scaling": _lab("parallel", "record_scaling"),
         **{name: _lab("parallel", "record_scaling", **part) for name, part in SCALING_PARTS.items()},
         "attention": _lab("attention"), "attention-sdpa": _lab("attention", "record_sdpa"),
         "quantization": _lab("quantization"),
         "quantization-prepare": _lab("quantization", "record_checkpoints"),
         "quantization-a": _lab("quantization", schemes=QUANT_A),
         "quantization-b": _lab("quantization", schemes=QUANT_B, key="quantization-2"),
         "quantization-quality": _lab("quantization", "record_quality"), "journey-fp8": step_journey_fp8,
         "capacity": _lab("serving", "record_capacity"), "goodput-referee": _lab("serving", "record_goodput"),
         "advisor-check": _lab("advisor"),
         "pareto": _lab("serving", "record_pareto")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", default="smoke,startup,big")
    ap.add_argument("--stop-on-error", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    store = ResultStore(args.out / "reference.jsonl")
    facts: dict = {}
    for name in args.steps.split(","):
        t0 = time.time()
        failed = interrupted = False
        try:
            STEPS[name](args.out, store, facts)
        except Exception:
            log(args.out, f"step {name} FAILED:\n{traceback.format_exc()}")
            failed = True
        except KeyboardInterrupt:  # gpu_session.sh's time limit (SIGINT): keep what the step had measured so far
            log(args.out, f"step {name} INTERRUPTED (time limit): its facts so far are kept\n{traceback.format_exc()}")
            interrupted = True
        facts.setdefault("step_seconds", {})[name] = round(time.time() - t0, 1)
        (args.out / f"facts-{args.steps.replace(',', '_')}.json").write_text(json.dumps(facts, indent=1, default=str))
        if interrupted or (failed and args.stop_on_error):
            break
    log(args.out, f"done: {facts.get('step_seconds')}")


if __name__ == "__main__":
    main()
