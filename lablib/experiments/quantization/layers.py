"""Lab 06's layers quantized differently: one scheme on the MLP only, on attention only, or on every Linear.

A common recipe treats layer types apart ("attention dynamic, MLP static, embeddings in full precision"): the
layers that hurt quality most when quantized get the careful treatment. Which those are is measurable: quantize
the same scheme (by default GPTQ W4A16, group 64, the recipe the lab already runs) into one part at a time, with
lm_head kept 16-bit every time, and score each checkpoint against bf16 on the same texts. `layer_rows` makes
the two partial checkpoints with the quantizer's `ignore=` (llm-compressor's `re:` patterns on module names) and
reuses the all-Linears one the quality table scored; each row says how many bytes it saved and what it cost.

A part's bytes and its cost do not scale together: in this model the MLP holds about three quarters of the
decoder's Linear weights, so it saves the most, and `cost_per_saved` (perplexity percent per percent of the
checkpoint saved) puts the parts on one scale. Weights only: every activation here stays 16-bit (W4A16), so
what this measures is each part's sensitivity to quantization, not static against dynamic activation scales.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import validate
from ...models import embedded_path
from ...models.quantize import SCHEMES, default_group_size, linear_widths
from .checkpoints import reuse_or_quantize
from .measures import OWNER, provenance, quality_gate, work_folder
from .quality import earlier_row, on_cpu, bf16_reference, score_checkpoint

# the part quantized -> the quantizer's ignore= (lm_head kept 16-bit in each) and the checkpoint folder's suffix
PARTS: dict[str, tuple[tuple[str, ...], str]] = {
    "every Linear": (("lm_head",), ""),
    "MLP only": (("lm_head", r"re:.*\.self_attn\..*"), "+mlp-only"),
    "attention only": (("lm_head", r"re:.*\.mlp\..*"), "+attention-only"),
}


def layer_rows(scheme: str = "gptq-w4a16", *, quality: Sequence[dict[str, Any]], work_dir: str | Path | None = None,
               eval_texts: int | None = None, prompts: int = 4, max_new_tokens: int = 32, num_samples: int = 64,
               max_increase_pct: float = 1.0, threads: int = 1, python: str | None = None) -> list[dict[str, Any]]:
    """`scheme` on every Linear, on the MLP only and on attention only (lm_head 16-bit in all three), live on the CPU.

    quality: quality_table's rows for the same eval_texts, prompts and max_new_tokens, holding `scheme`: bf16's
    perplexity, greedy tokens and bytes and the every-Linear checkpoint's scores are taken from there (rows made on
    other texts are refused). The partial checkpoints go to work_dir/<scheme>+mlp-only and +attention-only, at the
    group size of the whole model (64 here: attention's widths alone would take 128, and the parts would differ in
    more than their layers), and are reused when they hold the same quantization. Per row: the Linears quantized,
    weight bytes and the share of bf16's saved, perplexity and its change, the gate, greedy agreement, first
    divergence, and `cost_per_saved`.
    """
    validate.choice(OWNER, "scheme", scheme, list(SCHEMES), f"pick from {list(SCHEMES)}.")
    validate.integer(OWNER, "threads", threads, "pass e.g. 1 (a shared CPU).")
    model_dir, work = embedded_path("target"), work_folder(work_dir)
    group = default_group_size(linear_widths(model_dir)) if SCHEMES[scheme].grouped else None
    with on_cpu(threads):
        ref = bf16_reference(eval_texts, prompts, max_new_tokens, with_ppl=False)
        earlier = earlier_row(quality, scheme, ref)  # refuses rows of other texts before any quantization
        bf16_bytes = quality[0]["weight_bytes"]
        rows = []
        for part, (ignore, suffix) in PARTS.items():
            folder = work / f"{scheme}{suffix}"
            facts = reuse_or_quantize(model_dir, folder, scheme, num_samples, ignore, python, threads, group)
            score = score_checkpoint(folder, ref, max_new_tokens, earlier if not suffix else None)
            gate = quality_gate(score["ppl"], ref["ppl"], max_increase_pct)
            saved = 100.0 * (1.0 - facts["weight_bytes"] / bf16_bytes)
            rows.append({"scheme": scheme, "quantized": part, "ignore": list(ignore), "linears": facts["targets"],
                         "group_size": facts["group_size"], "weight_bytes": facts["weight_bytes"],
                         "saved_pct": saved, **score, "ppl_ref": ref["ppl"], "ppl_change_pct": gate.increase_pct,
                         "cost_per_saved": gate.increase_pct / saved if saved > 0 else None, "gate": gate.sentence,
                         "reused": facts["reused"], "eval": ref["eval"], "greedy": ref["greedy"],
                         "provenance": provenance(threads)})
    return rows


def layer_sentence(rows: Sequence[dict[str, Any]]) -> str:
    """layer_rows' finding in words, every number from the rows: what each part saved and cost, and which part
    costs more per byte saved."""
    by = {r["quantized"]: r for r in rows}
    parts = "; ".join(f"{r['quantized']} ({r['linears']} Linears): {r['saved_pct']:.1f}% of bf16's bytes saved, "
                      f"perplexity {r['ppl_change_pct']:+.2f}%, greedy agreement {r['agreement']:.0%}" for r in rows)
    mlp, attn = by["MLP only"], by["attention only"]
    if mlp["cost_per_saved"] is None or attn["cost_per_saved"] is None:
        return f"{rows[0]['scheme']}, lm_head 16-bit: {parts}."
    hurt = "attention" if attn["cost_per_saved"] > mlp["cost_per_saved"] else "the MLP"
    return (f"{rows[0]['scheme']}, lm_head 16-bit: {parts}. Per percent of the checkpoint saved, attention costs "
            f"{attn['cost_per_saved']:+.3f}% of perplexity and the MLP {mlp['cost_per_saved']:+.3f}%: {hurt} is the "
            "part that quantization hurts more here.")


def attention_more_sensitive(rows: Sequence[dict[str, Any]]) -> bool | None:
    """Whether attention costs more perplexity per byte saved than the MLP (None: a part saved nothing)."""
    by = {r["quantized"]: r for r in rows}
    a, m = by["attention only"]["cost_per_saved"], by["MLP only"]["cost_per_saved"]
    return None if a is None or m is None else a > m
