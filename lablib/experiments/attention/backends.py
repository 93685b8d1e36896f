"""Lab 02's attention backends in vLLM: one engine per `attention_backend`, the journey run on each.

vLLM picks an attention kernel per model (FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION) and takes
`LLM(attention_backend=...)` to force one. `vllm_backend_sweep` starts an engine per backend through a factory
that receives that backend's `LLM(...)` kwargs (`backend_llm_kwargs`), runs the workload through the lab's
timing protocol, and keeps the backend the engine reports running. vLLM refuses a backend that cannot take
the model's head size at start-up; the sweep keeps vLLM's words as the row's reason and goes on. `wired` says
whether `VLLMConfig` carries the field, so that `VLLMEngine` passes it (`experiments.attention.vllm_backends`
says "not wired" until it does).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ... import validate
from ...bench.offline import run
from ...config import BenchConfig, lab_id, VLLMConfig
from ...engines.vllm import VLLMEngine
from ...results.store import ResultStore
from ...workloads import Workload, load_workload

VLLM_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
NOT_WIRED = ("vLLM attention backends: not wired yet (VLLMConfig has no attention_backend field, so VLLMEngine cannot "
             "pass LLM(attention_backend=...); experiments.attention.vllm_backend_sweep takes the kwargs)")


def backend_llm_kwargs(backend: str, base: VLLMConfig = VLLMConfig()) -> dict[str, Any]:
    """The `vllm.LLM(...)` keyword arguments of `base` with `attention_backend=backend`."""
    validate.choice("backend_llm_kwargs", "backend", backend, VLLM_BACKENDS)
    return base.llm_kwargs() | {"attention_backend": backend}


def vllm_backend_sweep(start_engine: Callable[[str, dict[str, Any]], Any], backends: Sequence[str] = VLLM_BACKENDS, *,
                       workload: str | Workload = "journey", base: VLLMConfig = VLLMConfig(),
                       bench: BenchConfig = BenchConfig(progress=False), store: ResultStore | None = None,
                       lab: str = lab_id("02")) -> tuple[list[dict[str, Any]], list[Any]]:
    """One engine per backend, made by `start_engine(backend, backend_llm_kwargs(backend, base))`, the workload run.

    Each row: the backend asked for, the one the engine reported running (vLLM's log line, engine.facts
    "attention_backend"), output tok/s, TTFT and TPOT medians, start-up time; a backend vLLM refuses (a head
    size it cannot take, a missing package) is status 'failed' with the error's first line, and the sweep
    goes on. Returns (rows, Results).
    """
    kwargs = [backend_llm_kwargs(b, base) for b in backends]  # refuse an unknown name before any engine starts
    wl, rows, results = (workload if isinstance(workload, Workload) else load_workload(workload)), [], []
    for b, kw in zip(backends, kwargs):
        row: dict[str, Any] = {"backend": b, "status": "ok", "ran": None, "output_tok_s": None, "ttft_p50_s": None,
                               "tpot_p50_s": None, "startup_s": None, "reason": None}
        eng = None
        try:
            eng = start_engine(b, kw)
            r = run(eng, wl, bench, lab=lab, step=f"vllm-attn-{b.lower()}", store=store)
            results.append(r)
            row |= {"ran": eng.facts.get("attention_backend"), "output_tok_s": r.summary["output_tok_s"],
                    "ttft_p50_s": r.summary["ttft_s"]["p50"], "tpot_p50_s": r.summary["tpot_s"]["p50"],
                    "startup_s": eng.facts.get("startup_s")}
        except Exception as e:
            row |= {"status": "failed", "reason": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
        finally:
            if eng is not None:
                eng.close()
        rows.append(row)
    return rows, results


def wired() -> bool:
    """Whether VLLMConfig has an attention_backend field (then VLLMEngine passes it to vllm.LLM)."""
    return "attention_backend" in {f.name for f in dataclasses.fields(VLLMConfig)}


def vllm_sweep_live(model: str = "embedded", store: ResultStore | None = None) -> tuple[list[dict], list[Any]]:
    cfg = VLLMConfig(gpu_memory_utilization=0.3)
    return vllm_backend_sweep(lambda b, kw: VLLMEngine(model, dataclasses.replace(cfg, attention_backend=b)),
                              base=cfg, store=store)
