"""Paging the KV cache: a pool of fixed-size blocks handed out through block tables.

vLLM's PagedAttention (Kwon et al., SOSP 2023) borrows the operating system's
virtual memory. The KV cache is one pool of physical blocks of block_size tokens
(16 by default). Each request owns a *block table*: its logical block i (tokens
i*block_size up to (i+1)*block_size - 1) maps to some physical block id, and the
attention kernel follows the table, so a request's K/V need not be contiguous.

That buys three things. A request takes a new block only when its last one is
full, so nothing is reserved for tokens not yet generated and at most one block
per request is partly empty (`lablib.mechanisms.kv` does that arithmetic). Any
free block serves any request, so there is no external fragmentation. And when
the pool runs dry mid-generation, the scheduler can preempt a request, return
its blocks to the free list and recompute it later.

`BlockAllocator` is the pool and its tables; `replay_block_allocation` runs a
workload through it one scheduler step at a time and returns an
`AllocatorSnapshot` per step, which `lablib.plots.block_table_heatmap` draws.
"""

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from lablib.mechanisms.checks import check_requests
from lablib.validate import integer


class OutOfBlocksError(RuntimeError):
    """Raised when a request needs a KV block and the free list is empty."""


class BlockAllocator:
    """A pool of num_blocks physical KV blocks, handed out through per-request block tables.

    A request's block table maps its logical block i (tokens i*block_size up to
    (i+1)*block_size - 1) to a physical block id. Physical blocks come from a
    free list and go back to it when the request is freed, so no two live
    requests ever share one and memory is never held for tokens not yet written.
    """

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        integer("BlockAllocator", "num_blocks", num_blocks, "give the cache at least one block.", 1)
        integer("BlockAllocator", "block_size", block_size, "use 16, vLLM's default.", 1)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[int, list[int]] = {}
        self._tokens: dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_tokens(self) -> int:
        return sum(self._tokens.values())

    def blocks_needed(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= len(self._free)

    def _take(self, request_id: int, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfBlocksError(
                f"request {request_id} needs {count} more block(s) but only {len(self._free)} of "
                f"{self.num_blocks} are free. Fix: free a finished request, preempt one, or give the cache more blocks."
            )
        return [self._free.popleft() for _ in range(count)]

    def _held(self, request_id: int) -> list[int]:
        if request_id not in self._tables:
            raise KeyError(f"request {request_id} holds no blocks: allocate it first.")
        return self._tables[request_id]

    def allocate(self, request_id: int, num_tokens: int) -> tuple[int, ...]:
        """Give a new request blocks for its first num_tokens tokens; returns its block table."""
        if request_id in self._tables:
            raise ValueError(f"request {request_id} already holds blocks: free it before allocating again.")
        integer("BlockAllocator.allocate", "num_tokens", num_tokens, "a request holds at least its first prompt token.", 1)
        self._tables[request_id] = self._take(request_id, self.blocks_needed(num_tokens))
        self._tokens[request_id] = num_tokens
        return tuple(self._tables[request_id])

    def can_append(self, request_id: int) -> bool:
        """True if the request can add one token (room in its last block, or a free block)."""
        return self._tokens[request_id] % self.block_size != 0 or len(self._free) > 0

    def append_token(self, request_id: int) -> int | None:
        """Add one token to a request; returns the physical block taken, or None if the last one had room."""
        table = self._held(request_id)
        new = None
        if self._tokens[request_id] % self.block_size == 0:
            new = self._take(request_id, 1)[0]
            table.append(new)
        self._tokens[request_id] += 1
        return new

    def free(self, request_id: int) -> int:
        """Return all of a request's blocks to the free list; returns how many."""
        table = self._held(request_id)
        self._free.extend(table)
        del self._tables[request_id], self._tokens[request_id]
        return len(table)

    def block_table(self, request_id: int) -> tuple[int, ...]:
        return tuple(self._held(request_id))

    def block_tables(self) -> dict[int, tuple[int, ...]]:
        return {rid: tuple(t) for rid, t in self._tables.items()}

    def tokens(self) -> dict[int, int]:
        return dict(self._tokens)


@dataclass(frozen=True)
class AllocatorSnapshot:
    """The block pool after one scheduler step of replay_block_allocation."""

    step: int  # scheduler step, from 0
    block_tables: dict[int, tuple[int, ...]]  # request id -> physical block ids, logical order
    tokens: dict[int, int]  # request id -> tokens it holds
    free_blocks: int  # blocks on the free list
    total_blocks: int  # blocks in the pool
    block_size: int  # tokens per block
    used_tokens: int  # tokens holding real K/V, all requests
    waiting: int  # requests not yet admitted (or preempted back)
    admitted: tuple[int, ...]  # requests admitted this step
    finished: tuple[int, ...]  # requests that finished and freed their blocks this step
    preempted: tuple[int, ...]  # requests evicted this step to make room (they restart later)

    @property
    def allocated_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    @property
    def waste_tokens(self) -> int:
        return self.allocated_blocks * self.block_size - self.used_tokens


def replay_block_allocation(
    requests: Sequence[tuple[int, int]], num_blocks: int, block_size: int = 16, max_num_seqs: int | None = None
) -> list[AllocatorSnapshot]:
    """Run (prompt_len, output_len) requests through a BlockAllocator, one snapshot per step.

    Each step: every running request appends one token (a request holds
    prompt_len tokens once admitted and finishes holding prompt_len + output_len);
    finished requests free their blocks; then waiting requests are admitted in
    order while their prompt's blocks are free (and fewer than max_num_seqs
    run). When a running request needs a block and none is free, the most
    recently admitted request is preempted: its blocks are freed and it goes
    back to the front of the queue to start again (vLLM's recompute preemption).
    """
    reqs = check_requests(requests)
    alloc = BlockAllocator(num_blocks, block_size)
    if max_num_seqs is not None:
        integer("replay_block_allocation", "max_num_seqs", max_num_seqs, "allow at least one running request, or pass None.", 1)
    for i, (p, o) in enumerate(reqs):
        if alloc.blocks_needed(p + o) > num_blocks:
            raise ValueError(
                f"num_blocks={num_blocks} cannot hold even one request: requests[{i}] needs "
                f"{alloc.blocks_needed(p + o)} blocks of {block_size} tokens. Fix: raise num_blocks."
            )
    waiting: deque[int] = deque(range(len(reqs)))
    running: list[int] = []
    generated = [0] * len(reqs)
    snapshots: list[AllocatorSnapshot] = []
    while waiting or running:
        admitted, finished, preempted = [], [], []
        for rid in list(running):
            if rid not in running:
                continue
            while not alloc.can_append(rid):
                victim = running.pop()
                alloc.free(victim)
                generated[victim] = 0
                waiting.appendleft(victim)
                preempted.append(victim)
                if victim == rid:
                    break
            if rid in running:
                alloc.append_token(rid)
                generated[rid] += 1
                if generated[rid] == reqs[rid][1]:
                    finished.append(rid)
        for rid in finished:
            running.remove(rid)
            alloc.free(rid)
        room = max_num_seqs or len(reqs)
        while waiting and not preempted and len(running) < room and alloc.can_allocate(reqs[waiting[0]][0]):
            rid = waiting.popleft()
            alloc.allocate(rid, reqs[rid][0])
            running.append(rid)
            admitted.append(rid)
        snapshots.append(AllocatorSnapshot(
            len(snapshots), alloc.block_tables(), alloc.tokens(), alloc.num_free_blocks, num_blocks, block_size,
            alloc.used_tokens, len(waiting), tuple(admitted), tuple(finished), tuple(preempted),
        ))
    return snapshots
