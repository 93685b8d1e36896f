"""Lab 09's measured runs: vLLM at TP=t on the synthetic checkpoints, each batch beside the cost model's step.

`measure` starts one engine (`VLLMEngine`) for a (model, scheme, t) and sends b fixed-shape requests at once for
each batch b (`fixed_shapes`), and sets decode tok/s and the per-token latency (median TPOT) beside the model's
prediction for that t on the GPU it ran on (`predict`). Before any engine starts, a run that cannot happen here (a
t the shape cannot split into, more GPUs than a worker here can use, which is NVML's count cut to
CUDA_VISIBLE_DEVICES, a configuration that cannot fit) becomes a row that says "not measured" and why, never a
number (`not_measured`, `why_not`); the 70B shape, and a synthetic checkpoint larger than the free disk, run on
vLLM's dummy weights instead (`dummy_weights`). The notebook's calls (`lablib.experiments.parallel`) and the
recording steps (`record`, through `grid.measure_runs`) both measure through here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import statistics
from typing import Any

from ... import validate
from ...bench.offline import run as bench_run
from ...config import BenchConfig, lab_id, VLLMConfig
from ...engines.process import environ
from ...engines.vllm import VLLMEngine
from ...hardware.device import device_facts, nvml_memory, usable_gpu_count
from ...hardware.fit import check_fit
from ...hardware.roofline import lookup_gpu
from ...mechanisms import parallel as tp
from ...mechanisms.pipeline import pipeline_step
from ...models import load_tokenizer, resolve_model
from ...models.architecture import architectures, parameter_count
from ...models.synthetic import synthetic_folder, synthetic_spec
from ...results.record import Result
from ...results.store import ResultStore
from ...workloads import Request, Workload, load_workload
from .fit import check_tp, gpu_bytes, shape_spec
from .model import model_shape

LAB = lab_id("09")
PROMPT_LEN, OUTPUT_LEN = 128, 256  # the fixed shapes of the measured runs
QUANTIZATION = {"bf16": None, "fp8": "fp8"}  # scheme -> VLLMConfig.quantization (online FP8 of a bf16 checkpoint)


def gpus_here(facts: dict[str, Any] | None = None) -> tuple[int, str]:
    """The GPUs a worker started here can use (`usable_gpu_count`), and, when CUDA_VISIBLE_DEVICES hides some
    of those NVML counts, the note that says so ("CUDA_VISIBLE_DEVICES='0' of its 8 GPUs"), else ""."""
    facts = device_facts() if facts is None else facts
    usable = usable_gpu_count(facts)
    if usable == facts["gpu_count"]:
        return usable, ""
    return usable, f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} of its {facts['gpu_count']} GPUs"


def fixed_shapes(n: int, prompt_len: int = PROMPT_LEN, output_len: int = OUTPUT_LEN) -> Workload:
    """n distinct prompts of exactly prompt_len tokens (held-out code from the evaluation set, the embedded
    tokenizer's ids, which a synthetic checkpoint takes), output_len tokens each. A synthetic model is sent the
    chat form (bench.offline.prepare renders it), a few tokens longer: rows use the context the records report."""
    validate.integer("fixed_shapes", "n", n, "ask for at least one request, e.g. 8.")
    tok = load_tokenizer(resolve_model("embedded"))
    windows = [tok(r.prompt).input_ids[1:] for r in load_workload("evaluation").requests]
    reqs: list[Request] = []
    for start in range(0, 511, prompt_len):
        for w in windows:
            text = tok.decode(w[start:start + prompt_len - 1])
            if len(tok(text).input_ids) == prompt_len and len(reqs) < n:
                reqs.append(Request(f"fixed-{len(reqs):03d}", text, ({"role": "user", "content": text},),
                                    output_len, prompt_len))
    if len(reqs) < n:
        raise ValueError(f"fixed_shapes: only {len(reqs)} prompts of exactly {prompt_len} tokens; asked for {n}. "
                         "Fix: a shorter prompt_len or fewer requests.")
    return Workload(f"fixed-{prompt_len}x{output_len}", 1, "held-out code cut to a fixed token length", tuple(reqs))


ALL_REDUCES = ("custom", "nccl")  # vLLM's own all-reduce kernel (its default), or NCCL's (disable_custom_all_reduce)
SYMM_MEM = "VLLM_ALLREDUCE_USE_SYMM_MEM"  # "0": no NVLink multicast (off on the lent multi-GPU H200 machines)
# vLLM 0.26's default optimisation level (-O2) fuses each all-reduce with the RMSNorm after it into one FlashInfer
# kernel for TP > 1 on Hopper when FlashInfer is installed (vllm/config/vllm.py: OPTIMIZATION_LEVEL_02's
# fuse_allreduce_rms = enable_allreduce_rms_fusion), whichever all-reduce disable_custom_all_reduce picks: the
# NCCL-vs-custom rows would then time FlashInfer's kernel in both. Every run turns the pass off, so each arm runs
# the kernel it names (pinned in both: the same compilation for every run of the lab).
NO_ALLREDUCE_FUSION = {"pass_config": {"fuse_allreduce_rms": False}}


@dataclasses.dataclass(frozen=True)
class Run:
    """One engine of the lab's measured runs: a synthetic shape, its weight scheme and how it spreads over GPUs.

    `t` splits each layer's matrices across t GPUs (tensor_parallel_size), `pp` the layers into pp stages
    (pipeline_parallel_size): the engine takes t x pp GPUs. `all_reduce` is the kernel of TP's two all-reduces per
    layer: vLLM's custom one (its default) or NCCL's; at t=1 there is none to choose.
    """

    model: str  # a synthetic shape (lablib.models.architecture), e.g. "llama-3.1-8b"
    scheme: str = "bf16"  # QUANTIZATION's keys: bf16, or fp8 (vLLM's online FP8 of the bf16 checkpoint)
    t: int = 1  # tensor_parallel_size
    pp: int = 1  # pipeline_parallel_size
    all_reduce: str = "custom"  # ALL_REDUCES

    def __post_init__(self) -> None:
        validate.choice("Run", "scheme", self.scheme, tuple(QUANTIZATION))
        validate.integer("Run", "t", self.t, "1 for one GPU, else the GPUs each layer is split across.")
        validate.integer("Run", "pp", self.pp, "1 for no pipeline, else the number of stages.")
        validate.choice("Run", "all_reduce", self.all_reduce, ALL_REDUCES)
        if self.all_reduce != "custom" and self.t == 1:
            raise validate.refuse("Run", "all_reduce", self.all_reduce, "'custom' at t=1 (TP=1 has no all-reduce)",
                                  "set t >= 2 to compare NCCL's all-reduce with vLLM's, or leave all_reduce='custom'.")

    @property
    def gpus(self) -> int:
        return self.t * self.pp

    @property
    def name(self) -> str:
        """What tells it from the others at the same GPU count: "tp2", "tp2-nccl", "tp1-pp2"."""
        return f"tp{self.t}" + (f"-pp{self.pp}" if self.pp > 1 else "") + (
            f"-{self.all_reduce}" if self.all_reduce != "custom" else "")

    def step(self, batch: int, prefix: str = "") -> str:
        """The Result's step, unique per run and batch: "tp2-nccl-llama-3.1-8b-bf16-b64"; `prefix` tells one
        recording's runs from another's of the same shape ("scaling-tp1-..." is not step tp1's "tp1-...")."""
        return f"{prefix}{self.name}-{self.model}-{self.scheme}-b{batch}"

    def config(self, batches: tuple[int, ...]) -> VLLMConfig:
        """The engine's knobs: vLLM's multiprocess executor named explicitly for more than one GPU, FlashInfer's
        all-reduce + RMSNorm fusion off (NO_ALLREDUCE_FUSION)."""
        return VLLMConfig(max_num_seqs=max(batches), max_model_len=4096, quantization=QUANTIZATION[self.scheme],
                          tensor_parallel_size=self.t, pipeline_parallel_size=self.pp,
                          disable_custom_all_reduce=self.all_reduce == "nccl",
                          distributed_executor_backend="mp" if self.gpus > 1 else None,
                          compilation_config=NO_ALLREDUCE_FUSION)

    def fields(self) -> dict[str, Any]:
        return {"model": self.model, "scheme": self.scheme, "t": self.t, "pp": self.pp,
                "all_reduce": self.all_reduce, "gpus": self.gpus, "run": self.name}


def worker_env(gpus: int) -> contextlib.AbstractContextManager[None]:
    """VLLM_ALLREDUCE_USE_SYMM_MEM=0 while an engine of more than one GPU is spawned and runs (its worker and vLLM's
    own processes inherit it), restored after: the lent multi-GPU machines have NVLink multicast off."""
    return environ(SYMM_MEM, "0") if gpus > 1 else contextlib.nullcontext()


def predict(model: str, scheme: str, t: int, batch: int, context: float, gpu_name: str | None,
            pp: int = 1) -> dict[str, Any]:
    """The cost model's step for this run on the GPU it ran on (None when the GPU is not in the spec table, or for
    TP and PP together, which the model does not price): `decode_step` at TP=t, `pipeline_step` at PP=pp (TP=1).

    At PP=pp the run keeps one microbatch in flight: its b requests all fit one scheduler batch (max_num_seqs is
    the largest batch), so no second batch is there to fill the other stages while one decodes. The predicted
    throughput is that, b / the step's latency across every stage, not `pipeline_step`'s pp microbatches' b / the
    slowest stage (what a pipeline kept full would reach)."""
    peak = lookup_gpu(gpu_name)
    if peak is None or not (peak.bf16_flops or peak.fp16_flops) or (pp > 1 and t > 1):
        return {"predicted_ms": None, "predicted_tok_s": None}
    gpu = tp.Gpu(peak.name, peak.memory_gb * 1e9, peak.peak_bw, peak.bf16_flops or peak.fp16_flops)
    shape = model_shape(model, scheme)
    step: Any = (pipeline_step(shape, batch, round(context), pp, gpu, tp.NVLINK4) if pp > 1 else
                 tp.decode_step(shape, batch, round(context), t, gpu, tp.NVLINK4))
    tok_s = batch / step.latency_s if pp > 1 else step.throughput_tok_s  # PP: one microbatch in flight
    return {"predicted_ms": step.latency_s * 1e3, "predicted_tok_s": tok_s}


def not_measured(model: str, scheme: str, t: int, batch: int, why: str, pp: int = 1,
                 all_reduce: str = "custom") -> dict[str, Any]:
    """The row of a run that did not happen: its reason, no number."""
    return {**Run(model, scheme, t, pp, all_reduce).fields(), "batch": batch, "status": f"not measured: {why}",
            "tpot_ms": None, "decode_tok_s": None, "output_tok_s": None, "ttft_ms": None, "peak_memory_GiB": None,
            "predicted_ms": None, "measured_over_predicted": None, "weights": None}


def too_few(t: int, facts: dict[str, Any] | None = None) -> str | None:
    """Why t GPUs cannot be used here ("needs 4 GPUs, this machine has 2"), or None when a worker can use t GPUs."""
    gpus, note = gpus_here(facts)
    if t <= gpus:
        return None
    return f"needs {t} GPU{'s' if t > 1 else ''}, this machine " + (
        f"lets a worker use {gpus} ({note})" if note else f"has {gpus}")


def why_not(model: str, scheme: str, t: int, config: VLLMConfig, facts: dict[str, Any] | None = None) -> str | None:
    """Why this run cannot happen on this machine (GPUs a worker can use: t x the config's pipeline stages; memory),
    or None when it can (a checkpoint the disk cannot hold is no reason: `measure` runs vLLM's dummy weights then)."""
    short = too_few(t * config.pipeline_parallel_size, facts)
    if short:
        return short
    mem = nvml_memory()
    total = mem[2] if mem else gpu_bytes()
    report = check_fit(shape_spec(model), config, total)
    if not report.fits:
        return report.advice
    return None


# shapes whose bf16 checkpoint is never written: vLLM's dummy loader draws their weights at load, in step tp1 and
# in the scaling runs alike (one weights path for every run of the shape, no minutes spent writing 141 GB, and
# none of the 235 GiB disk of a 4- or 8-GPU machine)
DUMMY_SHAPES = {"llama-3.1-70b": "the 70B's 141 GB bf16 checkpoint is never written"}


def dummy_weights(model: str) -> str | None:
    """Why `measure` runs `model` on vLLM's dummy weights (load_format="dummy"), or None for its synthetic
    checkpoint: always for DUMMY_SHAPES, else only when the checkpoint cannot be written here (`no_room_on_disk`)."""
    return DUMMY_SHAPES.get(model) or no_room_on_disk(model)


def no_room_on_disk(model: str) -> str | None:
    """Why the bf16 synthetic checkpoint of `model` cannot be written here (absent, larger than the free disk), or
    None when it is there or fits. `measure` then runs vLLM's dummy weights instead (`synthetic_spec(weights=False)`)."""
    need = parameter_count(architectures()[model]) * 2  # the bf16 synthetic checkpoint
    folder = synthetic_folder(model)
    if not (folder / "config.json").exists():
        probe = next(p for p in (folder, *folder.parents) if p.exists())
        free = shutil.disk_usage(probe).free
        if free < 1.05 * need:
            return (f"the bf16 synthetic checkpoint needs {need / 1e9:.0f} GB of disk under {folder.parent}, "
                    f"{free / 1e9:.0f} GB is free")
    return None


def _row(r: Result, run: Run, batch: int) -> dict[str, Any]:
    tpot, ttft = r.summary["tpot_s"].get("p50"), r.summary["ttft_s"].get("p50")
    context = statistics.mean(q.prompt_tokens + q.output_tokens / 2 for q in r.requests)
    pred = predict(run.model, run.scheme, run.t, batch, context, r.hardware.get("gpu"), run.pp)
    peak = r.memory.get("peak_bytes")
    return {**run.fields(), "batch": batch, "status": "measured",
            "tpot_ms": tpot * 1e3 if tpot else None, "decode_tok_s": batch / tpot if tpot else None,
            "output_tok_s": r.summary["output_tok_s"], "ttft_ms": ttft * 1e3 if ttft is not None else None,
            "peak_memory_GiB": peak / 2**30 if peak else None, "context": context, **pred,
            "measured_over_predicted": tpot * 1e3 / pred["predicted_ms"] if tpot and pred["predicted_ms"] else None,
            "gpu": r.hardware.get("gpu"), "step": r.step,
            "recorded_at": r.recorded_at}  # which Result of this step the row is (scripts/pack_reference.py)


def measure(model: str, scheme: str = "bf16", t: int = 1, batches: tuple[int, ...] = (1, 8, 64),
            prompt_len: int = PROMPT_LEN, output_len: int = OUTPUT_LEN, store: ResultStore | None = None,
            lab: str = LAB, *, pp: int = 1, all_reduce: str = "custom", step_prefix: str = ""
            ) -> tuple[list[dict[str, Any]], list[Result]]:
    """vLLM on the synthetic `model` at TP=t x PP=pp: one engine, then b fixed-shape requests at once for each batch.

    Refuses a bad t, pp or all_reduce (ValueError) and turns a run this machine cannot make into "not measured"
    rows, both before any engine starts. With more than one GPU the engine runs vLLM's multiprocess executor
    (distributed_executor_backend="mp", named explicitly) and its workers start with NVLink multicast off
    (VLLM_ALLREDUCE_USE_SYMM_MEM=0); all_reduce="nccl" passes disable_custom_all_reduce=True. Each Result's step
    names the run (`Run.step`, after `step_prefix`), so TP=2 with NCCL and with vLLM's kernel are told apart. The
    70B shape always runs on vLLM's dummy weights, another shape only when its checkpoint cannot fit the disk
    (`dummy_weights`); the `weights` column says which.
    """
    run = Run(model, scheme, t, pp, all_reduce)
    batches = tuple(validate.integers("measure", "batches", batches, "pass batch sizes, e.g. (1, 8, 64)."))
    check_tp(model, t)
    config = run.config(batches)
    why = why_not(model, scheme, t, config)
    if why:
        return [not_measured(model, scheme, t, b, why, pp, all_reduce) for b in batches], []
    disk = dummy_weights(model)
    if disk:  # vLLM draws the weights itself: same shape, same speed, nothing on disk
        config = dataclasses.replace(config, load_format="dummy")
    rows, results = [], []
    with worker_env(run.gpus), VLLMEngine(synthetic_spec(model, weights=not disk), config) as eng:
        for i, b in enumerate(batches):
            try:
                r = bench_run(eng, fixed_shapes(b, prompt_len, output_len), BenchConfig(progress=False), lab=lab,
                              step=run.step(b, step_prefix), store=store)
            except Exception as e:  # the batches before it stay measured; this one and the rest say why not
                why = f"failed: {type(e).__name__}: {e}"[:400]
                rows += [not_measured(model, scheme, t, later, why if later == b else f"not run after batch {b} "
                                      "failed", pp, all_reduce) for later in batches[i:]]
                break
            rows.append({**_row(r, run, b), "weights": f"vLLM dummy weights ({disk})" if disk else
                         "synthetic checkpoint"})
            results.append(r)
    return rows, results

