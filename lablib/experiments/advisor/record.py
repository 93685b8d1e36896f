"""Lab 10's GPU recording step for the advisor under load (scripts/record_reference.py calls it; the notebook never
does): step `advisor-check`, `check.check` on each of `GOALS`, one engine each on this GPU."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ...hardware.device import device_facts
from ...results.store import ResultStore
from .check import check
from .plan import Goal

GOALS = {  # three deployments one H200 serves with TP=1 (the advice for each is TP=1: check runs one engine). The
    # chat at 8 ms: 64 in flight is advised TP=2 since FP8 prefill is priced as lab 06 measured it; 48 is one H200's
    "chat-shared-prefix": Goal(concurrency=48, prompt_tokens=1024, shared_prefix_tokens=512, output_tokens=256,
                               tpot_slo_ms=8.0),
    "long-context": Goal(concurrency=16, prompt_tokens=8192, output_tokens=512, tpot_slo_ms=12.0),
    "assistant-batch-1": Goal(concurrency=1, prompt_tokens=512, output_tokens=256, tpot_slo_ms=6.0),
}


def record(out_dir: Path, store: ResultStore, facts: dict[str, Any], *, goals: dict[str, Goal] | None = None,
           served: str | None = None) -> None:
    """Step `advisor-check`: facts["advisor_check"][name] = the advice, the rate, predicted against measured, goodput;
    each run's Result recorded. A goal that fails is logged in its entry and the next one runs."""
    got: dict[str, Any] = {}
    for name, goal in (goals or GOALS).items():
        t0 = time.time()
        try:
            out = check(goal, out_dir=Path(out_dir) / f"advisor-{name}", served=served)
        except Exception as e:  # noqa: BLE001 - one goal's failure must not lose the others' measurements
            got[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        store.append_recorded(out.pop("result"))
        out["predicted"] = {k: v for k, v in out["predicted"].items() if k != "result"}
        got[name] = {**out, "goal": vars(goal), "seconds": round(time.time() - t0, 1)}
    facts["advisor_check"] = {"goals": got, "gpu": device_facts().get("gpu"), "date": time.strftime("%Y-%m-%d")}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "advisor-check.json").write_text(json.dumps(facts["advisor_check"], indent=1, default=str))
