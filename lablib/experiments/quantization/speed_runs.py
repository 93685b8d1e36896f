"""Lab 06's GPU half: speed and memory on a synthetic Llama-3.1-8B per scheme and batch, through vLLM 0.26.

`prepare_checkpoints` quantizes the synthetic 8B in the quantization environment (llm-compressor cannot share
vLLM's), then `vllm_speed_runs` measures decode speed and memory per scheme and batch through vLLM, each
against its own bandwidth roofline (`speed_rows`). The notebook's one call, `speed` (live on a GPU, recorded
elsewhere), is in `recording` beside the steps that record it, since a live run can be that recording.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ... import validate
from ...bench.offline import run
from ...config import BenchConfig, lab_id, VLLMConfig
from ...engines.vllm import VLLMEngine
from ...hardware.roofline import decode_ceiling_tok_s, decode_weight_bytes, lookup_gpu
from ...hardware.tiers import gpu_refusal
from ...models import check_model_dir, load_tokenizer, ModelSpec, resolve_model, synthetic_spec
from ...models.quantize import SCHEMES, read_facts
from ...results.record import Result
from ...results.store import ResultStore
from ...session import live_label
from ...workloads import load_workload, Request, Workload
from .checkpoints import reuse_or_quantize
from .measures import OWNER

LAB = lab_id("06")
GPU_WORK = "/tmp/lablib-quantized"  # where the GPU session's quantized synthetic checkpoints go (64 GiB disk there)
SPEED_MODEL = "llama-3.1-8b"
BATCHES = (1, 8, 64, 256)
# schemes that are vLLM switches on the bf16 checkpoint rather than checkpoints of their own
VLLM_SWITCHES: dict[str, dict[str, Any]] = {"bf16": {}, "fp8": {"quantization": "fp8"},
                                            "bf16-kv-fp8": {"kv_cache_dtype": "fp8"}}
SPEED_SCHEMES = ("bf16", "fp8", "gptq-w4a16", "awq-w4a16", "w8a8-int8", "bf16-kv-fp8")
KERNEL_LINE = re.compile(r"(?:Using|Selected) (\w+Kernel) for (\w+)")
ENGINE_KNOBS = ("gpu_memory_utilization", "max_model_len")  # vllm_speed_runs' engine settings a speed row carries
LOAD_LINE = re.compile(r"Model loading took ([\d.]+) GiB")
KV_LINE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")


def prepare_checkpoints(schemes: Sequence[str] = SPEED_SCHEMES, *, model: str = SPEED_MODEL,
                        work_dir: str | Path = GPU_WORK, num_samples: int = 16, python: str | None = None,
                        threads: int | None = None) -> list[dict[str, Any]]:
    """The GPU session's first command: quantize the synthetic 8B with every checkpoint scheme in `schemes`.

    llm-compressor 0.14 (compressed-tensors 0.19) and vLLM 0.26 (compressed-tensors 0.17) cannot share an
    environment, so on the GPU machine the lab's speed step is two commands (shared/gpu/README.md, "A second
    environment for quantization"), sent while the machine is held (its /tmp goes with it):

        # 1. the quantization environment (staged with ../shared/gpu/stage --no-vllm --site /tmp/site-q
        #    -r ../shared/gpu/llmcompressor-0.14.0.1-deps.txt): make the checkpoints
        PYTHONPATH=/tmp/site-q python -c "from lablib.experiments.quantization import prepare_checkpoints as p; p()"
        # 2. vLLM's environment (/tmp/site): speed and memory per scheme and batch, recorded
        PYTHONPATH=/tmp/site python scripts/record_reference.py --out $OUT --steps quantization

    Step 1 is also a recording step, `quantization-prepare` (`record_checkpoints`: from vLLM's environment, the
    quantizer's worker in /tmp/site-q through $LABLIB_QUANT_SITE, as scripts/gpu_session.sh sets it), so it can be
    queued like step 2. Checkpoints go to work_dir/<model>/<scheme> and are reused when they hold the same
    quantization. The calibration windows only pace the quantizer here: synthetic weights have no quality to
    keep, so 16 do. Schemes that are vLLM switches (bf16, online fp8, fp8 KV cache) need no checkpoint and are
    skipped.
    """
    for s in schemes:
        validate.choice(OWNER, "schemes", s, list(SCHEMES) + list(VLLM_SWITCHES))
    work = Path(work_dir)
    src = Path(synthetic_spec(model).path)  # no tokenizer of its own: the quantizer takes the embedded one
    rows = []
    for s in (s for s in schemes if s not in VLLM_SWITCHES):
        facts = reuse_or_quantize(src, work / model / s, s, num_samples, ("lm_head",), python, threads)
        rows.append({k: facts.get(k) for k in ("scheme", "group_size", "seconds", "wall_s", "weight_bytes", "device",
                                               "reused", "out_dir")})
    return rows


def vllm_log_facts(log: str) -> dict[str, Any]:
    """What vLLM prints but does not expose: the kernel it chose per quantized layer type, the GiB the weights took
    on the GPU, the GiB left to the KV cache.

    vLLM 0.26 logs "Using MacheteLinearKernel for CompressedTensorsWNA16" (int4: Machete on Hopper, Marlin
    elsewhere) and "Selected CutlassFP8ScaledMMLinearKernel for ..." (8-bit scaled matmuls); a bf16 model logs
    none: its Linears are torch's cuBLAS GEMMs.
    """
    kernels = {layer: kernel for kernel, layer in KERNEL_LINE.findall(log)}
    load, kv = LOAD_LINE.findall(log), KV_LINE.findall(log)
    return {"linear_kernels": kernels, "model_load_gib": float(load[-1]) if load else None,
            "kv_cache_gib": float(kv[-1]) if kv else None}


def kernels_text(kernels: dict[str, str] | None, cublas: bool = True) -> str:
    """The kernels vLLM logged per quantized layer type, as a table cell: "<Kernel> (<layer>), ..."; where it logged
    none, say so, and (`cublas`: a bf16-weights engine) that torch's cuBLAS GEMMs ran."""
    return (", ".join(f"{k} ({layer})" for layer, k in (kernels or {}).items())
            or ("none logged (bf16: cuBLAS)" if cublas else "none logged"))


def fixed_name(prompt_len: int = 128, output_len: int = 128) -> str:
    """The name of fixed_workload's set, as a Result's workload carries it: the lengths a speed run ran."""
    return f"fixed-{prompt_len}x{output_len}"


def fixed_workload(n: int, prompt_len: int = 128, output_len: int = 128) -> Workload:
    """n requests of exactly prompt_len tokens (the embedded tokenizer's, bos included), output_len tokens out each:
    code cut from the calibration windows (speed runs score no quality), cycled when n asks for more."""
    validate.integer(OWNER, "n", n, "pass a batch size, e.g. 64.")
    validate.integer(OWNER, "prompt_len", prompt_len, "pass e.g. 128.", 2)
    validate.integer(OWNER, "output_len", output_len, "pass e.g. 128.")
    tok = load_tokenizer(resolve_model("embedded"))
    texts: list[str] = []
    for r in load_workload("calibration").requests:
        ids = tok(r.prompt)["input_ids"][1:]
        for start in range(0, len(ids) - prompt_len, prompt_len):
            text = tok.decode(ids[start:start + prompt_len - 1])
            if len(tok(text)["input_ids"]) == prompt_len:
                texts.append(text)
        if len(texts) >= n:
            break
    if not texts:
        raise validate.refuse(OWNER, "prompt_len", prompt_len, "a length the calibration windows (512 tokens) hold",
                              "pass e.g. 128.")
    reqs = tuple(Request(f"fixed-{i:03d}", texts[i % len(texts)], ({"role": "user", "content": texts[i % len(texts)]},),
                         output_len, prompt_len) for i in range(n))
    return Workload(fixed_name(prompt_len, output_len), 1, "code cut to a fixed token length, fixed output length",
                    reqs)


def base_model(model: str) -> str:
    """The name the speed runs' bf16 engine reports for `model` (a synthetic shape, or "embedded"); a checkpoint
    scheme's engine reports "<that>+<scheme>" (`_speed_engine`)."""
    return f"synthetic:{model}" if model != "embedded" else "embedded"


def _speed_engine(scheme: str, model: str, work_dir: Path, gpu_memory_utilization: float, max_num_seqs: int,
                  max_model_len: int) -> tuple[Any, VLLMConfig]:
    """The ModelSpec and VLLMConfig of one speed run; a missing checkpoint is refused naming the command that makes it."""
    config = VLLMConfig(gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
                        max_model_len=max_model_len, **VLLM_SWITCHES.get(scheme, {}))
    if scheme in VLLM_SWITCHES:
        return base_model(model), config
    folder = work_dir / model / scheme
    if read_facts(folder) is None:
        raise validate.refuse(OWNER, "schemes", scheme, f"a scheme whose checkpoint is in {folder} (not made yet)",
                              "make it first (scripts/record_reference.py --steps quantization-prepare, or in "
                              "the quantization environment: PYTHONPATH=/tmp/site-q python -c "
                              "\"from lablib.experiments.quantization import prepare_checkpoints as p; p()\"; "
                              "see prepare_checkpoints), or leave the scheme out.")
    source = "synthetic" if model != "embedded" else "path"
    name = f"synthetic:{model}+{scheme}" if model != "embedded" else str(folder)
    return ModelSpec(name, str(folder), source, check_model_dir(folder)), config


def vllm_speed_runs(schemes: Sequence[str] = SPEED_SCHEMES, batches: Sequence[int] = BATCHES, *,
                    model: str = SPEED_MODEL, work_dir: str | Path = GPU_WORK, prompt_len: int = 128,
                    output_len: int = 128, gpu_memory_utilization: float = 0.9, max_model_len: int = 2048,
                    store: ResultStore | None = None, lab: str = LAB,
                    on_result: Callable[[Result], None] | None = None) -> list[Result]:
    """Decode speed and memory of each scheme at each batch size, on vLLM (one engine per scheme, on a GPU).

    For every scheme one engine at `gpu_memory_utilization` (its KV capacity is what is left after the weights),
    then at each batch B a run of B requests of prompt_len in / output_len out, all submitted at once, through
    the lab's timing protocol (`bench.offline.run`: warm-up, fixed lengths). Each Result carries the kernel vLLM
    chose (`engine_facts["linear_kernels"]`, from its log), the GiB its weights took and its KV tokens; step
    `quant-<scheme>-b<B>`. Schemes: bf16 (the synthetic checkpoint), fp8 (vLLM's online FP8: quantization="fp8",
    no checkpoint), bf16-kv-fp8 (bf16 weights, kv_cache_dtype="fp8"), and any of SCHEMES, loaded from the
    checkpoint `prepare_checkpoints` made in the quantization environment first (see there: the two commands).
    The default model is a synthetic shape: synthetic weights, speed and memory are real, the text is not
    (model="embedded" runs the lab's own model, as the tests do on the fake vLLM). Every refusal (an unknown
    scheme, a checkpoint not made yet, a bad batch size) comes before any engine starts.
    """
    for s in schemes:
        validate.choice(OWNER, "schemes", s, list(VLLM_SWITCHES) + list(SCHEMES))
    validate.integers(OWNER, "batches", batches, "pass batch sizes, e.g. (1, 8, 64, 256).")
    work = Path(work_dir)
    plans = [(s, *_speed_engine(s, model, work, gpu_memory_utilization, max(batches), max_model_len)) for s in schemes]
    workloads = {b: fixed_workload(b, prompt_len, output_len) for b in batches}
    results = []
    for scheme, spec, config in plans:
        with VLLMEngine(spec, config) as eng:
            eng.start()
            eng.facts.update(vllm_log_facts(Path(eng.log_path).read_text(errors="replace")), scheme=scheme)
            for b in batches:
                bench = BenchConfig(progress=False, tags={"scheme": scheme, "batch": b})
                r = run(eng, workloads[b], bench, lab=lab, step=f"quant-{scheme}-b{b}", store=store)
                results.append(r)
                if on_result:
                    on_result(r)
    return results


def speed_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One row per speed run: decode tok/s (batch / median TPOT) against the scheme's own bandwidth roofline.

    The roofline reads every weight once per step plus each sequence's KV cache at its mean context
    (prompt + half the output): batch x peak bandwidth / (weight bytes + KV bytes per token x batch x context),
    with the bytes vLLM reported loading for this scheme (its log), else the checkpoint's size. Those bytes hold
    the input embedding table, of which a step reads only the batch's rows: where the embeddings are not tied
    (the synthetic Llama-3.1-8B: 128256 x 4096 x 2 bytes = 1.05 GB, bf16 in every scheme, the quantizers and
    vLLM's online FP8 touch only the Linears) the roofline leaves it out; tied, the LM head reads the whole table
    every step and nothing is left out (`roofline.decode_weight_bytes`). `weight_gib` stays what vLLM holds.
    """
    rows = []
    for r in results:
        f, s = r.engine_facts, r.summary
        batch = int(r.config.get("batch") or s["requests"])
        tpot = (s.get("tpot_s") or {}).get("p50")
        weights = f["model_load_gib"] * 2**30 if f.get("model_load_gib") else f.get("weight_bytes")
        context = sum(q.prompt_tokens + q.output_tokens / 2 for q in r.requests) / max(1, len(r.requests))
        peak = lookup_gpu(r.hardware.get("gpu"))
        kv = f.get("kv_bytes_per_token") or 0
        read = decode_weight_bytes(weights, r.model) if weights else None
        roof = decode_ceiling_tok_s(peak.peak_bw, read, kv, batch, context) if peak and read else None
        decode = batch / tpot if tpot else None
        rows.append({"scheme": r.config.get("scheme") or r.step, "batch": batch, "decode_tok_s": decode,
                     "output_tok_s": s["output_tok_s"], "roofline_tok_s": roof,
                     "of_roofline": decode / roof if decode and roof else None,
                     "tpot_ms": tpot * 1e3 if tpot else None, "weight_gib": weights / 2**30 if weights else None,
                     "kv_tokens": f.get("kv_tokens"), "kv_cache_dtype": f.get("kv_cache_dtype"),
                     "linear_kernels": kernels_text(f.get("linear_kernels")), "gpu": r.hardware.get("gpu"),
                     "model": r.model.get("name"), "synthetic": bool(r.model.get("synthetic")),
                     "workload": r.workload.get("name"), **{k: r.config.get(k) for k in ENGINE_KNOBS},
                     "provenance": (f"recorded on {r.hardware.get('gpu') or 'CPU'}, {r.recorded_at[:10]}"
                                    if r.provenance == "recorded" else live_label())})
    return rows


def kv_sentence(rows: Sequence[dict[str, Any]] | None) -> str:
    """FP8 KV cache against bf16 KV: capacity in tokens and throughput at the largest batch, from speed rows."""
    if not rows:
        return "FP8 KV cache: not measured here (the speed runs are not recorded yet)"
    by = {(r["scheme"], r["batch"]): r for r in rows}
    top = max(r["batch"] for r in rows)
    a, b = by.get(("bf16", top)), by.get(("bf16-kv-fp8", top))
    if not (a and b):
        return "FP8 KV cache: the speed runs hold no bf16 and bf16-kv-fp8 pair"
    return (f"KV capacity at the same gpu_memory_utilization: bf16 KV {a['kv_tokens']:,} tokens, FP8 KV "
            f"{b['kv_tokens']:,} (x{b['kv_tokens'] / a['kv_tokens']:.2f}); at batch {top}: {a['decode_tok_s']:,.0f} vs "
            f"{b['decode_tok_s']:,.0f} decode tok/s  [{b['provenance']}]")


def gpu_skips(schemes: Sequence[str]) -> dict[str, str]:
    """The vLLM switches among `schemes` this GPU cannot run (an FP8 KV cache on a T4), each with vLLM 0.26's reason
    (`hardware.tiers.vllm_refusal`); nothing without a GPU."""
    return {s: why for s in schemes if s in VLLM_SWITCHES and VLLM_SWITCHES[s]
            and (why := gpu_refusal(**VLLM_SWITCHES[s]))}


def available_speed_schemes(model: str = SPEED_MODEL, work_dir: str | Path = GPU_WORK) -> list[str]:
    """The speed schemes that can run now: vLLM's switches on bf16 this GPU takes (`gpu_skips` names the others), and
    every checkpoint prepare_checkpoints made."""
    skips = gpu_skips(SPEED_SCHEMES)
    return [s for s in SPEED_SCHEMES if s not in skips and
            (s in VLLM_SWITCHES or read_facts(Path(work_dir) / model / s) is not None)]
