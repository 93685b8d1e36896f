"""The one switch between live and recorded: what this machine can measure, and the label on what it shows.

Every lab runs two ways from the same notebook. On a GPU with vLLM the vLLM cells measure
live; without one (Colab CPU, a laptop, CI) they show runs recorded on the H200 by the
project's own scripts (`data/reference/`). This module alone decides which (`mode()`), and
`live_or_recorded` hands a lab one `Shown` value: the data, whether it is live, and the
label that goes next to it ("live on NVIDIA H200" or "recorded on NVIDIA H200, 2026-11-29").
A notebook never branches on the mode itself.

`Checks` is how a lab's Checks cell asserts on the run the user just made: a claim about
live data is asserted when the data is live, and reported as "not measured here" when it
was recorded (the recordings are tested in `tests/`, not in the notebook).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from collections.abc import Mapping
from typing import Any, Callable, ClassVar, Generic, TypeVar

from .config import LABS
from .hardware.device import device_facts
from .results.compare import table
from .results.record import Result
from .results.reference import NotRecorded, reference_facts

T = TypeVar("T")



@lru_cache(maxsize=1)
def mode() -> dict[str, Any]:
    """Which way this machine runs the vLLM cells: live (an NVIDIA GPU and vLLM) or recorded, and why.

    Decided once per process (NVML and an import check, no CUDA context): a lab asks many times.
    `LABLIB_MODE=recorded` forces the recorded path on a GPU machine (an instructor previewing
    what a CPU attendee sees).
    """
    gpu = device_facts().get("gpu")
    has_vllm = importlib.util.find_spec("vllm") is not None
    forced = os.environ.get("LABLIB_MODE") == "recorded"
    live = bool(gpu) and has_vllm and not forced
    why = ("GPU and vLLM present: measuring live" if live else "LABLIB_MODE=recorded" if forced else
           "no NVIDIA GPU visible" if not gpu else "vLLM is not installed (pip install 'lablib[gpu]')")
    head = reference_facts()["headline"]
    last = head.get("last_date", head["date"])
    recorded = f"recorded on {head['gpu']}, {head['date']}" + (f" to {last}" if last != head["date"] else "")
    banner = ("LIVE: vLLM runs on this machine's " + gpu) if live else (
        f"RECORDED: {why}, so vLLM cells show runs {recorded}; simulators, calculators and HF runs are live.")
    return {"live": live, "gpu": gpu, "vllm": has_vllm, "why": why, "banner": banner, "recorded": recorded}


def live_label() -> str:
    """How a live measurement on this machine is labelled: "live on <GPU>" (or "live on this CPU")."""
    gpu = mode()["gpu"]
    return f"live on {gpu}" if gpu else "live on this CPU"


@dataclass
class Shown(Generic[T]):
    """What a lab shows from one experiment: the data, whether this machine measured it, and the label to print."""

    value: T  # the rows, the Result(s), the facts
    live: bool  # measured in this session on this machine
    label: str  # "live on NVIDIA H200" or "recorded on NVIDIA H200, 2026-11-29"
    why: str = ""  # why recorded (no GPU, no vLLM), empty when live
    stand_ins: dict[str, dict[str, Any]] = field(default_factory=dict)  # knob -> {"asked", "shown"}: where the
    # recording shown ran with other settings than the cell asked for (empty when live, or when they match)

    @property
    def recorded_yet(self) -> bool:
        """False when nothing was measured here and nothing is recorded (the label says which step records it)."""
        return self.value is not None

    def line(self, template: str) -> str:
        """`template.format(**value)` (or `.format(value)` for a non-dict) followed by the label."""
        if self.value is None:
            return f"[{self.label}]"
        text = template.format(**self.value) if isinstance(self.value, dict) else template.format(self.value)
        return f"{text}  [{self.label}]"

    def table(self, columns: list[str] | None = None) -> Any:
        """A pandas DataFrame of list-of-dict or Result values, with a `provenance` column always present."""
        import pandas as pd  # deferred: pandas

        if self.value is None:  # not recorded yet: an empty table that still says why
            return pd.DataFrame([{"provenance": self.label}])
        rows = self.value if isinstance(self.value, list) else [self.value]
        if rows and isinstance(rows[0], Result):
            rows = [{**row, "provenance": r.label if r.provenance == "recorded" else self.label}
                    for r, row in zip(rows, table(rows))]
        else:
            rows = [{**row, "provenance": row.get("provenance") or self.label} for row in rows]
        frame = pd.DataFrame(rows)
        if columns is not None:
            frame = frame[[c for c in columns if c != "provenance"] + ["provenance"]]
        return frame

    def derived(self, value: Any) -> "Shown[Any]":
        """Another view of the same measurement (a table of its parts): same label, same stand-ins."""
        return replace(self, value=value)

    def __repr__(self) -> str:
        return f"Shown({'live' if self.live else 'recorded'}: {self.label})"


def _plain(v: Any) -> Any:
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


def _distinct(values: Any) -> list[Any]:
    """The distinct values, sorted (None first), each tuple as a list: how a knob's values are compared and shown."""
    def order(v: Any) -> Any:
        return (0,) if v is None else (1, tuple(map(order, v))) if isinstance(v, list) else (1, v)

    seen = {repr(_plain(v)): _plain(v) for v in values}
    try:
        return sorted(seen.values(), key=order)
    except TypeError:  # values of several types: in the order met
        return list(seen.values())


