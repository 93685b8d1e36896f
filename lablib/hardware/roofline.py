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

"Every weight" leaves one table out: the input embedding, of which a step looks up only
the batch's B rows (`decode_weight_bytes`). Where the embeddings are tied the LM head
multiplies by that same table every step, so there nothing is left out. An 8B model in
bf16 (16.06e9 bytes, 1.05e9 of them its untied 128256 x 4096 embedding) on an H200 tops
out near 4.8e12 / 15.01e9 ~ 320 tok/s at batch 1, whatever the kernels. Batching is nearly
free until the KV cache grows to rival the weights, which is why servers batch.

Prefill processes a whole prompt of T tokens in one pass: each weight is read once and
used T times, intensity ~ T FLOP/byte, past the ridge for prompts of a few hundred
tokens. It is compute-bound: ceiling ~ peak_flops / (2 * params) tokens/s (ignoring
attention's own FLOPs, which grow with context).

MBU (model bandwidth utilisation) = achieved bytes/s / peak bytes/s is the honest score
for decode: 0.6-0.8 is good on modern GPUs. For a GPU not in `GPU_PEAKS` we report
"unknown" rather than guess a peak.

The peaks are the spec-sheet table in `lablib.mechanisms.gpus` (one table for the roofline,
the attention IO model, the TP cost model and the fit view).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..mechanisms.gpus import GB_S, GPU_PEAKS, TFLOPS, GpuPeak  # noqa: F401 - the one spec-sheet table, re-exported

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


def decode_weight_bytes(weight_bytes: float, arch: dict, element_bytes: float = 2) -> float:
    """The weight bytes one decode step reads out of `weight_bytes` (all the model holds): all but the input
    embedding table (vocab x hidden x element_bytes) when the embeddings are not tied, since a step looks up only
    its batch's rows of it (Llama-3.1-8B: 128256 x 4096 x 2 = 1.05e9 bytes a step does not read); tied, the LM
    head multiplies by the whole table every step, so nothing is left out. `arch`: `ModelSpec.architecture()` or
    a Result's `model` (vocab, hidden, tie_word_embeddings); where it does not say, or where `weight_bytes` cannot
    hold such a table (a stand-in checkpoint smaller than its config's shape), nothing is left out."""
    tied, vocab, hidden = arch.get("tie_word_embeddings"), arch.get("vocab"), arch.get("hidden")
    table = vocab * hidden * element_bytes if vocab and hidden and tied is False else 0
    return weight_bytes - table if table < weight_bytes else weight_bytes


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
