"""Lab 02's experiments: predict attention's cost with the IO model, then measure the kernels and the engines.

Lab 01 named three costs of the naive baseline; this lab removes the first, attention re-reading
memory. Naive attention writes the N x N scores S and probabilities P to HBM and reads them back;
a tiled (flash) kernel keeps them in on-chip SRAM. Four steps, each one call from the notebook:

1. `prediction` / `prediction_summary`: `mechanisms.attention.predict` at the H200's SRAM size, per
   sequence (batch 1) at the microbenchmark's shape (hidden 2048, causal): bytes, extra memory and
   roofline time of naive and FA2-order tiled attention against N, their log-log slopes, the speedup.
2. `kernels_here`: the microbenchmark's CPU preset (`bench.attention.QUICK_CPU`), always on this CPU:
   every kernel torch has here checked against a float64 reference, and the list of the ones it lacks,
   with torch's reason. A CPU shows correctness and the kernel list, not the GPU's speed.
3. `kernel_sweep`: the GPU sweep through `session.live_or_recorded`: live, `run_attention_bench(quick=True)`
   on CUDA; recorded, facts["attention"] (rows and provenance) from `record`. Either way with the IO
   model's prediction for the same shapes next to it, when the GPU is an H200 (`with_prediction`).
4. In an engine. (a) `hf_prefill`: the Hugging Face model's prefill (one forward of the prompt, the time to
   the first token's logits, without tokenizer or sampling) with `attn_implementation` eager, sdpa and
   flex_attention, switched on one loaded model (`set_attn_implementation`), each length's next-token
   logits compared with eager's. `HFConfig` has no attn_implementation, so this measures with
   transformers directly. Live here on the embedded model (`hf_prefill_here`); on the GPU, the synthetic
   Llama-3.1-8B shape (`hf_prefill_gpu`). (b) `vllm_backend_sweep`: vLLM with `attention_backend`
   FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION on the journey. `VLLMConfig` has no
   attention_backend field yet, so `VLLMEngine` cannot pass it: the sweep takes an engine factory that
   receives each backend's `LLM(...)` kwargs (`backend_llm_kwargs`), and `vllm_backends` says "not wired"
   until the field exists (then it runs `VLLMEngine` with it, live or recorded). vLLM refuses a backend
   that cannot take the model's head size at start-up; the sweep keeps vLLM's words as the row's reason.

`record(out_dir, store, facts)` is the GPU session's step `attention` (scripts/record_reference.py).
"""
from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..hardware.device import torch_threads
from .. import validate
from ..bench.attention import TILED, run_attention_bench
from ..bench.offline import run
from ..config import BenchConfig, VLLMConfig
from ..hardware.device import device_facts, library_versions
from ..mechanisms.attention import H200, AttentionShape, Gpu, loglog_slopes, naive_traffic, predict
from ..models import ModelSpec, load_hf_model, resolve_model
from ..results.reference import NotRecorded, recorded_facts
from ..results.store import ResultStore
from ..session import Shown, live_or_recorded
from ..workloads import Workload, load_workload

STEP = KEY = "attention"  # scripts/record_reference.py --steps attention writes facts["attention"]
BIG = "llama-3.1-8b"  # the synthetic 8B shape of the GPU runs
CPU_LABEL = "live on this CPU"
PREDICT_LENS = tuple(2**i for i in range(8, 17))  # 256 .. 65536, the microbenchmark's lengths
HF_IMPLS = ("eager", "sdpa", "flex_attention")
HF_CPU_LENS = (128, 256, 512, 1024)  # under the embedded model's context (2048): eager at 2048 takes seconds a call here
HF_GPU_LENS = (1024, 4096, 16384)  # live in the notebook on the GPU
HF_RECORD_LENS = (1024, 2048, 4096, 8192, 16384, 32768)
VLLM_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
RECORD_BENCH = {"repeats": 10}  # the full default sweep (256..64k, d 64 and 128, every kernel), 10 timed calls each
FLEX_ON_CPU = ("transformers compiles flex_attention (torch.compile, dynamic=False) once per prompt length, too slow "
               "for a CPU lab; pass impls=HF_IMPLS to run it")
