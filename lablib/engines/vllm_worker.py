"""The child side of the vLLM engine: runs in its own (spawned) process, owns the GPU.

Protocol over a multiprocessing Pipe (tuples, first item the kind):
  parent → worker: ("generate", [request dicts]), ("prompt_logprobs", [token id lists]), ("reset_prefix_cache",),
                   ("close",)
  worker → parent: ("ready", facts), ("record", record dict), ("done", run facts), ("logprobs", [float lists]),
                   ("reset", bool), ("error", message, detail)

The worker drives vLLM's own engine loop (`llm_engine.add_request`, then `llm_engine.step()` until
nothing is unfinished: what `LLM.generate` does inside) so that each finished request can
be sent back while the others still run, and so that every output token gets a time stamp
as it leaves the engine (`RequestOutputKind.DELTA`). The clock is `time.monotonic`, the
one vLLM's engine core stamps its own per-request metrics with, so both agree.

Its stdout and stderr go to a log file the parent reads on failure (the worker's own
message) and for engine facts vLLM prints rather than exposes (attention backend).
"""
from __future__ import annotations

import gc
import itertools
import os
import re
import sys
import time
import traceback
from typing import Any


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)


def attention_backends(log: str) -> list[str]:
    """The attention backends vLLM says it chose, in order. It words it two ways: "Using FLASH_ATTN attention
    backend out of potential backends: [...]" when it picks, "Using AttentionBackendEnum.FLASH_ATTN backend." when
    `attention_backend` forces one (vLLM 0.26)."""
    return re.findall(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+)(?: attention)? backend", log)


def _facts(llm: Any, startup_s: float, log_path: str) -> dict[str, Any]:
    cfg = llm.llm_engine.vllm_config
    cache, sched, model = cfg.cache_config, cfg.scheduler_config, cfg.model_config
    blocks = cache.num_gpu_blocks or 0
    log = open(log_path, errors="replace").read()
    backend = attention_backends(log)
    import vllm  # deferred: vllm

    return {
        "startup_s": startup_s, "kv_blocks": blocks, "block_size": cache.block_size,
        "kv_tokens": blocks * cache.block_size, "max_model_len": model.max_model_len,
        "max_concurrency": blocks * cache.block_size / model.max_model_len if model.max_model_len else None,
        "max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens,
        "kv_cache_dtype": str(cache.cache_dtype), "dtype": str(model.dtype).replace("torch.", ""),
        "attention_backend": backend[0] if backend else "unknown", "vllm": vllm.__version__,
        "cuda_graphs": not model.enforce_eager,
    }


def _metrics(llm: Any) -> dict[str, Any]:
    """Counters and gauges from `LLM.get_metrics()` (prefix-cache hits, KV usage, spec-decode acceptance), and its
    one Vector, `vllm:spec_decode_num_accepted_tokens_per_pos` (a list of counts, one per draft position)."""
    out: dict[str, Any] = {}
    try:
        for m in llm.get_metrics():
            value, values = getattr(m, "value", None), getattr(m, "values", None)
            if isinstance(value, (int, float)):
                out[m.name] = out.get(m.name, 0.0) + float(value)
            elif isinstance(values, (list, tuple)) and all(isinstance(v, (int, float)) for v in values):
                old = out.get(m.name, [])  # summed over engines, position by position
                out[m.name] = [a + b for a, b in itertools.zip_longest(old, values, fillvalue=0)]
    except Exception as e:  # metrics are a bonus; never fail a run over them
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def _minus(after: Any, before: Any) -> Any:
    """A counter's growth over a run; for a Vector, position by position (a position new in the run counts whole)."""
    if isinstance(after, list):
        before = before if isinstance(before, list) else []
        return [a - (before[i] if i < len(before) else 0) for i, a in enumerate(after)]
    return after - before


