"""The journey: one workload, every step of the optimisation ladder this machine can run.

The ladder starts at naive Hugging Face `generate` (one request at a time) and climbs
through static batching to vLLM's paged attention and continuous batching, the same engine behind
its OpenAI server, then quantization,
prefix caching and speculative decoding. Each step runs the same journey workload and
appends its Result to one store, so the last lab (and the HTML report) can show the
whole road. A step this machine cannot run (vLLM without a GPU) is listed as skipped
with the reason, never silently dropped.

A rung may name its runs recorded on the H200 (`Step.recorded`, step names in
`data/reference/`): `road` puts them right after the rung, so the report shows the whole
road on any machine, the live rungs and the recorded ones side by side, in the ladder's
order. A later lab adds a rung (and its recording) here, and the report's picture grows with it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from .. import validate
from ..bench.offline import run
from ..config import BenchConfig, HFConfig
from ..engines.hf import HFEngine
from ..hardware.device import torch_threads
from ..results.record import Result
from ..results.reference import load_reference, reference_steps
from ..results.store import ResultStore
from ..workloads import load_workload


@dataclass(frozen=True)
class Step:
    """One rung of the ladder."""

    name: str  # "hf-naive", "hf-static-b8", ...
    make_engine: Callable[[str], Any]  # model name → engine
    needs: str = "cpu"  # "cpu" (runs anywhere) or "gpu+vllm"
    why: str = ""  # one line: what this step changes
    recorded: tuple[str, ...] = ()  # runs of this rung recorded on the H200 (step names in data/reference/)
    record_step: str = ""  # scripts/record_reference.py's step that records them ("": the rung's own name)


# HF static batching of the whole journey in one batch of 64, on the synthetic 8B: the H200's HF rung.
HF_RECORDED = ("hf-static-b64-8b-journey",)
# vLLM with FP8 weights (lab 06's rung) on the synthetic 8B: scripts/record_reference.py --steps journey-fp8
FP8_RECORDED = "vllm-fp8-8b-journey"


def hf_steps(batch_sizes: list[int]) -> list[Step]:
    """Naive generate, then static batching at each size > 1; the last HF step carries the H200's HF recording."""
    steps = [Step("hf-naive", lambda m: HFEngine(m, HFConfig()), why="HF generate, one request at a time")]
    for b in batch_sizes:
        if b > 1:
            steps.append(Step(f"hf-static-b{b}", lambda m, b=b: HFEngine(m, HFConfig("static", b)),
                              why=f"left-padded batches of {b}; each batch waits for its longest member"))
    steps[-1] = replace(steps[-1], recorded=HF_RECORDED)
    return steps


def ladder(batch_sizes: list[int]) -> list[Step]:
    """Every step, in order; `available` says which this machine can run."""
    from ..config import VLLMConfig
    from ..engines.server import ServerEngine
    from ..engines.vllm import VLLMEngine

    return hf_steps(batch_sizes) + [
        Step("vllm", lambda m: VLLMEngine(m, VLLMConfig()), needs="gpu+vllm", recorded=("vllm-8b-journey",),
             why="vLLM: paged KV cache, continuous batching, CUDA graphs (its own worker process)"),
        Step("vllm-server", lambda m: ServerEngine(m), needs="gpu+vllm", recorded=("serve-rate-inf",),
             why="the same engine behind its OpenAI server: every request over HTTP, streamed"),
        Step("vllm-fp8", lambda m: VLLMEngine(m, VLLMConfig(quantization="fp8")), needs="gpu+vllm",
             recorded=(FP8_RECORDED,), record_step="journey-fp8", why="vLLM with FP8 weights (Hopper's own format, quantized as it loads): "
                                          "half the bytes each decode step reads (lab 06)")]


def available(step: Step) -> tuple[bool, str]:
    if step.needs == "cpu":
        return True, ""
    from ..session import mode

    m = mode()
    if m["live"]:
        return True, ""
    shipped = set(reference_steps())
    have = [name for name in step.recorded if name in shipped]
    if have:
        return False, m["why"] + f"; the report shows its run recorded on the H200 ({', '.join(have)})"
    if step.recorded:
        return False, m["why"] + (f"; its H200 run ({', '.join(step.recorded)}) is not recorded yet: "
                                  f"scripts/record_reference.py --steps {step.record_step or step.name}")
    return False, m["why"] + "; it runs on a machine with an NVIDIA GPU and vLLM"



def run_journey(model: str = "embedded", workload: str = "journey", requests: int | None = None,
                batch_sizes: list[int] = (1, 4, 16), store: ResultStore | None = None,
                bench: BenchConfig = BenchConfig(), lab: str = "journey",
                log: Callable[[str], None] = print, cpu_threads: int | None = None,
                ) -> tuple[list[Result], list[dict[str, str]]]:
    """Run every available step on the workload; return the Results and the skipped steps.

    `cpu_threads` pins torch's threads in this process for every step (None: as they are); only the HF steps
    compute here, vLLM's run in their own worker. On a shared CPU (Colab, CI) a
    second OpenMP thread spins against other processes and one run can come out 3x slower than the next;
    one thread measures the same thing, steadily."""
    validate.integers("run_journey", "batch_sizes", batch_sizes, "e.g. --batch-sizes 1,4,16.")
    if cpu_threads is not None:
        validate.integer("run_journey", "cpu_threads", cpu_threads, "1 on a shared CPU, or None to leave torch's own.")
    wl = load_workload(workload, limit=requests)
    results, skipped = [], []
    for step in ladder(list(batch_sizes)):
        ok, why = available(step)
        if not ok:
            skipped.append({"step": step.name, "why": why})
            log(f"skip {step.name}: {why}")
            continue
        log(f"run  {step.name}: {step.why}")
        engine = step.make_engine(model)
        try:
            with torch_threads(cpu_threads):
                r = run(engine, wl, bench, lab=lab, step=step.name, store=store)
        finally:
            engine.close()
        s = r.summary
        log(f"     {s['output_tok_s']:.1f} output tok/s, TTFT p50 {s['ttft_s']['p50'] * 1e3:.0f} ms, "
            f"wall {r.wall_s:.1f} s")
        results.append(r)
    return results, skipped


def road(results: list[Result], batch_sizes: list[int] = (1, 4, 16)) -> list[Result]:
    """The whole road in the ladder's order: each rung's Results (as given), then its runs recorded on the H200.

    `batch_sizes` are those the Results were run with (they name the HF rungs). A recording already among
    `results` is not added twice; a Result whose step is on no rung goes at the end, never dropped.
    """
    steps = ladder(list(batch_sizes))
    given, shipped = {r.step for r in results}, set(reference_steps())
    out: list[Result] = []
    for step in steps:
        out += [r for r in results if r.step == step.name]
        for name in step.recorded:  # a recording not shipped yet is left out (`available` says which step records it)
            out += ([r for r in results if r.step == name] if name in given else
                    load_reference(name) if name in shipped else [])
    on_ladder = {s.name for s in steps} | {name for s in steps for name in s.recorded}
    return out + [r for r in results if r.step not in on_ladder]


def default_store(folder: str | Path | None = None, lab: str = "journey") -> ResultStore:
    """The main job's store: `<folder>/<lab>.jsonl`, in the one results folder (`results_dir()`) by default."""
    return ResultStore.for_lab(lab) if folder is None else ResultStore(Path(folder) / f"{lab}.jsonl")