NOT_WIRED = ("vLLM attention backends: not wired yet (VLLMConfig has no attention_backend field, so VLLMEngine cannot "
             "pass LLM(attention_backend=...); experiments.attention.vllm_backend_sweep takes the kwargs)")


# --- 1. predict -------------------------------------------------------------------------------------------------

def prediction(seq_lens: Sequence[int] = PREDICT_LENS, head_dim: int = 128, *, hidden: int = 2048, causal: bool = True,
               element_bytes: int = 2, gpu: Gpu = H200) -> list[dict[str, Any]]:
    """The IO model per sequence (batch 1) at the microbenchmark's shape: one dict per length (PredictionRow's fields)."""
    validate.integer("prediction", "hidden", hidden, "pass the model width, e.g. 2048.")
    validate.integer("prediction", "head_dim", head_dim, "pass the head dim, e.g. 64 or 128.")
    if hidden % head_dim:
        raise validate.refuse("prediction", "head_dim", head_dim, f"a divisor of hidden={hidden}", "e.g. 64 or 128.")
    rows = predict(seq_lens, head_dim, heads=hidden // head_dim, causal=causal, element_bytes=element_bytes, gpu=gpu)
    return [dataclasses.asdict(r) | {"head_dim": head_dim, "heads": hidden // head_dim, "causal": causal,
                                     "gpu": gpu.name, "sram_bytes": gpu.sram_bytes,
                                     "ridge": gpu.peak_flops / gpu.hbm_bandwidth} for r in rows]


SLOPED = ("naive_bytes", "flash_bytes", "naive_extra_bytes", "flash_extra_bytes", "naive_time_s", "flash_time_s", "flops")


def prediction_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Log-log slopes between the two longest lengths, the speedup and bytes ratio at each end, the bounds."""
    ns, first, last = [r["n"] for r in rows], rows[0], rows[-1]
    slopes = {k: loglog_slopes(ns, [r[k] for r in rows])[-1] for k in SLOPED}
    return {"gpu": last["gpu"], "head_dim": last["head_dim"], "n_min": first["n"], "n_max": last["n"], "slopes": slopes,
            "speedups": [r["speedup"] for r in rows], "bytes_ratio_max": last["bytes_ratio"],
            "naive_bound": last["naive_bound"], "flash_bound": last["flash_bound"],
            "naive_intensity": last["naive_intensity"], "flash_intensity": last["flash_intensity"],
            "ridge": last["ridge"]}


def describe_prediction(s: dict[str, Any]) -> str:
    """The summary in sentences, every number from it."""
    sl = s["slopes"]
    return "\n".join([
        f"IO model, {s['gpu']}, d = {s['head_dim']}, N = {s['n_min']:,} .. {s['n_max']:,} (log-log slopes at the top):",
        f"  HBM bytes: naive {sl['naive_bytes']:.3f}, flash (FA2) {sl['flash_bytes']:.3f}; both ~N^2, flash "
        f"{s['bytes_ratio_max']:.2f}x fewer at N = {s['n_max']:,}",
        f"  extra memory: naive (S and P) {sl['naive_extra_bytes']:.3f}, flash (logsumexp) {sl['flash_extra_bytes']:.3f}",
        f"  FLOPs {sl['flops']:.3f}; predicted time: naive {sl['naive_time_s']:.3f}, flash {sl['flash_time_s']:.3f}",
        f"  bound at the top: naive {s['naive_bound']} ({s['naive_intensity']:.0f} FLOP/byte), flash "
        f"{s['flash_bound']} ({s['flash_intensity']:.0f}); the ridge is {s['ridge']:.0f} FLOP/byte",
        f"  predicted speedup: {s['speedups'][0]:.2f}x at N = {s['n_min']:,} to {s['speedups'][-1]:.2f}x at "
        f"N = {s['n_max']:,}"])


# --- 2. the microbenchmark here, 3. the GPU sweep ---------------------------------------------------------------

cpu_threads = torch_threads  # torch on n threads for the duration (lablib.hardware.device)


def kernels_here(threads: int | None = 1, **kw: Any) -> Shown[dict[str, Any]]:
    """The microbenchmark's CPU preset on this machine's CPU (seconds): always live, labelled "live on this CPU"."""
    with cpu_threads(threads):
        rows, prov = run_attention_bench(quick=True, device="cpu", **kw)
    return Shown(with_prediction({"rows": rows, "provenance": prov}), True, CPU_LABEL)


def with_prediction(value: dict[str, Any]) -> dict[str, Any]:
    """value plus "prediction" {head_dim: rows} for its prefill shapes when it ran on an H200 in bf16, else a note why not."""
    prov, cfg = value["provenance"], value["provenance"]["config"]
    if "H200" not in str(prov.get("device")) or cfg["dtype"] != "bf16":
        return value | {"prediction": None, "prediction_note": f"no IO-model line: the model's peaks are the H200's, "
                        f"this ran on {prov.get('device')} in {cfg['dtype']}"}
    return value | {"prediction": {d: prediction(cfg["seq_lens"], d, hidden=cfg["hidden"], causal=cfg["causal"])
                                   for d in cfg["head_dims"]}, "prediction_note": None}


def _recorded_part(part: str | None = None) -> dict[str, Any]:
    facts = recorded_facts(KEY, STEP)
    if part is None:
        return facts
    if part not in facts:
        raise NotRecorded(f"{KEY}.{part}", STEP)
    return facts[part]


def _labelled(shown: Shown) -> Shown:
    """A recording is labelled with its own GPU and date (a step recorded after the headline runs keeps its date)."""
    if not shown.live and shown.value is not None:
        prov = shown.value["provenance"]
        shown.label = f"recorded on {prov['device']}, {str(prov['date'])[:10]}"
    return shown


def kernel_sweep(force: bool | None = None) -> Shown[dict[str, Any]]:
    """The quick GPU sweep live on a GPU with vLLM; otherwise facts["attention"] recorded on the H200 (or not yet)."""
    def live() -> dict[str, Any]:
        rows, prov = run_attention_bench(quick=True, device="cuda")
        return with_prediction({"rows": rows, "provenance": prov})

    return _labelled(live_or_recorded(live, lambda: with_prediction(_recorded_part()), force=force))


def rows_of(shown: Shown, panel: str = "prefill") -> list[dict[str, Any]]:
    """The rows of one panel ("prefill" or "decode"; "hf" for hf_prefill values); [] when nothing was measured."""
    return [] if shown.value is None else [r for r in shown.value["rows"] if r.get("panel", "hf") == panel]


def table(shown: Shown, panel: str = "prefill", columns: list[str] | None = None) -> Any:
    """A DataFrame of one panel's rows with a provenance column (one line saying why, when nothing was measured)."""
    return Shown(rows_of(shown, panel) or None, shown.live, shown.label).table(columns)


def speedups(shown: Shown) -> list[dict[str, Any]]:
    """Per prefill (kernel, N, d) where naive and the kernel both ran: naive time / kernel time, with the IO model's."""
    rows = rows_of(shown)
    naive = {(r["N"], r["head_dim"]): r for r in rows if r["kernel"] == "naive" and r["status"] == "ok"}
    pred = (shown.value or {}).get("prediction") or {}
    out = []
    for r in rows:
        base = naive.get((r["N"], r["head_dim"]))
        if r["kernel"] != "naive" and r["status"] == "ok" and base:
            model = next((p["speedup"] for p in pred.get(r["head_dim"], []) if p["n"] == r["N"]), None)
            out.append({"kernel": r["kernel"], "N": r["N"], "head_dim": r["head_dim"],
                        "measured": base["median_ms"] / r["median_ms"], "predicted": model})
    return out


def _short(reason: str) -> str:
    """A row's reason in one short line: the benchmark's own hint when it added one, else the error's start."""
    head, _, hint = reason.partition("; torch's CPU SDPA")
    return f"{head[:60]}... (torch's CPU SDPA{hint})" if hint else reason[:110]


def describe_here(shown: Shown) -> str:
    """What the CPU preset showed: which kernels ran and matched the reference, which this machine lacks and why."""
    rows = rows_of(shown) + rows_of(shown, "decode")
    ok = sorted({r["kernel"] for r in rows if r["status"] == "ok"})
    worst = max((r["max_abs_err"] for r in rows if r["status"] == "ok"), default=float("nan"))
    missing = {r["kernel"]: r["reason"] for r in rows if r["status"] == "unavailable"}
    lines = [f"{len(ok)} kernels ran and matched the float64 reference ({shown.value['provenance']['config']['dtype']}, "
             f"worst |out - ref| {worst:.2e}): {', '.join(ok)}  [{shown.label}]"]
    lines += [f"  not here: {k}: {_short(why)}" for k, why in missing.items()]
    wrong = [f"{r['kernel']} N={r['N']}" for r in rows if r["status"] == "wrong"]
    return "\n".join(lines + ([f"  OUTSIDE TOLERANCE: {', '.join(wrong)}"] if wrong else []))


def speedup_table(shown: Shown) -> Any:
    """speedups as a DataFrame with a provenance column (one line saying why, when nothing was measured)."""
    return Shown(speedups(shown) or None, shown.live, shown.label).table()


# The Checks cell's claims, each on a Shown's value ({"rows", "provenance"}): Checks.live passes the value.

def all_correct(value: dict[str, Any]) -> bool:
    """No kernel that ran is outside tolerance of the float64 reference (status 'wrong')."""
    return all(r["within_tol"] for r in value["rows"] if r["status"] in ("ok", "wrong"))


def kernels_ran(value: dict[str, Any]) -> set[str]:
    return {r["kernel"] for r in value["rows"] if r["status"] == "ok"}


def tiled_beat_naive(value: dict[str, Any], min_n: int = 4096) -> bool:
    """Every tiled kernel that ran is faster than naive at every N >= min_n where naive ran too."""
    ups = speedups(Shown(value, True, ""))
    return bool(ups) and all(u["measured"] > 1 for u in ups if u["kernel"] in TILED and u["N"] >= min_n)


def flash_memory_small(value: dict[str, Any]) -> bool:
    """At the longest prefill sdpa_flash ran, its extra memory is under a tenth of naive's S and P (the IO model's)."""
    top = max((r for r in value["rows"] if r["panel"] == "prefill" and r["kernel"] == "sdpa_flash"
               and r["status"] == "ok"), key=lambda r: r["N"])
    s_and_p = naive_traffic(AttentionShape(top["N"], top["head_dim"], top["batch"], top["heads"], causal=True))
    return top["extra_mem_bytes"] < 0.1 * s_and_p.extra_bytes


def decode_bandwidth_grows(value: dict[str, Any], kernel: str = "sdpa_flash") -> bool:
    """The kernel's achieved decode bandwidth is higher at the longest KV length than at the shortest."""
    got = sorted((r["N"], r["achieved_gbps"]) for r in value["rows"] if r["panel"] == "decode"
                 and r["kernel"] == kernel and r["status"] == "ok")
    return len(got) > 1 and got[-1][1] > got[0][1]


def same_next_token(value: dict[str, Any]) -> bool:
    """Every HF implementation that ran picked the reference's (eager's) next token at every prompt length."""
    return all(r["same_next_token"] for r in value["rows"] if r["status"] == "ok")


def _longest_both(value: dict[str, Any], a: str = "eager", b: str = "sdpa") -> tuple[int, float, float] | None:
    t = {(r["impl"], r["prompt_tokens"]): r["median_ms"] for r in value["rows"] if r["status"] == "ok"}
    both = [n for (i, n) in t if i == a and (b, n) in t]
    return (max(both), t[(a, max(both))], t[(b, max(both))]) if both else None


def sdpa_beats_eager(value: dict[str, Any]) -> bool:
    """sdpa's prefill is faster than eager's at the longest prompt both ran."""
    got = _longest_both(value)
    return got is not None and got[2] < got[1]


def observations(summary: dict[str, Any], here: Shown, hf_here: Shown, gpu: Shown, hf_gpu: Shown) -> str:
    """This run's numbers for "What you should see", each with where it was measured."""
    sp = summary["speedups"]
    lines = [f"IO model: predicted speedup {sp[0]:.2f}x at N = {summary['n_min']:,} to {sp[-1]:.2f}x at "
             f"N = {summary['n_max']:,} (Dao et al. 2022 measured 2-4x on an A100)  [simulated]",
             describe_here(here).splitlines()[0]]
    for name, shown in (("HF prefill, embedded model", hf_here), ("HF prefill, synthetic 8B", hf_gpu)):
        got = _longest_both(shown.value) if shown.value is not None else None
        lines.append(f"{name}: " + (f"at {got[0]:,} tokens eager {got[1]:.1f} ms, sdpa {got[2]:.1f} ms "
                                    f"({got[1] / got[2]:.2f}x)" if got else "nothing to compare") + f"  [{shown.label}]")
    if gpu.value is None:
        return "\n".join(lines + [f"GPU sweep: nothing measured here  [{gpu.label}]"])
    ups = speedups(gpu)
    for k in dict.fromkeys(u["kernel"] for u in ups if u["kernel"] in TILED):
        u = max((u for u in ups if u["kernel"] == k), key=lambda u: (u["N"], u["head_dim"]))
        model = f", the IO model {u['predicted']:.2f}x" if u["predicted"] else ""
        lines.append(f"GPU: {k} {u['measured']:.2f}x faster than naive at N = {u['N']:,}, d = {u['head_dim']}{model}")
    ooms = sorted({f"{r['kernel']} N={r['N']} d={r['head_dim']}" for r in gpu.value["rows"] if r["status"] == "oom"})
    return "\n".join(lines + [f"GPU: out of memory at {', '.join(ooms) or 'no point'}  [{gpu.label}]"])


# --- 4a. Hugging Face prefill with each attn_implementation -----------------------------------------------------

def hf_prefill(model: str | ModelSpec = "embedded", impls: Sequence[str] | None = None,
               prompt_lens: Sequence[int] = HF_CPU_LENS, *, device: str | None = None, dtype: str = "auto",
               repeats: int = 3, warmup: int = 1, seed: int = 0) -> dict[str, Any]:
    """Prefill time per (attn_implementation, prompt length) on one loaded model: {"rows", "provenance"}.

    Per point: one probe call (`first_ms`: flex compiles here; its logits are compared on the CPU), `warmup`
    calls, on CUDA one call for the logits and the peak memory beyond what was allocated before it, then
    `repeats` timed calls (synchronised on CUDA), median with min and max. Prompts are seeded random token ids, the same for every implementation;
    each point's next-token logits are compared with the first implementation that ran at that length (eager).
    impls=None: all of HF_IMPLS on CUDA; on a CPU eager and sdpa, flex_attention a 'skipped' row (FLEX_ON_CPU).
    Status: 'ok', 'oom' (freed, the sweep goes on), 'failed' (the error's first line), 'skipped'.
    Arguments are refused before the model loads.
    """
    import torch

    own = "hf_prefill"
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    validate.choice(own, "device", device, ("cpu", "cuda"))
    if device == "cuda" and not torch.cuda.is_available():
        raise validate.refuse(own, "device", device, "'cpu' here (torch sees no CUDA device)", "pass device='cpu'.")
    cuda = device == "cuda"
    chosen = [validate.choice(own, "impls", i, HF_IMPLS) for i in (impls if impls is not None else HF_IMPLS)]
    skipped = ["flex_attention"] if impls is None and not cuda else []
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    context = spec.architecture()["context"]
    lens = validate.integers(own, "prompt_lens", prompt_lens, "pass lengths, e.g. [128, 512, 2048].")
    if max(lens) > context:
        raise validate.refuse(own, "prompt_lens", lens, f"lengths <= the model's context {context}",
                              f"drop the lengths above {context}.")
    validate.integer(own, "repeats", repeats, "pass e.g. 3.")
    validate.integer(own, "warmup", warmup, "pass e.g. 1, or 0.", minimum=0)

    t0 = time.perf_counter()
    net = load_hf_model(spec, device, dtype)
    load_s, param_dtype = time.perf_counter() - t0, next(net.parameters()).dtype
    gen = torch.Generator().manual_seed(seed)
    prompts = {n: torch.randint(3, net.config.vocab_size, (1, n), generator=gen).to(device) for n in lens}
    reference: dict[int, tuple[str, Any]] = {}
    rows = []
    with _flex_room("flex_attention" in chosen and not skipped, len(lens)):
        for impl in [i for i in chosen if i not in skipped]:
            for n in lens:
                rows.append(_hf_point(net, impl, prompts[n], cuda, warmup, repeats, reference))
    rows += [dict.fromkeys(HF_FIELDS) | {"impl": i, "prompt_tokens": n, "status": "skipped", "reason": FLEX_ON_CPU}
             for i in skipped for n in lens]
    del net
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    hardware = device_facts(import_torch=True)
    prov = {"device": torch.cuda.get_device_name() if cuda else hardware.get("cpu"), "hardware": hardware,
            "versions": library_versions(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"), "model": spec.name, "synthetic": spec.source == "synthetic", "load_s": load_s,
            "config": {"impls": chosen, "skipped": skipped, "prompt_lens": lens, "device": device,
                       "dtype": str(param_dtype).replace("torch.", ""), "repeats": repeats, "warmup": warmup,
                       "seed": seed, "torch_threads": torch.get_num_threads(),
                       "timed": "one forward of the prompt (use_cache=True, logits_to_keep=1)"}}
    return {"rows": rows, "provenance": prov}


HF_FIELDS = ("impl", "prompt_tokens", "status", "median_ms", "min_ms", "max_ms", "first_ms", "prefill_tok_s",
             "extra_mem_bytes", "reference_impl", "max_abs_logit_diff", "same_next_token", "reason")


def _flex_room(active: bool, shapes: int) -> Any:
    """transformers compiles flex_attention's own code object, which the microbenchmark may have compiled for many
    shapes already: past dynamo's recompile limit it would run eager (unfused) without a word. Start clean."""
    import contextlib

    import torch

    if not active:
        return contextlib.nullcontext()
    torch._dynamo.reset()
    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    return cfg.patch(**{limit: max(getattr(cfg, limit), 8 * shapes)})


def _hf_point(net: Any, impl: str, ids: Any, cuda: bool, warmup: int, repeats: int,
              reference: dict[int, tuple[str, Any]]) -> dict[str, Any]:
    """One (implementation, length) point of hf_prefill."""
    import torch

    n = ids.shape[-1]
    row = dict.fromkeys(HF_FIELDS) | {"impl": impl, "prompt_tokens": n, "status": "ok"}
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def forward() -> Any:
        return net(input_ids=ids, use_cache=True, logits_to_keep=1).logits[0, -1]

    oom = None
    try:
        net.set_attn_implementation(impl)
        with torch.inference_mode():
            t = time.perf_counter()
            logits = forward().float().cpu()  # on the CPU the probe's logits are the ones compared
            row["first_ms"] = (time.perf_counter() - t) * 1e3
            for _ in range(warmup):
                forward()
            if cuda:  # one more call for the memory, from a settled allocator
                sync()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                logits = forward().float().cpu()
                row["extra_mem_bytes"] = torch.cuda.max_memory_allocated() - base
            times = []
            for _ in range(repeats):
                sync()
                t = time.perf_counter()
                forward()
                sync()
                times.append((time.perf_counter() - t) * 1e3)
        row |= {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}
        row["prefill_tok_s"] = n / (row["median_ms"] / 1e3)
        ref_impl, ref = reference.setdefault(n, (impl, logits))
        row |= {"reference_impl": ref_impl, "max_abs_logit_diff": float((logits - ref).abs().max()),
                "same_next_token": int(logits.argmax()) == int(ref.argmax())}
    except torch.OutOfMemoryError as e:
        oom = f"OutOfMemoryError: {(str(e).splitlines() or [''])[0][:200]}"
    except Exception as e:  # an implementation this transformers cannot run here: its own words
        row |= {"status": "failed", "reason": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}
    if oom is not None:  # freed outside the handler: its traceback holds the activations
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        row |= {"status": "oom", "reason": oom}
    return row


def hf_prefill_here(threads: int | None = 1, **kw: Any) -> Shown[dict[str, Any]]:
    """hf_prefill on the embedded model on this CPU (eager and sdpa; seconds): always live."""
    with cpu_threads(threads):
        value = hf_prefill("embedded", device="cpu", **({"repeats": 3, "warmup": 0} | kw))
    return Shown(value, True, CPU_LABEL)


def hf_prefill_gpu(force: bool | None = None, prompt_lens: Sequence[int] = HF_GPU_LENS) -> Shown[dict[str, Any]]:
    """hf_prefill on the synthetic Llama-3.1-8B shape on the GPU (live), or facts["attention"]["hf_prefill"]."""
    def live() -> dict[str, Any]:
        from ..models.synthetic import synthetic_spec

        return hf_prefill(synthetic_spec(BIG), prompt_lens=prompt_lens, device="cuda")

    return _labelled(live_or_recorded(live, lambda: _recorded_part("hf_prefill"), force=force))


# --- 4b. vLLM attention backends --------------------------------------------------------------------------------

def backend_llm_kwargs(backend: str, base: VLLMConfig = VLLMConfig()) -> dict[str, Any]:
    """The `vllm.LLM(...)` keyword arguments of `base` with `attention_backend=backend`."""
    validate.choice("backend_llm_kwargs", "backend", backend, VLLM_BACKENDS)
    return base.llm_kwargs() | {"attention_backend": backend}


def vllm_backend_sweep(start_engine: Callable[[str, dict[str, Any]], Any], backends: Sequence[str] = VLLM_BACKENDS, *,
                       workload: str | Workload = "journey", base: VLLMConfig = VLLMConfig(),
                       bench: BenchConfig = BenchConfig(progress=False), store: ResultStore | None = None,
                       lab: str = "02_attention") -> tuple[list[dict[str, Any]], list[Any]]:
    """One engine per backend, made by `start_engine(backend, backend_llm_kwargs(backend, base))`, the workload run.

    Each row: the backend asked for, the one the engine reported running (vLLM's log line, engine.facts
    "attention_backend"), output tok/s, TTFT and TPOT medians, start-up time; a backend vLLM refuses (a head
    size it cannot take, a missing package) is status 'failed' with the error's first line, and the sweep
    goes on. Returns (rows, Results).
    """
    kwargs = [backend_llm_kwargs(b, base) for b in backends]  # refuse an unknown name before any engine starts
    wl, rows, results = (workload if isinstance(workload, Workload) else load_workload(workload)), [], []
    for b, kw in zip(backends, kwargs):
        row: dict[str, Any] = {"backend": b, "status": "ok", "ran": None, "output_tok_s": None, "ttft_p50_s": None,
                               "tpot_p50_s": None, "startup_s": None, "reason": None}
        eng = None
        try:
            eng = start_engine(b, kw)
            r = run(eng, wl, bench, lab=lab, step=f"vllm-attn-{b.lower()}", store=store)
            results.append(r)
            row |= {"ran": eng.facts.get("attention_backend"), "output_tok_s": r.summary["output_tok_s"],
                    "ttft_p50_s": r.summary["ttft_s"]["p50"], "tpot_p50_s": r.summary["tpot_s"]["p50"],
                    "startup_s": eng.facts.get("startup_s")}
        except Exception as e:
            row |= {"status": "failed", "reason": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
        finally:
            if eng is not None:
                eng.close()
        rows.append(row)
    return rows, results


def wired() -> bool:
    """Whether VLLMConfig has an attention_backend field (then VLLMEngine passes it to vllm.LLM)."""
    return "attention_backend" in {f.name for f in dataclasses.fields(VLLMConfig)}


def _vllm_sweep_live(model: str = "embedded", store: ResultStore | None = None) -> tuple[list[dict], list[Any]]:
    from ..engines.vllm import VLLMEngine

    cfg = VLLMConfig(gpu_memory_utilization=0.3)
    return vllm_backend_sweep(lambda b, kw: VLLMEngine(model, dataclasses.replace(cfg, attention_backend=b)),
                              base=cfg, store=store)


def vllm_backends(force: bool | None = None) -> Shown[list[dict[str, Any]] | None]:
    """The backend sweep on the embedded model, live or recorded, once wired (`wired`); until then, says so."""
    if not wired():
        return Shown(None, False, NOT_WIRED)
    return live_or_recorded(lambda: _vllm_sweep_live()[0], lambda: _recorded_part("vllm_backends")["rows"], force=force)


# --- the GPU session's step -------------------------------------------------------------------------------------

def record(out_dir: str | Path, store: ResultStore, facts: dict[str, Any],
           parts: Sequence[str] = ("bench", "hf", "vllm")) -> None:
    """Step `attention`: facts["attention"] = the full microbenchmark {rows, provenance} (RECORD_BENCH), then
    ["hf_prefill"] (synthetic 8B, HF_RECORD_LENS), then ["vllm_backends"] when wired (Results into `store`, recorded).

    Each part is written to out_dir/attention-<part>.json as it ends, so a part cut off by the session's time
    limit leaves the earlier ones. `parts` picks a subset (two GPU commands when one is too short)."""
    for part in parts:
        validate.choice("record", "parts", part, ("bench", "hf", "vllm"))
    out, got = Path(out_dir), facts.setdefault(KEY, {})
    if "bench" in parts:
        rows, prov = run_attention_bench(**RECORD_BENCH)
        got.update(rows=rows, provenance=prov)
        (out / "attention-bench.json").write_text(json.dumps({"rows": rows, "provenance": prov}, default=str))
    if "hf" in parts:
        from ..models.synthetic import synthetic_spec

        got["hf_prefill"] = hf_prefill(synthetic_spec(BIG), prompt_lens=HF_RECORD_LENS, device="cuda")
        (out / "attention-hf.json").write_text(json.dumps(got["hf_prefill"], default=str))
    if "vllm" in parts and wired():
        rows, results = _vllm_sweep_live()
        for r in results:
            store.append(dataclasses.replace(r, provenance="recorded"))
        got["vllm_backends"] = {"rows": rows, "provenance": {"device": results[0].hardware.get("gpu") if results else None,
                                                              "date": datetime.date.today().isoformat()}}
        (out / "attention-vllm.json").write_text(json.dumps(got["vllm_backends"], default=str))
