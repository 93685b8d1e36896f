"""Lab 06's quality on the GPU: each checkpoint's perplexity as vLLM runs it, beside transformers' on the CPU.

The CPU table (`quality_table`) scores a scheme's arithmetic: weights dequantized to the values the checkpoint
stores, matmuls in float32, activations fake-quantized where the scheme quantizes them. vLLM runs the real
kernels (Machete or Marlin for int4, CUTLASS for 8-bit, cuBLAS for bf16) in bfloat16. `vllm_quality_rows` scores
the same evaluation texts through vLLM's `prompt_logprobs` (`VLLMEngine.prompt_logprobs`, then the same
`from_logprobs`), one engine per checkpoint, each from a cold start and eager (`enforce_eager`: a perplexity is
prefill only, so no CUDA graphs and no torch.compile, whose fused kernels could move a perplexity in its last
digits), and sets each beside the CPU's number.

On bf16 the two differ only in arithmetic (bfloat16 on the GPU against float32 on the CPU, the same weights), so
they must agree within `TOLERANCE_PCT`, set before the first measurement: bf16 keeps 8 bits of mantissa, and the
rounding of a 5-layer model's logits moves a perplexity by tenths of a percent, not whole ones. On the quantized
schemes the gap between the two is the kernels' own (their accumulation order and precision), reported, not
asserted: what the lab asserts about a scheme's quality is its change against bf16 measured the same way.

The FP8 KV cache is a vLLM switch, not a checkpoint: the `bf16-kv-fp8` row runs the bf16 weights with
`kv_cache_dtype="fp8"`, so its change against bf16 is what vLLM's FP8 KV path costs (the CPU has no such path: its
CPU columns stay empty). That path is more than 8-bit storage: with an FP8 KV cache vLLM 0.26's FlashAttention
backend (Hopper) also casts the query to FP8 at scale 1.0 (`Attention.query_quant`, `_q_scale` 1.0) and runs
attention in FP8, so the row measures FP8 attention as served. Its `kv_tokens` beside bf16's is the capacity the halved bytes per token buy
at the same `gpu_memory_utilization`.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ... import validate
from ...config import VLLMConfig
from ...engines.vllm import VLLMEngine
from ...hardware.device import device_facts
from ...hardware.tiers import gpu_refusal
from ...models import load_tokenizer, resolve_model
from ...models.quantize import SCHEMES, read_facts
from ...results.reference import recorded_facts, reference_facts
from ...results.store import keep_if_recording
from ...session import live_label, live_or_recorded, mode, Shown
from .measures import OWNER, evaluation_set, from_logprobs, quality_gate, work_folder
from .speed_runs import kernels_text, vllm_log_facts

TOLERANCE_PCT = 1.0  # vLLM's bf16 perplexity against transformers' float32 one, same weights: |gap| at most this
KEY, STEP = "quantization_quality", "quantization-quality"  # facts key; scripts/record_reference.py's step
KV_FP8 = "bf16-kv-fp8"  # the bf16 weights with vLLM's FP8 KV cache (kv_cache_dtype="fp8"): a row of every run


def _engine_spec(scheme: str, work: Path) -> Any:
    """The embedded target (bf16) or the checkpoint work/<scheme>, refused (naming what makes it) when not made."""
    if scheme in ("bf16", KV_FP8):
        return "embedded"
    folder = work / scheme
    if read_facts(folder) is None:
        raise validate.refuse(OWNER, "schemes", scheme, f"a scheme whose checkpoint is in {folder} (not made yet)",
                              "run quantize_all (the lab's step 2) with the same work_dir first, or leave it out.")
    return resolve_model(folder)  # a local folder: checked here, before any engine starts


def vllm_quality_rows(schemes: Sequence[str], *, work_dir: str | Path | None = None, eval_texts: int | None = None,
                      cpu_rows: Sequence[dict[str, Any]] | None = None, gpu_memory_utilization: float = 0.3,
                      on_row: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """bf16, bf16 with the FP8 KV cache (`KV_FP8`), then every scheme's checkpoint in work_dir, scored by vLLM on the
    first `eval_texts` evaluation windows.

    Per row: vLLM's perplexity, its change against vLLM's bf16, the CPU's perplexity from `cpu_rows` (a
    `quality_table` of the same texts) and the gap between the two, the kernels vLLM logged, the tokens scored,
    the KV cache's dtype and its capacity in tokens.
    Every refusal (an unknown scheme, a checkpoint not made) comes before any engine starts. `on_row` is handed
    the rows so far after each engine, so a run cut short keeps the checkpoints it scored."""
    for s in schemes:
        validate.choice(OWNER, "schemes", s, list(SCHEMES), f"pick from {list(SCHEMES)}.")
    work = work_folder(work_dir)
    kv_refused = gpu_refusal(kv_cache_dtype="fp8")
    if kv_refused:  # a GPU without an FP8 KV path in vLLM (a T4): that row is left out, and why is said
        print(f"Not run on this GPU: {KV_FP8}: {kv_refused}")
    plans = [(s, _engine_spec(s, work)) for s in ("bf16", *(() if kv_refused else (KV_FP8,)), *schemes)]
    texts = evaluation_set(eval_texts).prompt_ids(load_tokenizer(resolve_model("embedded")))
    rows = []
    for scheme, spec in plans:
        # eager: a perplexity is one prefill pass per text and no decode step, so the engine skips torch.compile
        # and capturing CUDA graphs (decode's), what most of a start's minute on the H200 went to
        config = VLLMConfig(gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=False,
                            kv_cache_dtype="fp8" if scheme == KV_FP8 else "auto", enforce_eager=True)
        t0 = time.perf_counter()
        with VLLMEngine(spec, config) as eng:
            ppl = from_logprobs(eng.prompt_logprobs(texts))
            kernels = vllm_log_facts(Path(eng.log_path).read_text(errors="replace"))["linear_kernels"]
        base = rows[0]["ppl_vllm"] if rows else ppl.ppl
        rows.append({"scheme": scheme, "ppl_vllm": ppl.ppl, "ppl_change_pct": 100.0 * (ppl.ppl / base - 1.0),
                     "tokens": ppl.tokens, "texts": ppl.texts,
                     "linear_kernels": kernels_text(kernels, cublas=scheme in ("bf16", KV_FP8)),
                     "kv_cache_dtype": eng.facts.get("kv_cache_dtype"), "kv_tokens": eng.facts.get("kv_tokens"),
                     "engine_s": time.perf_counter() - t0,
                     "provenance": live_label()})
        if on_row is not None:
            on_row(beside_cpu(rows, cpu_rows))
    return beside_cpu(rows, cpu_rows)


def beside_cpu(rows: Sequence[dict[str, Any]], cpu_rows: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """vLLM's rows with the CPU's perplexity of the same scheme set beside each (`ppl_cpu`) and the gap in percent
    (`vllm_vs_cpu_pct`); both None where the CPU rows hold no such scheme."""
    cpu = {r["scheme"]: r["ppl"] for r in cpu_rows or ()}
    return [{**r, "ppl_cpu": cpu.get(r["scheme"]),
             "vllm_vs_cpu_pct": 100.0 * (r["ppl_vllm"] / cpu[r["scheme"]] - 1.0) if r["scheme"] in cpu else None}
            for r in rows]


def bf16_agrees(rows: Sequence[dict[str, Any]], tolerance_pct: float = TOLERANCE_PCT) -> bool:
    """The cross-check: on bf16, vLLM's perplexity is within `tolerance_pct` of the CPU's (same weights, same texts)."""
    gap = next((r["vllm_vs_cpu_pct"] for r in rows if r["scheme"] == "bf16"), None)
    return gap is not None and abs(gap) <= tolerance_pct


# record's settings: its checkpoints (schemes, calibration windows), the evaluation windows vLLM scores, and the CPU
# table it sets beside them (greedy prompts x tokens, the gate's threshold); a live `gpu_quality` run on exactly these,
# every engine run, is kept as the recording (`quality_facts`)
RECORD: dict[str, Any] = {"schemes": ("fp8-dynamic", "gptq-w4a16", "w8a8-int8", "awq-w4a16"), "eval_texts": 16,
                          "num_samples": 16, "prompts": 4, "max_new_tokens": 16, "max_increase_pct": 1.0}


CPU_SCHEMES = ("fp8-dynamic", "gptq-w4a16", "w8a8-int8")  # AWQ's scale search adds ~40 s on a 2-core CPU: asked for


def default_schemes() -> list[str]:
    """What lab 06 quantizes by default on this machine: on a live GPU machine record's four (so the run is step
    `quantization-quality`'s recording too, AWQ costing seconds there), on a CPU the three that keep the lab
    to about two minutes (add 'awq-w4a16' to run AWQ here)."""
    return list(RECORD["schemes"] if mode()["live"] else CPU_SCHEMES)


def made_facts(schemes: Sequence[str], work: Path) -> list[dict[str, Any]]:
    """What the recording keeps of each checkpoint it scored, read from the checkpoint's own quantization.json."""
    out = []
    for s in schemes:
        f = read_facts(work / s) or {}
        out.append({"scheme": s, "group_size": f.get("group_size"), "quantize_s": f.get("seconds"),
                    "device": f.get("device")})
    return out


