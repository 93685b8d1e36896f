"""Prefix caching on this machine, in transformers: the shared prefix's K/V computed once, reused by every request.

What vLLM's prefix cache does on a GPU can be measured on any CPU with the embedded model. Cold, each request's
prefill runs over its whole prompt. Warm, the shared prefix is prefilled once and its cache (a transformers
`DynamicCache`) is copied for each request, cut to what vLLM would reuse (whole 16-token blocks of the shared
part, never the prompt's last token: `mechanisms.prefix`'s rules), and only the rest of the prompt is run. The
time to the first token is the prefill's time, so the saving is what a user with a shared system prompt gets.

Both ways must give the same next token: the cached K/V are the same numbers computed in another batch shape,
so the logits agree to float rounding (float32 on the CPU: ~1e-5), not bit for bit; `max_logit_diff` says how
close. The first request pays for the prefix once (`prefix_s`), as in vLLM: caching moves that cost, it does
not remove it.
"""
from __future__ import annotations

import copy
import time
from typing import Any

from ... import validate
from ...bench.offline import prepare
from ...config import BenchConfig
from ...hardware.device import torch_threads
from ...stats import percentile
from ...workloads import load_workload
from .workloads import shared_tokens


def reusable_tokens(prompt_len: int, shared: int, block_size: int = 16) -> int:
    """The prompt tokens vLLM would find cached: whole blocks of the shared part, never the last prompt token."""
    validate.integer("reusable_tokens", "block_size", block_size, "e.g. 16 (vLLM's default).")
    whole = (min(shared, prompt_len - 1) // block_size) * block_size
    return max(whole, 0)


def _forward(model: Any, ids: list[int], cache: Any = None) -> Any:
    """One prefill pass over `ids` (after `cache`'s tokens, when given); the model's output, its cache extended."""
    import torch  # deferred: torch

    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)


def _first_token(model: Any, ids: list[int], cache: Any = None) -> tuple[int, Any, float]:
    t0 = time.perf_counter()
    logits = _forward(model, ids, cache).logits[0, -1].float()
    return int(logits.argmax()), logits, time.perf_counter() - t0


def reuse_study(engine: Any, workload: str = "shared-prefix-512", requests: int = 8, rounds: int = 3,
                block_size: int = 16, threads: int | None = 1) -> dict[str, Any]:
    """Cold and warm prefill of the same requests on `engine` (an HFEngine), `rounds` times, interleaved.

    Returns per request (its prompt and reused tokens, cold and warm seconds as medians over the rounds, whether
    the first tokens agree, the largest logit difference) and a summary: the median TTFT both ways, their ratio,
    the share of prompt tokens reused, and `prefix_s`, what prefilling the shared prefix once cost."""
    validate.integer("reuse_study", "requests", requests, "e.g. 8 requests of the shared-prefix set.")
    validate.integer("reuse_study", "rounds", rounds, "e.g. 3 (the median of each request's rounds is kept).")
    model = engine.model
    if getattr(engine, "device", "cpu") != "cpu":
        raise ValueError(f"reuse_study.engine: on {engine.device}; allowed an HFEngine on the CPU (this step measures "
                         "the CPU; vLLM's prefix cache is the GPU's, in step 7). Fix: lablib.HFEngine('embedded', "
                         "lablib.HFConfig(device='cpu')).")
    wl = load_workload(workload, limit=requests)
    ids = [list(p.prompt_ids) for p in prepare(wl, engine, BenchConfig(warmup_requests=0))]
    shared = shared_tokens(ids)
    reuse = [reusable_tokens(len(p), shared, block_size) for p in ids]
    prefix_len = max(reuse)  # the longest reusable run: every request's reuse is a prefix of it
    cold: list[list[float]] = [[] for _ in ids]
    warm: list[list[float]] = [[] for _ in ids]
    agree, diffs, prefix_s = [True] * len(ids), [0.0] * len(ids), []
    with torch_threads(threads):
        _first_token(model, ids[0][:32])  # warm-up: kernels and allocator, not timed
        for _ in range(rounds):
            t0 = time.perf_counter()
            prefix_cache = _forward(model, ids[0][:prefix_len]).past_key_values if prefix_len else None
            prefix_s.append(time.perf_counter() - t0)
            for i, p in enumerate(ids):
                tok_cold, logits_cold, s_cold = _first_token(model, p)
                t0 = time.perf_counter()  # the warm side pays for its copy of the prefix's cache (vLLM shares
                cache = None  # blocks by reference; a DynamicCache is extended in place, so each request needs one)
                if reuse[i]:
                    cache = copy.deepcopy(prefix_cache)
                    if reuse[i] < prefix_len:
                        cache.crop(reuse[i] - prefix_len)  # a negative count drops that many tokens from the end
                tok_warm, logits_warm, _ = _first_token(model, p[reuse[i]:], cache)
                warm[i].append(time.perf_counter() - t0)
                cold[i].append(s_cold)
                agree[i] = agree[i] and tok_cold == tok_warm
                diffs[i] = max(diffs[i], float((logits_cold - logits_warm).abs().max()))
    rows = [{"request": r.id, "prompt_tokens": len(p), "reused_tokens": n, "cold_ms": 1e3 * percentile(c, 50),
             "warm_ms": 1e3 * percentile(w, 50), "same_first_token": a, "max_logit_diff": d}
            for r, p, n, c, w, a, d in zip(wl.requests, ids, reuse, cold, warm, agree, diffs)]
    cold_p50 = percentile([r["cold_ms"] for r in rows], 50)
    warm_p50 = percentile([r["warm_ms"] for r in rows], 50)
    return {"rows": rows, "workload": workload, "shared_tokens": shared, "block_size": block_size, "rounds": rounds,
            "threads": threads, "cold_ttft_p50_ms": cold_p50, "warm_ttft_p50_ms": warm_p50,
            "speedup": cold_p50 / warm_p50 if warm_p50 else None,
            # what skipping the reused tokens would give if a prefill cost only its tokens (no fixed cost per pass)
            "speedup_bound": sum(len(p) for p in ids) / sum(len(p) - n for p, n in zip(ids, reuse)),
            "reused_share": sum(reuse) / sum(len(p) for p in ids), "prefix_ms": 1e3 * percentile(prefix_s, 50)}


def reuse_lines(study: dict[str, Any], label: str = "live on this machine's CPU") -> str:
    """The study in two sentences, its numbers from the run (which `reuse_study` made on the CPU, GPU or not)."""
    return (f"{study['workload']}, {len(study['rows'])} requests sharing {study['shared_tokens']} prompt tokens: "
            f"{study['reused_share']:.0%} of the prompt tokens reused (whole {study['block_size']}-token blocks). "
            f"Median TTFT {study['cold_ttft_p50_ms']:.1f} ms cold, {study['warm_ttft_p50_ms']:.1f} ms with the "
            f"prefix's K/V reused ({study['speedup']:.1f}x, against {study['speedup_bound']:.1f}x if a prefill cost only "
            "its tokens: a forward pass has a fixed cost too, and each request copies the prefix's cache), after "
            f"{study['prefix_ms']:.1f} ms to prefill the prefix once [{label}, {study['threads']} torch thread(s), "
            f"median of {study['rounds']} rounds]")
