"""Lab 04's experiment: vLLM's scheduler knobs (`max_num_seqs`, `max_num_batched_tokens`), one engine per setting.

Both are fixed when an engine starts, so each point is one engine, started in its own worker
and closed before the next; each row carries KV capacity, throughput, tail TTFT and whether
the GPU returned to its baseline.
"""
from __future__ import annotations

from typing import Any

from ..config import VLLMConfig
from ..models import ModelSpec
from ..results.record import Result
from ..results.store import ResultStore
from ..results.reference import recorded_rows
from ..session import Shown, live_or_recorded
from .sweeps import config_sweep


def scheduler_sweep(max_num_seqs: list[int] = (8, 32, 128, 256), max_num_batched_tokens: list[int | None] = (None,),
                    model: str | ModelSpec = "embedded", workload: str = "journey", store: ResultStore | None = None,
                    lab: str = "04_continuous_batching", **engine: Any) -> tuple[list[dict[str, Any]], list[Result]]:
    """vLLM's scheduler knobs: one engine per (max_num_seqs, max_num_batched_tokens) pair."""
    configs = [VLLMConfig(max_num_seqs=n, max_num_batched_tokens=b, **engine)
               for n in max_num_seqs for b in max_num_batched_tokens]
    return config_sweep(configs, model, workload,
                        lambda c: f"vllm-seqs{c.max_num_seqs}-tok{c.max_num_batched_tokens}", store, lab)


def scheduler_rows(max_num_seqs: list[int] = (8, 64), max_num_batched_tokens: list[int | None] = (None,),
                   force: bool | None = None, **kw: Any) -> Shown[list[dict[str, Any]]]:
    """Live scheduler-sweep rows on a GPU with vLLM; otherwise the synthetic-8B sweep recorded on the H200."""
    [VLLMConfig(max_num_seqs=n, max_num_batched_tokens=b) for n in max_num_seqs for b in max_num_batched_tokens]  # refuse first
    return live_or_recorded(lambda: scheduler_sweep(list(max_num_seqs), list(max_num_batched_tokens), **kw)[0],
                            lambda: recorded_rows("scheduler_sweep", "knobs"), force=force)
