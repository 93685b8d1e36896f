"""Lab 02 as one object: each step of the notebook is one method, and what it measured stays on the object.

A notebook cell calls one step (`lab.predict()`, `lab.kernels_here()`, `lab.kernel_sweep()`): the step runs the
module that owns it (the IO model's prediction in `findings`, the measurements in `study`), keeps the value
(`lab.pred`, `lab.here`, `lab.gpu`, ...), prints its sentences and returns what the cell shows. The figures
(`lablib.plots.attention`) read those values, and the Checks cell takes the whole object (`checks.checks(lab)`), so
no cell passes the others' variables around.
"""
from __future__ import annotations

from typing import Any

from ...session import LabSteps, Shown
from . import findings, study

HERE_COLUMNS = ["kernel", "N", "batch", "status", "median_ms", "max_abs_err", "within_tol"]
SWEEP_COLUMNS = ["kernel", "N", "head_dim", "batch", "status", "median_ms", "tflops", "pct_of_peak", "extra_mem_bytes",
                 "within_tol"]
HF_COLUMNS = ["impl", "prompt_tokens", "status", "median_ms", "max_abs_logit_diff", "same_next_token"]
BACKEND_COLUMNS = ["backend", "ran", "status", "output_tok_s", "ttft_p50_s", "tpot_p50_s", "reason"]


class AttentionLab(LabSteps):
    """Lab 02's prediction and measurements, one attribute per step, filled in as the notebook runs them (None until
    then)."""

    STEPS = {"summary": "predict", "here": "kernels_here", "gpu": "kernel_sweep", "hf_here": "hf_prefill_here",
             "hf_gpu": "hf_prefill_gpu", "backends": "vllm_backends", "rung": "journey_rung"}

    def __init__(self) -> None:
        self.pred: list[dict[str, Any]] | None = None  # `predict`: the IO model's bytes and times per N
        self.summary: dict[str, Any] | None = None  # `predict`: its slopes, bytes ratio and speedups
        self.here: Shown | None = None  # `kernels_here`: every kernel on this machine's CPU, checked
        self.gpu: Shown | None = None  # `kernel_sweep`: the GPU sweep, prefill and decode
        self.hf_here: Shown | None = None  # `hf_prefill_here`: HF prefill per attn_implementation, on this CPU
        self.hf_gpu: Shown | None = None  # `hf_prefill_gpu`: the same on the synthetic 8B, on a GPU
        self.backends: Shown | None = None  # `vllm_backends`: the journey once per vLLM attention backend
        self.rung: Shown | None = None  # `journey_rung`: lab 01's largest static batch with sdpa against eager

    def predict(self) -> list[dict[str, Any]]:
        """The IO model's prediction per sequence length (`findings.prediction`) and its summary."""
        self.pred = findings.prediction()
        self.summary = findings.prediction_summary(self.pred)
        return self.pred

    def prediction_summary(self) -> None:
        """What the prediction says, in sentences (`findings.describe_prediction`)."""
        print(findings.describe_prediction(self.ran("summary")))

    def kernels_here(self) -> Any:
        """Every attention kernel on this machine's CPU, checked against float64 (`study.kernels_here`): prints what
        ran, returns the prefill table."""
        self.here = study.kernels_here()
        print(findings.describe_here(self.here))
        return findings.table(self.here, "prefill", HERE_COLUMNS)

    def kernel_sweep(self) -> Shown:
        """The GPU sweep, live on a GPU, else the H200's recording (`study.kernel_sweep`)."""
        self.gpu = study.kernel_sweep()
        return self.gpu

    def sweep_table(self) -> Any:
        """The GPU sweep's prefill rows."""
        return findings.table(self.ran("gpu"), "prefill", SWEEP_COLUMNS)

    def speedups(self) -> Any:
        """Each kernel's speedup over naive beside the IO model's (`findings.speedup_table`)."""
        return findings.speedup_table(self.ran("gpu"))

    def hf_prefill_here(self) -> Shown:
        """HF prefill per attn_implementation on the embedded model, on this CPU (`study.hf_prefill_here`)."""
        self.hf_here = study.hf_prefill_here()
        return self.hf_here

    def hf_table(self) -> Any:
        """`hf_prefill_here`'s rows."""
        return findings.table(self.ran("hf_here"), "hf", HF_COLUMNS)

    def hf_prefill_gpu(self) -> Shown:
        """HF prefill on the synthetic 8B, live on a GPU, else recorded (`study.hf_prefill_gpu`)."""
        self.hf_gpu = study.hf_prefill_gpu()
        return self.hf_gpu

    def vllm_backends(self) -> Any:
        """The journey once per vLLM attention backend, live on a GPU, else recorded (`study.vllm_backends`)."""
        self.backends = study.vllm_backends()
        return self.backends.table(BACKEND_COLUMNS)

    def journey_rung(self, requests: int = 16, batch: int = 16, max_new_tokens: int = 32) -> Any:
        """Lab 01's largest static batch with sdpa against eager, live here (`study.journey_rung`): prints what the
        tokens say, returns the table."""
        self.rung = study.journey_rung(requests=requests, batch=batch, max_new_tokens=max_new_tokens)
        print(study.journey_rung_lines(self.rung))
        return findings.table(self.rung, "rung")

    def observations(self) -> None:
        """This run's numbers, each with where it was measured (`findings.observations`)."""
        print(findings.observations(self.ran("summary"), self.ran("here"), self.ran("hf_here"), self.ran("gpu"),
                                    self.ran("hf_gpu")))
