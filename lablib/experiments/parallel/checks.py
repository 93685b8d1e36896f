"""Lab 09's Checks cell, on what the lab's object (`lab.ParallelLab`) made: the cost model's and the fit's claims
asserted on this run, vLLM's TP=1 and TP=2 claims when measured live (each `Checks.live`, skipped where the cell
shows a recording)."""
from __future__ import annotations

from typing import Any

from ...config import lab_id
from ...session import Checks
from .model import lookup, pcie_share_above_nvlink, two_gpu_rows
from .nodes import needs_several_nodes
from .study import batch_gain, tp_cuts_latency


def checks(lab: Any) -> None:
    """Lab 09's Checks cell: reads the cost rows, the fits, the refusal's advice, the TP=1 baseline and the TP scaling
    runs. Prints what ran and what did not (and returns nothing, so the cell shows it once)."""
    lab.require_all()
    rows, fits, advice, tp1, scaling = lab.rows, lab.fits, lab.advice, lab.tp1, lab.scaling
    c = Checks(lab_id("09"))
    c.that("TP=1 pays no communication",
           all(r["allreduce_bandwidth_s"] + r["allreduce_latency_s"] == 0 for r in rows if r["t"] == 1))
    c.that("PCIe (Gen4 and Gen5) spends a larger share of every TP>1 step on all-reduces than NVLink",
           pcie_share_above_nvlink(rows))
    c.that("TP=2 cuts the 8B batch-1 latency, more over NVLink than over PCIe Gen4, and by less than 2x",
           1 < lookup(rows, "speedup", model="llama-3.1-8b", t=2, batch=1, link="PCIe Gen4 x16")
           < lookup(rows, "speedup", model="llama-3.1-8b", t=2, batch=1, link="NVLink 4") < 2)
    c.that("llama-3.1-70b in bf16 needs 2 H200s, in FP8 one",
           lookup(fits, "H200", model="llama-3.1-70b", scheme="bf16") == 2
           and lookup(fits, "H200", model="llama-3.1-70b", scheme="fp8") == 1)
    c.that("the refusal names tensor_parallel_size=2 and quantization",
           advice["knobs"][:2] == ["tensor_parallel_size=2", "quantization='fp8'"], advice["advice"])
    c.that("a second replica doubles the 8B's TP=1 throughput exactly",
           lookup(two_gpu_rows("llama-3.1-8b", (1,)), "throughput_vs_one_gpu", plan="2 replicas (TP=1 each)") == 2.0)
    c.that("no shape here needs more than one node of 8 H200s; on T4s the 70B in bf16 does",
           needs_several_nodes(fits, "H200") == [] and "llama-3.1-70b bf16" in needs_several_nodes(fits, "T4"))
    c.live(tp1, "vLLM's TP=1 step is no faster than the model's bound",
           lambda rs: all(r["measured_over_predicted"] >= 1 for r in rs if r["status"] == "measured"))
    c.live(tp1, "batching pays at TP=1: the 8B decodes over 8x the tokens/s at batch 64 as at batch 1",
           lambda rs: (batch_gain(rs, "llama-3.1-8b", "bf16") or 0) > 8)
    c.live(scaling, "TP=2 cuts the 8B per-token latency at batch 1 below TP=1 on the same host",
           lambda rs: tp_cuts_latency(rs, "llama-3.1-8b", "bf16", 2))
    c.done()
