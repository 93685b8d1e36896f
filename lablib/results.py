"""The one record every measurement returns, and the store that never loses it.

Every engine, on every machine, hands back per-request timings; `Result` wraps them with
everything needed to trust and compare the number later: the configuration, the model,
the workload, the hardware and library versions, whether it was measured live or recorded
elsewhere, and the aggregates a lab plots (TTFT, TPOT, ITL and end-to-end latency
percentiles, throughput, peak memory and its timeline, achieved bandwidth against the
GPU's peak). Plots read only these records, so a run recorded on an H200 and a run made
live on a laptop go through the same code.

Time stamps are seconds relative to the start of the run (`time.perf_counter` based);
all requests of an offline run arrive at 0.

Vocabulary (the serving community's, e.g. vLLM's benchmarks):
- TTFT, time to first token: first_token - arrival (queueing + prefill).
- TPOT, time per output token: (last_token - first_token) / (output_tokens - 1), per request.
- ITL, inter-token latency: the gaps between consecutive tokens, pooled over requests.
- E2E latency: finished - arrival (finished can be later than last_token: static batching
  returns a request only when its whole batch is done).

`ResultStore` appends one JSON line per Result and fsyncs it, so a dead kernel loses
nothing that was measured.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .mechanisms.batching import percentile as _percentile

SCHEMA = 1
PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """What one request did, in seconds since the run started."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrival: float = 0.0
    start: float | None = None  # when the engine began working on it (its batch started, or it was scheduled)
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None  # when the response was handed back (defaults to last_token)
    token_times: list[float] | None = None  # every output token's time, where the engine gives them
    output_ids: list[int] | None = None  # generated token ids (kept for correctness checks)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or self.last_token is None or self.output_tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.output_tokens - 1)

    @property
    def e2e(self) -> float | None:
        end = self.finished if self.finished is not None else self.last_token
        return None if end is None else end - self.arrival

    @property
    def itls(self) -> list[float]:
        t = self.token_times or []
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def prefill_s(self) -> float | None:
        if self.first_token is None:
            return None
        return self.first_token - (self.start if self.start is not None else self.arrival)

    @property
    def decode_s(self) -> float | None:
        if self.first_token is None or self.last_token is None:
            return None
        return self.last_token - self.first_token


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default) of the values that are not None; None for none."""
    xs = [v for v in values if v is not None]
    return _percentile(xs, q) if xs else None


def distribution(values: Iterable[float | None]) -> dict[str, float | None]:
    xs = [v for v in values if v is not None]
    out: dict[str, float | None] = {"mean": sum(xs) / len(xs) if xs else None}
    out.update({f"p{q}": percentile(xs, q) for q in PERCENTILES})
    return out


def summarise(requests: list[RequestRecord], wall_s: float) -> dict[str, Any]:
    """Aggregates over a run: throughput over the wall time, latency percentiles."""
    out_tok = sum(r.output_tokens for r in requests)
    in_tok = sum(r.prompt_tokens for r in requests)
    wall = max(wall_s, 1e-12)
    return {
        "requests": len(requests),
        "prompt_tokens": in_tok,
        "output_tokens": out_tok,
        "wall_s": wall_s,
        "output_tok_s": out_tok / wall,
        "total_tok_s": (out_tok + in_tok) / wall,
        "requests_s": len(requests) / wall,
        "ttft_s": distribution(r.ttft for r in requests),
        "tpot_s": distribution(r.tpot for r in requests),
        "itl_s": distribution(x for r in requests for x in r.itls),
        "e2e_s": distribution(r.e2e for r in requests),
        "prefill_s": sum(r.prefill_s or 0.0 for r in requests),
        "decode_s": sum(r.decode_s or 0.0 for r in requests),
    }


@dataclass
class Result:
    """One measurement: a workload run on one engine configuration.

    `provenance` is "live" (measured in this session) or "recorded" (measured elsewhere by
    the project's scripts, e.g. on the H200, and shipped in `data/reference/`); a figure
    built from a recorded Result says so.
    """

    lab: str  # which lab or command produced it, e.g. "01_batching"
    step: str  # the journey step or sweep point, e.g. "hf-naive", "hf-static-b8"
    engine: str  # "hf-naive", "hf-static", "vllm", "simulator"
    config: dict[str, Any]  # the engine knobs that were set
    model: dict[str, Any]  # name, path, parameters, dtype, weight_bytes, synthetic
    workload: dict[str, Any]  # name, version, requests
    requests: list[RequestRecord]
    wall_s: float
    summary: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)  # source, baseline/peak bytes, timeline
    roofline: dict[str, Any] = field(default_factory=dict)  # peak bw, achieved bw, mbu, ceiling
    engine_facts: dict[str, Any] = field(default_factory=dict)  # start-up time, KV capacity, backend...
    hardware: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    provenance: str = "live"
    recorded_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    notes: list[str] = field(default_factory=list)
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        if self.provenance not in ("live", "recorded"):
            raise ValueError(f"Result.provenance={self.provenance!r}: allowed 'live' or 'recorded'")
        if not self.summary:
            self.summary = summarise(self.requests, self.wall_s)

    @property
    def label(self) -> str:
        """How a figure names this run; recorded runs say where they were recorded."""
        if self.provenance == "recorded":
            gpu = self.hardware.get("gpu") or "CPU"
            return f"{self.step} (recorded on {gpu}, {self.recorded_at[:10]})"
        return self.step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), default=_jsonable)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Result":
        d = dict(d)
        d["requests"] = [RequestRecord(**r) for r in d.get("requests", [])]
        return cls(**d)


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


class ResultStore:
    """An append-only JSON-lines file of Results, one per line, flushed and fsynced per append.

    A line is written in one `write` call of a complete record followed by fsync, so a kernel
    killed mid-run leaves every earlier Result intact; a torn last line (power loss) is skipped
    on load with a warning rather than failing the whole file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def append(self, result: Result) -> None:
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

    def load(self) -> list[Result]:
        """Every readable Result in the file (a `.gz` file is read through gzip)."""
        if not self.path.exists():
            return []
        if self.path.suffix == ".gz":
            import gzip

            text = gzip.open(self.path, "rt", encoding="utf-8").read()
        else:
            text = self.path.read_text()
        out = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(Result.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                import warnings

                warnings.warn(f"{self.path}:{i}: skipped an unreadable record ({e})", stacklevel=2)
        return out


def load_results(*paths: str | Path) -> list[Result]:
    """Every Result in the given JSONL files or folders of them, in file order."""
    out: list[Result] = []
    for p in map(Path, paths):
        files = sorted([*p.glob("*.jsonl"), *p.glob("*.jsonl.gz")]) if p.is_dir() else [p]
        for f in files:
            out.extend(ResultStore(f).load())
    return out


def table(results: list[Result]) -> list[dict[str, Any]]:
    """One flat row per Result (for pandas.DataFrame or a printed table)."""
    rows = []
    for r in results:
        s = r.summary
        rows.append({
            "step": r.step, "engine": r.engine, "provenance": r.provenance, "requests": s["requests"],
            "output_tok_s": s["output_tok_s"], "total_tok_s": s["total_tok_s"], "requests_s": s["requests_s"],
            "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p99_s": s["ttft_s"]["p99"],
            "tpot_p50_s": s["tpot_s"]["p50"], "e2e_p99_s": s["e2e_s"]["p99"],
            "peak_mem_bytes": r.memory.get("peak_bytes"), "mbu": r.roofline.get("mbu"),
            "hardware": r.hardware.get("gpu") or "CPU"})
    return rows


def token_agreement(a: Result, b: Result) -> float:
    """Fraction of requests (matched by id) whose generated token ids are identical in both runs."""
    ids_b = {r.request_id: r.output_ids for r in b.requests}
    pairs = [(r.output_ids, ids_b[r.request_id]) for r in a.requests if r.request_id in ids_b]
    if not pairs or any(x is None or y is None for x, y in pairs):
        raise ValueError("token_agreement: the runs share no requests with stored output_ids. "
                         "Fix: compare two live runs of the same workload.")
    return sum(x == y for x, y in pairs) / len(pairs)
