"""Lab 07's scarce-memory run on vLLM: the simulator's evictions checked against vLLM's own block pool.

Step 8 simulates a pool too small for eight distinct 128-token system prompts. Here vLLM gets a pool of that very
size: `num_gpu_blocks_override` = the simulator's capacity + 1, because vLLM's `BlockPool` takes block 0 as its
null block and never hands it out. One request at a time, one output token each (so a request holds its prompt's
blocks and no more), each arrival order from a reset cache after a warm-up. vLLM's KV cache manager frees a
finished request's blocks last block first, the cached ones onto the tail of its free queue and a partial last
block (no hash) onto its head, and hands out, evicting what a block still caches, from the head: the simulator's
LRU (`mechanisms.prefix.PrefixCache.free`). So the prediction is exact: every request's
`num_cached_tokens` equals the simulator's at the same capacity. The offline counters are not compared: one request
at a time vLLM 0.26 drops the stats of steps without outputs (the lab's aside after step 9), so per request is the
measure.
"""
from __future__ import annotations

from typing import Any

from ... import validate
from ...config import VLLMConfig
from ...engines.vllm import VLLMEngine
from ...results.reference import recorded_facts
from ...session import live_label, live_or_recorded
from ...workloads import Request, Workload
from .runs import predict, run_from_empty_cache
from .simulated import BLOCK
from .workloads import LAB, ORDERS, embedded_tokenizer, distinct_prefix_prompts

CAPACITIES = (48, 80)  # blocks: at 48 round-robin keeps nothing that comes back; at 80 it loses some of it
MAX_MODEL_LEN = 512  # longer than any request here (at most ~190 tokens) and the warm-up; 32 blocks at least
KEY, STEP = "prefix_scarce", "prefix-scarce"  # the facts key record.record_scarce writes, and its step's name


def scarce_workload(order: str, tokenizer: Any = None) -> Workload:
    """`distinct_prefix_prompts` in one order as a workload the engines can be sent (text; one output token each).

    The prompts are the simulator's token ids decoded; what an engine is sent is re-tokenized, and the prediction
    is made on those very ids (`prefix.predict`), so the two always count the same tokens."""
    tok = embedded_tokenizer(tokenizer)
    reqs = []
    for k, ids in enumerate(distinct_prefix_prompts(order=order, tokenizer=tok)):
        text = tok.decode(ids, skip_special_tokens=True)
        reqs.append(Request(f"scarce-{order}-{k:03d}", text, ({"role": "user", "content": text},), 1,
                            len(tok(text)["input_ids"]), {"variant": "scarce", "order": order}))
    about = f"8 distinct 128-token system prompts, 4 requests each, {order}, one output token each"
    return Workload(f"scarce-{order}", 1, about, tuple(reqs), {"description": about, "num_requests": len(reqs),
                                                               "variant": "scarce", "order": order})


def scarce_row(result: Any, predicted: Any, order: str, capacity: int, kv_blocks: int | None) -> dict[str, Any]:
    """One order at one capacity: vLLM's cached tokens per request against the simulator's, and the verdict."""
    per_request = [{"request_id": r.request_id, "prompt_tokens": r.prompt_tokens, "predicted": p,
                    "vllm": r.cached_tokens} for r, p in zip(result.requests, predicted.cached_tokens, strict=True)]
    differ = [r for r in per_request if r["predicted"] != r["vllm"]]
    cached = sum(r["vllm"] or 0 for r in per_request)
    verdict = (f"{order}, {capacity} blocks: vLLM cached {cached:,} of {predicted.queries:,} prompt tokens, the "
               f"simulator {predicted.hits:,} ({predicted.evictions} hashes evicted): "
               + ("equal, request by request" if not differ else
                  f"{len(differ)} of {len(per_request)} requests differ (first: {differ[0]['request_id']}, vLLM "
                  f"{differ[0]['vllm']}, simulator {differ[0]['predicted']})"))
    return {"order": order, "num_blocks": capacity, "kv_blocks": kv_blocks, "requests": len(per_request),
            "queries": predicted.queries, "predicted_hits": predicted.hits, "vllm_cached": cached,
            "predicted_hit_rate": predicted.hit_rate, "vllm_hit_rate": cached / predicted.queries,
            "predicted_evictions": predicted.evictions, "per_request_exact": not differ, "differ": differ,
            "per_request": per_request, "verdict": verdict, "step": result.step}


def scarce_vllm_rows(capacities: tuple[int, ...] = CAPACITIES, orders: tuple[str, ...] = ORDERS, *,
                     store: Any = None, lab: str = LAB, results: list[Any] | None = None) -> list[dict[str, Any]]:
    """The embedded model on vLLM with a pool of each capacity (+ the null block), every order from a reset cache.

    Each run's Result goes to `store` (and is appended to `results`, when given); the refusals come first."""
    for order in orders:
        validate.choice("scarce_vllm_rows", "orders", order, ORDERS)
    need = -(-MAX_MODEL_LEN // BLOCK)
    validate.integers("scarce_vllm_rows", "capacities", capacities,
                      f"pools of at least {need} blocks ({MAX_MODEL_LEN} tokens, one request's room), e.g. (48, 80).",
                      need)
    rows = []
    for cap in capacities:
        # eager: what is read here is the pool's hits and evictions, not decode's speed, so the engine skips
        # torch.compile and capturing CUDA graphs (most of a start on the H200)
        config = VLLMConfig(gpu_memory_utilization=0.3, max_num_seqs=1, enable_prefix_caching=True,
                            max_model_len=MAX_MODEL_LEN, num_gpu_blocks_override=cap + 1, enforce_eager=True)
        with VLLMEngine("embedded", config) as eng:
            for order in orders:
                wl = scarce_workload(order, eng.tokenizer)
                result = run_from_empty_cache(eng, wl, True, lab, f"prefix-scarce-{order}-{cap}", store)
                if results is not None:
                    results.append(result)
                predicted = predict(wl, eng, block_size=int(eng.facts.get("block_size") or BLOCK), num_blocks=cap)
                rows.append({**scarce_row(result, predicted, order, cap, eng.facts.get("kv_blocks")),
                             "provenance": live_label()})
    return rows


def scarce_vllm(capacities: tuple[int, ...] = CAPACITIES, *, store: Any = None, force: bool | None = None) -> Any:
    """`scarce_vllm_rows` live on a GPU with vLLM; else what `--steps prefix-scarce` recorded, every capacity."""
    return live_or_recorded(lambda: scarce_vllm_rows(capacities, store=store), lambda: recorded_facts(KEY, STEP),
                            force=force, asked={"capacities": sorted(capacities)}, where={"capacities": "num_blocks"})


def pool_as_asked(rows: list[dict[str, Any]]) -> bool:
    """vLLM's pool held the blocks asked for: the capacity plus its null block."""
    return all(r["kv_blocks"] == r["num_blocks"] + 1 for r in rows)


def scarce_lines(shown: Any) -> str:
    """One verdict per order and capacity, every number from the rows."""
    if shown.value is None:
        return f"[{shown.label}]"
    return "\n".join(r["verdict"] for r in shown.value) + f"\n[{shown.label}]"