def _generate(llm: Any, requests: list[dict[str, Any]], conn: Any) -> None:
    from vllm import SamplingParams  # deferred: vllm
    from vllm.inputs import TokensPrompt  # deferred: vllm
    from vllm.sampling_params import RequestOutputKind  # deferred: vllm

    params = [SamplingParams(max_tokens=r["max_new_tokens"], ignore_eos=True, temperature=0.0, detokenize=False,
                             output_kind=RequestOutputKind.DELTA) for r in requests]
    prompts = [TokensPrompt(prompt_token_ids=list(r["prompt_ids"])) for r in requests]
    engine = llm.llm_engine
    before = _metrics(llm)  # counters are cumulative: the run's own share is after - before
    t0 = time.monotonic()
    by_id: dict[str, tuple] = {}
    for i, (r, p, sp) in enumerate(zip(requests, prompts, params)):  # DELTA outputs: a time stamp for every token
        state = (r, [], [], [None])  # request, token times, token ids, num_cached_tokens
        by_id[f"lab-{i}-{r['request_id']}"] = state  # outputs carry this id
        by_id[engine.add_request(f"lab-{i}-{r['request_id']}", p, sp) or f"lab-{i}-{r['request_id']}"] = state
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.monotonic() - t0
        for o in outs:
            r, times, toks, cached = by_id[o.request_id]
            if cached[0] is None and getattr(o, "num_cached_tokens", None) is not None:
                cached[0] = int(o.num_cached_tokens)  # set once the prompt is scheduled
            new = list(o.outputs[0].token_ids) if o.outputs else []
            times.extend([now] * len(new))
            toks.extend(new)
            if o.finished:
                m = getattr(o, "metrics", None)
                sched = getattr(m, "scheduled_ts", 0.0) if m is not None else 0.0
                conn.send(("record", {
                    "request_id": r["request_id"], "prompt_tokens": len(r["prompt_ids"]), "output_tokens": len(toks),
                    "arrival": 0.0, "start": sched - t0 if sched else None,
                    "first_token": times[0] if times else None, "last_token": times[-1] if times else None,
                    "finished": now, "token_times": times, "output_ids": toks, "cached_tokens": cached[0]}))
    after = _metrics(llm)
    delta = {k: _minus(after[k], before[k]) for k in after if k in before and k != "error"}
    conn.send(("done", {"wall_s": time.monotonic() - t0, "metrics": after, "metrics_delta": delta}))


def _prompt_logprobs(llm: Any, prompts: list[list[int]]) -> list[list[float]]:
    """Each prompt's log-probability of every token after its first, as the model scores its own prompt (what
    perplexity needs): `SamplingParams(max_tokens=1, prompt_logprobs=0)`; vLLM's entry 0 is None (the first token
    is never predicted), each later one holds the prompt token's Logprob."""
    from vllm import SamplingParams  # deferred: vllm
    from vllm.inputs import TokensPrompt  # deferred: vllm

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    return [[float(o.prompt_logprobs[i][p[i]].logprob) for i in range(1, len(p))]  # by index: a list, or vLLM's
            for o, p in zip(outs, prompts)]  # FlatLogprobs (its slices re-base their indices)


def worker_main(conn: Any, model: str, tokenizer: str | None, llm_kwargs: dict[str, Any], log_path: str,
                skip_tokenizer_init: bool) -> None:
    """Start vLLM, answer generate requests until told to close, then free the GPU."""
    _redirect_output(log_path)
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # greedy only; skips a 1-1.5 min JIT on a fresh machine
    try:
        from vllm import LLM  # deferred: vllm

        t0 = time.monotonic()
        llm = LLM(model=model, tokenizer=tokenizer, disable_log_stats=False, skip_tokenizer_init=skip_tokenizer_init,
                  **llm_kwargs)
        conn.send(("ready", _facts(llm, time.monotonic() - t0, log_path)))
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] == "close":
            break
        if msg[0] == "reset_prefix_cache":  # between measurements: the next run starts with an empty cache
            try:
                conn.send(("reset", bool(llm.reset_prefix_cache())))
            except BaseException as e:
                conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
            continue
        try:
            if msg[0] == "prompt_logprobs":
                conn.send(("logprobs", _prompt_logprobs(llm, msg[1])))
            else:
                _generate(llm, msg[1], conn)
        except BaseException as e:
            conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
    del llm
    gc.collect()


def spare_main(conn: Any, log_path: str) -> None:
    """A worker made before its engine is asked for (`VLLMEngine`'s spare, LABLIB_VLLM_SPARE=1): it imports vLLM
    now, while the engine before it starts (20-30 s of every engine's start on the H200's host), says so
    ("spare_ready"), then waits for its engine: ("start", model, tokenizer, llm_kwargs, log_path,
    skip_tokenizer_init, env). `env` is every VLLM_* variable as the engine's caller has it (None: unset), applied
    before vLLM reads them (it reads them when an engine starts, not at import); then it is that engine's worker."""
    _redirect_output(log_path)
    try:
        t0 = time.monotonic()
        import vllm  # deferred: vllm (imported ahead of its engine: the point of a spare)

        conn.send(("spare_ready", time.monotonic() - t0))
        msg = conn.recv()
    except EOFError:  # its owner ended without using it
        return
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
        return
    if msg[0] != "start":
        return
    _, model, tokenizer, llm_kwargs, engine_log, skip_tokenizer_init, env = msg
    for key in [k for k in os.environ if k.startswith("VLLM_") and k not in env]:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if v is not None})
    worker_main(conn, model, tokenizer, llm_kwargs, engine_log, skip_tokenizer_init)
