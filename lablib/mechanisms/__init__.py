"""Pure-Python teaching models of serving mechanisms: KV sizing, KV paging and batching schedules.

No torch, no numpy: each runs on the CPU in milliseconds, so labs can sweep them
interactively and tests can check them exactly.

The names below (kv, paging, batching) are re-exported here. The later labs' models are used
as modules, because their names overlap (each has its own roofline): `attention` (lab 02,
the IO model of naive and tiled attention), `prefix` (lab 07, the hashed-block prefix cache),
`speculative` (lab 08, acceptance maths and where speculation stops paying), `parallel`
(lab 09, one decode step under tensor parallelism) and `pipeline` (lab 09, pipeline stages and
the three ways to spend two GPUs), e.g. `from lablib.mechanisms import attention`. `gpus` is
the one spec-sheet table they (and the roofline above them) read.
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
