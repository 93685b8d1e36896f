"""The KV cache: how big it is, and why vLLM stores it in fixed-size blocks.

Every token a model has seen leaves one key and one value vector per layer per
KV head, so the cache grows by a fixed number of bytes per token:

    bytes/token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element

Llama-3.1-8B in bf16 is 2 x 32 x 8 x 128 x 2 = 131072 bytes (128 KiB) per token:
one 8k-token sequence holds 1 GiB, and the batch a GPU can run is the memory
left after the weights divided by that.

How the memory is handed out decides how much of it holds real tokens.
A *contiguous* allocator must reserve a request's whole future up front, since
nobody knows its output length: max_model_len slots, or prompt + max_new_tokens.
A *paged* allocator (vLLM's PagedAttention, Kwon et al., SOSP 2023) gives each
request ceil(tokens / block_size) fixed-size blocks, mapped through a block table
like virtual memory pages, and takes a new block only when the last one is full.

What drives the waste: contiguous waste is 1 - (mean real length / reserved
length). Chat requests average a few hundred tokens against a 2048-token
reservation, hence the paper's 60-80%. Paged waste is only the unfilled tail of
each request's last block: under block_size tokens, about block_size / 2 on
average, i.e. a few percent once requests are a few hundred tokens long.
External fragmentation (holes between contiguous reservations) is not modelled,
so the contiguous figures here are a lower bound.
"""

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}

Reserve = Literal["max_model_len", "max_possible"]


def _require_int(name: str, value: object, minimum: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is out of range: it must be an integer >= {minimum}. Fix: {fix}")


def _check_requests(requests: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Validate (prompt_len, output_len) pairs; both must be integers >= 1."""
    if len(requests) == 0:
        raise ValueError("requests is empty: pass at least one (prompt_len, output_len) pair.")
    checked = []
    for i, pair in enumerate(requests):
        if len(pair) != 2:
            raise ValueError(f"requests[{i}]={pair!r} is not a (prompt_len, output_len) pair.")
        for name, value in zip(("prompt_len", "output_len"), pair):
            _require_int(f"requests[{i}].{name}", value, 1, "lengths count tokens; correct or drop that request.")
        checked.append((pair[0], pair[1]))
    return checked


def bytes_per_element(dtype: str) -> int:
    """Bytes per K/V element for a dtype name in DTYPE_BYTES."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not a known KV cache dtype: use one of {sorted(DTYPE_BYTES)}.")
    return DTYPE_BYTES[dtype]


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int | str) -> int:
    """K and V bytes one token adds to the cache; dtype_bytes may be a byte count or a DTYPE_BYTES name."""
    if isinstance(dtype_bytes, str):
        dtype_bytes = bytes_per_element(dtype_bytes)
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        _require_int(name, value, 1, "read it from the model's config.json.")
    _require_int("dtype_bytes", dtype_bytes, 1, f"pass a byte count or a name from {sorted(DTYPE_BYTES)}.")
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int | str, context_len: int, batch: int
) -> int:
    """Bytes of K/V for `batch` sequences of `context_len` tokens each."""
    _require_int("context_len", context_len, 0, "pass the number of tokens per sequence.")
    _require_int("batch", batch, 0, "pass the number of sequences.")
    return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes) * context_len * batch


@dataclass(frozen=True)
class SchemeUsage:
    """How one allocation scheme holds a workload's K/V at one snapshot."""

    scheme: str  # "contiguous" or "paged"
    reserved: tuple[int, ...]  # token slots each request holds
    used: tuple[int, ...]  # token slots of each request holding real K/V
    reserved_tokens: int  # sum of reserved
    used_tokens: int  # sum of used
    waste_fraction: float  # 1 - used / reserved: reservation waste plus internal fragmentation
    max_concurrent: int  # requests that fit in the budget at once (FCFS, workload repeated)


@dataclass(frozen=True)
class FragmentationReport:
    """Contiguous reservation against paging for one workload and one KV budget."""

    budget_tokens: int  # KV slots the GPU has after the weights
    block_size: int  # tokens per paged block
    reservation: int | None  # max_model_len reserved per request, or None for prompt + max_new_tokens
    progress: float  # fraction of each output generated at the snapshot
    contiguous: SchemeUsage
    paged: SchemeUsage

    def rows(self) -> list[dict[str, object]]:
        """One flat row per scheme, for a table or a bar chart."""
        keep = ("scheme", "reserved_tokens", "used_tokens", "waste_fraction", "max_concurrent")
        return [{k: getattr(s, k) for k in keep} for s in (self.contiguous, self.paged)]


