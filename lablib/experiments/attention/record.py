"""Lab 02's GPU recording step `attention` (scripts/record_reference.py calls it; the notebook never does).

What the lab's GPU cells show on a machine without one: the full microbenchmark, HF prefill per attention kernel on
the synthetic 8B shape at every length up to 32k (`HF_RECORD_LENS`), and vLLM's backends once they are wired; and
step `attention-sdpa` (`record_sdpa`): PyTorch's SDPA backends one by one, twice each, on the embedded model.
"""
from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import validate
from ...bench.attention import run_attention_bench
from ...models.synthetic import synthetic_spec
from ...results.store import ResultStore
from .backends import vllm_sweep_live, wired
from .sdpa_cost import sdpa_backends
from .study import BIG, HF_RECORD_LENS, KEY, RECORD_BENCH, hf_prefill


def record(out_dir: str | Path, store: ResultStore, facts: dict[str, Any],
           parts: Sequence[str] = ("bench", "hf", "vllm")) -> None:
    """Step `attention`: facts["attention"] = the full microbenchmark {rows, provenance} (RECORD_BENCH), then
    ["hf_prefill"] (synthetic 8B, HF_RECORD_LENS), then ["vllm_backends"] when wired (Results into `store`, recorded).

    Each part is written to out_dir/attention-<part>.json as it ends, so a part cut off by the session's time
    limit leaves the earlier ones. `parts` picks a subset (two GPU commands when one is too short)."""
    for part in parts:
        validate.choice("record", "parts", part, ("bench", "hf", "vllm"))
    out, got = Path(out_dir), facts.setdefault(KEY, {})
    if "bench" in parts:
        rows, prov = run_attention_bench(**RECORD_BENCH)
        got.update(rows=rows, provenance=prov)
        (out / "attention-bench.json").write_text(json.dumps({"rows": rows, "provenance": prov}, default=str))
    if "hf" in parts:
        got["hf_prefill"] = hf_prefill(synthetic_spec(BIG), prompt_lens=HF_RECORD_LENS, device="cuda")
        (out / "attention-hf.json").write_text(json.dumps(got["hf_prefill"], default=str))
    if "vllm" in parts and wired():
        rows, results = vllm_sweep_live()
        for r in results:
            store.append_recorded(r)
        got["vllm_backends"] = {"rows": rows, "provenance": {"device": results[0].hardware.get("gpu") if results else None,
                                                              "date": datetime.date.today().isoformat()}}
        (out / "attention-vllm.json").write_text(json.dumps(got["vllm_backends"], default=str))


def record_sdpa(out_dir: str | Path, store: ResultStore, facts: dict[str, Any]) -> None:
    """Step `attention-sdpa`: facts["attention"]["sdpa_backends"] = `sdpa_backends` on the embedded model (lab 10's
    sdpa rung's batch of 8, 32 tokens), every backend twice, with the device and date; also attention-sdpa.json."""
    shown = sdpa_backends()
    got = {**shown.value, "provenance": {"label": shown.label, "date": datetime.date.today().isoformat()}}
    facts.setdefault(KEY, {})["sdpa_backends"] = got
    (Path(out_dir) / "attention-sdpa.json").write_text(json.dumps(got, default=str))
