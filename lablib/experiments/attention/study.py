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
   on CUDA; recorded, facts["attention"] (rows and provenance) from `record.record`. Either way with the IO
   model's prediction for the same shapes next to it, when the GPU is an H200 (`with_prediction`).
4. In an engine. (a) `hf_prefill`: the Hugging Face model's prefill (one forward of the prompt, the time to
   the first token's logits, without tokenizer or sampling) with `attn_implementation` eager, sdpa and
   flex_attention, switched on one loaded model (`set_attn_implementation`), each length's next-token
   logits compared with eager's: the prefill alone, on one model (the engine's `HFConfig.attn_implementation`
   loads one model per kernel). Live here on the embedded model (`hf_prefill_here`); on the GPU, the synthetic
   Llama-3.1-8B shape (`hf_prefill_gpu`). (b) `vllm_backend_sweep`: vLLM with `attention_backend`
   FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION on the journey. `VLLMConfig` has no
   attention_backend field yet, so `VLLMEngine` cannot pass it: the sweep takes an engine factory that
   receives each backend's `LLM(...)` kwargs (`backend_llm_kwargs`), and `vllm_backends` says "not wired"
   until the field exists (then it runs `VLLMEngine` with it, live or recorded). vLLM refuses a backend
   that cannot take the model's head size at start-up; the sweep keeps vLLM's words as the row's reason.

5. `journey_rung`: the journey's lab 02 rung against lab 01's, whole `generate` runs through the lab's harness:
   the largest static batch with eager attention, then the same batches with sdpa (`journey.hf_steps`), on the
   same requests: tok/s, TTFT (prefill, where the N x N scores are) and TPOT (decode: one query row, no N x N).

The GPU session's step `attention` is `record.record` (scripts/record_reference.py).

