"""The IO model of attention: why FlashAttention is faster, counted in bytes to and from HBM.

Attention is O = softmax(Q K^T / sqrt(d)) V for N queries against N_k keys of head dim d.
Its matmuls cost 4 N N_k d FLOPs per head (2 for QK^T, 2 for PV); causal attention needs
only the pairs with key <= query, N (N + 1) / 2 of them when N_k = N.

*Naive* attention (the FlashAttention paper's Algorithm 0; Dao et al., NeurIPS 2022) runs
three kernels: S = QK^T written to HBM, P = softmax(S) read back and written, O = PV read
back. S and P are N x N_k each, so for N >> d the traffic is ~4 N^2 elements per head for
4 N^2 d FLOPs: about d / 2 FLOP per byte in bf16 (64 at d = 128, under an H200's ridge of
~206), memory-bound at any long N, and the extra memory (S and P) grows as N^2 until it no
longer fits. Causal masking happens after the matmul, so naive pays for the full S anyway.

*Tiled* (flash) attention cuts Q, K, V into blocks that fit in on-chip SRAM (M elements) and
keeps a running max and sum per query row (the online softmax): O_i is rescaled each time a
new K/V block raises the row max, so the full softmax is built without S or P ever leaving
the chip. It is the same maths, exactly re-associated: outputs differ from naive only by
floating-point reordering, and the extra memory is O(N) statistics. Two loop orders:

* FA1 (the paper's Algorithm 1, Theorem 2): outer loop over T_c K/V blocks, each read once;
  every outer step reads and writes all of Q, O and the row statistics l, m. Traffic is
  Theta(N d T_c) = Theta(N^2 d^2 / M).
* FA2 (Dao 2023; FA3 keeps it): outer loop over T_r query blocks; Q is read once, O and
  the logsumexp written once, K and V read once per query block: 2 N_k d T_r elements. This is
  what PyTorch's FLASH backend (FA2) and vLLM's bundled FA3 run, so `flash_*` fields mean FA2.

Block sizes are the paper's: B_c = ceil(M / 4d), B_r = min(B_c, d), M in elements. With B_r = d
FA2 moves ~2 N N_k elements, half of naive (a quarter when causal), at ~B_r FLOP per byte. The
model counts HBM only; in real kernels L2 (50 MB on an H200; one head's K and V at 16k tokens,
d = 128, are 8 MiB) serves most repeated K/V reads, so the flash figures are pessimistic bounds.

Decode (one query against N_k cached keys) materialises no N x N matrix: S is 1 x N_k, and
both methods are dominated by reading K and V once (2 N_k d elements per KV head, ~1 FLOP per
byte in bf16): decode is KV-bandwidth bound, and the flash win there is parallelism over the
KV length across SMs (split-KV, "flash decoding"), which this model does not count.

GQA: g = heads / kv_heads query heads share one K/V head. Tiled kernels are counted as FA3
and FA2's decode path run them, the g heads packed into one tile's rows (position-major), so
K/V are read per KV head; for prefill this changes the count only by rounding.
Causal is bottom-right aligned (query i sees keys j <= i + N_k - N), as FA2 >= 2.1 and vLLM do.
Counted: matmul FLOPs only (softmax's ~5 ops per score, on the exp units, left out). Not counted:
naive's extra passes for scaling, masking and dtype casts (each another 2 N N_k elements), L2 hits.
"""

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from lablib.mechanisms.gpus import GPU_PEAKS, HOPPER_SMEM_PER_BLOCK_BYTES, HOPPER_SMEM_PER_SM_BYTES, HOPPER_SXM_SMS
from lablib.validate import choice, integer, integers, number, refuse

STATS_BYTES = 4  # row statistics (m, l, logsumexp) are fp32 in every flash kernel
Order = Literal["fa1", "fa2"]


@dataclass(frozen=True)
class Gpu:
    """The peaks a roofline needs, as numbers."""

    name: str
    peak_flops: float  # dense bf16 tensor FLOP/s
    hbm_bandwidth: float  # bytes/s
    sram_bytes: int  # shared memory one thread block may use: the M of the IO model
    smem_per_sm_bytes: int  # shared memory per SM
    sms: int  # streaming multiprocessors

    def __post_init__(self) -> None:
        fix = "pass the spec sheet's number, e.g. H200's."
        number("Gpu", "peak_flops", self.peak_flops, fix, 0.0, low_open=True)
        number("Gpu", "hbm_bandwidth", self.hbm_bandwidth, fix, 0.0, low_open=True)
        for field in ("sram_bytes", "smem_per_sm_bytes", "sms"):
            integer("Gpu", field, getattr(self, field), fix, 1)


