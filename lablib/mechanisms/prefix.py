"""Prefix caching: reuse the K/V of a prompt's start that an earlier request already computed.

Requests that open with the same tokens (a system prompt, few-shot examples, the
earlier turns of a chat) compute the same keys and values for them. vLLM's V1 KV
cache manager keeps those blocks after a request ends and hands them to the next
request whose prompt starts the same way, so its prefill only computes the rest.

Only full blocks are hashed. A block that is still filling will be written again by
its owner, so it cannot be shared; a full block's K/V never changes. Its hash is
chained: hash(parent's hash, this block's token ids). A token's K/V depends on every
token before it, and the chain says the same: a hit on block i means blocks 0..i
all matched. Lookup walks from the first block and stops at the first miss. So the
shared part must come first: five per-request tokens (a date, a user name) in front
of a shared system prompt change the first block's hash and with it every later one,
and nothing hits.

The last prompt token is always recomputed: sampling the first output token needs
its logits, so at least one token must go through the model. vLLM caps a hit at
N - 1 tokens and rounds down to whole blocks: a 64-token prompt seen again reports
48 cached tokens (block 16), a 65-token one 64.

Blocks carry reference counts. A block whose count drops to 0 keeps its K/V and its
hash and joins the tail of a free queue; a new block comes from the queue's head,
and if it still held a hash that hash is evicted (LRU: the least recently freed
block goes first). A request's blocks are freed in reverse, so its tail, the part
least likely to be shared, is evicted before its prefix; a freed block with no hash
(a partial last block: nothing in it can be reused) goes to the head instead, to be
handed out before any cached block is evicted (vLLM's `BlockPool.free_blocks`). A
block in use is never evicted. The counters are vLLM's, in tokens: `vllm:prefix_cache_queries` adds each
request's prompt length, `vllm:prefix_cache_hits` its cached tokens.

`PrefixCache` is the pool; `simulate` runs a workload of token ids through it, with a
`CacheSnapshot` per step, into a `PrefixCacheResult`; `predict_hits` is the shortcut
for a cache that never evicts.
"""

import hashlib
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from lablib.validate import integer, refuse

ROOT_HASH = ""  # the parent hash of a prompt's first block


class CacheFullError(RuntimeError):
    """Raised when a request needs new KV blocks and too few are free or evictable."""


def block_hash(parent: str, token_ids: Sequence[int]) -> str:
    """One full block's chained hash: sha256 over the parent's hash and this block's token ids (hex)."""
    return hashlib.sha256(f"{parent}|{tuple(token_ids)!r}".encode()).hexdigest()


def chain_hashes(token_ids: Sequence[int], block_size: int) -> list[str]:
    """The hash of every full block of token_ids, each chained to the one before; a partial tail has none."""
    hashes, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


def _token_ids(owner: str, field: str, token_ids: object) -> list[int]:
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence) or len(token_ids) == 0:
        raise refuse(owner, field, token_ids, "a non-empty list of token ids (ints >= 0)",
                     "tokenize the text first, e.g. tokenizer(text).input_ids.")
    for j, t in enumerate(token_ids):
        integer(owner, f"{field}[{j}]", t, "token ids are vocabulary indices: ints >= 0.", minimum=0)
    return list(token_ids)