This module runs the lab's steps, live or recorded. `attention_vllm` holds the backend sweep's machinery,
and `attention_findings` reads what the steps returned (the IO model's prediction, the speedups, the
sentences "What you should see" prints, the Checks cell's claims). Their public names are importable from
here too: the notebook and the tests call `attention.prediction`, `attention.vllm_backend_sweep`, ...
"""
from __future__ import annotations

import contextlib
import datetime
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ... import validate
from ...bench.attention import run_attention_bench
from ...bench.offline import run_step
from ...engines.hf import HFEngine
from ...hardware.device import device_facts, library_versions, torch_threads
from ...hardware.oom import error_line, free_memory, is_out_of_memory, oom_row
from ...models import ModelSpec, load_hf_model, resolve_model
from ...models.synthetic import synthetic_spec
from ...results.compare import outputs_agree
from ...results.reference import NotRecorded, recorded_facts
from ...results.store import ResultStore
from ...session import live_label, live_or_recorded, Shown
from ...workloads import load_workload
from ..journey import hf_steps, Step
from .findings import with_prediction
from .backends import NOT_WIRED, vllm_sweep_live, wired
from ...config import BenchConfig, HFConfig, lab_id

STEP = KEY = "attention"  # scripts/record_reference.py --steps attention writes facts["attention"]
BIG = "llama-3.1-8b"  # the synthetic 8B shape of the GPU runs
CPU_LABEL = "live on this CPU"
HF_IMPLS = ("eager", "sdpa", "flex_attention")
HF_CPU_LENS = (128, 256, 512, 1024)  # under the embedded model's context (2048): eager at 2048 takes seconds a call here
HF_GPU_LENS = (1024, 4096, 16384)  # live in the notebook on the GPU
HF_RECORD_LENS = (1024, 2048, 4096, 8192, 16384, 32768)
RECORD_BENCH = {"repeats": 10}  # the full default sweep (256..64k, d 64 and 128, every kernel), 10 timed calls each
FLEX_ON_CPU = ("transformers compiles flex_attention (torch.compile, dynamic=False) once per prompt length, too slow "
               "for a CPU lab; pass impls=HF_IMPLS to run it")


# --- 2. the microbenchmark here, 3. the GPU sweep ---------------------------------------------------------------

cpu_threads = torch_threads  # torch on n threads for the duration (lablib.hardware.device)


def kernels_here(threads: int | None = 1, **kw: Any) -> Shown[dict[str, Any]]:
    """The microbenchmark's CPU preset on this machine's CPU (seconds): always live, labelled "live on this CPU"."""
    with cpu_threads(threads):
        rows, prov = run_attention_bench(quick=True, device="cpu", **kw)
    return Shown(with_prediction({"rows": rows, "provenance": prov}), True, CPU_LABEL)


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
    import torch  # deferred: torch

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
    free_memory(cuda)
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
    import torch  # deferred: torch

    if not active:
        return contextlib.nullcontext()
    torch._dynamo.reset()
    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    return cfg.patch(**{limit: max(getattr(cfg, limit), 8 * shapes)})


def _hf_point(net: Any, impl: str, ids: Any, cuda: bool, warmup: int, repeats: int,
              reference: dict[int, tuple[str, Any]]) -> dict[str, Any]:
    """One (implementation, length) point of hf_prefill."""
    import torch  # deferred: torch

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
    except Exception as e:
        if is_out_of_memory(e):
            oom = error_line(e, 200)
        else:  # an implementation this transformers cannot run here: its own words
            row |= {"status": "failed", "reason": error_line(e, 200)}
    if oom is not None:  # freed outside the handler: its traceback holds the activations
        row |= oom_row(oom, cuda)
    return row


def hf_prefill_here(threads: int | None = 1, **kw: Any) -> Shown[dict[str, Any]]:
    """hf_prefill on the embedded model on this CPU (eager and sdpa; seconds): always live."""
    with cpu_threads(threads):
        value = hf_prefill("embedded", device="cpu", **({"repeats": 3, "warmup": 0} | kw))
    return Shown(value, True, CPU_LABEL)


def hf_prefill_gpu(force: bool | None = None, prompt_lens: Sequence[int] = HF_GPU_LENS) -> Shown[dict[str, Any]]:
    """hf_prefill on the synthetic Llama-3.1-8B shape on the GPU (live), or facts["attention"]["hf_prefill"].

    The recording ran HF_RECORD_LENS and is shown whole; the line under the cell says which lengths (and which
    model) it shows where the cell asked others."""
    def live() -> dict[str, Any]:
        return hf_prefill(synthetic_spec(BIG), prompt_lens=prompt_lens, device="cuda")

    return _labelled(live_or_recorded(
        live, lambda: _recorded_part("hf_prefill"), force=force,
        asked={"model": f"synthetic:{BIG}", "prompt_lens": sorted(prompt_lens)},
        where={"model": "provenance.model", "prompt_lens": "rows.prompt_tokens"}))


def vllm_backends(force: bool | None = None) -> Shown[list[dict[str, Any]] | None]:
    """The backend sweep on the embedded model, live or recorded, once wired (`wired`); until then, says so."""
    if not wired():
        return Shown(None, False, NOT_WIRED)
    return live_or_recorded(lambda: vllm_sweep_live()[0], lambda: _recorded_part("vllm_backends")["rows"], force=force)


def journey_rung(requests: int = 16, batch: int = 16, max_new_tokens: int = 32, *, store: ResultStore | None = None,
                 threads: int | None = 1) -> Shown[dict[str, Any]]:
    """Lab 01's largest static batch (eager attention) and lab 02's rung (the same batches with sdpa), on the
    first `requests` journey requests through `bench.run`, live on this machine (any machine runs it). A Shown
    of {"rows": per rung (panel "rung": attention, tok/s, TTFT p50, TPOT p50; `table(shown, "rung")`), "ratios":
    sdpa over eager (tok/s, TTFT, TPOT: above 1, sdpa better), "identical": the greedy tokens agree, "agreement":
    `outputs_agree` of the two, "dtype", "float32": the same pair's agreement in float32, "results"}.

    sdpa computes the same attention as eager in another order of sums. In float32 (the CPU's dtype) that leaves
    the greedy tokens identical; in bfloat16 (a GPU's) the two roundings differ in the last bits and greedy
    decoding flips where two tokens are nearly tied, so off float32 the pair runs again in float32 (the
    embedded model, on the CPU: seconds) and "float32" says whether the tokens are then identical. `threads` pins torch's
    threads."""
    owner = "journey_rung"
    validate.integer(owner, "requests", requests, "journey requests, e.g. 16.", 1, 64)
    validate.integer(owner, "batch", batch, "a static batch size > 1, e.g. 16.", 2, 64)
    validate.integer(owner, "max_new_tokens", max_new_tokens, "new tokens per request, e.g. 32.")
    wl, bench = load_workload("journey", limit=requests), BenchConfig(max_new_tokens=max_new_tokens, progress=False)
    results = [run_step(step, "embedded", wl, bench, lab=lab_id("02"), store=store, threads=threads)
               for step in hf_steps([batch])[-2:]]  # hf-static-b<batch> (eager), then its -sdpa rung
    eager, sdpa = results
    rows = [{"panel": "rung", "rung": r.step, "attention": r.config["attn_implementation"],
             "output_tok_s": r.summary["output_tok_s"],
             "ttft_p50_s": r.summary["ttft_s"]["p50"], "tpot_p50_s": r.summary["tpot_s"]["p50"]} for r in results]
    ratios = {"tok_s": rows[1]["output_tok_s"] / rows[0]["output_tok_s"],
              "ttft": rows[0]["ttft_p50_s"] / rows[1]["ttft_p50_s"], "tpot": rows[0]["tpot_p50_s"] / rows[1]["tpot_p50_s"]}
    agreement, dtype = outputs_agree(sdpa, eager), eager.model.get("dtype")
    exact = agreement if dtype == "float32" else outputs_agree(*reversed(_float32_pair(wl, bench, batch, threads)))
    return Shown({"rows": rows, "ratios": ratios, "identical": agreement["identical"] == agreement["of"],
                  "agreement": agreement, "dtype": dtype, "float32": exact, "results": results}, True,
                 f"{live_label()}, {threads or 'all'} torch thread(s)")


def _float32_pair(wl: Any, bench: Any, batch: int, threads: int | None) -> list[Any]:
    """The rung's eager and sdpa runs again in float32 on the CPU, where the claim was measured (not stored: they check
    the tokens, not the speed; the embedded model takes seconds)."""
    return [run_step(Step(f"hf-static-b{batch}-{impl}-float32", lambda m, impl=impl: HFEngine(m, HFConfig(
                "static", batch, attn_implementation=impl, dtype="float32", device="cpu"))), "embedded", wl, bench,
                     lab=lab_id("02"), threads=threads) for impl in ("eager", "sdpa")]


def journey_rung_lines(shown: Shown[dict[str, Any]]) -> str:
    """What the two rungs say, every number from them."""
    rung = shown.value
    e, s = rung["rows"]
    r = rung["ratios"]

    def word(x: float, better: str, worse: str) -> str:
        return f"{x:.2f}x {better}" if x >= 1 else f"{1 / x:.2f}x {worse}"

    return (f"{shown.label}: {s['rung']} made {s['output_tok_s']:,.0f} output tok/s against {e['rung']}'s "
            f"{e['output_tok_s']:,.0f} ({word(r['tok_s'], 'as many', 'fewer')}); TTFT p50 {s['ttft_p50_s']:.2f} s "
            f"against {e['ttft_p50_s']:.2f} s ({word(r['ttft'], 'sooner', 'later')}: the prefill, where eager writes "
            f"the N x N scores); TPOT p50 {s['tpot_p50_s'] * 1e3:.1f} ms against {e['tpot_p50_s'] * 1e3:.1f} ms "
            f"({word(r['tpot'], 'faster', 'slower')}: decode, one query row a step, no N x N). " + agreement_line(rung))


def agreement_line(rung: dict[str, Any]) -> str:
    """Whether the two rungs' greedy tokens agree, in the rung's dtype and in float32, every number from the runs."""
    a, f = rung["agreement"], rung["float32"]
    firsts = sorted(d["first_divergence"] for d in a["diverged"] if d["first_divergence"] is not None)
    said = (f"Greedy tokens in {rung['dtype']}: {a['identical']} of {a['of']} requests identical"
            + (f" (the others part at token {', '.join(map(str, firsts))})" if firsts else ""))
    if rung["dtype"] == "float32":
        return said + "."
    said += f"; in float32 on the CPU, {f['identical']} of {f['of']} identical"
    if a["identical"] < a["of"] and f["identical"] == f["of"]:
        said += (": sdpa computes the same attention in another order of sums, and in bfloat16 the two roundings "
                 "differ in the last bits, enough to flip greedy decoding where two tokens are nearly tied")
    return said + "."