def quality_facts(rows: Sequence[dict[str, Any]], cpu: Sequence[dict[str, Any]], made: list[dict[str, Any]],
                  cpu_error: str | None, eval_texts: int, gpu: str | None, date: str,
                  complete: bool) -> dict[str, Any]:
    """facts[KEY] as step `quantization-quality` keeps it, from record.record_quality and a live lab run alike (one,
    so the two cannot drift): vLLM's rows labelled recorded, the CPU table beside them, the checkpoints made."""
    return {"rows": [{**r, "provenance": f"recorded on {gpu}, {date}"} for r in rows],
            "cpu_rows": [{k: v for k, v in r.items() if k != "first_divergence"} for r in cpu],
            "made": made, "cpu_error": cpu_error, "eval_texts": eval_texts,
            "tolerance_pct": TOLERANCE_PCT, "gpu": gpu, "date": date, "complete": complete}


def gpu_and_date() -> tuple[str | None, str]:
    """This machine's GPU and today's date (UTC, as the Results' recorded_at): what a quality recording is labelled."""
    return device_facts().get("gpu"), time.strftime("%Y-%m-%d", time.gmtime())  # UTC, as the Results' recorded_at


def differs_from_record(schemes: Sequence[str], eval_texts: int | None, cpu_rows: Sequence[dict[str, Any]],
                        work: Path) -> list[str]:
    """Each setting of a live run that is not record's (`RECORD`), in words; empty when the run is record's own: the
    same schemes, their checkpoints calibrated on as many windows, as many evaluation windows, and CPU rows of the
    same schemes, greedy lengths and gate."""
    want, out = RECORD, []
    if sorted(schemes) != sorted(want["schemes"]):
        out.append(f"schemes {sorted(schemes)} (record's: {sorted(want['schemes'])})")
    n = len(evaluation_set(eval_texts))
    if n != want["eval_texts"]:
        out.append(f"eval_texts {n} (record's: {want['eval_texts']})")
    for s in schemes:
        samples = ((read_facts(work / s) or {}).get("calibration") or {}).get("samples")
        if SCHEMES[s].calibrated and samples != want["num_samples"]:
            out.append(f"{s} calibrated on {samples} windows (record's: {want['num_samples']})")
    if [r.get("scheme") for r in cpu_rows] != ["bf16", *schemes]:
        out.append(f"CPU rows of {[r.get('scheme') for r in cpu_rows]} (record's: bf16 and the same schemes)")
        return out
    greedy = f"{want['prompts']} journey prompts x {want['max_new_tokens']} tokens"
    if cpu_rows[0].get("greedy") != greedy or not str(cpu_rows[0].get("eval", "")).startswith(
            f"{evaluation_set(want['eval_texts']).label},"):
        out.append(f"CPU rows of {cpu_rows[0].get('eval')} and {cpu_rows[0].get('greedy')} (record's: "
                   f"{evaluation_set(want['eval_texts']).label} and {greedy})")
    ref = cpu_rows[0]["ppl"]
    if any(r.get("gate") != quality_gate(r["ppl"], ref, want["max_increase_pct"]).sentence for r in cpu_rows[1:]):
        out.append(f"CPU rows gated at another threshold (record's: {want['max_increase_pct']:g}%)")
    return out


