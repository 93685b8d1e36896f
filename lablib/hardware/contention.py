"""Did a run have its CPU to itself? A compute-bound run's share of the core it ran on.

An HF rung on the CPU is compute-bound: every second of its wall time the torch thread either computes or waits
in the run queue for a core. So the process's CPU time over the rungs, divided by wall time x the threads it ran
on (never more than the cores), is the share of its core it got. Alone that is about 1: Python's bookkeeping
between torch's ops is CPU time too. With another busy process on its core it is about 1/2, and the run measured
this machine's leftovers, not its speed: every rung slower, and batching's gains bent out of shape.

Measured on a 2-core VM beside three other busy processes (Linux's schedstat for lablab's main thread, 140 s into
its naive rung): 73.5 s on a core, 66.1 s waiting for one, 0.4% of the wall neither: compute-bound as assumed, and
a share of 0.52. Loading a model and the first import of torch and transformers, inside a rung's span, are
compute-bound too (0.03 s of 8.4 s, and 0 of 11.5 s, off the CPU). Two one-thread runs on two cores get a core
each (about 1 each, no contention); three get 2/3 each. `SHARE_FLOOR` (0.8) sits between: a background job taking
a fifth of the core passes, one taking a third does not. The floor is calibrated for one torch thread (the labs'
and lablab's default); with more, the Python between ops runs on one thread and a run alone may fall short of
it, so the share is printed, not judged. The 1-minute load average (runnable processes, this one included) is
printed beside it as the likely cause, never judged: it lags a minute, and in some containers it counts the
host's processes. Contention that costs no CPU time (runs sharing memory bandwidth or caches) is not seen here.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

SHARE_FLOOR = 0.8  # below this share of its core, a one-thread compute-bound run is called contended
MIN_WALL_S = 1.0  # spans shorter than this in all are too short to judge (a scheduler quantum is milliseconds)
ADVICE = ("this run shared its CPU with other work: its speeds are lower than this machine's own; "
          "run it alone (nothing else busy on these cores) for this machine's numbers")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a container's cpuset)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has none
        return None


@dataclass(frozen=True)
class CpuShare:
    """What the measured spans of a run got of the CPU: the figures and the verdict on them."""

    wall_s: float  # wall time over the measured spans (the HF rungs)
    cpu_s: float  # this process's CPU time (user + system, every thread) over the same spans
    threads: int  # torch threads the spans computed on
    cores: int  # cores this process may run on
    load_avg: float | None = None  # highest 1-minute load average seen at the end of a span (None: no OS figure)

    @property
    def share(self) -> float | None:
        """CPU time over wall time x the cores the run could use; None where the spans are too short to judge."""
        if self.wall_s < MIN_WALL_S:
            return None
        return self.cpu_s / (self.wall_s * max(1, min(self.threads, self.cores)))

    @property
    def contended(self) -> bool | None:
        """True below SHARE_FLOOR; None where not judged (spans too short, or more than one torch thread)."""
        share = self.share
        return None if share is None or self.threads != 1 else share < SHARE_FLOOR

    def figures(self) -> str:
        """The measured figures in one clause: "52% of 1 core (71.2 s of CPU time in 137.0 s of wall time), ..."."""
        used = max(1, min(self.threads, self.cores))
        share = self.share
        text = (f"{share:.0%} of {used} core{'s' if used > 1 else ''} " if share is not None else "") + (
            f"({self.cpu_s:.1f} s of CPU time in {self.wall_s:.1f} s of wall time on {self.threads} torch "
            f"thread{'s' if self.threads > 1 else ''})")
        if self.load_avg is not None:
            text += f", load average up to {self.load_avg:.1f} on {self.cores} core{'s' if self.cores > 1 else ''}"
        return text

    def to_dict(self) -> dict[str, object]:
        """The summary's `cpu` field: every figure, the share, the floor and the verdict."""
        share = self.share
        return {"contended": self.contended, "share": None if share is None else round(share, 3),
                "floor": SHARE_FLOOR, "cpu_s": round(self.cpu_s, 1), "wall_s": round(self.wall_s, 1),
                "threads": self.threads, "cores": self.cores,
                "load_avg": None if self.load_avg is None else round(self.load_avg, 2)}


class CpuMeter:
    """Adds up wall time and this process's CPU time over the spans it measures (`with meter.measure(): ...`).

    The clocks are parameters so a test can feed it numbers: `clock` wall seconds, `cpu_clock` process CPU
    seconds, `load_avg` the 1-minute load average or None."""

    def __init__(self, threads: int | None = None, cores: int | None = None,
                 clock: Callable[[], float] = time.perf_counter, cpu_clock: Callable[[], float] = time.process_time,
                 load_avg: Callable[[], float | None] = _load_avg) -> None:
        self.cores = cores or _cores()
        self.threads = threads or self.cores  # None: torch's default, about one thread per core
        self._clock, self._cpu_clock, self._load_avg = clock, cpu_clock, load_avg
        self.wall_s = self.cpu_s = 0.0
        self.load_max: float | None = None

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        """Count the wall and CPU time of the block (whatever it raises)."""
        wall, cpu = self._clock(), self._cpu_clock()
        try:
            yield
        finally:
            self.wall_s += self._clock() - wall
            self.cpu_s += self._cpu_clock() - cpu
            load = self._load_avg()
            if load is not None:
                self.load_max = load if self.load_max is None else max(self.load_max, load)

    def result(self) -> CpuShare:
        """The spans measured so far, with the verdict."""
        return CpuShare(self.wall_s, self.cpu_s, self.threads, self.cores, self.load_max)
