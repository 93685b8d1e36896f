"""Several vLLM engines started at once, then measured one at a time.

A lab that compares engine settings needs one engine per setting, and an engine's start is long and mostly not GPU
work: on the H200's host the worker's spawn and vLLM's imports took 20-30 s, torch.compile 10-20 s, then loading,
profiling and capturing CUDA graphs (lab 08's grid of 8 engines: 95 s each, 12.5 minutes). `one_by_one` starts a
group of engines at once, so the host's cores import and compile side by side, and then hands them to the caller in
turn. Each is measured while the others sit idle (an idle engine waits on its queue: no kernel runs, no core spins).
Once the last is measured the group closes, all at once. Nothing starts or closes while something is measured: the
next group starts only once this one has closed. vLLM's OpenAI server (`ServerEngine`) starts in a group as an offline
engine does (its KV cache given with --kv-cache-memory-bytes).

Memory. vLLM sizes its KV cache by profiling: the GPU's free memory, less what its own forward pass took. Beside
other engines' starts that reading moves under it, so engines started together get their KV cache exactly
(`VLLMConfig.kv_cache_memory_bytes`, which skips the profiling): room for the max_num_seqs longest of the run's
requests, and for one of max_model_len (vLLM's start check), twice over where a drafter's layers share the pool;
max_model_len, where the caller left it to the model, is the run's longest request (the 8B's 131,072 tokens would
ask 16 GiB of KV of each engine for one request no run sends). Their gpu_memory_utilization then only gates the
start (that much must be free), so it is set to the engine's own need.
How many start at once: as many as SHARE of the free memory holds (weights, KV and the fit check's overheads), one
per CORES_PER_START of the host's cores, and at most `LABLIB_VLLM_TOGETHER` (1: one at a time, as before).

An engine that fails to start beside the others is started again alone before its turn, with its own configuration
where the memory left allows it; its facts say so (`facts["together"]`).
"""
from __future__ import annotations

import concurrent.futures
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import VLLMConfig
from ..hardware.fit import CONTEXT_OVERHEAD, check_fit
from ..models import ModelSpec
from . import vllm as engines_vllm
from .base import GroupEngine as Engine
from .process import environ
from .vllm import SETTLE_SLACK, SPARE_ENV, preflight

ENV = "LABLIB_VLLM_TOGETHER"  # most engines started at once; 1: one after another
SHARE = 0.85  # of the GPU's free memory that engines started together may take between them
CORES_PER_START = 2  # host cores one engine's start keeps busy (its worker's imports, then torch.compile)
BLOCK = 16  # vLLM's KV block, in tokens
LENGTH_STEP = 256  # a together-started engine's max_model_len, in whole steps of this many tokens
MARGIN = 2 * 2**30  # per engine, beyond the fit check's overheads: vLLM's profile run, the allocator's cache


def cap_from_env() -> int | None:
    """`LABLIB_VLLM_TOGETHER` as a number (None where unset): refused unless a whole number >= 1."""
    raw = os.environ.get(ENV)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV}={raw!r}: allowed a whole number >= 1 (the most vLLM engines started at once). "
                         f"Fix: {ENV}=1 to start them one after another, or unset it to let the memory decide.")
    return value


def kv_bytes_for(spec: ModelSpec, config: VLLMConfig, longest_tokens: int, requests: int | None = None,
                 runs: Sequence[Sequence[int]] | None = None) -> int:
    """The KV cache (bytes) an engine of `config` needs for the run: max_num_seqs requests (no more than the run's
    `requests`, where given) of `longest_tokens` (in whole blocks, with the tokens a speculative step drafts past
    the end), or where each run's requests' prompt + new tokens are given (`runs`), the max_num_seqs longest of
    one run, the most that can be in flight at once; at least one of max_model_len, plus vLLM's null block; doubled
    with a drafter (a draft model's or an EAGLE head's KV per token is at most the target's)."""
    per_token = spec.kv_bytes_per_token(1 if config.kv_cache_dtype.startswith("fp8") else 2)
    spec_cfg = config.speculative_config or {}

    def blocks(n: int) -> int:  # a request's tokens in whole blocks
        return math.ceil((n + _past_end(config)) / BLOCK) * BLOCK

    max_len = config.max_model_len or spec.architecture()["context"] or 2048
    slots = config.max_num_seqs if requests is None else min(config.max_num_seqs, requests)
    busiest = (max(sum(sorted((blocks(n) for n in run), reverse=True)[:slots]) for run in runs) if runs else
               slots * blocks(longest_tokens))
    tokens = max(busiest, math.ceil(max_len / BLOCK) * BLOCK) + BLOCK
    drafter_layers = spec_cfg and spec_cfg.get("method") != "ngram"  # n-gram drafts from the prompt: no layers
    return int(tokens * per_token * (2 if drafter_layers else 1))