def gpu_quality(schemes: Sequence[str], *, cpu_rows: Sequence[dict[str, Any]], work_dir: str | Path | None = None,
                eval_texts: int | None = None, store: Any = None,
                force: bool | None = None) -> Shown[list[dict[str, Any]]]:
    """`vllm_quality_rows` live on a GPU with vLLM (beside this run's CPU rows); else what step
    `quantization-quality` recorded on the H200 (its own CPU rows, made there, beside it).

    With a `store`, a live run on the recording's settings (`RECORD`: `differs_from_record` finds nothing) is also kept
    as step quantization-quality's recording (`keep_if_recording`, the facts record.record_quality writes), after every
    engine ("complete": False until the last, as the step's when cut short): lab 06 run live on the GPU is its own
    quality recording, and a run cut by a time limit keeps the engines that ended. Any other run stays this user's,
    and a line says which setting differs."""
    def live() -> list[dict[str, Any]]:
        work = work_folder(work_dir)
        differs = differs_from_record(schemes, eval_texts, cpu_rows, work) if store is not None else ["no store"]
        if differs:
            rows = vllm_quality_rows(schemes, work_dir=work, eval_texts=eval_texts, cpu_rows=cpu_rows)
            if store is not None:
                print(f"Not kept as step {STEP}'s recording (this is your run): " + "; ".join(differs))
            return rows
        made, n, (gpu, date) = made_facts(schemes, work), len(evaluation_set(eval_texts)), gpu_and_date()

        def keep(rows: list[dict[str, Any]], complete: bool) -> Path | None:  # the step's facts, cut short or not
            return keep_if_recording(store, KEY, quality_facts(rows, cpu_rows, made, None, n, gpu, date, complete))

        rows = vllm_quality_rows(schemes, work_dir=work, eval_texts=eval_texts, cpu_rows=cpu_rows,
                                 on_row=lambda so_far: keep(so_far, False))  # kept after every engine
        complete = len(rows) == len(schemes) + 2  # every engine ran (one raising stops the run before here)
        path = keep(rows, complete)
        print(f"Kept as step {STEP}'s recording (record's settings{', every engine ran' if complete else ''}): {path}")
        return rows

    asked = {"schemes": sorted(["bf16", KV_FP8, *schemes]), "eval_texts": len(evaluation_set(eval_texts))}
    return live_or_recorded(live, lambda: recorded_facts(KEY, STEP)["rows"], force=force, asked=asked,
                            where={"schemes": "scheme", "eval_texts": "texts"})


