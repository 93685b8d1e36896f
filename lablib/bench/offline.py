"""The timing protocol: run a workload on an engine, return a Result.

Measured the way gpt-fast and nanochat measure: seeded; a warm-up request first (kernel
selection, allocator growth and lazy initialisation are not the engine's steady state);
the device synchronised around the timer (each engine's records come from tokens already
on the host); fixed output lengths (every engine ignores EOS and says so in its facts), so two
engines do the same work; memory sampled in a background thread for the whole run.

Order matters for the user's time: every request is tokenised and checked against the
engine's context (`facts["context"]`, known before it starts) first, and only then is the
engine started (`engine.start()`): a prompt too long for the model is refused in
milliseconds, not after a vLLM engine's minute of start-up. The Result records what ran:
the engine's own config (its seed included), the bench's seed as `bench_seed`, and
`ignore_eos` as the engine reports it.

The roofline numbers follow the usual model-bandwidth-utilisation definition: during
decode, every step reads all weights once (but an untied input embedding, of which it reads
only the batch's rows: `roofline.decode_weight_bytes`) plus the KV cache of each running sequence, so
bytes per step / time per step (TPOT) is the bandwidth the run achieved; divided by the
GPU's peak from the table it is MBU. The mean number of sequences decoding together is
derived from the records (total decode time of all requests / wall time), so the same
formula serves naive, static and continuous batching. On a GPU not in the table, and on
the CPU, the peak is "unknown", never guessed.

Nothing measured is lost: the Result is appended to the store as soon as it exists. An
interrupted run (Kernel → Interrupt) closes the engine (its state mid-call is unknown), stores
the requests that finished as a Result marked partial in its notes (`Result.partial`: its wall
time includes work on the rest, so a chart of runs leaves it out), or nothing when none
finished, and raises `RunInterrupted`, a KeyboardInterrupt that says in one line what was kept.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from types import SimpleNamespace
from typing import Any, Callable

from ..config import BenchConfig
from ..engines.base import Engine, PreparedRequest
from ..hardware.device import device_facts, library_versions, torch_threads
from ..hardware.memory import MemoryMonitor
from ..results.record import PARTIAL, RequestRecord, Result
from ..results.store import ResultStore
from ..hardware.roofline import Roofline, decode_weight_bytes
from ..models import prompt_tokenizer
from ..models.architecture import DTYPE_BYTES
from ..workloads import Workload


def prepare(workload: Workload, engine: Engine, bench: BenchConfig = BenchConfig()) -> list[PreparedRequest]:
    """Token ids for every request, checked against the model's context before any work starts.

    The embedded models take the completion-form prompt; a chat model (any other model whose
    tokenizer has a chat template) takes the chat form through its template.
    """
    tok = engine.tokenizer
    chat = getattr(engine.spec, "source", "") != "embedded" and getattr(tok, "chat_template", None)
    texts = workload.chat_prompts(tok) if chat else [r.prompt for r in workload.requests]
    context = engine.facts.get("context") or engine.facts.get("max_model_len")
    out = []
    for r, text in zip(workload.requests, texts):
        ids = tok(text, add_special_tokens=not chat)["input_ids"]
        n = bench.max_new_tokens or r.max_new_tokens
        if n < 1:
            raise ValueError(f"request {r.id} of workload {workload.name!r}: max_new_tokens={n}; allowed >= 1. "
                             "Fix: BenchConfig(max_new_tokens=...) to set an output length.")
        if context and len(ids) + n > context:
            raise ValueError(
                f"request {r.id} of workload {workload.name!r}: prompt {len(ids)} + max_new_tokens {n} = "
                f"{len(ids) + n} tokens, longer than the model's context of {context}. Fix: a shorter "
                "max_new_tokens (BenchConfig), workload.head(n) to drop long requests, or a longer-context model.")
        out.append(PreparedRequest(r.id, tuple(ids), n))
    return out


def request_lengths(workload: Workload, spec: Any, bench: BenchConfig = BenchConfig()) -> list[int]:
    """Each request's prompt + new tokens as `prepare` makes them for `spec`'s tokenizer: what an engine's KV cache
    must hold per request (`lablib.engines.together` sizes it so)."""
    shim = SimpleNamespace(tokenizer=prompt_tokenizer(spec), spec=spec, facts={})
    return [len(r.prompt_ids) + r.max_new_tokens for r in prepare(workload, shim, bench)]


def roofline_for(records: list[RequestRecord], wall_s: float, facts: dict[str, Any], gpu: str | None,
                 arch: dict[str, Any] | None = None) -> dict:
    """Achieved decode bandwidth and MBU from per-request records (see the module docstring).

    facts["weight_bytes"] is all the engine holds (vLLM: the checkpoint's size; HF: its parameters' bytes); with
    `arch` (`ModelSpec.architecture()`) an untied input embedding is left out of what a step reads, at the engine's
    dtype (facts["dtype"]) or else the checkpoint's."""
    tpots = sorted(r.tpot for r in records if r.tpot)
    weight_bytes, kv = facts.get("weight_bytes"), facts.get("kv_bytes_per_token")
    if not tpots or not weight_bytes or kv is None:
        return {"mbu": "unknown", "why": "no decode timing or no model size"}
    if arch:
        weight_bytes = decode_weight_bytes(weight_bytes, arch, DTYPE_BYTES.get(facts.get("dtype") or arch.get("dtype"), 2))
    tpot = tpots[len(tpots) // 2]
    batch = max(1, round(sum(r.decode_s or 0.0 for r in records) / max(wall_s, 1e-9)))
    context = sum(r.prompt_tokens + r.output_tokens / 2 for r in records) / len(records)
    return Roofline(gpu, weight_bytes, kv, batch, context, decode_tok_s=batch / tpot).to_dict()


class RunInterrupted(KeyboardInterrupt):
    """Kernel → Interrupt during `run`, in one line: how far the run got, what was kept, that the engine was closed.

    Still a KeyboardInterrupt, so a notebook cell (and Run All) stops as an interrupt stops it; IPython shows only
    this line (`_render_traceback_`), not forty lines through the engine's generate down to a bare interrupt."""

    def __init__(self, message: str, kept: Result | None = None):
        super().__init__(message)
        self.kept = kept  # the partial Result (stored where the message says), or None: nothing was kept

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {self}"]


def interrupted_message(step: str, done: int, total: int, where: str | None) -> str:
    """What `RunInterrupted` says: `done` of `total` requests finished; `where` the store's path (None: no store)."""
    if not done:
        kept = "nothing was stored (no request had finished)"
    elif where:
        kept = f"kept a Result of those {done}, marked partial in its notes, in {where}"
    else:
        kept = f"a Result of those {done}, marked partial, is on this exception's .kept (no store was given)"
    return f"Interrupted {step} after {done} of {total} requests: {kept}; the engine was closed."


def run(engine: Engine, workload: Workload, bench: BenchConfig = BenchConfig(), *, lab: str = "",
        step: str | None = None, store: ResultStore | None = None,
        on_record: Callable[[RequestRecord], None] | None = None) -> Result:
    """Warm up, run the whole workload once under the memory monitor, return (and store) its Result.

    Kernel → Interrupt closes the engine and raises `RunInterrupted` (see the module docstring)."""
    import torch  # deferred: torch

    requests = prepare(workload, engine, bench)  # refused here, before a vLLM engine spends a minute starting
    try:
        engine.start()
        torch.manual_seed(bench.seed)
        if hasattr(engine, "size_for"):  # an engine of fixed shapes (HF compiled) sizes them for this run first
            engine.size_for(requests)
        if bench.warmup_requests:
            warm = [PreparedRequest(f"warmup-{r.request_id}", r.prompt_ids, min(8, r.max_new_tokens))
                    for r in requests[:bench.warmup_requests]]
            engine.generate(warm, progress=False)
    except KeyboardInterrupt:
        engine.close()
        raise RunInterrupted(f"Interrupted {step or engine.name} while the engine started or warmed up, before any "
                             "request was timed: nothing was stored; the engine was closed.") from None
    hardware = device_facts(import_torch=True)
    done: list[RequestRecord] = []

    def collect(rec: RequestRecord) -> None:
        done.append(rec)
        if on_record:
            on_record(rec)

    notes: list[str] = []
    mon = MemoryMonitor(bench.monitor_interval_s)
    for pid in engine.worker_pids():
        mon.watch_pid(pid)
    others = engine.others() if hasattr(engine, "others") else []  # engines started with it, idle meanwhile
    for other in others:
        for pid in other.worker_pids():
            mon.exclude_pid(pid)
    t0 = time.perf_counter()
    interrupted: BaseException | None = None
    with mon:
        try:
            if bench.max_concurrency is None:
                records = engine.generate(requests, on_record=collect, progress=bench.progress)
            else:
                records = _in_waves(engine, requests, bench.max_concurrency, collect, t0)
        except (KeyboardInterrupt, Exception) as e:  # keep what finished, then re-raise
            records, interrupted = list(done), e
            notes.append(f"{PARTIAL} interrupted after {len(done)} of {len(requests)} requests: {type(e).__name__}"
                         + (f": {e}" if str(e) else ""))
    wall = time.perf_counter() - t0
    if mon.source == "rss":
        notes.append("memory is this process's resident set size (no NVIDIA GPU/NVML here)")
    if others:
        notes.append(f"{len(others)} other engine(s) started with this one sat idle while it ran: the GPU's used memory "
                     "holds theirs (memory.others_bytes), the per-process memory does not")
    result = Result(
        lab=lab, step=step or engine.name, engine=engine.name,
        config={**_config_dict(engine.config), "ignore_eos": engine.facts.get("ignore_eos"), "bench_seed": bench.seed,
                "warmup_requests": bench.warmup_requests, "max_concurrency": bench.max_concurrency, **bench.tags},
        model=engine.spec.describe() | {k: engine.facts.get(k) for k in ("parameters", "weight_bytes", "dtype")},
        workload={"name": workload.name, "version": workload.version, "requests": len(requests)},
        requests=records, wall_s=wall, memory=mon.timeline(),
        roofline=roofline_for(records, wall, engine.facts, hardware.get("gpu"), engine.spec.architecture()),
        engine_facts=copy.deepcopy(engine.facts), hardware=hardware, versions=library_versions(), notes=notes)
    stored = store is not None and store.append(result)  # a Result of no requests is not stored
    if isinstance(interrupted, KeyboardInterrupt):
        engine.close()
        message = interrupted_message(result.step, len(records), len(requests), str(store.path) if stored else None)
        raise RunInterrupted(message, result if records else None) from None
    if interrupted is not None:
        raise interrupted
    return result


def _shifted(rec: RequestRecord, offset: float) -> RequestRecord:
    """`rec` with every time moved `offset` seconds later (arrival stays: the request was there at t=0)."""
    def move(t: float | None) -> float | None:
        return None if t is None else t + offset

    return dataclasses.replace(rec, start=move(rec.start), first_token=move(rec.first_token),
                               last_token=move(rec.last_token), finished=move(rec.finished),
                               token_times=None if rec.token_times is None else [t + offset for t in rec.token_times])


def _in_waves(engine: Engine, requests: list[PreparedRequest], size: int, collect: Callable[[RequestRecord], None],
              t0: float) -> list[RequestRecord]:
    """The requests in waves of `size`, one `generate` call each, every record's times moved onto the run's clock.

    An engine stamps a call's records from that call's own start, so a wave's offset (when it was sent, on the
    run's clock) is added to every time; `arrival` stays 0 (every request was there at t=0, waiting for its
    wave). The engine's `facts["last_run"]` ends as the waves' sum (`merge_last_run`)."""
    records: list[RequestRecord] = []
    parts: list[dict[str, Any]] = []
    try:
        for i in range(0, len(requests), size):
            offset = time.perf_counter() - t0
            engine.facts.pop("last_run", None)  # this wave's, when the call ends; none if it does not
            got = engine.generate(requests[i:i + size], on_record=lambda rec, o=offset: collect(_shifted(rec, o)),
                                  progress=False)
            records += [_shifted(rec, offset) for rec in got]
            if "last_run" in engine.facts:
                parts.append(engine.facts["last_run"])
    finally:  # an interrupted run keeps the counters of the waves that finished, as it keeps their records
        if parts:
            engine.facts["last_run"] = merge_last_run(parts)
        else:
            engine.facts.pop("last_run", None)  # the warm-up's would pass for the run's
    return records


def merge_last_run(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several engine calls' `last_run` facts as one run's: counters (`metrics_delta`, wall time, a speculative
    engine's tokens and target forwards) summed, lists of counters summed element by element, gauges (`metrics`:
    the state after the call) the last call's; tokens per target forward recomputed from the sums."""
    def add(a: Any, b: Any) -> Any:
        if isinstance(a, dict) and isinstance(b, dict):
            return {k: add(a[k], b[k]) if k in a and k in b else b.get(k, a.get(k)) for k in {**a, **b}}
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
                and not isinstance(b, bool):
            return a + b
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            return [add(x, y) for x, y in zip(a, b)]
        return b

    out = copy.deepcopy(parts[0])  # the engine's own dicts stay as they were
    for part in parts[1:]:
        for key, value in part.items():
            out[key] = value if key == "metrics" or key not in out else add(out[key], value)
    spec, last = out.get("speculative"), next((p["speculative"] for p in reversed(parts) if "speculative" in p), {})
    if isinstance(spec, dict):
        spec.update(k=last.get("k"), method=last.get("method"),
                    tokens_per_forward=spec["tokens"] / spec["target_forwards"] if spec.get("target_forwards") else None)
    out["calls"] = len(parts)
    return out


def _config_dict(config: Any) -> dict[str, Any]:
    return config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))


def run_step(step: Any, model: Any, workload: Workload, bench: BenchConfig, *, lab: str,
             store: ResultStore | None = None, threads: int | None = None) -> Result:
    """One named rung on `workload`: `step.make_engine(model)`, the run (named `step.name`, torch on `threads`
    in this process), the engine closed whatever happens. The journey's ladder and the labs that run a few
    rungs of their own (02's attention pair, 08's harness) call this."""
    engine = step.make_engine(model)
    try:
        with torch_threads(threads):
            return run(engine, workload, bench, lab=lab, step=step.name, store=store)
    finally:
        engine.close()
