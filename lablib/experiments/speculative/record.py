"""Lab 08's GPU recording steps (scripts/record_reference.py calls them; the notebook never does).

`record` is step `speculative`: every setting of `vllm_runs.RECORD_GRID` at every batch, the loop's acceptance on
the same prompts and the cross-check (a live `gpu_study` on that grid is kept as this same recording). `record_8b` is
step `speculative-8b`: the synthetic 8B pair at the loop's acceptance length (after `speculative`, whose loop sets it).
`record_eagle_8b` is step `speculative-eagle-8b-<part>`: one part of the EAGLE head's grid on the synthetic 8B.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...hardware.device import device_facts
from ...results.store import ResultStore
from .eagle_8b import KEY as KEY_EAGLE, eagle_runs
from .synthetic import KEY as KEY_8B, measure_8b
from .vllm_runs import METHODS, STEP, as_facts, measure_grid


def record(out_dir: Path, store: ResultStore, facts: dict[str, Any], *, batches: Sequence[int] = (1, 4, 16, 64),
           ks: Sequence[int] = (2, 4), methods: Sequence[str] = METHODS, prompt_lookup: tuple[int, int] = (2, 5),
           n_prompts: int = 64, max_new_tokens: int = 64) -> None:
    """Step `speculative`: 2 baselines + 3 methods x 2 k = 8 engine starts with the defaults, each serving the 4
    batch sizes, the loop's acceptance on the same 64 prompts x 64 tokens on the machine's CPU, the cross-check.
    Results go into `store` marked recorded; facts["speculative"] holds the rows, the loop, the cross-check,
    the GPU and the date; out_dir/speculative.json a copy."""
    got = measure_grid(batches, ks, methods, prompt_lookup, n_prompts, max_new_tokens, None)
    for r in got["results"]:
        store.append_recorded(r)
    facts[STEP] = as_facts(got)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "speculative.json").write_text(json.dumps(facts[STEP], indent=1, default=str))


def record_8b(out_dir: Path, store: ResultStore, facts: dict[str, Any], *, k: int = 4,
              batches: Sequence[int] = (1, 4, 16, 64), n_prompts: int = 64, max_new_tokens: int = 128) -> None:
    """Step `speculative-8b` (after `speculative`, whose loop sets L; else the loop runs here)."""
    got = measure_8b(k, batches, n_prompts, max_new_tokens, None, facts)
    for r in got.pop("results"):
        store.append_recorded(r)
    got.update({"gpu": device_facts().get("gpu"), "date": time.strftime("%Y-%m-%d")})
    facts[KEY_8B] = got
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "speculative-8b.json").write_text(json.dumps(got, indent=1, default=str))


def record_eagle_8b(out_dir: Path, store: ResultStore, facts: dict[str, Any], *, part: str, **knobs: Any) -> None:
    """Step `speculative-eagle-8b-<part>` (`eagle_8b.PARTS`): facts[f"speculative-eagle-8b-{part}"] = the part's
    `eagle_runs` with the GPU and the date; its Results recorded."""
    got = eagle_runs(part, **knobs)
    for r in got["rows"]:
        store.append_recorded(r.pop("result"))
    got.update({"gpu": device_facts().get("gpu"), "date": time.strftime("%Y-%m-%d")})
    facts[f"{KEY_EAGLE}-{part}"] = got
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"{KEY_EAGLE}-{part}.json").write_text(json.dumps(got, indent=1, default=str))
