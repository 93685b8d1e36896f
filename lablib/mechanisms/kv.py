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
so the contiguous figures here are a lower bound. The paged allocator itself, block
tables and all, is `lablib.mechanisms.paging`.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from lablib.mechanisms.checks import check_requests
from lablib.validate import integer
from lablib.models.architecture import (  # noqa: F401 (the formula, taught here)
    DTYPE_BYTES,
    bytes_per_element,
    kv_bytes_per_token,
)

Reserve = Literal["max_model_len", "max_possible"]


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int | str, context_len: int, batch: int
) -> int:
    """Bytes of K/V for `batch` sequences of `context_len` tokens each."""
    integer("kv_cache_bytes", "context_len", context_len, "pass the number of tokens per sequence.", 0)
    integer("kv_cache_bytes", "batch", batch, "pass the number of sequences.", 0)
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
    reqs = check_requests(requests)
    integer("simulate_fragmentation", "block_size", block_size, "use 16, vLLM's default.", 1)
    integer("simulate_fragmentation", "max_model_len", max_model_len, "use the model's context length, e.g. 2048.", 1)
    integer("simulate_fragmentation", "budget_tokens", budget_tokens, "pass the KV slots left after the weights.", 1)
    if reserve not in ("max_model_len", "max_possible"):
        raise ValueError(f"reserve={reserve!r} is not a policy: use 'max_model_len' or 'max_possible'.")
    if not isinstance(progress, (int, float)) or not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress={progress!r} is out of range: it must be in [0, 1]. Fix: 1.0 or 0.5.")
    longest_out = max(o for _, o in reqs)
    if max_new_tokens is None:
        max_new_tokens = longest_out
    integer("simulate_fragmentation", "max_new_tokens", max_new_tokens, "a smaller cap would truncate some requests.", longest_out)
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
