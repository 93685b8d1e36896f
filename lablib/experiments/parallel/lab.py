"""Lab 09 as one object: each step of the notebook is one method, and what it made stays on the object.

A notebook cell calls one step (`lab.cost_model(...)`, `lab.fit()`, `lab.tp1_baseline()`): the step runs the module
that owns it (the cost model, the fit, the runs on vLLM), keeps the value (`lab.rows`, `lab.fits`, `lab.tp1`, ...),
prints its sentences and returns what the cell shows. The figures (`lablib.plots.parallel`) read those values, and
the Checks cell takes the whole object (`checks.checks(lab)`), so no cell passes the others' variables around.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ...config import VLLMConfig, lab_id
from ...results.store import ResultStore
from ...session import frame, LabSteps, Shown
from . import fit, grid, model, nodes, study

COST_COLUMNS = ["link", "batch", "t", "latency_s", "throughput_tok_s", "speedup", "efficiency", "communication_share",
                "dominant"]
TWO_GPU_COLUMNS = ["plan", "batch", "sequences_in_flight", "latency_s", "throughput_tok_s", "throughput_vs_one_gpu",
                   "fits", "label"]
TP1_COLUMNS = ["model", "scheme", "batch", "status", "tpot_ms", "decode_tok_s", "predicted_ms",
               "measured_over_predicted", "ttft_ms", "peak_memory_GiB", "weights"]
SCALING_COLUMNS = ["model", "scheme", "run", "t", "pp", "all_reduce", "batch", "status", "tpot_ms", "decode_tok_s",
                   "ttft_ms", "peak_memory_GiB", "predicted_ms"]



class ParallelLab(LabSteps):
    """Lab 09's cost model, fits and measurements, one attribute per step, filled in as the notebook runs them (None
    until then)."""

    STEPS = {"rows": "cost_model", "fits": "fit", "advice": "advise", "tp1": "tp1_baseline", "scaling": "tp_scaling",
             "too_big": "refusal"}
    OPTIONAL = frozenset({"too_big"})

    def __init__(self, store: ResultStore | None = None) -> None:
        self.store = store if store is not None else ResultStore.for_lab(lab_id("09"))  # every live vLLM run
        self.rows: list[dict[str, Any]] | None = None  # `cost_model`: one decode step priced per model, link, t, batch
        self.points: Shown | None = None  # `overhead`: the 8B at TP=1 on the H200, recorded for labs 01-03
        self.overhead_s: float | None = None  # `overhead`: the fixed cost per step the model does not see
        self.fits: list[dict[str, Any]] | None = None  # `fit`: the smallest t per shape, scheme and GPU
        self.shape = "llama-3.1-70b"  # `refusal`: the model the preflight is asked about
        self.too_big: VLLMConfig | None = None  # `refusal`: the configuration the preflight refuses
        self.advice: dict[str, Any] | None = None  # `advise`: the preflight on one GPU's memory, and the knobs
        self.tp1: Shown | None = None  # `tp1_baseline`: vLLM at TP=1, beside the model's prediction
        self.scaling: Shown | None = None  # `tp_scaling`: vLLM at TP=1/2/4 on one host

    def links(self) -> Any:
        """The links the model prices, and the H200's own memory (`model.link_rows`)."""
        return frame(model.link_rows())

    def cost_model(self, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                   models: tuple[str, ...] = ("llama-3.1-8b", "llama-3.1-70b")) -> list[dict[str, Any]]:
        """One decode step priced for each model in bf16, t = 1, 2, 4, 8, every link and batch (`model.cost_rows`)."""
        self.rows = model.cost_rows(models, batches=batches)
        return self.rows

    def cost_table(self, name: str = "llama-3.1-8b", batches: tuple[int, ...] = (1, 64)) -> Any:
        """The cost model's rows for one model at a few batches."""
        rows = [r for r in self.ran("rows") if r["model"] == name and r["batch"] in batches]
        return frame(rows)[COST_COLUMNS]

    def dominance(self, models: tuple[str, ...] = ("llama-3.1-8b", "llama-3.1-70b")) -> Any:
        """Per model, link and t, the smallest batch from which communication dominates (`model.dominance_rows`)."""
        return frame([r for name in models for r in model.dominance_rows(name)])

    def overhead(self) -> Any:
        """The recorded TP=1 step against the model's bound (`study.recorded_tp1_points`): prints the gap, returns
        TP's speedup at batch 1 with that gap charged per step (`model.overhead_effect`)."""
        self.points = points = study.recorded_tp1_points()
        self.overhead_s = model.calibrated_overhead(points.value)
        first = points.value[0]
        print(f"batch 1: {first['tpot_ms']:.2f} ms per token measured, {first['predicted_ms']:.2f} ms the model's "
              f"bound: {self.overhead_s * 1e3:.2f} ms a step the model does not see  [{points.label}]")
        return frame(model.overhead_effect(self.overhead_s))

    def fit(self) -> list[dict[str, Any]]:
        """The smallest t per shape, scheme and GPU at one 8,192-token sequence (`fit.fit_rows`)."""
        self.fits = fit.fit_rows()
        return self.fits

    def fit_table(self) -> Any:
        """`fit`'s rows as a table."""
        return frame(self.ran("fits"))

    def refusal(self, name: str = "llama-3.1-70b", **config: Any) -> None:
        """What `VLLMEngine`'s preflight answers on this machine for `name` with `VLLMConfig(**config)`
        (`fit.engine_refusal`)."""
        self.shape, self.too_big = name, VLLMConfig(**config)
        print(fit.engine_refusal(self.shape, self.too_big))

    def advise(self, gpu: str = "H200") -> None:
        """The same preflight on one `gpu`'s memory, and the knobs that make it fit (`fit.fit_advice`)."""
        self.advice = fit.fit_advice(self.shape, self.ran("too_big"), gpu)
        print("check_fit says:", self.advice["check_fit_advice"])
        print("the lab says:  ", self.advice["advice"])

    def try_knobs(self, gpu: str = "H200", **knobs: Any) -> None:
        """The refused configuration with `knobs` changed, through the same preflight (`fit.fit_advice`)."""
        config = dataclasses.replace(self.ran("too_big"), **knobs)
        print(fit.fit_advice(self.shape, config, gpu)["advice"])

    def refusals(self, name: str = "llama-3.1-70b") -> Any:
        """Bad inputs, refused before any engine starts (`study.refusals`)."""
        return frame(study.refusals(name))

    def two_gpus(self, name: str = "llama-3.1-8b") -> list[dict[str, Any]]:
        """TP=2, PP=2 and two replicas priced by the cost model (`model.two_gpu_rows`)."""
        return model.two_gpu_rows(name)

    def two_gpu_table(self, name: str = "llama-3.1-70b") -> Any:
        """`two_gpus`' rows as a table."""
        return frame(model.two_gpu_rows(name))[TWO_GPU_COLUMNS]

    def tp1_baseline(self) -> Any:
        """vLLM at TP=1 on the synthetic checkpoints, live or recorded (`study.tp1_baseline`)."""
        self.tp1 = study.tp1_baseline(store=self.store)
        return self.tp1.table(TP1_COLUMNS)

    def predictions(self) -> list[dict[str, Any]]:
        """The cost model's TP=1 prediction on the GPU each run used (`study.prediction_rows`)."""
        return study.prediction_rows()

    def tp_scaling(self, quick: bool = True) -> Any:
        """vLLM at TP=1/2/4 on one host (`study.tp_scaling`): live the quick grid (the 8B at TP=1 and 2), recorded the
        whole grid."""
        self.scaling = study.tp_scaling(store=self.store, quick=quick)
        return self.scaling.table(SCALING_COLUMNS)

    def remaining_runs(self) -> Any:
        """The planned GPU runs and what is recorded of them yet (`grid.remaining_runs`)."""
        return frame(grid.remaining_runs())

    def nodes(self) -> Any:
        """Where each multi-node path starts to pay (`nodes.multi_node_paths`), after its line."""
        fits = self.ran("fits")
        print(nodes.nodes_line(fits))
        return frame(nodes.multi_node_paths(fits))

    def summary(self) -> None:
        """The cost model's headline numbers, one line each (`model.headline`)."""
        print("\n".join(model.headline(self.ran("rows"), self.ran("fits"))))