def stand_ins(asked: dict[str, Any], shown: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The knobs where what is shown differs from what was asked: {knob: {"asked", "shown"}} (a knob the
    recording does not say is shown as "not recorded"). A list is compared as the set of its values; a single
    asked value against a recording that ran one value of that knob."""
    out = {}
    for k, want in asked.items():
        got = _plain(shown[k]) if k in shown else "not recorded"
        if isinstance(want, (list, tuple)):
            same = isinstance(got, list) and _distinct(want) == _distinct(got)
        else:
            got = got[0] if isinstance(got, list) and len(_distinct(got)) == 1 else got
            same = _plain(want) == got
        if not same:
            out[k] = {"asked": _plain(want), "shown": got}
    return out


Where = str | tuple[str, ...] | Callable[[Any], Any]  # how a recording says what it ran of one knob: see recorded_as


def _at(value: Any, path: str) -> list[Any]:
    """Every value at `path` ("settings.ks", "rows.batch", "vllm.config.batch_size") below `value`: dict keys or
    attributes, a list along the way read element by element; a list at the end gives its elements."""
    items = [value]
    for key in path.split("."):
        found = []
        for x in items:
            for y in x if isinstance(x, list) else [x]:
                if isinstance(y, dict) and key in y:
                    found.append(y[key])
                elif not isinstance(y, dict) and hasattr(y, key):
                    found.append(getattr(y, key))
        items = found
    return [v for x in items for v in (x if isinstance(x, list) else [x])]


def recorded_as(value: Any, knobs: Any, where: Mapping[str, Where] | None = None) -> dict[str, Any]:
    """What a recording ran of each knob, read from the recording itself: the distinct values at the path `where`
    names for the knob (the knob's own name by default: a field of each row when the value is a list of rows), a
    tuple of row fields read together as one point per row (e.g. ("model", "scheme")), or a function of the value
    for what the data does not say. A knob the recording holds nothing of is left out ("not recorded")."""
    out = {}
    for knob in knobs:
        how = (where or {}).get(knob, knob)
        if callable(how):
            got = how(value)
            out[knob] = _distinct(got) if isinstance(got, (list, tuple)) else got
            continue
        if isinstance(how, tuple):
            got = [[next(iter(_at(row, f)), None) for f in how] for row in value]
        else:
            got = _at(value, how)
        if got:
            out[knob] = _distinct(got)
    return out


def stand_in_line(diffs: dict[str, dict[str, Any]], label: str) -> str:
    """One sentence naming the recorded values that stand in for the ones a cell asked for."""
    def say(v: Any) -> str:
        return "the engine's default" if v is None else str(v)

    parts = "; ".join(f"{k}: asked {say(d['asked'])}, shown {say(d['shown'])}" for k, d in diffs.items())
    return f"Shown instead of what this cell asked ({label}): {parts}."


def live_or_recorded(live: Callable[[], T], recorded: Callable[[], T], *, force: bool | None = None,
                     asked: dict[str, Any] | None = None, where: Mapping[str, Where] | None = None) -> Shown[T]:
    """Run `live()` on a machine that can (see `mode`), else load `recorded()`; either way labelled.

    `force=True/False` overrides the machine's mode (tests; a GPU user who wants the recording).
    A recording is shown as it was recorded, whole. `asked` are the knobs the cell passed (model, batch sizes, ...);
    where the recording ran others (`recorded_as(value, asked, where)`) the Shown's `stand_ins` name each, and one
    line under the cell says which recorded values are shown instead of the asked ones.
    """
    m = mode()
    use_live = m["live"] if force is None else force
    if use_live:
        return Shown(live(), True, live_label())
    try:
        value = recorded()
    except NotRecorded as e:  # a lab newer than the shipped recordings: say so, show nothing invented
        return Shown(None, False, str(e), m["why"])  # type: ignore[arg-type]
    diffs = stand_ins(asked, recorded_as(value, asked, where)) if asked else {}
    if diffs:
        print(stand_in_line(diffs, m["recorded"]))
    return Shown(value, False, m["recorded"], m["why"], diffs)


def display_if_live(widget: Any, instead: str) -> Any:
    """`widget.display()` when vLLM runs live here; otherwise one line saying why not and what is shown instead."""
    m = mode()
    return widget.display() if m["live"] else f"not live ({m['why']}): {instead}"


class Checks:
    """A lab's Checks cell: assertions on the run the user just made, and an honest count of what was checked.

        c = Checks(lab_id("03"))
        c.that("paging wastes under 4%", report.paged.waste_fraction < 0.04)
        c.live(gmu, "VRAM back to baseline after every engine", lambda rows: all(r["back_to_baseline"] for r in rows))
        c.done()

    `that` asserts now. `live` asserts only when the data was measured here; for a recording it
    notes the claim as not measured on this machine (the recordings are tested by
    tests/results/test_recordings.py, not re-asserted in a notebook). `done` prints what ran and what did not.
    """

    def __init__(self, lab: str):
        self.lab = lab
        self.passed: list[str] = []
        self.not_here: list[str] = []

    def that(self, claim: str, ok: bool, detail: Any = None) -> None:
        assert ok, f"{self.lab}: check failed: {claim}" + (f" ({detail})" if detail is not None else "")
        self.passed.append(claim)

    def live(self, shown: Shown, claim: str, test: Callable[[Any], bool], detail: Callable[[Any], Any] | None = None
             ) -> None:
        if not shown.live or shown.value is None:
            self.not_here.append(f"{claim} ({shown.label})")
            return
        self.that(claim, test(shown.value), detail(shown.value) if detail else None)

    def summary(self) -> str:
        """What passed on this run, and what needs a live GPU run and was not checked here."""
        text = f"{self.lab}: {len(self.passed)} checks on this run passed"
        if self.not_here:
            text += (f"; {len(self.not_here)} need a live GPU run and were not checked here (the recordings are "
                     "tested in tests/): " + "; ".join(self.not_here))
        return text

    def done(self) -> None:
        """Print the summary: a Checks cell's last line (returning nothing, so the cell shows it once)."""
        print(self.summary())


def frame(rows: Any, columns: list[str] | None = None) -> Any:
    """A pandas DataFrame of a lab step's rows (only `columns`, in that order, when given): the lab objects' tables."""
    import pandas as pd  # deferred: pandas only where a table is shown

    table = pd.DataFrame(rows)
    return table if columns is None else table[columns]


class LabSteps:
    """A lab's study object: each notebook step is one method that keeps what it made on an attribute (None until
    the step ran), later steps read those attributes through `ran`, and the Checks cell calls `require_all` first.

    `STEPS` maps each attribute a later step or the Checks cell reads to the method that fills it; `OPTIONAL` names
    the ones the Checks cell does not need; `CALL` is how the error message writes the call ("()" or "(...)").
    """

    STEPS: ClassVar[dict[str, str]] = {}
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    CALL: ClassVar[str] = "()"

    def missing(self) -> list[str]:
        """The steps the Checks cell needs that have not run yet, by their method names."""
        return sorted({step for name, step in self.STEPS.items()
                       if name not in self.OPTIONAL and getattr(self, name) is None})

    def ran(self, name: str) -> Any:
        """Attribute `name`, refused with the step to run when that step has not run yet."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{type(self).__name__}.{name} is empty: run {self._call(self.STEPS[name])} first (a "
                             "cell above this one)")
        return value

    def require_all(self) -> None:
        """The Checks cell's first line: refuse, naming them, while any step it needs has not run."""
        if missing := self.missing():
            raise ValueError(f"checks(lab): the steps {missing} have not run; run every step above first "
                             f"({', '.join(map(self._call, missing))}; Run > Run All Cells)")

    def _call(self, step: str) -> str:
        return f"lab.{step}" if "(" in step else f"lab.{step}{self.CALL}"


def lab_plan() -> list[dict[str, str]]:
    """For each lab: what it does and whether it measures live here or shows recorded runs."""
    m = mode()
    return [{"lab": lab, "does": does,
             "here": "live" if need == "cpu" or m["live"] else f"simulators and HF live, vLLM recorded ({m['why']})"}
            for lab, does, need in LABS]