# The H200 SXM from the project's spec-sheet table (mechanisms.gpus: bf16 dense 989.5 TFLOP/s, HBM3e 4.8 TB/s)
# with Hopper's shared memory (228 KB per SM, up to 227 KB per thread block) and 132 SMs.
H200 = Gpu("H200 SXM", GPU_PEAKS["H200"].bf16_flops, GPU_PEAKS["H200"].peak_bw, HOPPER_SMEM_PER_BLOCK_BYTES,
           HOPPER_SMEM_PER_SM_BYTES, HOPPER_SXM_SMS)


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: batch x heads queries of query_len tokens against context_len keys."""

    query_len: int  # N: queries per sequence (1 for a decode step)
    head_dim: int  # d
    batch: int = 1  # B
    heads: int = 1  # H: query heads
    kv_heads: int | None = None  # K/V heads (GQA); None = heads
    context_len: int | None = None  # N_k: keys per sequence; None = query_len
    element_bytes: int = 2  # bytes per element of Q, K, V, O, S, P: 2 for bf16
    causal: bool = False  # key j visible to query i iff j <= i + context_len - query_len

    def __post_init__(self) -> None:
        own = "AttentionShape"
        integer(own, "query_len", self.query_len, "pass the number of query tokens (1 for decode).", 1)
        integer(own, "head_dim", self.head_dim, "pass the model's head dim, e.g. 64 or 128.", 1)
        integer(own, "batch", self.batch, "pass the number of sequences.", 1)
        integer(own, "heads", self.heads, "pass the number of query heads.", 1)
        integer(own, "element_bytes", self.element_bytes, "2 for bf16/fp16, 4 for fp32, 1 for fp8.", 1)
        if self.kv_heads is not None:
            integer(own, "kv_heads", self.kv_heads, "pass the number of K/V heads, or None for MHA.", 1)
            if self.heads % self.kv_heads:
                raise refuse(own, "kv_heads", self.kv_heads, f"a divisor of heads={self.heads}",
                             "GQA shares each K/V head between a whole number of query heads.")
        if self.context_len is not None:
            integer(own, "context_len", self.context_len, "pass the number of keys, or None for query_len.", 1)
        if self.causal and self.query_len > self.n_k:
            raise refuse(own, "query_len", self.query_len, f"<= context_len={self.n_k} when causal",
                         "causal attention needs at least as many keys as queries.")

    @property
    def n_k(self) -> int:
        return self.query_len if self.context_len is None else self.context_len

    @property
    def h_kv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def group(self) -> int:
        return self.heads // self.h_kv


def query_key_pairs(n: int, n_k: int, causal: bool) -> int:
    """Query-key pairs one head scores: n n_k, or causal sum over i of (i + n_k - n + 1)."""
    return n * (n_k - n) + n * (n + 1) // 2 if causal else n * n_k


def attention_flops(shape: AttentionShape) -> int:
    """Useful matmul FLOPs: 4 B H d x pairs (QK^T and PV, 2 FLOPs per multiply-add each)."""
    return 4 * shape.batch * shape.heads * shape.head_dim * query_key_pairs(shape.query_len, shape.n_k, shape.causal)


@dataclass(frozen=True)
class Traffic:
    """HBM traffic and memory of one method on one shape."""

    method: str  # "naive", "fa1" or "fa2"
    elements: int  # elements of Q, K, V, O, S, P read plus written (element_bytes each)
    stats_elements: int  # fp32 row statistics read plus written (m, l or logsumexp)
    bytes: int  # elements x element_bytes + stats_elements x 4
    extra_bytes: int  # peak memory beyond Q, K, V, O: S and P for naive, statistics for flash
    flops_executed: int  # matmul FLOPs the kernel runs: naive computes masked scores too
    block_r: int | None = None  # B_r (tiled only)
    block_c: int | None = None  # B_c
    tiles: int | None = None  # (query block, key block) pairs visited, per batch x KV head


def naive_traffic(shape: AttentionShape, *, inplace_softmax: bool = False) -> Traffic:
    """Algorithm 0: read Q, K; write S; read S; write P; read P, V; write O (all in HBM).

    Elements: B (2 H N d + 2 H_kv N_k d + 4 H N N_k). K and V are counted once per KV head
    (a broadcast matmul; HF eager's repeat_kv copy is not counted). S is full even when causal:
    masking happens after the matmul. Extra memory: S and P coexist (softmax is out of place),
    2 B H N N_k elements; one buffer if softmax writes in place.
    """
    b, h, n, n_k, d = shape.batch, shape.heads, shape.query_len, shape.n_k, shape.head_dim
    scores = b * h * n * n_k
    elements = 2 * b * h * n * d + 2 * b * shape.h_kv * n_k * d + 4 * scores
    extra = (1 if inplace_softmax else 2) * scores * shape.element_bytes
    return Traffic("naive", elements, 0, elements * shape.element_bytes, extra, 4 * scores * d)


def block_sizes(sram_bytes: int, head_dim: int, element_bytes: int) -> tuple[int, int]:
    """(B_r, B_c) of Algorithm 1: B_c = ceil(M / 4d), B_r = min(B_c, d), M = sram_bytes // element_bytes.

    M must hold one row each of Q, K, V and O (4 d elements), or no block exists.
    """
    integer("block_sizes", "head_dim", head_dim, "pass the model's head dim.", 1)
    integer("block_sizes", "element_bytes", element_bytes, "2 for bf16.", 1)
    need = 4 * head_dim * element_bytes
    integer("block_sizes", "sram_bytes", sram_bytes, f"SRAM must hold one row each of Q, K, V, O (4 x head_dim x element_bytes = {need} bytes); "
                f"use the GPU's shared memory per block, e.g. H200.sram_bytes={H200.sram_bytes}.", need)
    b_c = math.ceil((sram_bytes // element_bytes) / (4 * head_dim))
    return min(b_c, head_dim), b_c


def _visited(shape: AttentionShape, b_r: int, b_c: int) -> list[tuple[int, int]]:
    """Per query tile of one (batch, KV head): (rows, keys it reads), blocks above the diagonal skipped."""
    rows_total, n_k, g = shape.group * shape.query_len, shape.n_k, shape.group
    t_c, out = math.ceil(n_k / b_c), []
    for start in range(0, rows_total, b_r):
        last = min(start + b_r, rows_total) - 1
        blocks = min(t_c, (last // g + n_k - shape.query_len) // b_c + 1) if shape.causal else t_c
        out.append((last - start + 1, min(blocks * b_c, n_k)))
    return out


def tiled_traffic(shape: AttentionShape, sram_bytes: int = H200.sram_bytes, *, order: Order = "fa2") -> Traffic:
    """HBM traffic of tiled attention in the FA1 (Algorithm 1) or FA2 loop order.

    Per (batch, KV head), rows R = g N (GQA packed), tiles visited (i, j), r_i rows in tile i:
    FA2: elements 2 R d (Q in, O out) + 2 d sum_i keys_i (K, V per query tile); stats R (logsumexp out).
    FA1: elements R d (O initialised) + 2 N_k d (K, V once) + 3 d sum_(i,j) r_i (Q in, O in and out);
    stats 2 R (l, m initialised) + 4 sum_(i,j) r_i (l, m in and out). Causal skips the same tiles in both.
    """
    choice("tiled_traffic", "order", order, ("fa1", "fa2"))
    b_r, b_c = block_sizes(sram_bytes, shape.head_dim, shape.element_bytes)
    d, rows, units = shape.head_dim, shape.group * shape.query_len, shape.batch * shape.h_kv
    tiles = _visited(shape, b_r, b_c)
    visited, executed = sum(math.ceil(k / b_c) for _, k in tiles), 4 * d * units * sum(r * k for r, k in tiles)
    if order == "fa2":
        elements, stats = 2 * rows * d + 2 * d * sum(keys for _, keys in tiles), rows
    else:
        row_visits = sum(r * math.ceil(keys / b_c) for r, keys in tiles)
        elements = rows * d + 2 * shape.n_k * d + 3 * d * row_visits
        stats = 2 * rows + 4 * row_visits
    elements, stats, extra = units * elements, units * stats, units * rows * STATS_BYTES * (1 if order == "fa2" else 2)
    nbytes = elements * shape.element_bytes + stats * STATS_BYTES
    return Traffic(order, elements, stats, nbytes, extra, executed, b_r, b_c, visited)


@dataclass(frozen=True)
class Roofline:
    """The roofline's verdict on one kernel: the slower of its compute time and its memory time."""

    time_s: float  # max(compute_s, memory_s)
    compute_s: float  # flops / peak_flops
    memory_s: float  # bytes / bandwidth
    intensity: float  # FLOPs per HBM byte
    bound: str  # "compute" or "memory"


def roofline(flops: float, nbytes: float, peak_flops: float, bandwidth: float) -> Roofline:
    """Predicted time = max(flops / peak_flops, bytes / bandwidth); the larger term names the bound."""
    fix = "pass spec-sheet peaks, e.g. H200.peak_flops and H200.hbm_bandwidth."
    number("roofline", "flops", flops, "count FLOPs with attention_flops().", 0.0)
    number("roofline", "nbytes", nbytes, "count bytes with naive_traffic() or tiled_traffic().", 0.0, low_open=True)
    number("roofline", "peak_flops", peak_flops, fix, 0.0, low_open=True)
    number("roofline", "bandwidth", bandwidth, fix, 0.0, low_open=True)
    compute, memory = flops / peak_flops, nbytes / bandwidth
    return Roofline(max(compute, memory), compute, memory, flops / nbytes, "compute" if compute >= memory else "memory")


@dataclass(frozen=True)
class PredictionRow:
    """Naive against flash (FA2 order) at one length: one point of each curve in the lab's figures."""

    n: int  # sequence length swept: query_len for prefill, context_len for decode
    batch: int
    flops: int  # useful matmul FLOPs (causal counts only visible pairs): what TFLOP/s divides
    naive_bytes: int
    fa1_bytes: int  # the paper's Algorithm 1, for comparison with Theorem 2
    flash_bytes: int  # FA2 order: PyTorch FLASH, vLLM FA3
    bytes_ratio: float  # naive_bytes / flash_bytes
    naive_extra_bytes: int  # S and P
    flash_extra_bytes: int  # logsumexp
    naive_intensity: float  # executed FLOPs per byte
    flash_intensity: float
    naive_time_s: float
    flash_time_s: float
    naive_bound: str
    flash_bound: str
    naive_tflops: float  # useful FLOPs / predicted time, in TFLOP/s
    flash_tflops: float
    speedup: float  # naive_time_s / flash_time_s


def predict(seq_lens: Sequence[int], head_dim: int = 128, *, batch: int = 1, tokens: int | None = None,
            heads: int = 16, kv_heads: int | None = None, causal: bool = True, decode: bool = False,
            element_bytes: int = 2, gpu: Gpu = H200, sram_bytes: int | None = None) -> list[PredictionRow]:
    """One row per length: bytes, FLOPs, intensities and roofline times of naive and flash attention.

    tokens, if given, holds batch x length constant (batch = max(1, tokens // n)), as the
    FlashAttention paper's benchmark does; decode=True sweeps context_len with one query.
    sram_bytes defaults to gpu.sram_bytes.
    """
    lens = integers("predict", "seq_lens", seq_lens, "pass lengths, e.g. [256, 1024, 4096].")
    if tokens is not None:
        integer("predict", "tokens", tokens, "pass batch x length, e.g. 16384, or None.", 1)
    sram, rows = gpu.sram_bytes if sram_bytes is None else sram_bytes, []
    for n in lens:
        b = max(1, tokens // n) if tokens is not None else batch
        shape = AttentionShape(1 if decode else n, head_dim, b, heads, kv_heads, n, element_bytes, causal)
        useful, naive = attention_flops(shape), naive_traffic(shape)
        fa1, fa2 = tiled_traffic(shape, sram, order="fa1"), tiled_traffic(shape, sram, order="fa2")
        rn = roofline(naive.flops_executed, naive.bytes, gpu.peak_flops, gpu.hbm_bandwidth)
        rf = roofline(fa2.flops_executed, fa2.bytes, gpu.peak_flops, gpu.hbm_bandwidth)
        rows.append(PredictionRow(
            n, b, useful, naive.bytes, fa1.bytes, fa2.bytes, naive.bytes / fa2.bytes, naive.extra_bytes,
            fa2.extra_bytes, rn.intensity, rf.intensity, rn.time_s, rf.time_s, rn.bound, rf.bound,
            useful / rn.time_s / 1e12, useful / rf.time_s / 1e12, rn.time_s / rf.time_s))
    return rows


def loglog_slopes(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    """Slope of log y against log x between consecutive points: 2 where y ~ x^2."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise refuse("loglog_slopes", "xs", list(xs), "two or more points, as many as ys",
                     "pass matching lists, e.g. [r.n for r in rows] and [r.naive_bytes for r in rows].")
    for name, vals in (("xs", xs), ("ys", ys)):
        for v in vals:
            number("loglog_slopes", name, v, "log-log slopes need positive values.", 0.0, low_open=True)
    if any(b <= a for a, b in itertools.pairwise(xs)):
        raise refuse("loglog_slopes", "xs", list(xs), "strictly increasing values", "sort the points by x.")
    return [math.log(ys[i + 1] / ys[i]) / math.log(xs[i + 1] / xs[i]) for i in range(len(xs) - 1)]
