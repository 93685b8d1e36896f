"""Spec-sheet numbers of the GPUs the labs talk about: one table, every model reads it.

The roofline (MBU), the attention IO model (lab 02), the tensor-parallel cost model (lab 09) and
the fit view all need a GPU's memory bandwidth, bf16 peak and capacity; they take them from here,
so a corrected number is corrected everywhere. Pure data, standard library only.

Peaks are vendor datasheet numbers, dense (the datasheets' headline tensor numbers assume 2:4
sparsity and are twice these), tensor-core FLOPs with FP32 accumulate, bandwidth in bytes/s
(1 GB/s = 1e9 B/s), capacity in GB as the datasheet states it. None = not supported or not published.
"""
from __future__ import annotations

from dataclasses import dataclass

GB_S = 1e9  # 1 GB/s in bytes/s, as datasheets count it
TFLOPS = 1e12


@dataclass(frozen=True)
class GpuPeak:
    """Datasheet peaks of one GPU model."""

    name: str  # canonical key in GPU_PEAKS, e.g. "H100 SXM"
    peak_bw: float  # memory bandwidth, bytes/s
    bf16_flops: float | None  # dense bf16 tensor FLOP/s; None if the GPU has no bf16 tensor cores
    fp16_flops: float | None  # dense fp16 tensor FLOP/s (FP32 accumulate)
    fp8_flops: float | None  # dense fp8 tensor FLOP/s; None before Ada/Hopper
    memory_gb: float  # memory capacity as the datasheet states it

    def __post_init__(self) -> None:
        if not self.peak_bw > 0:
            raise ValueError(f"GpuPeak {self.name!r}: peak_bw={self.peak_bw!r} must be > 0 bytes/s")
        for field in ("bf16_flops", "fp16_flops", "fp8_flops"):
            value = getattr(self, field)
            if value is not None and not value > 0:
                raise ValueError(f"GpuPeak {self.name!r}: {field}={value!r} must be > 0 FLOP/s or None")
        if not self.memory_gb > 0:
            raise ValueError(f"GpuPeak {self.name!r}: memory_gb={self.memory_gb!r} must be > 0")

    @property
    def ridge_point(self) -> float | None:
        """FLOP/byte where the bf16 (else fp16) compute roof meets the bandwidth roof."""
        flops = self.bf16_flops or self.fp16_flops
        return flops / self.peak_bw if flops else None


GPU_PEAKS: dict[str, GpuPeak] = {p.name: p for p in [
    # NVIDIA T4 Tensor Core GPU datasheet: 320 GB/s, 65 TFLOPS mixed FP16/FP32; Turing has no bf16, no fp8
    GpuPeak("T4", 320 * GB_S, None, 65 * TFLOPS, None, 16),
    # NVIDIA L4 Tensor Core GPU datasheet: 300 GB/s, BF16/FP16 242* and FP8 485* TFLOPS (*sparse)
    GpuPeak("L4", 300 * GB_S, 121 * TFLOPS, 121 * TFLOPS, 242.5 * TFLOPS, 24),
    # AWS EC2 G5 documentation: 600 GB/s GDDR6. NVIDIA publishes no A10G datasheet, so no FLOPs
    GpuPeak("A10G", 600 * GB_S, None, None, None, 24),
    # NVIDIA A10 Tensor Core GPU datasheet: 600 GB/s, BF16/FP16 125 | 250* TFLOPS
    GpuPeak("A10", 600 * GB_S, 125 * TFLOPS, 125 * TFLOPS, None, 24),
    # NVIDIA A100 Tensor Core GPU datasheet: 40GB PCIe and SXM both 1,555 GB/s, BF16 312 TFLOPS
    GpuPeak("A100 40GB", 1555 * GB_S, 312 * TFLOPS, 312 * TFLOPS, None, 40),
    # NVIDIA A100 Tensor Core GPU datasheet: 80GB PCIe 1,935 GB/s, BF16 312 TFLOPS
    GpuPeak("A100 80GB PCIe", 1935 * GB_S, 312 * TFLOPS, 312 * TFLOPS, None, 80),
    # NVIDIA A100 Tensor Core GPU datasheet: 80GB SXM 2,039 GB/s, BF16 312 TFLOPS
    GpuPeak("A100 80GB SXM", 2039 * GB_S, 312 * TFLOPS, 312 * TFLOPS, None, 80),
    # NVIDIA L40S GPU datasheet: 864 GB/s, BF16/FP16 362.05 | 733*, FP8 733 | 1,466* TFLOPS
    GpuPeak("L40S", 864 * GB_S, 362.05 * TFLOPS, 362.05 * TFLOPS, 733 * TFLOPS, 48),
    # NVIDIA H100 Tensor Core GPU datasheet, PCIe: 2 TB/s, BF16 1,513*, FP8 3,026* TFLOPS
    GpuPeak("H100 PCIe", 2000 * GB_S, 756.5 * TFLOPS, 756.5 * TFLOPS, 1513 * TFLOPS, 80),
    # NVIDIA H100 Tensor Core GPU datasheet, SXM: 3.35 TB/s, BF16 1,979*, FP8 3,958* TFLOPS
    GpuPeak("H100 SXM", 3350 * GB_S, 989.5 * TFLOPS, 989.5 * TFLOPS, 1979 * TFLOPS, 80),
    # NVIDIA H100 Tensor Core GPU datasheet, NVL: 3.9 TB/s, BF16 1,671*, FP8 3,341* TFLOPS
    GpuPeak("H100 NVL", 3900 * GB_S, 835.5 * TFLOPS, 835.5 * TFLOPS, 1670.5 * TFLOPS, 94),
    # NVIDIA H200 Tensor Core GPU datasheet, SXM: 4.8 TB/s, BF16 1,979*, FP8 3,958* TFLOPS
    GpuPeak("H200", 4800 * GB_S, 989.5 * TFLOPS, 989.5 * TFLOPS, 1979 * TFLOPS, 141),
    # NVIDIA H200 Tensor Core GPU datasheet, NVL: 4.8 TB/s, BF16 1,671*, FP8 3,341* TFLOPS
    GpuPeak("H200 NVL", 4800 * GB_S, 835.5 * TFLOPS, 835.5 * TFLOPS, 1670.5 * TFLOPS, 141),
    # NVIDIA Ada Lovelace GPU Architecture whitepaper, RTX 4090: 1,008 GB/s, FP16/BF16 (FP32 acc.) 165.2, FP8 330.3
    GpuPeak("RTX 4090", 1008 * GB_S, 165.2 * TFLOPS, 165.2 * TFLOPS, 330.3 * TFLOPS, 24),
    # NVIDIA Ampere GA102 GPU Architecture whitepaper, RTX 3090: 936 GB/s, FP16/BF16 (FP32 acc.) 71 TFLOPS
    GpuPeak("RTX 3090", 936 * GB_S, 71 * TFLOPS, 71 * TFLOPS, None, 24),
]}


# NVIDIA Hopper tuning guide: 228 KB of shared memory per SM, up to 227 KB for one thread block (KB = 1024 B);
# 132 SMs on the H100/H200 SXM parts. What the attention IO model's SRAM size M is on Hopper.
HOPPER_SMEM_PER_SM_BYTES = 228 * 1024
HOPPER_SMEM_PER_BLOCK_BYTES = 227 * 1024
HOPPER_SXM_SMS = 132
