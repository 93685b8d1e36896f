"""The store that never loses a measurement: one JSON line per Result, appended and fsynced.

A kernel killed mid-run (Kernel → Interrupt, a dead kernel, a time limit) leaves every
Result written before it intact; a torn last line is skipped on load with a warning. A Result
of no requests (a run interrupted before its first) is neither written nor read back: it
measured nothing, and a chart would draw it as a run at 0 tok/s. The shipped H200 recordings
are the same format, gzipped.

Everything a lab, the main job or a widget measures goes to one folder, `results_dir()`: the repository's own
`results/` in a clone (whatever folder the notebook runs from: nbval and Jupyter run each lab inside `labs/`),
`$LABLIB_RESULTS` where set, `./results` where lablib is installed outside a clone.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import warnings
from .record import Result


def results_dir() -> Path:
    """The one folder every measurement is written to (see the module docstring for how it is found)."""
    env = os.environ.get("LABLIB_RESULTS")
    if env:
        return Path(env).resolve()
    root = Path(__file__).resolve().parents[2]
    if (root / "labs").is_dir() and (root / "pyproject.toml").is_file():
        return root / "results"
    return Path("results").resolve()  # outside a clone: below the folder the process works in


class ResultStore:
    """An append-only JSON-lines file of Results, one per line, flushed and fsynced per append.

    A line is written in one `write` call of a complete record followed by fsync, so a kernel
    killed mid-run leaves every earlier Result intact; a torn last line (power loss) is skipped
    on load with a warning rather than failing the whole file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def for_lab(cls, lab: str) -> "ResultStore":
        """The store a lab (or the main job) appends to: `<results_dir()>/<lab>.jsonl`."""
        if not lab or "/" in lab or lab.startswith("."):
            raise ValueError(f"ResultStore.for_lab.lab={lab!r}: allowed a lab's name, e.g. '01_batching'; "
                             "Fix: pass the notebook's name without folder or suffix.")
        return cls(results_dir() / f"{lab}.jsonl")

    def append(self, result: Result) -> bool:
        """Write `result` as one line; False, and nothing written, for a Result of no requests.

        A run that finished no request (interrupted before the first, every request failed) measured nothing: stored,
        it would be read back as a run at 0 tok/s."""
        if not result.requests:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (result.to_json() + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # after a torn last line, start a fresh one so this record stays readable
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def append_recorded(self, result: Result) -> Result:
        """Append `result` as a recording (provenance "recorded": what a recording step keeps); returns what it stored."""
        kept = dataclasses.replace(result, provenance="recorded")
        self.append(kept)
        return kept

    def facts_path(self, key: str) -> Path:
        """Where `keep_facts(key, ...)` writes: `facts-<key>.json` beside this store's file."""
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"ResultStore.facts_path.key={key!r}: allowed a recording step's name, e.g. "
                             "'speculative'; Fix: pass the step's STEP constant.")
        return self.path.parent / f"facts-{key}.json"

    def keep_facts(self, key: str, value: dict[str, Any]) -> Path:
        """Write a live study's figures (what its recording step writes as facts[key]) beside the Results.

        A lab run live on the GPU by scripts/gpu_session.sh then doubles as that recording: the session brings
        results/ back and scripts/pack_reference.py --labs overlays facts-<key>.json onto data/reference/facts.json,
        so the lab's cell and its recording are one measurement, not two (GPU time is the scarce thing). Written
        whole to a temporary file and renamed, so an interrupted write leaves the last complete one.
        """
        path = self.facts_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.partial")
        tmp.write_text(json.dumps(value, indent=1, default=str))
        os.replace(tmp, path)
        return path

    def load(self) -> list[Result]:
        """Every readable Result in the file (a `.gz` file is read through gzip), but any of no requests: a run
        interrupted before its first request, which an older lablib stored, is not a run at 0 tok/s."""
        if not self.path.exists():
            return []
        if self.path.suffix == ".gz":
            text = gzip.open(self.path, "rt", encoding="utf-8").read()
        else:
            text = self.path.read_text()
        out = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                result = Result.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError) as e:
                warnings.warn(f"{self.path}:{i}: skipped an unreadable record ({e})", stacklevel=2)
                continue
            if result.requests:
                out.append(result)
        return out


def keep_if_recording(store: ResultStore | None, key: str, facts: dict[str, Any] | Callable[[], dict[str, Any]],
                      differs: Sequence[str] = ()) -> Path | None:
    """A live run kept as step `key`'s recording (`store.keep_facts(key, facts)`) when it is that step's own run: a
    `store` is given and `differs` (each way the run is not the recording's: another setting, a run that failed) is
    empty. `facts` may be a function, called only then. Returns the path written, or None: the run stays this
    user's. Called after every run of a long one, so a run cut short keeps what it made."""
    if store is None or differs:
        return None
    return store.keep_facts(key, facts() if callable(facts) else facts)


def load_results(*paths: str | Path) -> list[Result]:
    """Every Result in the given JSONL files or folders of them, in file order."""
    out: list[Result] = []
    for p in map(Path, paths):
        files = sorted([*p.glob("*.jsonl"), *p.glob("*.jsonl.gz")]) if p.is_dir() else [p]
        for f in files:
            out.extend(ResultStore(f).load())
    return out
