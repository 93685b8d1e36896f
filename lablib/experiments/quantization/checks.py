"""Lab 06's Checks cell, on what the lab's object (`lab.QuantizationLab`) made: the checkpoints' sizes, the quality
gate and the int4-against-8-bit ordering measured live on this machine, vLLM's speed, memory and perplexity claims
when measured live (each `Checks.live`, skipped where the cell shows a recording)."""
from __future__ import annotations

from typing import Any

from ...config import lab_id
from ...session import Checks, Shown
from .speed_runs import gpu_skips
from .quality import gate_rows
from .verdicts import gate_judged, int4_costs_more, kernels_logged
from .vllm_ppl import KV_FP8, TOLERANCE_PCT, bf16_agrees


def _bf16_weights_smallest(rs: list[dict[str, Any]]) -> bool:
    bf16 = next(b["weight_gib"] for b in rs if b["scheme"] == "bf16")
    return all(r["weight_gib"] < bf16 for r in rs if r["scheme"] not in ("bf16", "bf16-kv-fp8"))


def _kv_fp8_about_twice(rs: list[dict[str, Any]]) -> bool:
    fp8 = next(r["kv_tokens"] for r in rs if r["scheme"] == "bf16-kv-fp8")
    return 1.8 < fp8 / next(r["kv_tokens"] for r in rs if r["scheme"] == "bf16") < 2.2


def _kv_fp8_ran(spd: Shown) -> Shown:
    """The speed rows, or, live on a GPU vLLM runs no FP8 KV cache on (a T4), nothing to check and the reason."""
    if spd.live and spd.value is not None and not any(r["scheme"] == KV_FP8 for r in spd.value):
        return Shown(None, True, "not run on this GPU: " + (gpu_skips([KV_FP8]).get(KV_FP8) or "not asked for"))
    return spd


def checks(lab: Any) -> None:
    """Lab 06's Checks cell: reads the checkpoints made, their storage, the quality table at the lab's gate, the
    lm_head and layer variants, the speed runs and vLLM's perplexities. Prints what ran and what did not (and returns
    nothing, so the cell shows it once)."""
    lab.require_all()
    rows, made, stored, lm, parts = lab.quality, lab.made, lab.stored, lab.lm_heads, lab.parts
    spd, gq, gate = lab.speeds, lab.vllm, lab.gate_pct
    c = Checks(lab_id("06"))
    c.that("every scheme's checkpoint is smaller than bf16's",
           all(r["weight_bytes"] < rows[0]["weight_bytes"] for r in rows[1:]),
           [(r["scheme"], r["weight_bytes"]) for r in rows])
    c.that("the 8-bit schemes run here (fp8-dynamic, w8a8-int8) are within your gate",
           all(g["passed"] for g in gate_rows(rows, gate) if g["scheme"] in ("fp8-dynamic", "w8a8-int8")),
           gate_rows(rows, gate))
    c.that("every int4 scheme's verdict at your gate is stated", gate_judged(rows, gate),
           [(r["scheme"], r["gate"]) for r in rows[1:]])
    c.that("every int4 scheme run here costs more perplexity than every 8-bit one", int4_costs_more(rows),
           [(r["scheme"], r["ppl_change_pct"]) for r in rows[1:]])
    c.that("the MLP alone and attention alone each save less than every Linear, and more than nothing",
           all(0 < p["saved_pct"] < parts[0]["saved_pct"] for p in parts[1:]),
           [(p["quantized"], p["saved_pct"]) for p in parts])
    c.that("int4 at group 64 here (704 = 11 x 64): about 4.25 bits per Linear weight",
           all(m["group_size"] == 64 for m in made if "w4a16" in m["scheme"])
           and all(4.25 <= r["bits_per_weight"] < 4.32 for r in stored if "w4a16" in r["scheme"]))
    c.that("fp8-dynamic needed no calibration data",
           all(m["calibration_tokens"] == 0 for m in made if m["scheme"] == "fp8-dynamic"))
    c.that("quantizing the tied lm_head made the checkpoint larger", lm[1]["weight_bytes"] > lm[0]["weight_bytes"],
           [r["weight_bytes"] for r in lm])
    c.live(spd, "every scheme's decode stays under its bandwidth roofline",
           lambda rs: all(r["of_roofline"] is None or r["of_roofline"] <= 1.0 for r in rs))
    c.live(spd, "every quantized scheme's weights take less GPU memory than bf16's", _bf16_weights_smallest)
    c.live(_kv_fp8_ran(spd), "the FP8 KV cache holds about twice the KV tokens of bf16 KV", _kv_fp8_about_twice)
    c.live(spd, "vLLM logged a kernel for online fp8 and every quantized checkpoint", kernels_logged,
           lambda rs: [(r["scheme"], r["linear_kernels"]) for r in rs])
    c.live(gq, f"vLLM's bf16 perplexity is within {TOLERANCE_PCT:g}% of transformers' float32 one (same weights, "
           "same texts)", bf16_agrees, lambda rs: [(r["scheme"], r["ppl_vllm"], r["ppl_cpu"]) for r in rs])
    c.done()
