"""The decode roofline: how fast a GPU could possibly generate tokens, and how close we got.

A GPU has two speed limits: how many bytes per second it can read from memory
(`peak_bw`) and how many FLOPs per second its tensor cores can do (`peak_flops`).
Which one binds depends on arithmetic intensity, the FLOPs done per byte read.

Decode (one new token per sequence per step) must read every weight once per step,
plus the KV cache of every running sequence. For one sequence a weight of 2 bytes
(bf16) takes part in one multiply-add, 2 FLOPs: about 1 FLOP per byte. A batch of B
sequences reuses each weight B times, so intensity ~ B FLOP/byte. The GPU's ridge point,
peak_flops / peak_bw, is where the two limits meet; for an H200 it is
989.5e12 / 4.8e12 ~ 206 FLOP/byte. Decode at batch 1..~200 sits far left of it:
memory-bound, so the ceiling is bandwidth / bytes per step:

    ceiling_tok_s = batch * peak_bw / (weight_bytes + kv_bytes_per_token * batch * context_len)

An 8B model in bf16 (16.06e9 bytes) on an H200 tops out near 4.8e12 / 16.06e9 ~ 299
tok/s at batch 1, whatever the kernels. Batching is nearly free until the KV cache
grows to rival the weights, which is why servers batch.

Prefill processes a whole prompt of T tokens in one pass: each weight is read once and
used T times, intensity ~ T FLOP/byte, past the ridge for prompts of a few hundred
tokens. It is compute-bound: ceiling ~ peak_flops / (2 * params) tokens/s (ignoring
attention's own FLOPs, which grow with context).

MBU (model bandwidth utilisation) = achieved bytes/s / peak bytes/s is the honest score
for decode: 0.6-0.8 is good on modern GPUs. For a GPU not in `GPU_PEAKS` we report
"unknown" rather than guess a peak.

Peaks below are vendor datasheet numbers, dense (the datasheets' headline tensor
numbers assume 2:4 sparsity and are twice these), tensor-core FLOPs with FP32
accumulate, bandwidth in bytes/s (1 GB/s = 1e9 B/s). None = not supported or not published.
"""

from __future__ import annotations

import re
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

_VENDOR_WORDS = {"NVIDIA", "TESLA", "GEFORCE", ""}


def _tokens(name: str) -> frozenset[str]:
    """A device name as a set of upper-case words, vendor words dropped, SXM4/SXM5 -> SXM."""
    name = name.upper().replace("SXM4", "SXM").replace("SXM5", "SXM")
    return frozenset(t for t in re.split(r"[\s\-_]+", name) if t not in _VENDOR_WORDS)


# Device names of each GPU, compared as token sets: order and punctuation do not matter,
# but every token must be there and no other, so "H100" alone (which form factor?) or
# "RTX 4090 D" (a cut-down variant) match nothing rather than a guess.
_DEVICE_NAMES: dict[str, list[str]] = {
    "T4": ["T4"], "L4": ["L4"], "A10G": ["A10G"], "A10": ["A10"], "L40S": ["L40S"],
    "A100 40GB": ["A100 40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"],
    "A100 80GB PCIe": ["A100 80GB PCIe", "A100-PCIE-80GB"],
    "A100 80GB SXM": ["A100 80GB SXM", "A100-SXM4-80GB"],
    "H100 PCIe": ["H100 PCIe", "H100 80GB PCIe"],
    "H100 SXM": ["H100 SXM", "H100 80GB HBM3", "H100 SXM5 80GB", "H100 SXM5 80GB HBM3"],
    "H100 NVL": ["H100 NVL", "H100 94GB NVL"],
    "H200": ["H200", "H200 SXM", "H200 141GB HBM3e", "H200 SXM 141GB"],
    "H200 NVL": ["H200 NVL", "H200 141GB NVL"],
    "RTX 4090": ["RTX 4090"], "RTX 3090": ["RTX 3090"],
}
_ALIASES: dict[frozenset[str], str] = {_tokens(n): key for key, names in _DEVICE_NAMES.items() for n in names}


def lookup_gpu(name: str | None) -> GpuPeak | None:
    """The GPU_PEAKS entry for an NVML / torch device name ("NVIDIA A100-SXM4-80GB",
    "Tesla T4", "NVIDIA H100 80GB HBM3") or a GPU_PEAKS key; None when not sure which GPU it is."""
    if not name:
        return None
    key = _ALIASES.get(_tokens(name))
    return GPU_PEAKS[key] if key else None


def _check_nonneg(**values: float) -> None:
    for field, value in values.items():
        if value is None or value < 0:
            raise ValueError(f"{field}={value!r}: must be a number >= 0")


def decode_bytes_per_step(weight_bytes: float, kv_bytes_per_token: float, context_tokens_total: float) -> int:
    """Bytes one decode step reads: every weight once, plus the KV cache of every running
    sequence (context_tokens_total = sum of the sequences' context lengths)."""
    _check_nonneg(weight_bytes=weight_bytes, kv_bytes_per_token=kv_bytes_per_token,
                  context_tokens_total=context_tokens_total)
    return int(weight_bytes + kv_bytes_per_token * context_tokens_total)


