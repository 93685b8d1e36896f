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
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..stats import distribution
from ..config import lab_id

SCHEMA = 1
PARTIAL = "partial run:"  # how a note of a run cut short begins (Kernel → Interrupt, an engine error mid-run)


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
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache, where the engine says (vLLM's
    # RequestOutput.num_cached_tokens: whole blocks only, never the last prompt token)

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

    lab: str  # which lab or command produced it, e.g. lab_id("01")
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
    def partial(self) -> bool:
        """Whether the run was cut short (a note starts with PARTIAL): its requests are those that finished, its
        wall time includes work on the rest, so its throughput is not the setting's and a chart of runs skips it."""
        return any(n.startswith(PARTIAL) for n in self.notes)

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


