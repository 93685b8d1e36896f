"""Lab 09's cost model, swept: what tensor parallelism should buy, shape by shape, link by link.

The cost model (`lablib.mechanisms.parallel`) prices one decode step under TP=t: each GPU reads
1/t of the weights and its share of the KV cache, then waits for 2 x layers all-reduces of
batch x hidden bf16 activations over the link. This module runs it over the shapes the lab
talks about (the synthetic Llama-3.1-8B and -70B, Qwen2.5-72B) and the links (NVLink 4, PCIe
Gen5 and Gen4), says where communication dominates, and compares TP=2 with PP=2 and with a
second replica (`lablib.mechanisms.pipeline`). Every row it returns from the model says so in
its "provenance" (SIMULATED).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from ... import validate
from ...hardware.fit import SCHEME_BYTES
from ...mechanisms import parallel as tp
from ...mechanisms.pipeline import compare_two_gpus
from ...models.architecture import architectures, parameter_count

SIMULATED = ("simulated on this machine (lablib.mechanisms.parallel and .pipeline, spec-sheet peaks): a model, "
             "not a measurement")
LINKS = (tp.NVLINK4, tp.PCIE_GEN5_X16, tp.PCIE_GEN4_X16)
TPS = (1, 2, 4, 8)
BATCHES = (1, 8, 64, 256)


def link_rows() -> list[dict[str, Any]]:
    """The links the model prices (spec-sheet bandwidth; latency per collective an assumption), and HBM beside."""
    return [{"link": link.name, "GB/s per direction": link.bandwidth / 1e9, "latency per collective (us)":
             link.latency_s * 1e6, "latency source": "assumed (measure it, then replace)" if link.latency_s else "-"}
            for link in (*LINKS, tp.H200_HBM3E)]


def lookup(rows: list[dict[str, Any]], key: str, **match: Any) -> Any:
    """row[key] of the one row matching every `match` (ValueError when none or several do)."""
    got = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if len(got) != 1:
        raise ValueError(f"lookup: {len(got)} rows match {match}; pass rows that hold exactly one.")
    return got[0][key]


def pcie_share_above_nvlink(rows: list[dict[str, Any]]) -> bool:
    """Whether, at every model, t > 1 and batch in the rows, both PCIe links spend a larger share of the step on
    all-reduces than NVLink 4 (the common warning that the all-reduces "must go over NVLink", as the
    model states it)."""
    keys = {(r["model"], r["t"], r["batch"]) for r in rows if r["t"] > 1}
    share = {(r["model"], r["t"], r["batch"], r["link"]): r["communication_share"] for r in rows}
    return bool(keys) and all(share[k + (pcie.name,)] > share[k + (tp.NVLINK4.name,)]
                              for k in keys for pcie in (tp.PCIE_GEN4_X16, tp.PCIE_GEN5_X16))


def overhead_effect(overhead_s: float, model: str = "llama-3.1-8b", batch: int = 1,
                    link: tp.Link = tp.NVLINK4) -> list[dict[str, Any]]:
    """Speedup and efficiency against t with no fixed per-step cost and with `overhead_s` (which TP cannot split)."""
    bare, paid = (cost_rows((model,), batches=(batch,), links=(link,), overhead_s=o) for o in (0.0, overhead_s))
    return [{"t": a["t"], "latency_ms": a["latency_s"] * 1e3, "speedup": a["speedup"],
             f"latency_ms with {overhead_s * 1e3:.2f} ms overhead": b["latency_s"] * 1e3,
             "speedup with overhead": b["speedup"], "efficiency with overhead": b["efficiency"],
             "provenance": SIMULATED} for a, b in zip(bare, paid)]


def model_shape(model: str, scheme: str = "bf16", kv_bytes: int = 2) -> tp.DenseShape:
    """The cost model's shape of a shipped architecture under a weight scheme, as tp_fit_table counts it:
    linear layers at the scheme's bytes, embeddings and LM head at 2 (one average byte count per weight)."""
    archs = architectures()
    validate.choice("model_shape", "model", model, tuple(archs))
    validate.choice("model_shape", "scheme", scheme, tuple(SCHEME_BYTES))
    cfg = archs[model]
    total = parameter_count(cfg)
    embed = cfg["vocab_size"] * cfg["hidden_size"] * (1 if cfg.get("tie_word_embeddings") else 2)
    average = ((total - embed) * SCHEME_BYTES[scheme] + embed * 2) / total
    return tp.DenseShape.from_config(cfg, weight_bytes=average, kv_bytes=kv_bytes)