def gpu_quality_lines(shown: Shown[list[dict[str, Any]]], tolerance_pct: float = TOLERANCE_PCT) -> str:
    """What vLLM's perplexities say, every number from the rows."""
    if shown.value is None:
        return f"[{shown.label}]"
    rows = shown.value
    bf16 = next(r for r in rows if r["scheme"] == "bf16")
    out = [f"vLLM, bf16: perplexity {bf16['ppl_vllm']:.3f} over {bf16['tokens']:,} tokens"
           + (f", {bf16['vllm_vs_cpu_pct']:+.2f}% against transformers' float32 {bf16['ppl_cpu']:.3f} on the CPU "
              f"({'within' if bf16_agrees(rows, tolerance_pct) else 'OUTSIDE'} the {tolerance_pct:g}% the two must "
              "agree by)" if bf16["ppl_cpu"] is not None else "")]
    for r in rows[1:]:
        if r["scheme"] == KV_FP8:
            kv = (f"; KV capacity {r['kv_tokens']:,} tokens against bf16 KV's {bf16['kv_tokens']:,} "
                  f"(x{r['kv_tokens'] / bf16['kv_tokens']:.2f}) at the same gpu_memory_utilization"
                  if r.get("kv_tokens") and bf16.get("kv_tokens") else "")
            out.append(f"  {r['scheme']} (bf16 weights, FP8 KV cache): {r['ppl_vllm']:.3f}, "
                       f"{r['ppl_change_pct']:+.2f}% against vLLM's bf16{kv}")
            continue
        out.append(f"  {r['scheme']}: {r['ppl_vllm']:.3f}, {r['ppl_change_pct']:+.2f}% against vLLM's bf16"
                   + (f" (the CPU's arithmetic: {r['ppl_cpu']:.3f}; vLLM's kernels {r['vllm_vs_cpu_pct']:+.2f}% from it)"
                      if r["ppl_cpu"] is not None else "") + f"; {r['linear_kernels']}")
    return "\n".join(out) + f"\n[{shown.label}]"


def quality_recording() -> dict[str, Any] | None:
    """Step quantization-quality's facts (every RECORD scheme quantized on the H200 machine, scored on its CPU and by
    vLLM), or None where it is not recorded: `claims` reads AWQ against GPTQ from it when a run left one out."""
    return reference_facts().get(KEY)