def _fit_count(sizes: list[int], budget: int) -> int:
    """How many requests, taken in order and repeating the list, fit in budget."""
    full, rest = divmod(budget, sum(sizes))
    count = full * len(sizes)
    for size in sizes:
        if size > rest:
            break
        rest -= size
        count += 1
    return count


def _usage(scheme: str, reserved: list[int], used: list[int], fit: int) -> SchemeUsage:
    r, u = sum(reserved), sum(used)
    return SchemeUsage(scheme, tuple(reserved), tuple(used), r, u, 1.0 - u / r, fit)


def simulate_fragmentation(
    requests: Sequence[tuple[int, int]],
    budget_tokens: int,
    *,
    block_size: int = 16,
    max_model_len: int = 2048,
    reserve: Reserve = "max_model_len",
    max_new_tokens: int | None = None,
    progress: float = 1.0,
) -> FragmentationReport:
    """Compare contiguous reservation with paged blocks on (prompt_len, output_len) pairs.

    The snapshot is taken when every request has generated `progress` of its
    output: 1.0 is the kindest moment for contiguous reservation (every request
    at full length), 0.5 the average over a request's life. `reserve` picks the
    contiguous policy: "max_model_len" reserves max_model_len slots per request,
    "max_possible" reserves prompt_len + max_new_tokens (default: the longest
    output in the workload, the smallest cap that serves every request).
    """
    reqs = _check_requests(requests)
    _require_int("block_size", block_size, 1, "use 16, vLLM's default.")
    _require_int("max_model_len", max_model_len, 1, "use the model's context length, e.g. 2048.")
    _require_int("budget_tokens", budget_tokens, 1, "pass the KV slots left after the weights.")
    if reserve not in ("max_model_len", "max_possible"):
        raise ValueError(f"reserve={reserve!r} is not a policy: use 'max_model_len' or 'max_possible'.")
    if not isinstance(progress, (int, float)) or not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress={progress!r} is out of range: it must be in [0, 1]. Fix: 1.0 or 0.5.")
    longest_out = max(o for _, o in reqs)
    if max_new_tokens is None:
        max_new_tokens = longest_out
    _require_int("max_new_tokens", max_new_tokens, longest_out, "a smaller cap would truncate some requests.")
    for i, (p, o) in enumerate(reqs):
        if p + o > max_model_len:
            raise ValueError(
                f"requests[{i}] needs {p + o} tokens but max_model_len={max_model_len}. "
                "Fix: raise max_model_len or drop that request."
            )
    fixed = reserve == "max_model_len"
    reserved = [max_model_len if fixed else min(p + max_new_tokens, max_model_len) for p, _ in reqs]
    used = [p + math.floor(progress * o) for p, o in reqs]
    blocks = [math.ceil(u / block_size) for u in used]
    worst = max(max(reserved), max(math.ceil((p + o) / block_size) * block_size for p, o in reqs))
    if budget_tokens < worst:
        raise ValueError(
            f"budget_tokens={budget_tokens} cannot hold even one request: the largest needs {worst} tokens. "
            f"Fix: raise budget_tokens to at least {worst}, or lower max_model_len."
        )
    contiguous = _usage("contiguous", reserved, used, _fit_count(reserved, budget_tokens))
    paged = _usage("paged", [b * block_size for b in blocks], used, _fit_count(blocks, budget_tokens // block_size))
    reservation = max_model_len if fixed else None
    return FragmentationReport(budget_tokens, block_size, reservation, float(progress), contiguous, paged)


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
        _require_int("num_blocks", num_blocks, 1, "give the cache at least one block.")
        _require_int("block_size", block_size, 1, "use 16, vLLM's default.")
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
        _require_int("num_tokens", num_tokens, 1, "a request holds at least its first prompt token.")
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
    reqs = _check_requests(requests)
    alloc = BlockAllocator(num_blocks, block_size)
    if max_num_seqs is not None:
        _require_int("max_num_seqs", max_num_seqs, 1, "allow at least one running request, or pass None.")
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