def cost_rows(models: tuple[str, ...] = ("llama-3.1-8b", "llama-3.1-70b"), scheme: str = "bf16",
              tps: tuple[int, ...] = TPS, batches: tuple[int, ...] = BATCHES, links: tuple[tp.Link, ...] = LINKS,
              context: int = 1024, gpu: tp.Gpu = tp.H200, overhead_s: float = 0.0) -> list[dict[str, Any]]:
    """`tp_sweep` for each model and link: every part of the step's time, latency, throughput, speedup, fits."""
    gpu = dataclasses.replace(gpu, overhead_s=overhead_s)
    return [{"model": m, "scheme": scheme, **row, "provenance": SIMULATED}
            for m in models for link in links
            for row in tp.tp_sweep(model_shape(m, scheme), tps, batches, context, gpu, link)]


def dominance_rows(model: str = "llama-3.1-8b", scheme: str = "bf16", tps: tuple[int, ...] = (2, 4, 8),
                   links: tuple[tp.Link, ...] = LINKS, context: int = 1024, max_batch: int = 1024,
                   gpu: tp.Gpu = tp.H200) -> list[dict[str, Any]]:
    """Per link and t: the all-reduces' share of the step at batch 1 and 64, and the smallest batch (powers of
    two up to max_batch, only those whose KV fits at that t) where they take half the step or more ("never")."""
    shape = model_shape(model, scheme)
    batches = [2**k for k in range(int(math.log2(max_batch)) + 1)]
    rows = []
    for link in links:
        for t in tps:
            fits = [b for b in batches if tp.memory_fit(shape, b, context, t, gpu).fits]
            share = {b: tp.decode_step(shape, b, context, t, gpu, link).communication_share for b in fits}
            rows.append({"model": model, "link": link.name, "t": t, "share_batch_1": share.get(1),
                         "share_batch_64": share.get(64), "largest_batch_that_fits": max(fits, default=None),
                         "dominates_from_batch": next((b for b in fits if share[b] >= 0.5), "never"),
                         "provenance": SIMULATED})
    return rows


def two_gpu_rows(model: str = "llama-3.1-8b", batches: tuple[int, ...] = (1, 64), scheme: str = "bf16",
                 context: int = 1024, link: tp.Link = tp.NVLINK4) -> list[dict[str, Any]]:
    """TP=2 vs PP=2 vs two TP=1 replicas (`compare_two_gpus`) at each batch: a model, labelled as one."""
    return [{"model": model, "batch": b, **row, "provenance": SIMULATED}
            for b in batches for row in compare_two_gpus(model_shape(model, scheme), b, context, tp.H200, link)]


def headline(rows: list[dict[str, Any]], fits: list[dict[str, Any]]) -> list[str]:
    """What the lab's figures say, in sentences with their numbers (all from the cost model's rows)."""
    m = "llama-3.1-8b"
    sp = {link.name: lookup(rows, "speedup", model=m, t=2, batch=1, link=link.name) for link in LINKS}
    share8 = {link.name: lookup(rows, "communication_share", model=m, t=8, batch=1, link=link.name) for link in LINKS}
    big = next(r for r in fits if (r["model"], r["scheme"]) == ("llama-3.1-70b", "bf16"))
    fp8 = next(r for r in fits if (r["model"], r["scheme"]) == ("llama-3.1-70b", "fp8"))
    return [(f"{m}, batch 1: TP=2 is {sp['NVLink 4']:.2f}x faster per token over NVLink 4, "
             f"{sp['PCIe Gen5 x16']:.2f}x over PCIe Gen5, {sp['PCIe Gen4 x16']:.2f}x over PCIe Gen4 (2x is the ideal)"),
            (f"{m}, batch 1, TP=8: all-reduces take {share8['NVLink 4']:.0%} of the step over NVLink 4, "
             f"{share8['PCIe Gen4 x16']:.0%} over PCIe Gen4"),
            (f"llama-3.1-70b needs {big['H200']} H200s in bf16, {fp8['H200']} in FP8 ({big['weights_GB']:.0f} GB and "
             f"{fp8['weights_GB']:.0f} GB of weights)"),
            f"[{SIMULATED}]"]


def calibrated_overhead(points: list[dict[str, Any]]) -> float:
    """Seconds per step the model misses at batch 1: the recorded TPOT less the prediction (kernel efficiency
    and fixed per-step cost together, a calibration on a recording, not a part the model derives)."""
    one = next(p for p in points if p["batch"] == 1)
    return max(0.0, (one["tpot_ms"] - one["predicted_ms"]) / 1e3)
