"""The journey: one workload, every step of the optimisation ladder this machine can run.

The ladder starts at naive Hugging Face `generate` (one request at a time) and climbs
through static batching to vLLM's paged attention and continuous batching, the same engine behind
its OpenAI server, then quantization,
prefix caching and speculative decoding. Each step runs the same journey workload and
appends its Result to one store, so the last lab (and the HTML report) can show the
whole road. A step this machine cannot run (vLLM without a GPU) is listed as skipped
with the reason, never silently dropped.

Each rung belongs to the lab that adds it (`Step.lab`), and `run_journey(through="01")` runs only the rungs of
labs up to that one. Most rungs run the journey workload; a rung whose gain only shows on other requests runs
its own (`Step.workload`: prefix caching needs prompts that share a prefix) beside the rung it is measured
against (`Step.baseline`, on the same requests), and `side_roads` reads each such pair for the report, next to
the journey's own gain.

A rung may name its runs recorded on the H200 (`Step.recorded`, step names in
`data/reference/`): `road` puts them right after the rung, so the report shows the whole
road on any machine, the live rungs and the recorded ones side by side, in the ladder's
order. A later lab adds a rung (and its recording) here, and the report's picture grows with it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import validate
from ..bench.offline import request_lengths, run, run_step
from ..config import BenchConfig, HFConfig, VLLMConfig
from ..engines.hf import HFEngine
from ..engines.together import one_by_one
from ..engines.vllm import VLLMEngine
from ..hardware.contention import CpuMeter
from ..hardware.oom import error_line, free_memory, is_out_of_memory
from ..hardware.tiers import live_model, tier_of
from ..models import resolve_model
from ..models.architecture import architectures, kv_bytes_per_token, parameter_count, shape
from ..models.drafters import speculative_config, synthetic_eagle_config
from ..models.synthetic import synthetic_eagle, synthetic_folder
from ..results.record import Result
from ..results.reference import load_reference, recorded_facts, reference_steps
from ..results.store import ResultStore
from ..session import live_label, mode, Shown
from ..stats import latency_text
from ..workloads import load_workload
from .batching import LAB01_RUNG


@dataclass(frozen=True)
class Step:
    """One rung of the ladder."""

    name: str  # "hf-naive", "hf-static-b8", ...
    make_engine: Callable[[str], Any]  # model name → engine
    needs: str = "cpu"  # "cpu" (runs anywhere) or "gpu+vllm"
    why: str = ""  # one line: what this step changes
    recorded: tuple[str, ...] = ()  # runs of this rung recorded on the H200 (step names in data/reference/)
    record_step: str = ""  # scripts/record_reference.py's step that records them ("": the rung's own name)
    lab: str = "01"  # the lab that adds this rung (one of LABS)
    workload: str = ""  # the rung's own workload ("": the journey's)
    baseline: str = ""  # the rung this one is measured against, on the same workload ("": the road before it)
    models: tuple[str, ...] = ()  # the only models it runs on (): any; e.g. the EAGLE head fits the embedded target
    real_size_limit: int = 0  # on a real-size model, only the first N requests (0: all): the batch-1 rungs' (naive
    # generate's, and vLLM's one request at a time beside it, so both read the same requests)
    # its engine is vLLM's (VLLMEngine, or its server, ServerEngine): those rungs run after the others, their engines
    # started together and measured one by one (lablib.engines.together)
    together: bool = False
    # measured on the engine of the rung named here (a together rung of the same run), its requests sent
    # `max_concurrency` at a time, right after that rung: one engine start fewer (an 8B engine takes ~100 s to start)
    # for a rung that changes only how many requests are in flight. Where that rung does not run, it starts its own.
    rides: str = ""
    max_concurrency: int | None = None  # requests in flight at most (BenchConfig.max_concurrency); None: all at once


# HF static batching of the whole journey in one batch of 64, on the synthetic 8B: the H200's HF rung.
HF_RECORDED = ("hf-static-b64-8b-journey",)
# the same with the static cache and the compiled decode step: scripts/record_reference.py --steps hf-compile-big
HF_COMPILE_RECORDED = ("hf-static-b64-compile-8b-journey",)
# vLLM with FP8 weights (lab 06's rung) on the synthetic 8B: scripts/record_reference.py --steps journey-fp8
FP8_RECORDED = "vllm-fp8-8b-journey"
# Prefix caching (lab 07) on the shared-prefix set, off and on, synthetic 8B: lab 07's on/off runs (prefix.on_off_runs)
PREFIX_WORKLOAD = "shared-prefix-512"
PREFIX_RECORDED = {False: f"prefix-off-{PREFIX_WORKLOAD}-llama-3.1-8b", True: f"prefix-on-{PREFIX_WORKLOAD}-llama-3.1-8b"}
# Speculative decoding (lab 08), the EAGLE head k=4 on the embedded target, at batch 1 and 64 (its cost under load):
# lab 08's runs (speculative.record), each beside the baseline of the same batch.
SPEC_K = 4
SPEC_RECORDED = {1: ("spec-baseline-b1", f"spec-eagle-k{SPEC_K}-b1"), 64: ("spec-baseline-b64", f"spec-eagle-k{SPEC_K}-b64")}
# At real size (a synthetic Llama shape): a random-weight EAGLE-1 head of the target's shape, vLLM's synthetic
# rejection sampler set to the trained embedded head's per-position rates as issue 31's part a recorded them
# (scripts/record_reference.py --steps speculative-eagle-8b-a), at that part's best k at batch 1.
EAGLE_REAL_K = 2
EAGLE_RATES_STEP = "speculative-eagle-8b-a"
LABS = ("01", "02", "03", "04", "05", "06", "07", "08", "09", "10")
CPU_BATCHES = (1, 4, 16)  # the embedded model's HF rungs: batch sizes a CPU climbs in minutes
REAL_SIZE_BATCHES = (1, 64)  # a real-size model's: naive, then the journey's 64 requests in one batch (HF's best)
NAIVE_REAL_SIZE = 8  # naive generate at real size runs the first 8 requests: all 64, one weight read per token each,
# would take most of the ladder's minutes (HF generate ran the 8B at 14.7 tok/s on the H200). vLLM's batch-1
# rungs run the same 8: a latency rung (all 64 one at a time: 7,682 tokens at ~200 tok/s, 40 s of the ladder) and
# its factor over naive generate is then over the same requests
# A recorded rung's own baseline, where it is not its step's baseline's recording (other model, other batch).
RECORDED_BASELINE = {HF_COMPILE_RECORDED[0]: HF_RECORDED[0], PREFIX_RECORDED[True]: PREFIX_RECORDED[False], SPEC_RECORDED[1][1]: SPEC_RECORDED[1][0],
                     SPEC_RECORDED[64][1]: SPEC_RECORDED[64][0]}


def hf_steps(batch_sizes: list[int]) -> list[Step]:
    """Lab 01's rungs: naive generate, then static batching at each size > 1, with the textbook attention kernel
    (eager: the N x N scores written out and read back, one of lab 01's three costs); then lab 02's: the largest
    batch again with PyTorch's fused attention (sdpa), which carries the H200's HF recording (made with sdpa)."""
    eager = "eager"
    steps = [Step("hf-naive", lambda m: HFEngine(m, HFConfig(attn_implementation=eager)),
                  why="HF generate, one request at a time", real_size_limit=NAIVE_REAL_SIZE)]
    for b in batch_sizes:
        if b > 1:
            steps.append(Step(f"hf-static-b{b}", lambda m, b=b: HFEngine(m, HFConfig("static", b,
                                                                                     attn_implementation=eager)),
                              why=f"left-padded batches of {b}; each batch waits for its longest member"))
    b = max(batch_sizes)
    mode, largest = (("static", b), f"hf-static-b{b}") if b > 1 else (("naive", 1), "hf-naive")
    steps.append(Step(f"{largest}-sdpa", lambda m: HFEngine(m, HFConfig(*mode, attn_implementation="sdpa")),
                      lab="02", baseline=largest, recorded=HF_RECORDED, real_size_limit=NAIVE_REAL_SIZE if b == 1 else 0,
                      why="the same batches with PyTorch's fused attention (sdpa) instead of eager's N x N scores"))
    return steps


def hf_compile_steps(batch_sizes: list[int]) -> list[Step]:
    """Lab 03's Hugging Face rung: the largest batch again with a static KV cache and the decode step compiled
    (transformers' optimisation guide: cache_implementation="static", torch.compile), against the same batches with
    sdpa and the default (growing) cache; the cache is sized for the run's longest request."""
    b = max(batch_sizes)
    mode, largest = (("static", b), f"hf-static-b{b}") if b > 1 else (("naive", 1), "hf-naive")
    return [Step(f"{largest}-compile", lambda m: HFEngine(m, HFConfig(*mode, compile=True)), lab="03",
                 baseline=f"{largest}-sdpa", recorded=HF_COMPILE_RECORDED, record_step="hf-compile-big",
                 real_size_limit=NAIVE_REAL_SIZE if b == 1 else 0,
                 why="a KV cache allocated once at a fixed length, so every decode step has the same shapes and "
                     "torch.compile fuses it (on a GPU, replays it as one CUDA graph): transformers' own recipe")]


def hf_continuous_steps(batch_sizes: list[int]) -> list[Step]:
    """Lab 04's Hugging Face rung: transformers' own continuous batching at the largest batch size, against static
    batching at that size with the same kernel (sdpa): the best HF path a user would pick instead of an engine."""
    b = max(batch_sizes)
    if b < 2:
        return []
    return [Step(f"hf-continuous-b{b}", lambda m: HFEngine(m, HFConfig("continuous", b)), lab="04",
                 baseline=f"hf-static-b{b}-sdpa",
                 why=f"transformers' own continuous batching (generate_batch): up to {b} requests in flight in a paged "
                     "KV cache, a finished one's slot refilled at the next step, not at the batch's end (lab 04)")]


def speculative_hf_steps() -> list[Step]:
    """Lab 08's rungs this CPU runs: transformers' own speculative decoding (assisted generation, batch 1) with
    the embedded draft and with prompt lookup (n-gram), each against naive generate, k = SPEC_K, with naive
    generate's own attention kernel (eager): a side road changes one thing. On the embedded model only: at real
    size naive generate is a minute or more of the ladder (14.7 tok/s on the H200), and a second
    minute would show prompt lookup on text that repeats little of its prompt; the speculative rung of a real-size
    ladder is vLLM's EAGLE head (`real_size_eagle`)."""
    return [Step(f"hf-naive-{how}-k{SPEC_K}", lambda m, how=how: HFEngine(m, HFConfig(
                     speculative=how, num_speculative_tokens=SPEC_K, attn_implementation="eager")),
                 lab="08", baseline="hf-naive", models=("embedded",),
                 why=f"{'the embedded draft' if how == 'draft' else 'prompt lookup (n-gram)'} proposes {SPEC_K} "
                     "tokens, the target checks them in one pass (transformers' assisted generation)")
            for how in ("ngram", "draft")]


def ladder(batch_sizes: list[int]) -> list[Step]:
    """Every step, in order; `available` says which this machine can run."""
    from ..engines.server import ServerEngine  # deferred: urllib.request (through lablib.engines.server)

    gpu = "gpu+vllm"

    def prefix(caching: bool) -> Step:
        return Step(f"vllm-prefix-{'on' if caching else 'off'}", lambda m: VLLMEngine(m, VLLMConfig(
            enable_prefix_caching=caching)), needs=gpu, together=True, lab="07", workload=PREFIX_WORKLOAD,
            baseline="vllm-prefix-off" if caching else "", recorded=(PREFIX_RECORDED[caching],),
            record_step="prefix-on-off",
            why=("32 requests sharing a 512-token file header, " + (
                "prefix caching on: later requests reuse the header's KV blocks (lab 07)" if caching else
                "caching off: every request prefills the header again (the baseline of the next rung)")))

    def eagle(batch: int | None) -> Step:
        tail = f"-b{batch}" if batch else ""
        return Step(f"vllm-eagle-k{SPEC_K}{tail}", lambda m: VLLMEngine(m, VLLMConfig(
            speculative_config=speculative_config("eagle", SPEC_K))),
            needs=gpu, together=True, lab="08", baseline=f"vllm{tail}", models=("embedded",),
            rides=f"vllm-eagle-k{SPEC_K}" if batch else "", max_concurrency=batch,
            recorded=SPEC_RECORDED[1][1:] if batch else SPEC_RECORDED[64], record_step="speculative",
            why=(f"the EAGLE head proposes {SPEC_K} tokens from the target's own features, " +
                 ("one request at a time: where speculation pays, latency at low load (lab 08)" if batch else
                  "every request at once: what it costs under load (lab 08)")))

    def real_size_eagle() -> Step:
        return Step(f"vllm-eagle-synthetic-k{EAGLE_REAL_K}-b1", lambda m: VLLMEngine(m, VLLMConfig(
            speculative_config=real_size_eagle_config(m))), needs=gpu, together=True, lab="08",
            baseline="vllm-b1", real_size_limit=NAIVE_REAL_SIZE,  # its baseline's requests, sent as its baseline
            max_concurrency=1,  # sends them: one at a time, each its own engine call
            models=SYNTHETIC_LLAMAS, record_step=EAGLE_RATES_STEP,
            why=f"at real size an EAGLE head of the target's shape (random weights) proposes {EAGLE_REAL_K} tokens a "
                "step, one request at a time; synthetic acceptance: the speed is real, the acceptance rate is set to "
                "the trained embedded head's (lab 08)")

    return hf_steps(batch_sizes) + hf_compile_steps(batch_sizes) + [
        Step("vllm", lambda m: VLLMEngine(m, VLLMConfig()), needs=gpu, together=True, lab="03",
             recorded=("vllm-8b-journey",),
             why="vLLM: paged KV cache, continuous batching, CUDA graphs (its own worker process)"),
        *hf_continuous_steps(batch_sizes),
        Step("vllm-server", lambda m: ServerEngine(m), needs=gpu, together=True, lab="05",
             recorded=("serve-rate-inf",), why="the same engine behind its OpenAI server: every request over HTTP, streamed"),
        Step("vllm-fp8", lambda m: VLLMEngine(m, VLLMConfig(quantization="fp8")), needs=gpu, together=True, lab="06",
             recorded=(FP8_RECORDED,), record_step="journey-fp8", why="vLLM with FP8 weights (Hopper's own format, "
                                                                     "quantized as it loads): half the bytes each decode step reads (lab 06)"),
        prefix(False), prefix(True),
        *speculative_hf_steps(),
        Step("vllm-b1", lambda m: VLLMEngine(m, VLLMConfig()), needs=gpu, together=True, lab="08",
             recorded=SPEC_RECORDED[1][:1], record_step="speculative", real_size_limit=NAIVE_REAL_SIZE,
             rides="vllm", max_concurrency=1,
             why="vLLM one request at a time (live: the vllm rung's engine, each request sent when the one before "
                 "it finished; its recording is lab 08's baseline, V1 runner and async off): the next rung's baseline"),
        eagle(1), eagle(None), real_size_eagle()]


SYNTHETIC_LLAMAS = tuple(f"synthetic:{n}" for n, a in architectures().items() if a.get("model_type") == "llama")


def _path_of(model: Any) -> str:
    """The folder `model` names, without making a synthetic checkpoint that is not there yet."""
    if isinstance(model, str) and model.startswith("synthetic:"):
        return str(synthetic_folder(model.split(":", 1)[1]))
    return str(getattr(model, "path", None) or resolve_model(model).path)


def _is_one_of(model: Any, names: tuple[str, ...]) -> bool:
    """Whether `model` (a name, an alias or a ModelSpec) is the checkpoint one of `names` resolves to."""
    try:
        path = _path_of(model)
        return any(_path_of(n) == path for n in names)
    except ValueError:
        return False


def real_size_eagle_config(model: Any) -> dict[str, Any]:
    """The speculative_config of the real-size EAGLE rung for a synthetic Llama `model`: its synthetic head (made on
    first use) and the rates recorded in EAGLE_RATES_STEP at EAGLE_REAL_K; NotRecorded names the step if absent."""
    rates = recorded_facts(EAGLE_RATES_STEP, EAGLE_RATES_STEP)["rates"][str(EAGLE_REAL_K)]["rates"]
    target = model.path if hasattr(model, "path") else resolve_model(model).path  # made here if absent: it runs next
    name = model if isinstance(model, str) else model.name
    arch = name.split(":", 1)[1] if name.startswith("synthetic:") else \
        json.loads((Path(target) / "synthetic.json").read_text())["architecture"]  # a synthetic folder by its path
    return synthetic_eagle_config(EAGLE_REAL_K, rates, synthetic_eagle(arch), target)


def available(step: Step, model: Any = None) -> tuple[bool, str]:
    """Whether this machine runs `step` for `model` (None: any model), and if not, why (and what shows instead)."""
    if step.models and model is not None and not _is_one_of(model, step.models):
        name = getattr(model, "name", model)
        return False, f"it runs on {', '.join(step.models)} only, not {name!r}"
    if step.needs == "cpu":
        return True, ""
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



def default_model() -> str:
    """The model the journey climbs when none is named: on an NVIDIA GPU the largest synthetic shape it holds
    (`hardware.tiers`: the 8B from 40 GB, the 3B on 16-24 GB), so speed is measured at real size; else embedded."""
    return live_model("embedded")


def is_real_size(model: Any) -> bool:
    """Whether `model` is not the embedded 4.7M pair: a synthetic shape, a preset or a folder (speed at real size)."""
    return not _is_one_of(model, ("embedded",))  # `_path_of` makes no synthetic checkpoint to compare


def default_batch_sizes(model: Any, workload: str = "journey") -> list[int]:
    """The HF rungs' batch sizes: CPU_BATCHES on the embedded model; at real size 1 and `real_size_hf_batch`."""
    if not is_real_size(model):
        return list(CPU_BATCHES)
    return [1, real_size_hf_batch(model, workload)]


def real_size_hf_batch(model: Any, workload: str = "journey", memory_bytes: int | None = None) -> int:
    """The static batch HF climbs at real size: the largest of 64, 32, 16, 8, 4 whose 16-bit weights, KV cache for
    that many of the workload's longest requests, and eager attention's float32 scores of its longest prompt (two
    copies: the scores and their softmax) fit in 90% of the GPU's memory (`memory_bytes`, NVML's by default;
    64 where there is no GPU to ask). An estimate that leaves HF room, not vLLM's profiler."""
    if memory_bytes is None:
        tier = tier_of()
        if tier is None:
            return REAL_SIZE_BATCHES[-1]
        memory_bytes = tier.memory_bytes
    cfg = architectures()[model.split(":", 1)[1]] if isinstance(model, str) and model.startswith("synthetic:") else \
        (model.config if hasattr(model, "config") else resolve_model(model).config)
    a = shape(cfg)
    wl = load_workload(workload)
    prompt, longest = max(wl.prompt_lengths), max(p + r.max_new_tokens for p, r in zip(wl.prompt_lengths, wl.requests))
    weights = 2 * parameter_count(cfg)
    for b in (64, 32, 16, 8, 4):
        kv = b * longest * kv_bytes_per_token(a["layers"], a["kv_heads"], a["head_dim"], 2)
        scores = 2 * b * a["heads"] * prompt * prompt * 4
        if weights + kv + scores <= 0.9 * memory_bytes:
            return b
    return 4


def rungs(model: Any, workload: str = "journey", requests: int | None = None, batch_sizes: list[int] = (1, 4, 16),
          bench: BenchConfig = BenchConfig(), through: str | None = None, log: Callable[[str], None] = lambda _: None
          ) -> tuple[list[tuple[Step, Any, BenchConfig]], list[dict[str, str]]]:
    """The rungs `run_journey` runs on `model`, in the ladder's order, each with the requests it is given and its
    BenchConfig (a stated `subset` at real size: `Step.real_size_limit`), and the rungs it skips with the reason
    (`log`ged where this machine cannot run one)."""
    wl = load_workload(workload, limit=requests)
    todo, skipped = [], []
    for step in ladder(list(batch_sizes)):
        if through is not None and step.lab > through:
            skipped.append({"step": step.name, "why": f"lab {step.lab}'s rung (this run goes through lab {through})"})
            continue
        ok, why = available(step, model)
        if not ok:
            skipped.append({"step": step.name, "why": why})
            log(f"skip {step.name}: {why}")
            continue
        own = load_workload(step.workload, limit=requests) if step.workload else wl
        step_bench = bench if step.max_concurrency is None else dataclasses.replace(
            bench, max_concurrency=step.max_concurrency)
        if step.real_size_limit and is_real_size(model) and len(own) > step.real_size_limit:
            subset = (f"the first {step.real_size_limit} of {len(own)} requests (real size: one request at a time, "
                      "naive generate's requests)")
            own, step_bench = own.head(step.real_size_limit), dataclasses.replace(
                step_bench, tags={**step_bench.tags, "subset": subset})
        todo.append((step, own, step_bench))
    hosts = {step.name for step, _, _ in todo}  # a rung whose host runs rides its engine, and its Result says so
    todo = [(step, own, dataclasses.replace(b, tags={**b.tags, "rides": step.rides}) if step.rides in hosts else b)
            for step, own, b in todo]
    return todo, skipped


def run_journey(model: str = "auto", workload: str = "journey", requests: int | None = None,
                batch_sizes: list[int] | None = None, store: ResultStore | None = None,
                bench: BenchConfig = BenchConfig(), lab: str = "journey",
                log: Callable[[str], None] = print, cpu_threads: int | None = None, through: str | None = None,
                cpu: CpuMeter | None = None) -> tuple[list[Result], list[dict[str, str]]]:
    """Run every available step on the workload; return the Results and the skipped steps.

    `model="auto"`: `default_model()`; `batch_sizes=None`: `default_batch_sizes(model)`. At real size the batch-1 rungs
    (naive generate, its speculative side roads, vLLM one request at a time and its EAGLE rung) run the first
    NAIVE_REAL_SIZE requests only (each Result's config says so: `subset`); every other rung all of them.

    `through` ("01".."10", None: all) keeps the rungs of the labs up to that one: lab 01 runs its own. A rung
    with its own workload (`Step.workload`) runs that, limited to `requests` too.

    `cpu_threads` pins torch's threads in this process for every step (None: as they are); only the HF steps
    compute here, vLLM's run in their own worker. On a shared CPU (Colab, CI) a
    second OpenMP thread spins against other processes and one run can come out 3x slower than the next;
    one thread measures the same thing, steadily. `cpu` (a CpuMeter) adds up the wall and CPU time of the rungs
    that compute in this process, so the caller can tell whether they had their core to themselves.

    The model, the settings and the workload are checked before any rung starts."""
    if model == "auto":
        model = default_model()
    if not hasattr(model, "path"):  # a name: a typo is refused here, not after a rung has started
        resolve_model(model)
    if batch_sizes is None:
        batch_sizes = default_batch_sizes(model)
    validate.integers("run_journey", "batch_sizes", batch_sizes,
                      "e.g. batch_sizes=[1, 4, 16] (from lablab: --batch-sizes 1,4,16).")
    if cpu_threads is not None:
        validate.integer("run_journey", "cpu_threads", cpu_threads, "1 on a shared CPU, or None to leave torch's own.")
    if through is not None:
        validate.choice("run_journey", "through", through, LABS, "the last lab whose rungs run, e.g. '01', or None.")
    results: list[Result] = []
    todo, skipped = rungs(model, workload, requests, batch_sizes, bench, through, log)
    steps = ladder(list(batch_sizes))

    def measured(step: Step, own: Any, step_bench: BenchConfig, measure: Callable[[], Result]) -> None:
        log(f"run  {step.name}: {step.why}")
        if "subset" in step_bench.tags and step_bench is not bench:
            log(f"     {step_bench.tags['subset']}")
        try:
            with cpu.measure() if cpu is not None and step.needs == "cpu" else contextlib.nullcontext():
                r = measure()
        except Exception as e:  # out of memory on this GPU: this rung is skipped, the road goes on
            if not is_out_of_memory(e):
                raise
            free_memory(bool(mode()["gpu"]))
            why = (f"out of memory on this machine ({error_line(e, 160)}): a smaller --batch-sizes, or a smaller "
                   "--model")
            skipped.append({"step": step.name, "why": why})
            log(f"skip {step.name}: {why}")
            return
        s, start = r.summary, engine_start(r)
        log(f"     {s['output_tok_s']:.1f} output tok/s, TTFT p50 {latency_text(s['ttft_s']['p50'])}, "
            f"wall {r.wall_s:.1f} s" + (f"; {start_text(start)}" if start else ""))
        results.append(r)

    for step, own, step_bench in [t for t in todo if not t[0].together]:
        measured(step, own, step_bench, lambda: run_step(step, model, own, step_bench, lab=lab, store=store,
                                                         threads=cpu_threads))
    together, riders = hosts_and_riders([t for t in todo if t[0].together])  # vLLM's engines last: started
    if together:  # together, measured one by one, each rung riding an engine measured right after its host
        made: list[Any] = []
        for step, _, _ in together:
            try:
                made.append(step.make_engine(model))
            except Exception as e:  # noqa: BLE001 - handed over at its turn (a refusal raises there)
                made.append(e)
        spec = next((e.spec for e in made if not isinstance(e, Exception)), None)
        lengths = [request_lengths(own, spec, b) for t in together for (_, own, b) in (t, *riders.get(t[0].name, ()))
                   if spec is not None] or [[1]]  # all refused: each raises its own at its turn
        with contextlib.closing(one_by_one(made, runs=lengths)) as engines:
            for (step, own, step_bench), engine in zip(together, engines):
                for rung, rung_own, rung_bench in ((step, own, step_bench), *riders.get(step.name, ())):
                    def measure(engine: Any = engine, rung: Step = rung, own: Any = rung_own,
                                b: BenchConfig = rung_bench) -> Result:
                        if isinstance(engine, Exception):
                            raise engine
                        return run(engine, own, b, lab=lab, step=rung.name, store=store)

                    measured(rung, rung_own, rung_bench, measure)
    order = {s.name: i for i, s in enumerate(steps)}
    results.sort(key=lambda r: order.get(r.step, len(order)))  # the ladder's order, whatever order they ran in
    return results, skipped


def hosts_and_riders(together: list[tuple[Step, Any, BenchConfig]]
                     ) -> tuple[list[tuple[Step, Any, BenchConfig]], dict[str, list[tuple[Step, Any, BenchConfig]]]]:
    """The together rungs that start an engine, in order, and per host rung's name the rungs that ride its engine
    (`Step.rides`); a rung whose host is not among them starts its own."""
    names = {step.name for step, _, _ in together}
    riders: dict[str, list[tuple[Step, Any, BenchConfig]]] = {}
    for t in together:
        if t[0].rides in names:
            riders.setdefault(t[0].rides, []).append(t)
    return [t for t in together if t[0].rides not in names], riders


def engine_start(r: Result) -> dict[str, Any] | None:
    """Where a vLLM rung's engine start went (its facts): the start's wall time and, for engines started together
    (`lablib.engines.together`), how many and the group's wall time; None for an engine that reports no start."""
    if r.config.get("rides"):  # measured on another rung's engine: that rung's Result has the start
        return None
    f = r.engine_facts or {}
    if f.get("startup_wall_s") is None:
        return None
    group = f.get("together") or {}
    return {"start_s": round(f["startup_wall_s"], 1), "together": group.get("engines", 1),
            "group_start_s": None if group.get("group_start_s") is None else round(group["group_start_s"], 1)}


def start_text(start: dict[str, Any]) -> str:
    """`engine_start` as the journey's log line says it."""
    if start["together"] > 1:  # (each engine of a group is waited for in turn: its own figure is an upper bound)
        return f"its engine started with {start['together'] - 1} other(s): {start['group_start_s']:.0f} s for the group"
    return f"engine start {start['start_s']:.0f} s"


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


def batch_sizes_of(results: list[Result]) -> list[int]:
    """The --batch-sizes a journey's live HF rungs ran with (lab 01's rungs name them), (1, 4, 16) if none."""
    sizes = {int(r.config.get("batch_size") or 1) for r in results if r.provenance == "live"
             and LAB01_RUNG.fullmatch(r.step)}
    return sorted(sizes) or [1, 4, 16]


def side_roads(results: list[Result], batch_sizes: list[int] | None = None) -> list[dict[str, Any]]:
    """Each rung that is measured against a baseline of its own (`Step.baseline`, or a recording's
    `RECORDED_BASELINE`) and ran beside it in `results`: what it bought on those requests.

    A row: the rung and its baseline, the workload, where measured, output tok/s of both and their ratio, TTFT p50
    and TPOT p50 of both (seconds) and the baseline's over the rung's (above 1: faster), and tokens per target forward
    where the rung speculates. `journey_gain` is the road's own (the best journey rung over naive
    generate, same model, same place), so a reader sees the side road's factor beside the whole road's."""
    by_step = {r.step: r for r in results}
    steps = ladder(list(batch_sizes or batch_sizes_of(results)))
    lab_of = {name: s.lab for s in steps for name in (s.name, *s.recorded)}
    pairs = [(s.name, s.baseline) for s in steps if s.baseline] + list(RECORDED_BASELINE.items())
    rows = []
    for rung, base in pairs:
        r, b = by_step.get(rung), by_step.get(base)
        if r is None or b is None:
            continue
        rs, bs = r.summary, b.summary

        def ratio(x: float | None, y: float | None) -> float | None:
            return x / y if x and y else None

        spec = (r.engine_facts.get("last_run") or {}).get("speculative")
        rows.append({"rung": rung, "baseline": base, "lab": lab_of.get(rung), "workload": r.workload.get("name"),
                     "where": r.provenance,
                     "model": r.model.get("name"), "requests": rs["requests"],
                     "tok_s": rs["output_tok_s"], "baseline_tok_s": bs["output_tok_s"],
                     "tok_s_ratio": ratio(rs["output_tok_s"], bs["output_tok_s"]),
                     "ttft_p50_s": rs["ttft_s"]["p50"], "baseline_ttft_p50_s": bs["ttft_s"]["p50"],
                     "ttft_speedup": ratio(bs["ttft_s"]["p50"], rs["ttft_s"]["p50"]),
                     "tpot_p50_s": rs["tpot_s"]["p50"], "baseline_tpot_p50_s": bs["tpot_s"]["p50"],
                     "tpot_speedup": ratio(bs["tpot_s"]["p50"], rs["tpot_s"]["p50"]),
                     "tokens_per_forward": spec.get("tokens_per_forward") if spec else None,
                     "journey_gain": journey_gain(results, r)})
    return rows


def journey_gain(results: list[Result], like: Result) -> float | None:
    """The rest of the road's gain where `like` was measured: the best journey-workload rung other than `like`
    over naive generate, among the runs of `like`'s model and provenance (a recorded 8B's vLLM over the CPU's
    naive run is no gain); None where that place has no naive generate run."""
    same = [r for r in results if r.provenance == like.provenance and r.model.get("name") == like.model.get("name")
            and r.workload.get("name") == "journey" and r is not like]
    naive = next((r for r in same if r.step == "hf-naive"), None)
    if naive is None or not same:  # no naive generate here (the H200's recordings start at static batching)
        return None
    best = max(same, key=lambda r: r.summary["output_tok_s"])
    return best.summary["output_tok_s"] / naive.summary["output_tok_s"]


def best_on_road(results: list[Result], workload: str = "journey") -> Result | None:
    """The fastest rung this machine ran live on the road itself, so that it over naive generate compares like with
    like: `workload`'s requests, every token decoded by the model itself. A speculative rung (lab 08) is a side
    road: its gain depends on how well the text is guessed, and `side_roads` sets it against its own baseline."""
    road_runs = [r for r in results if r.provenance == "live" and r.workload.get("name") == workload
                 and not (r.config.get("speculative") or r.config.get("speculative_config"))]
    return max(road_runs, key=lambda r: r.summary["output_tok_s"], default=None)


def default_store(folder: str | Path | None = None, lab: str = "journey") -> ResultStore:
    """The main job's store: `<folder>/<lab>.jsonl`, in the one results folder (`results_dir()`) by default."""
    return ResultStore.for_lab(lab) if folder is None else ResultStore(Path(folder) / f"{lab}.jsonl")


def labs_on_road(results: list[Result], batch_sizes: list[int] = (1, 4, 16)) -> set[str]:
    """The labs with a rung among `results`, run or recorded (a rung's own name or one of its recordings)."""
    steps = {r.step for r in results}
    return {s.lab for s in ladder(list(batch_sizes)) if s.name in steps or steps & set(s.recorded)}


def vllm_gain(results: list[Result]) -> Any:
    """vLLM's journey rung over the fastest HF rung, both run on this machine now (a Shown: live only where vLLM
    ran here; on a machine without it, not measured, and the recorded road says the rest)."""
    here = [r for r in results if r.provenance == "live" and r.workload.get("name") == "journey"]
    vllm, hf = next((r for r in here if r.step == "vllm"), None), [r for r in here if r.engine.startswith("hf")]
    if vllm is None or not hf:
        why = mode()["why"]
        return Shown(None, False, f"vLLM's rung did not run here ({why})", why)
    return Shown(vllm.summary["output_tok_s"] / max(r.summary["output_tok_s"] for r in hf), True, live_label())