def _past_end(config: VLLMConfig) -> int:
    """Tokens a request may hold past its prompt + new tokens: a speculative step's k drafts and, under async
    scheduling, the next step's, and the token sampled with each."""
    return 2 * int((config.speculative_config or {}).get("num_speculative_tokens", 0)) + 2


def run_length(spec: ModelSpec, config: VLLMConfig, longest_tokens: int) -> int | None:
    """max_model_len for an engine started together whose caller left it to the model (None: kept): the run's
    longest request with a speculative step's drafts, in whole LENGTH_STEP tokens, at most the model's context.
    Its KV cache must hold one request of max_model_len (vLLM's start check): at the 8B's 131,072 tokens that is
    16 GiB an engine, for a run whose requests are 1-2 thousand tokens long."""
    if config.max_model_len is not None:
        return None
    need = math.ceil((longest_tokens + _past_end(config)) / LENGTH_STEP) * LENGTH_STEP
    context = spec.architecture()["context"]
    return need if not context or need < context else None


def together_config(spec: ModelSpec, config: VLLMConfig, longest_tokens: int, total_bytes: int,
                    requests: int | None = None, runs: Sequence[Sequence[int]] | None = None) -> VLLMConfig:
    """`config` for a start beside other engines: max_model_len the run's longest request where the caller left it
    to the model (`run_length`), its KV cache given exactly (`kv_bytes_for`), and a gpu_memory_utilization that asks
    to find free only what it will take (weights, KV, the fit check's overheads)."""
    length = run_length(spec, config, longest_tokens)
    if length is not None:
        config = replace(config, max_model_len=length)
    kv = config.kv_cache_memory_bytes or kv_bytes_for(spec, config, longest_tokens, requests, runs)
    fit = check_fit(spec, replace(config, kv_cache_memory_bytes=kv), total_bytes)
    need = fit.weight_bytes + _drafter_bytes(config) + fit.overhead_bytes + CONTEXT_OVERHEAD + MARGIN + kv
    gate = min(1.0, math.ceil(100 * need / total_bytes) / 100)
    return replace(config, kv_cache_memory_bytes=kv, gpu_memory_utilization=gate)


def _drafter_bytes(config: VLLMConfig) -> int:
    """The weights of the draft model or EAGLE head `config` speculates with (its folder's safetensors; 0 for
    n-gram or where the folder is not on this machine)."""
    folder = (config.speculative_config or {}).get("model")
    return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors")) if folder and Path(folder).is_dir() else 0


def _together_or_none(spec: ModelSpec, config: VLLMConfig, longest_tokens: int, total_bytes: int,
                      requests: int | None, runs: Sequence[Sequence[int]] | None) -> VLLMConfig | None:
    """`together_config`, or None where the model's shape is not known before a download (it then starts alone)."""
    if not spec.config:
        return None
    return together_config(spec, config, longest_tokens, total_bytes, requests, runs)


def footprint(config: VLLMConfig, total_bytes: int) -> int:
    """What a together-started engine may take: the share of the GPU its gate asks to be free."""
    return int(config.gpu_memory_utilization * total_bytes)


