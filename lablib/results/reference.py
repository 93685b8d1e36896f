"""Runs recorded on the H200, for machines that cannot run vLLM themselves.

Without a GPU (Colab CPU, a laptop, CI) the vLLM cells of labs 03-05 show these
instead of measuring: Results made by `scripts/record_reference.py` through the same
`bench.run` a notebook uses, with provenance "recorded", the GPU, versions and date. Every
figure built from them says "recorded on NVIDIA H200, <date>", so nobody mistakes them for
a measurement of the machine in front of them. `lablib.session` decides which a lab shows.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from ..config import DATA_DIR
from .record import Result
from .store import ResultStore

REFERENCE_DIR = DATA_DIR / "reference"


@lru_cache(maxsize=1)
def _all() -> tuple[Result, ...]:
    path = REFERENCE_DIR / "h200.jsonl.gz"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the recorded runs ship with the repository. "
                                "Fix: git checkout data/reference (or re-record: scripts/record_reference.py on a GPU).")
    return tuple(ResultStore(path).load())


def reference_steps() -> list[str]:
    return [r.step for r in _all()]


class NotRecorded(LookupError):
    """What a lab asks for has not been recorded on the GPU yet (a lab newer than the shipped recordings).

    `session.live_or_recorded` turns it into a Shown with no value whose label names the recording step,
    so the notebook says so instead of failing."""

    def __init__(self, what: str, step: str):
        how = (f"`scripts/record_reference.py --steps {step}`" if "," not in step else
               "`scripts/record_reference.py --steps STEP`, one GPU command for each of " + ", ".join(step.split(",")))
        super().__init__(f"{what} is not recorded yet: a GPU session records it with {how} "
                         f"(then scripts/pack_reference.py)")
        self.what, self.step = what, step


def recorded_facts(key: str, step: str) -> Any:
    """facts[key] of the recordings, or NotRecorded naming the step that records it."""
    facts = reference_facts()
    if key not in facts:
        raise NotRecorded(key, step)
    return facts[key]


def load_reference(*steps: str, prefix: str | None = None) -> list[Result]:
    """Recorded Results by step name (or every step starting with `prefix`; all when neither is given)."""
    runs = {r.step: r for r in _all()}
    unknown = [s for s in steps if s not in runs]
    if unknown:
        raise ValueError(f"no recorded run named {unknown}: recorded steps are {sorted(runs)}.")
    if steps:
        return [runs[s] for s in steps]
    return [r for r in runs.values() if prefix is None or r.step.startswith(prefix)]


def reference_facts() -> dict[str, Any]:
    """Engine start-up, VRAM after close, greedy agreement, the gpu_memory_utilization sweep, headline figures."""
    return json.loads((REFERENCE_DIR / "facts.json").read_text())




def recorded_rows(key: str, step: str) -> list[dict[str, Any]]:
    """The sweep rows recorded on the H200 under facts[key], each labelled with where and when."""
    facts = reference_facts()
    if key not in facts:
        raise ValueError(f"data/reference/facts.json has no {key!r}: it ships with the repository. Fix: git checkout "
                         f"data/reference, or record it on a GPU (scripts/record_reference.py --steps {step}).")
    head = facts["headline"]
    return [{**row, "provenance": f"recorded on {head['gpu']}, {recorded_date(key)}"} for row in facts[key]]


def recorded_date(key: str) -> str:
    """The day facts[key] was recorded (scripts/pack_reference.py keeps it per key; older keys: the headline's)."""
    facts = reference_facts()
    return facts.get("recorded_dates", {}).get(key, facts["headline"]["date"])
