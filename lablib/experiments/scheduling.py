"""Lab 04's experiments: vLLM against HF static batching on the journey, and vLLM's scheduler knobs.

`journey_comparison` runs the whole journey through HF static batching (one batch of 64) and
through vLLM, on the embedded model when this machine can run vLLM, else shows the H200's
recording of the same pair on the 8B-shaped synthetic model.

The knobs (`max_num_seqs`, `max_num_batched_tokens`) are fixed when an engine starts, so each
point is one engine, started in its own worker and closed before the next; each row carries KV
capacity, throughput, tail TTFT and whether the GPU returned to its baseline.
"""
from __future__ import annotations

from typing import Any

from ..config import BenchConfig, HFConfig, lab_id, VLLMConfig
from ..models import ModelSpec
from ..results.record import Result
from ..results.store import ResultStore
from ..results.reference import load_reference, recorded_rows
from ..session import Shown, asked_rows, live_label, live_or_recorded
from .sweeps import config_sweep


def scheduler_sweep(max_num_seqs: list[int] = (8, 32, 128, 256), max_num_batched_tokens: list[int | None] = (None,),
                    model: str | ModelSpec = "embedded", workload: str = "journey", store: ResultStore | None = None,
                    lab: str = lab_id("04"), **engine: Any) -> tuple[list[dict[str, Any]], list[Result]]:
    """vLLM's scheduler knobs: one engine per (max_num_seqs, max_num_batched_tokens) pair."""
    configs = [VLLMConfig(max_num_seqs=n, max_num_batched_tokens=b, **engine)
               for n in max_num_seqs for b in max_num_batched_tokens]
    return config_sweep(configs, model, workload,
                        lambda c: f"vllm-seqs{c.max_num_seqs}-tok{c.max_num_batched_tokens}", store, lab)


def scheduler_rows(max_num_seqs: list[int] = (8, 64), max_num_batched_tokens: list[int | None] = (None,),
                   force: bool | None = None, **kw: Any) -> Shown[list[dict[str, Any]]]:
    """Live scheduler-sweep rows on a GPU with vLLM; otherwise the synthetic-8B sweep recorded on the H200."""
    [VLLMConfig(max_num_seqs=n, max_num_batched_tokens=b) for n in max_num_seqs for b in max_num_batched_tokens]  # refuse first
    model = kw.get("model", "embedded")
    return live_or_recorded(lambda: [{**r, "provenance": live_label()} for r in
                                     scheduler_sweep(list(max_num_seqs), list(max_num_batched_tokens), **kw)[0]],
                            lambda: asked_rows(recorded_rows("scheduler_sweep", "knobs"), _pair,
                                               [(n, b) for n in max_num_seqs for b in max_num_batched_tokens]),
                            force=force,
                            asked={"(max_num_seqs, max_num_batched_tokens)":
                                   [[n, b] for n in max_num_seqs for b in max_num_batched_tokens],
                                   "model": model if isinstance(model, str) else model.name},
                            recorded_with=lambda rows: {"(max_num_seqs, max_num_batched_tokens)":
                                                        [[r["max_num_seqs"], r["max_num_batched_tokens"]] for r in rows],
                                                        "model": rows[0]["model"]})


def _pair(row: dict[str, Any]) -> tuple[Any, Any]:
    return row["max_num_seqs"], row["max_num_batched_tokens"]


def more_seqs_help(rows: list[dict[str, Any]]) -> bool:
    """The knob sweep's claim: the most running sequences beat the fewest on throughput and on p99 TTFT."""
    few, many = min(rows, key=lambda r: r["max_num_seqs"]), max(rows, key=lambda r: r["max_num_seqs"])
    return many["output_tok_s"] > few["output_tok_s"] and many["ttft_p99_s"] < few["ttft_p99_s"]


def pair(hf: Result, vllm: Result) -> dict[str, Any]:
    """The two journey runs and vLLM's output tok/s over HF static batching's."""
    return {"hf": hf, "vllm": vllm, "hf_tok_s": hf.summary["output_tok_s"], "vllm_tok_s": vllm.summary["output_tok_s"],
            "ratio": vllm.summary["output_tok_s"] / hf.summary["output_tok_s"], "model": vllm.model.get("name")}


def journey_comparison(workload: str = "journey", *, gpu_memory_utilization: float = 0.3, hf_batch: int = 64,
                       store: ResultStore | None = None, lab: str = lab_id("04"),
                       force: bool | None = None) -> Shown[dict[str, Any]]:
    """HF static batching (one batch of `hf_batch`) against vLLM on the whole journey, same requests, same model.

    Live (a GPU with vLLM): both on the embedded model, full output lengths, steps
    'vllm-embedded-journey' and 'hf-static-b64-embedded-journey' (the names the packing script
    collects). Recorded: 'vllm-8b-journey' and 'hf-static-b64-8b-journey' from the H200, on the
    8B-shaped synthetic model. The value: {"hf", "vllm" (Results), "hf_tok_s", "vllm_tok_s", "ratio", "model"}.
    """
    vllm_config, hf_config = VLLMConfig(gpu_memory_utilization=gpu_memory_utilization), HFConfig("static", hf_batch)

    def live() -> dict[str, Any]:
        from ..bench.offline import run
        from ..engines.hf import HFEngine
        from ..engines.vllm import VLLMEngine
        from ..workloads import load_workload

        wl, bench = load_workload(workload), BenchConfig(progress=False)
        with VLLMEngine("embedded", vllm_config) as eng:
            vllm = run(eng, wl, bench, lab=lab, step=f"vllm-embedded-{workload}", store=store)
        hf_engine = HFEngine("embedded", hf_config)
        try:
            hf = run(hf_engine, wl, bench, lab=lab, step=f"hf-static-b{hf_batch}-embedded-{workload}", store=store)
        finally:
            hf_engine.close()
        return pair(hf, vllm)

    def recorded() -> dict[str, Any]:
        vllm, hf = load_reference("vllm-8b-journey", "hf-static-b64-8b-journey")
        return pair(hf, vllm)

    return live_or_recorded(live, recorded, force=force,
                            asked={"model": "embedded", "workload": workload, "hf_batch": hf_batch,
                                   "gpu_memory_utilization": gpu_memory_utilization},
                            recorded_with=lambda v: {"model": v["model"], "workload": v["vllm"].workload["name"],
                                                     "hf_batch": v["hf"].config["batch_size"],
                                                     "gpu_memory_utilization": v["vllm"].config["gpu_memory_utilization"]})