def decode_ceiling_tok_s(peak_bw: float, weight_bytes: float, kv_bytes_per_token: float,
                         batch: int, context_len: float) -> float:
    """Most tokens/s (all sequences together) decode can reach when memory bandwidth binds.

    context_len is the tokens in each sequence's KV cache (use the mean over the run)."""
    if not peak_bw > 0:
        raise ValueError(f"peak_bw={peak_bw!r}: must be > 0 bytes/s")
    if batch < 1:
        raise ValueError(f"batch={batch!r}: must be >= 1 running sequences")
    step_bytes = decode_bytes_per_step(weight_bytes, kv_bytes_per_token, batch * context_len)
    if step_bytes <= 0:
        raise ValueError("weight_bytes and kv_bytes_per_token * context are both 0: nothing to read, no ceiling")
    return batch * peak_bw / step_bytes


def prefill_ceiling_tok_s(peak_flops: float, n_params: float) -> float:
    """Most prompt tokens/s prefill can reach when compute binds: FLOPs ~ 2 x params per token."""
    if not peak_flops > 0:
        raise ValueError(f"peak_flops={peak_flops!r}: must be > 0 FLOP/s")
    if not n_params > 0:
        raise ValueError(f"n_params={n_params!r}: must be > 0 parameters")
    return peak_flops / (2 * n_params)


def decode_arithmetic_intensity(batch: int, bytes_per_param: float = 2.0) -> float:
    """FLOP/byte of decode's weight reads: 2 FLOPs per weight per sequence / bytes per weight."""
    if batch < 1 or not bytes_per_param > 0:
        raise ValueError(f"batch={batch!r} must be >= 1 and bytes_per_param={bytes_per_param!r} > 0")
    return 2.0 * batch / bytes_per_param


def achieved_bandwidth(decode_tok_s: float, batch: int, weight_bytes: float,
                       kv_bytes_per_token: float, context_len: float) -> float:
    """Bytes/s the measured decode rate implies: steps/s (= tok/s / batch) x bytes per step."""
    if batch < 1:
        raise ValueError(f"batch={batch!r}: must be >= 1 running sequences")
    _check_nonneg(decode_tok_s=decode_tok_s)
    return decode_tok_s / batch * decode_bytes_per_step(weight_bytes, kv_bytes_per_token, batch * context_len)


def mbu(achieved_bytes_per_s: float, peak_bw: float | None) -> float | None:
    """Model bandwidth utilisation, achieved / peak in [0, ~1]; None when the peak is unknown."""
    if peak_bw is None:
        return None
    if not peak_bw > 0:
        raise ValueError(f"peak_bw={peak_bw!r}: must be > 0 bytes/s or None (unknown GPU)")
    return achieved_bytes_per_s / peak_bw


@dataclass(frozen=True)
class Roofline:
    """One decode measurement set against its GPU's roofline; `to_dict()` for the result record."""

    gpu: str | None  # device name as NVML/torch reports it, or None (no GPU / not known)
    weight_bytes: float  # bytes of model weights read per decode step
    kv_bytes_per_token: float  # KV cache bytes per token of context (all layers, K and V)
    batch: int  # sequences decoding together, >= 1
    context_len: float  # mean tokens in each sequence's KV cache during decode
    decode_tok_s: float | None = None  # measured decode tokens/s, all sequences together

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"Roofline.batch={self.batch!r}: must be >= 1 running sequences")
        _check_nonneg(weight_bytes=self.weight_bytes, kv_bytes_per_token=self.kv_bytes_per_token,
                      context_len=self.context_len)
        if self.decode_tok_s is not None:
            _check_nonneg(decode_tok_s=self.decode_tok_s)

    @property
    def peak(self) -> GpuPeak | None:
        return lookup_gpu(self.gpu) if self.gpu else None

    def to_dict(self) -> dict:
        """{"gpu", "gpu_peak_entry", "peak_bw", "ceiling_tok_s", "achieved_bw", "mbu", ...};
        numbers, with "unknown" where the GPU is not in GPU_PEAKS and None where nothing was measured."""
        peak = self.peak
        achieved = None
        if self.decode_tok_s is not None:
            achieved = achieved_bandwidth(self.decode_tok_s, self.batch, self.weight_bytes,
                                          self.kv_bytes_per_token, self.context_len)
        ceiling = None if peak is None else decode_ceiling_tok_s(
            peak.peak_bw, self.weight_bytes, self.kv_bytes_per_token, self.batch, self.context_len)
        fraction = None if peak is None or achieved is None else mbu(achieved, peak.peak_bw)
        unknown = "unknown"
        return {
            "gpu": self.gpu,
            "gpu_peak_entry": peak.name if peak else None,
            "peak_bw": peak.peak_bw if peak else unknown,
            "ceiling_tok_s": ceiling if peak else unknown,
            "achieved_bw": achieved,
            "mbu": fraction if peak else unknown,
            "bytes_per_step": decode_bytes_per_step(self.weight_bytes, self.kv_bytes_per_token,
                                                    self.batch * self.context_len),
            "batch": self.batch, "context_len": self.context_len, "decode_tok_s": self.decode_tok_s,
        }
