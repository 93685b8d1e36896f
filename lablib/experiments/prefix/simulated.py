"""Lab 07's simulator runs, on any machine: `mechanisms.prefix.simulate` on the embedded tokenizer's real token ids.

Each row is what vLLM's prefix cache should do, block by block (16 tokens, vLLM's default): a repeated
prompt caches its whole blocks but the last token (`repeat_rows`), chained hashes share blocks only over
a shared start (`chain_rows`), the hit rate grows with the shared prefix and loses the partial block at
its end (`prefix_length_rows`), and a cache too small for every prefix evicts (`scarce_memory_rows`,
`eviction_demo`). `experiments.prefix` sets the same prediction beside vLLM's own counters.
"""
from __future__ import annotations

from typing import Any

from ... import validate
from ...mechanisms.prefix import PrefixCacheResult, chain_hashes, simulate
from ...workloads import load_workload
from .workloads import (
    LENGTHS,
    ORDERS,
    token_ids,
    prefixed,
    embedded_tokenizer,
    distinct_prefix_prompts,
    shared_set,
    shared_tokens,
    variant,
)

BLOCK = 16  # vLLM's default block size, the simulator's here


def repeat_rows(engine: Any, lengths: tuple[int, ...] = (15, 16, 17, 48, 63, 64, 65, 100)) -> list[dict[str, Any]]:
    """The last-token rule on real token ids: a shipped prompt's first n tokens sent twice, what the second hits."""
    ids = token_ids(load_workload("shared-prefix-1024").head(1), engine)[0]
    validate.integers("repeat_rows", "lengths", lengths, f"prompt lengths up to {len(ids)} tokens.", 1, len(ids))
    rows = []
    for n in lengths:
        cached = simulate([ids[:n], ids[:n]], block_size=BLOCK).cached_tokens[1]
        rows.append({"prompt_tokens": n, "full_blocks": n // BLOCK, "cached_second_time": cached,
                     "recomputed": n - cached})
    return rows


def chain_rows(engine: Any, blocks: int = 10, base: str = "shared-prefix-128") -> list[dict[str, Any]]:
    """The chained hashes (first 8 hex digits) of two requests' first blocks, shared part first and line first.

    Shared part first, the two agree block for block over the shared prompt and differ after it; with a
    per-request line first they differ from block 0, and so in every later block, however much text they share."""
    wl = load_workload(base).head(2)
    first = [chain_hashes(p, BLOCK) for p in token_ids(wl, engine)]
    after = [chain_hashes(p, BLOCK) for p in token_ids(variant("shared-after", wl, engine.tokenizer), engine)]
    rows = []
    for i in range(blocks):
        a, b, c, d = (h[i][:8] if i < len(h) else None for h in (*first, *after))
        rows.append({"block": i, "tokens": f"{i * BLOCK}-{(i + 1) * BLOCK - 1}", "request 0": a, "request 1": b,
                     "shared": a is not None and a == b, "request 0, line first": c, "request 1, line first": d,
                     "shared, line first": c is not None and c == d})
    return rows


def prefix_length_rows(engine: Any, lengths: tuple[int, ...] = LENGTHS) -> list[dict[str, Any]]:
    """The simulator's hit rate against the shared-prefix length, each set as the engine would be sent it.

    `best_hit_rate` is what every shared token of every later request would give if partial blocks could be
    shared; the simulator's rate is lower by the partial block at the shared prompt's end (none when the shared
    prefix is a whole number of blocks)."""
    rows = []
    for n in lengths:
        wl = shared_set(n, getattr(engine, "tokenizer", None))
        ids = token_ids(wl, engine)
        got = simulate([(p, 1) for p in ids], block_size=BLOCK, keep_snapshots=False)
        shared = shared_tokens(ids)
        later = sorted(got.cached_tokens[1:])
        rows.append({"workload": wl.name, "shared_tokens": shared, "shared_full_blocks": shared // BLOCK,
                     "requests": len(ids), "cached_per_later_request": later[len(later) // 2],
                     "queries": got.queries, "hits": got.hits, "hit_rate": got.hit_rate,
                     "best_hit_rate": shared * (len(ids) - 1) / got.queries})
    return rows


def scarce_memory_rows(capacities: tuple[int, ...] = tuple(range(16, 161, 16)), prefixes: int = 8,
                       per_prefix: int = 4, prefix_tokens: int = 128, orders: tuple[str, ...] = ORDERS,
                       tokenizer: Any = None) -> list[dict[str, Any]]:
    """Hit rate and evictions against the cache's capacity (blocks), for each arrival order of distinct prefixes.

    One request at a time. `prefix_blocks` is what all the prefixes take together: with less room than that
    plus one request's own blocks, LRU evicts, and a prefix reused only after every other one (round-robin) is
    gone before it comes back."""
    tok, rows = embedded_tokenizer(tokenizer), []
    for order in orders:
        prompts = distinct_prefix_prompts(prefixes, per_prefix, prefix_tokens, order, tok)
        for cap in capacities:
            got = simulate([(p, 1) for p in prompts], block_size=BLOCK, num_blocks=cap, keep_snapshots=False)
            rows.append({"order": order, "num_blocks": cap, "prefix_blocks": prefixes * (prefix_tokens // BLOCK),
                         "queries": got.queries, "hits": got.hits, "hit_rate": got.hit_rate,
                         "evictions": got.evictions})
    return rows


def eviction_demo(num_blocks: int = 20, order: tuple[int, ...] = (0, 0, 1, 2, 0, 3, 1, 0, 2, 0),
                  tokenizer: Any = None) -> PrefixCacheResult:
    """A pool small enough to evict: prefixes of 48 tokens (3 blocks), request k using prefix order[k], two at a time,
    4 tokens out each. Prefix 0 is popular: its blocks are shared while two requests hold them and stay cached
    between its uses; the rare ones are evicted before they come back."""
    validate.integers("eviction_demo", "order", order, "prefix indices 0..63, e.g. (0, 0, 1, 2, 0).", 0, 63)
    prompts = prefixed(list(order), 48, embedded_tokenizer(tokenizer))
    return simulate([(p, 4) for p in prompts], block_size=BLOCK, num_blocks=num_blocks, concurrency=2)