class PrefixCache:
    """num_blocks KV blocks of block_size tokens, shared between requests through chained block hashes.

    vLLM holds back one more block (block 0, the null block for padding); num_blocks here
    counts the blocks requests can use.
    """

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        integer("PrefixCache", "num_blocks", num_blocks, "give the cache at least one block.", 1)
        integer("PrefixCache", "block_size", block_size, "use 16, vLLM's default.", 1)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_counts = [0] * num_blocks
        self.hash_of: list[str | None] = [None] * num_blocks
        self._by_hash: dict[str, dict[int, None]] = {}  # hash -> blocks holding it (two can, see allocate)
        self._free: dict[int, None] = dict.fromkeys(range(num_blocks))  # LRU order: first key goes first
        self._tables: dict[int, list[int]] = {}
        self._ids: dict[int, list[int] | None] = {}  # known token ids; None once tokens of unknown id arrive
        self._tokens: dict[int, int] = {}
        self.queries = self.hits = self.evictions = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free queue, cached or not: all can be handed out."""
        return len(self._free)

    def lookup(self, token_ids: Sequence[int]) -> list[int]:
        """The blocks serving the longest cached prefix, at most len - 1 tokens; changes nothing."""
        usable = (len(token_ids) - 1) // self.block_size * self.block_size
        hit = []
        for h in chain_hashes(token_ids[:usable], self.block_size):
            holders = self._by_hash.get(h)
            if not holders:
                break
            hit.append(next(iter(holders)))
        return hit

    def blocks_to_admit(self, token_ids: Sequence[int], extra_tokens: int = 0) -> int:
        """Free-queue blocks a request would take: new blocks for prompt + extra_tokens beyond its hit,
        plus the hit blocks it pulls off the free queue (cached, but no longer evictable)."""
        hit = self.lookup(token_ids)
        new = math.ceil((len(token_ids) + extra_tokens) / self.block_size) - len(hit)
        return new + sum(self.ref_counts[b] == 0 for b in hit)

    def allocate(self, request_id: int, token_ids: Sequence[int]) -> int:
        """Admit a request: reuse its cached prefix, take blocks for the rest, register its full blocks.

        Returns the cached tokens (vLLM's num_cached_tokens). Full blocks are registered at once, as
        vLLM does when it schedules a whole prompt in one step (a chunked prefill registers chunk by
        chunk). A block the last-token rule kept from hitting is computed and registered again: two
        blocks then hold one hash, and lookups take the first.
        """
        if request_id in self._tables:
            raise refuse("PrefixCache.allocate", "request_id", request_id, "an id not already running",
                         "free the request first, or give the new one another id.")
        ids = _token_ids("PrefixCache.allocate", "token_ids", token_ids)
        hit = self.lookup(ids)
        need = math.ceil(len(ids) / self.block_size) - len(hit)
        self._check_room(request_id, need, sum(self.ref_counts[b] == 0 for b in hit))
        for b in hit:
            if self.ref_counts[b] == 0:
                del self._free[b]
            self.ref_counts[b] += 1
        self._tables[request_id] = hit + [self._new_block() for _ in range(need)]
        self._ids[request_id], self._tokens[request_id] = ids, len(ids)
        self._register(request_id)
        cached = len(hit) * self.block_size
        self.queries += len(ids)
        self.hits += cached
        return cached

    def append(self, request_id: int, tokens: int | Sequence[int]) -> list[int]:
        """Add generated tokens whose K/V is now written; returns the blocks taken for them.

        Pass their ids and the blocks they fill are hashed and registered, as vLLM does, so the
        next turn of a chat hits them too. Pass a count when the ids are unknown: the block being
        filled and every later one stay unhashed, since the chain cannot continue past them.
        """
        table, known = self._held(request_id), self._ids[request_id]
        if isinstance(tokens, int):
            n = integer("PrefixCache.append", "tokens", tokens, "append at least one token.", minimum=1)
            self._ids[request_id] = None
        else:
            n = len(ids := _token_ids("PrefixCache.append", "tokens", tokens))
            if known is not None:
                known.extend(ids)
        need = math.ceil((self._tokens[request_id] + n) / self.block_size) - len(table)
        self._check_room(request_id, need, 0)
        new = [self._new_block() for _ in range(need)]
        table.extend(new)
        self._tokens[request_id] += n
        self._register(request_id)
        return new

    def free(self, request_id: int) -> int:
        """Release a request's blocks, last block first. Those no one else holds go back on the free queue as
        vLLM's `BlockPool.free_blocks` puts them: a cached one (it has a hash) at the tail, to be evicted last; one
        with nothing to reuse (a partial last block) at the head, to be handed out first."""
        table, unhashed = self._held(request_id), []
        for b in reversed(table):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                if self.hash_of[b] is None:
                    unhashed.append(b)
                else:
                    self._free[b] = None
        self._free = {**dict.fromkeys(unhashed), **self._free}
        del self._tables[request_id], self._ids[request_id], self._tokens[request_id]
        return len(table)

    def block_tables(self) -> dict[int, tuple[int, ...]]:
        return {rid: tuple(t) for rid, t in self._tables.items()}

    def snapshot(self, step: int = 0, admitted: Sequence[int] = (), finished: Sequence[int] = ()) -> "CacheSnapshot":
        return CacheSnapshot(step, tuple(self.ref_counts), tuple(h is not None for h in self.hash_of),
                             tuple(self._free), self.block_tables(), tuple(admitted), tuple(finished), self.evictions)

    def _held(self, request_id: int) -> list[int]:
        if request_id not in self._tables:
            raise KeyError(f"request {request_id} holds no blocks: allocate it first.")
        return self._tables[request_id]

    def _check_room(self, request_id: int, need: int, touched: int) -> None:
        room = len(self._free) - touched
        if need > room:
            raise CacheFullError(f"request {request_id} needs {need} new block(s) of {self.block_size} tokens but only "
                                 f"{room} of the {self.num_blocks} blocks are free or evictable; running requests hold the "
                                 "rest. Fix: give the cache more blocks (num_blocks; in vLLM gpu_memory_utilization) or "
                                 "run fewer requests at once.")

    def _new_block(self) -> int:
        b = next(iter(self._free))
        del self._free[b]
        h = self.hash_of[b]
        if h is not None:  # evict the hash it still held
            del self._by_hash[h][b]
            if not self._by_hash[h]:
                del self._by_hash[h]
            self.hash_of[b] = None
            self.evictions += 1
        self.ref_counts[b] = 1
        return b

    def _register(self, request_id: int) -> None:
        """Hash the request's full blocks of known ids not hashed yet (a held block never loses its hash)."""
        ids, table, bs = self._ids[request_id], self._tables[request_id], self.block_size
        for i in range(len(ids) // bs if ids else 0):
            if self.hash_of[table[i]] is None:
                h = block_hash(self.hash_of[table[i - 1]] if i else ROOT_HASH, ids[i * bs:(i + 1) * bs])
                self.hash_of[table[i]] = h
                self._by_hash.setdefault(h, {})[table[i]] = None


@dataclass(frozen=True)
class CacheSnapshot:
    """The block pool after one step of simulate (or whenever PrefixCache.snapshot is called)."""

    step: int  # scheduler step, from 0
    ref_counts: tuple[int, ...]  # per physical block: how many running requests hold it
    hashed: tuple[bool, ...]  # per physical block: holds a registered hash, so a later request can hit it
    free_queue: tuple[int, ...]  # blocks with no holder, the next one to be handed out (and evicted) first
    block_tables: dict[int, tuple[int, ...]]  # running request id -> its blocks, logical order
    admitted: tuple[int, ...]  # requests allocated this step
    finished: tuple[int, ...]  # requests freed this step
    evictions: int  # hashes evicted so far

    def states(self) -> tuple[str, ...]:
        """Per physical block: "in_use" (held), "cached" (free, hash kept) or "free" (free, nothing to reuse)."""
        return tuple("in_use" if r else "cached" if h else "free" for r, h in zip(self.ref_counts, self.hashed, strict=True))

    def blocks(self, state: str) -> tuple[int, ...]:
        """The blocks in one state ("in_use", "cached", "free"), by id."""
        return tuple(b for b, s in enumerate(self.states()) if s == state)


@dataclass(frozen=True)
class PrefixCacheResult:
    """What a workload did to a prefix cache: per request (workload order), in total, and step by step."""

    block_size: int  # tokens per block
    num_blocks: int  # capacity
    concurrency: int  # requests running at once, at most
    queried_tokens: tuple[int, ...]  # per request: prompt tokens looked up (its share of the queries)
    cached_tokens: tuple[int, ...]  # per request: prompt tokens served from the cache, vLLM's num_cached_tokens
    queries: int  # tokens: vllm:prefix_cache_queries
    hits: int  # tokens: vllm:prefix_cache_hits
    evictions: int  # cached hashes lost to make room
    snapshots: tuple[CacheSnapshot, ...]  # one per step (empty with keep_snapshots=False)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries


def _workload(requests: object) -> list[tuple[list[int], int, list[int] | None]]:
    if not isinstance(requests, Sequence) or len(requests) == 0:
        raise refuse("simulate", "requests", requests, "a non-empty list of requests",
                     "give each request as its prompt's token ids, or as (token_ids, output).")
    out = []
    for i, r in enumerate(requests):
        prompt, output = r if isinstance(r, tuple) and len(r) == 2 and not isinstance(r[0], int) else (r, 1)
        prompt = _token_ids("simulate", f"requests[{i}].token_ids", prompt)
        if isinstance(output, int):
            out.append((prompt, integer("simulate", f"requests[{i}].output", output,
                                        "an output length counts tokens (>= 1), or pass the output's ids."), None))
        else:
            ids = _token_ids("simulate", f"requests[{i}].output", output)
            out.append((prompt, len(ids), ids))
    return out


def simulate(requests: Sequence[Sequence[int] | tuple[Sequence[int], int | Sequence[int]]], block_size: int = 16,
             num_blocks: int | None = None, concurrency: int = 1, keep_snapshots: bool = True) -> PrefixCacheResult:
    """Run requests through a PrefixCache in order, at most `concurrency` at a time, one snapshot per step.

    A request is its prompt's token ids, or (token_ids, output): an output length (its blocks stay
    unhashed) or the output's token ids (hashed, as vLLM does). Each step the running requests
    decode one token, then waiting requests are admitted in order, then finished ones are freed.
    The last output token's K/V is never written (it is sampled, and the request ends), so an
    output of O tokens adds O - 1 tokens to the cache. A request is admitted only when its whole
    lifetime fits beside the blocks the running ones will still take: nothing is preempted
    (vLLM admits on the prompt and preempts later; with concurrency=1 the two agree).
    num_blocks=None gives every request its own blocks: nothing is ever evicted.
    """
    reqs = _workload(requests)
    integer("simulate", "block_size", block_size, "use 16, vLLM's default.", 1)
    integer("simulate", "concurrency", concurrency, "run at least one request at a time.", 1)
    life = [math.ceil((len(p) + o - 1) / block_size) for p, o, _ in reqs]
    if num_blocks is None:
        num_blocks = sum(life)
    biggest = max(range(len(reqs)), key=life.__getitem__)
    integer("simulate", "num_blocks", num_blocks, f"raise num_blocks, or shorten requests[{biggest}].", life[biggest])
    cache = PrefixCache(num_blocks, block_size)
    waiting, running = deque(range(len(reqs))), []
    produced, cached = [0] * len(reqs), [0] * len(reqs)
    snapshots = []
    step = 0
    while waiting or running:
        for rid in running:  # feed the last sampled token: its K/V is written, the next token sampled
            out_ids = reqs[rid][2]
            cache.append(rid, [out_ids[produced[rid] - 1]] if out_ids else 1)
            produced[rid] += 1
        admitted = []
        while waiting and len(running) < concurrency:
            rid = waiting[0]
            pending = sum(life[r] - len(cache._held(r)) for r in running)  # blocks the running will still take
            if cache.blocks_to_admit(reqs[rid][0], reqs[rid][1] - 1) > cache.num_free_blocks - pending:
                break
            waiting.popleft()
            cached[rid], produced[rid] = cache.allocate(rid, reqs[rid][0]), 1
            running.append(rid)
            admitted.append(rid)
        finished = [rid for rid in running if produced[rid] == reqs[rid][1]]
        for rid in finished:
            cache.free(rid)
            running.remove(rid)
        if keep_snapshots:
            snapshots.append(cache.snapshot(step, admitted, finished))
        step += 1
    return PrefixCacheResult(block_size, num_blocks, concurrency, tuple(len(p) for p, _, _ in reqs), tuple(cached),
                             cache.queries, cache.hits, cache.evictions, tuple(snapshots))


def predict_hits(prompts: Sequence[Sequence[int]], block_size: int = 16) -> list[int]:
    """Cached tokens per prompt for a cache that never evicts: simulate's answer with ample blocks.

    Counts prompt blocks only (outputs given as lengths, which stay unhashed).
    """
    integer("predict_hits", "block_size", block_size, "use 16, vLLM's default.", 1)
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise refuse("predict_hits", "prompts", prompts, "a non-empty list of prompts", "pass each prompt's token ids.")
    seen: set[str] = set()
    out = []
    for i, p in enumerate(prompts):
        ids = _token_ids("predict_hits", f"prompts[{i}]", p)
        hashes = chain_hashes(ids, block_size)
        n, usable = 0, (len(ids) - 1) // block_size
        while n < usable and hashes[n] in seen:
            n += 1
        out.append(n * block_size)
        seen.update(hashes)
    return out