def at_once(footprints: Sequence[int], free_bytes: int, cpus: int, cap: int | None = None) -> int:
    """How many of the next engines start together: in order, as many as SHARE of `free_bytes` holds, one per
    CORES_PER_START of `cpus`, at most `cap`; at least one (alone, an engine keeps its own configuration)."""
    most = max(1, cpus // CORES_PER_START)
    if cap is not None:
        most = min(most, cap)
    n, used = 0, 0
    for f in footprints[:most]:
        if used + f > SHARE * free_bytes:
            break
        n, used = n + 1, used + f
    return max(1, n)


def _alone(engine: Engine, fallback: VLLMConfig | None = None) -> Engine | Exception:
    """One engine started by itself: `engine` as its caller made it, or one of `fallback` where the memory other
    engines still hold refuses its own configuration (`preflight`'s fit check)."""
    if fallback is not None:
        try:
            preflight(engine.spec, engine.vllm_config())
        except ValueError:
            try:
                engine = engine.resized(fallback)
            except ValueError as e:
                return e
    try:
        return engine.start()
    except Exception as e:  # noqa: BLE001 - the caller is handed the error at this engine's turn
        return e


def one_by_one(engines: Sequence[Engine | Exception], *, runs: Sequence[Sequence[int]] | None = None,
               longest_tokens: int | None = None, requests: int | None = None,
               cap: int | None = None) -> Iterator[Engine | Exception]:
    """For each of `engines` (made, not started: their checks ran; or the exception that refused one), in order:
    an engine of its model and configuration, started, or the exception that stopped it. See the module: engines
    start in groups while nothing is measured; a group closes, all at once, when the engine after its last is asked
    for (and every one still open when the loop ends or breaks). Started together, an engine is a new one of the same
    model with `together_config`; alone, it is the caller's. `runs`: per run the engines will make, each request's
    prompt + new tokens (`bench.offline.request_lengths`: the KV cache holds the longest that can be in flight at
    once), or only the longest of all (`longest_tokens`) with `requests`, the most any run sends (the KV cache holds
    no more slots); `cap`: at most this many at once (default `LABLIB_VLLM_TOGETHER`, else the memory and the cores
    decide)."""
    if longest_tokens is None:
        if not runs or not all(runs):
            raise ValueError("one_by_one: give runs (per run, each request's prompt + new tokens: "
                             "bench.offline.request_lengths) or longest_tokens")
        longest_tokens = max(max(run) for run in runs)
    engines = list(engines)
    cap = cap if cap is not None else cap_from_env()
    mem = engines_vllm.nvml_used()
    together = [None if mem is None or isinstance(e, Exception) else
                _together_or_none(e.spec, e.vllm_config(), longest_tokens, mem[2], requests, runs) for e in engines]
    refused = [isinstance(e, Exception) for e in engines]  # handed over as they are: they take no memory
    i = 0
    while i < len(engines):
        mem = engines_vllm.nvml_used()
        size = 1 if mem is None or len(engines) - i == 1 else at_once(  # one with no together config: alone
            [0 if no else mem[2] + 1 if c is None else footprint(c, mem[2])
             for c, no in zip(together[i:], refused[i:])], mem[1], os.cpu_count() or 1, cap)
        group = list(range(i, i + size))
        got: dict[int, Engine | Exception] = {}
        try:
            if size == 1:
                got[i] = engines[i] if isinstance(engines[i], Exception) else _alone(engines[i])
            else:
                got, baseline = _start_group({j: engines[j] if refused[j] else (engines[j], together[j])
                                              for j in group})
                for j in group:
                    if isinstance(got[j], Exception) and not refused[j]:  # again by itself: a port taken, memory
                        error = got[j]  # moved under it
                        got[j] = _alone(engines[j], fallback=together[j])
                        if not isinstance(got[j], Exception):
                            got[j].baseline = baseline  # the GPU before any of the group started
                            got[j].facts["vram_baseline_bytes"] = baseline[0] if baseline else None
                            got[j].facts.setdefault("together", {})["alone_after"] = f"{type(error).__name__}: {error}"
            for j in group:
                yield got[j]
        finally:  # after the group's last, or where the loop broke off: nothing started here is left holding the GPU
            _close_group([e for e in got.values() if not isinstance(e, Exception)])
        i += size


def _close_group(group: list[Engine]) -> None:
    """Close a group's engines once its last one is measured, all at once (each worker's exit and its memory's
    return take 4-6 s on the H200: one after another, lab 08's eight took 42 s), each checking that its own
    processes let go of their memory; then, with no other engine of this process up, the whole GPU against the
    baseline from before the group started (`_whole_gpu_verdict`): what the next group's start reads as free.
    A close that raises does not stop the others; the first error is raised once all have closed."""
    group = [e for e in group if not e.facts.get("closed")]
    if not group:
        return
    t0 = time.perf_counter()
    errors: list[BaseException] = []
    if len(group) == 1:
        try:
            group[0].close()
        except Exception as err:  # noqa: BLE001 - raised below, once the verdict is taken
            errors.append(err)
    else:
        with concurrent.futures.ThreadPoolExecutor(len(group)) as pool:
            done = [pool.submit(e.close, beside=True) for e in group]
        errors = [f.exception() for f in done if f.exception() is not None]
    if len(group) > 1:  # one engine alone checked the whole GPU itself, where nothing else was up
        _whole_gpu_verdict(group)
        wall = time.perf_counter() - t0
        for e in group:
            e.facts.setdefault("together", {})["group_close_s"] = wall
    if errors:
        raise errors[0]


def _whole_gpu_verdict(group: list[Engine]) -> None:
    """Once every engine of the group has closed and no other engine of this process is up: the whole GPU back to
    the baseline from before the group started, or not (`vram_group_back_to_baseline`, on each). Where NVML could
    not say per process whether an engine let go of its memory, that verdict is the engine's own."""
    baseline = next((e.baseline for e in group if e.baseline), None)
    if baseline is None or group[0].others():  # another engine of this process still holds its memory
        return
    used = engines_vllm.settled(engines_vllm.nvml_used, lambda u: not u or u[0] <= baseline[0] + SETTLE_SLACK)
    back = bool(used and used[0] <= baseline[0] + SETTLE_SLACK)
    for e in group:
        e.facts["vram_group_back_to_baseline"] = back
        if e.facts.get("vram_back_to_baseline") is None and e.facts.get("vram_check", "").startswith("not per"):
            e.facts.update({"vram_back_to_baseline": back, "vram_after_close_bytes": used[0] if used else None,
                            "vram_check": "the whole GPU, once every engine started with it had closed"})


def _start_group(entries: dict[int, Any]) -> tuple[dict[int, Engine | Exception], Any]:
    """Launch every engine (each spawn in turn: a worker inherits the environment of its own launch), then wait for
    each to be ready; the GPU's memory before the first launch is every one's baseline. `entries`: (the caller's
    engine, its together config), or the exception that refused it (handed back as it is). Interrupted (Kernel →
    Interrupt), every engine launched so far is closed before it propagates."""
    baseline = engines_vllm.nvml_used()
    got: dict[int, Engine | Exception] = {}
    launched = 0  # engines whose starts ran side by side (one that then failed included)
    t0 = time.perf_counter()
    try:
        with environ(SPARE_ENV, None):  # no spare worker: every engine of the group is spawned now, side by side
            for j, entry in entries.items():
                if isinstance(entry, Exception):
                    got[j] = entry
                    continue
                caller, config = entry
                try:
                    got[j] = caller.resized(config).launch()
                    launched += 1
                except Exception as e:  # noqa: BLE001 - refused or failed: it gets its turn alone
                    got[j] = e
        for j, e in list(got.items()):
            if not isinstance(e, Exception):
                e.baseline = baseline
                try:
                    e.wait_ready()
                except Exception as err:  # noqa: BLE001 - the worker closed; the others go on
                    e.close(force=True)
                    got[j] = err
    except BaseException:
        for e in got.values():
            if not isinstance(e, Exception):
                e.close(force=True)
        raise
    wall = time.perf_counter() - t0
    for e in got.values():
        if not isinstance(e, Exception):
            e.facts["together"] = {"engines": launched, "group_start_s": wall,
                                   "kv_cache_memory_bytes": e.vllm_config().kv_cache_memory_bytes}
    return got, baseline
