"""Pure-Python teaching models of serving mechanisms: KV sizing, KV paging and batching schedules.

No torch, no numpy: each runs on the CPU in milliseconds, so labs can sweep them
interactively and tests can check them exactly.
"""

from lablib.mechanisms.batching import (
    CostModel,
    RequestRecord,
    ScheduleResult,
    ScheduleSummary,
    StepRecord,
    continuous_batching,
    percentile,
    static_batching,
    summarise,
)
from lablib.mechanisms.kv import (
    DTYPE_BYTES,
    FragmentationReport,
    SchemeUsage,
    bytes_per_element,
    kv_bytes_per_token,
    kv_cache_bytes,
    simulate_fragmentation,
)
from lablib.mechanisms.paging import (
    AllocatorSnapshot,
    BlockAllocator,
    OutOfBlocksError,
    replay_block_allocation,
)

__all__ = [
    "DTYPE_BYTES",
    "AllocatorSnapshot",
    "BlockAllocator",
    "CostModel",
    "FragmentationReport",
    "OutOfBlocksError",
    "RequestRecord",
    "ScheduleResult",
    "ScheduleSummary",
    "SchemeUsage",
    "StepRecord",
    "bytes_per_element",
    "continuous_batching",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "percentile",
    "replay_block_allocation",
    "simulate_fragmentation",
    "static_batching",
    "summarise",
]
