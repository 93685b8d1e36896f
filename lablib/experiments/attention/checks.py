"""Lab 02's Checks cell, on what the lab's object (`lab.AttentionLab`) made: the IO model's slopes and the CPU's
kernels and HF prefill asserted on this run, the GPU's claims when measured live (each `Checks.live`, skipped where
the cell shows a recording)."""
from __future__ import annotations

from typing import Any

from ...config import lab_id
from ...session import Checks
from .findings import (
    all_correct,
    decode_bandwidth_grows,
    describe_here,
    flash_memory_small,
    kernels_ran,
    same_next_token,
    sdpa_beats_eager,
    tiled_beat_naive,
)
from .study import agreement_line


def checks(lab: Any) -> None:
    """Lab 02's Checks cell: reads the prediction's summary, the kernels here, HF prefill here, the GPU sweep, HF
    prefill on the GPU, vLLM's backends and the journey rung. Prints what ran and what did not (and returns nothing,
    so the cell shows it once)."""
    lab.require_all()
    summary, here, hf_here, gpu, hf_gpu = lab.summary, lab.here, lab.hf_here, lab.gpu, lab.hf_gpu
    backends, rung, s = lab.backends, lab.rung, lab.summary["slopes"]
    c = Checks(lab_id("02"))
    c.that("every kernel this CPU has matches the float64 reference", all_correct(here.value), describe_here(here))
    c.that("naive, SDPA MATH and FLASH, and flex all run on this CPU",
           kernels_ran(here.value) >= {"naive", "sdpa_math", "sdpa_flash", "flex"})
    c.that("IO model: naive and tiled HBM bytes both grow as N^2, tiled ~4x fewer at 64k",
           1.99 < s["naive_bytes"] < 2.01 and 1.95 < s["flash_bytes"] < 2.0 and summary["bytes_ratio_max"] > 3.9, s)
    c.that("IO model: extra memory grows as N^2 for naive (S and P), as N for tiled",
           (round(s["naive_extra_bytes"], 9), round(s["flash_extra_bytes"], 9)) == (2, 1), s)
    c.that("IO model: the predicted speedup grows with N inside the paper's 2-4x",
           summary["speedups"] == sorted(summary["speedups"]) and 2 < summary["speedups"][0]
           and summary["speedups"][-1] < 4, summary["speedups"])
    c.that("HF eager and sdpa pick the same next token at every prompt length here", same_next_token(hf_here.value))
    c.live(gpu, "every GPU kernel that ran matches the float64 reference", all_correct)
    c.live(gpu, "every tiled kernel beats naive wherever both ran at N >= 4096", tiled_beat_naive)
    c.live(gpu, "SDPA FLASH's extra memory is under a tenth of naive's S and P at its longest N", flash_memory_small)
    c.live(gpu, "decode bandwidth grows with the KV length", decode_bandwidth_grows)
    c.live(hf_gpu, "synthetic 8B: sdpa prefill beats eager at the longest prompt both ran", sdpa_beats_eager)
    c.live(backends, "every vLLM backend ran the journey or said why not",
           lambda rows: all(r["status"] == "ok" or r["reason"] for r in rows))
    c.that("in float32 the journey's sdpa rung keeps the eager rung's greedy tokens, every request",
           rung.value["float32"]["identical"] == rung.value["float32"]["of"], agreement_line(rung.value))
    c.done()
