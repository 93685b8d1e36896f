"""Tensor parallelism at decode: what splitting a model across t GPUs buys, and what the all-reduces cost.

A decode step is memory-bound: every weight is read once per step however many sequences
ride along, plus each sequence's KV cache. Tensor parallelism (Megatron-LM, Shoeybi et al.
2019; vLLM's `tensor_parallel_size`) splits each layer's matrices across t GPUs: the
attention heads and the MLP's columns (gate/up) and rows (down). Each GPU then reads 1/t of
the weights, so the step's memory time, and with it the per-token latency, falls by up to t.

The price is two all-reduces per layer (after the attention output projection and after the
MLP down projection), each of batch x hidden activations (bf16, 2 bytes). A ring all-reduce
moves 2 (t-1)/t x message bytes through each GPU's link, so its bandwidth part barely
grows with t; its latency part does not shrink with t at all, and 2 x layers collectives
(64 for an 8B model) each pay it every step. Over NVLink (450 GB/s a direction) the
bandwidth part is small; over PCIe (32-64 GB/s) it can cancel the gain at large batch, which
is the common warning (the all-reduces "must go over NVLink"). At batch 1 the message is tiny (8 KiB for hidden 4096) and the
latency term, not bandwidth, is the communication cost.

The model, per GPU, for one decode step of b sequences with `context` tokens each:

    weights  = params on this GPU, less the input embedding (a lookup of b rows), x bytes per weight
    kv       = 2 x layers x max(kv_heads / t, 1) x head_dim x kv bytes x context x b
    flops    = 2 x matmul params on this GPU x b + 4 x layers x (heads / t) x head_dim x context x b
    one all-reduce = 2 (t-1)/t x (b x hidden x 2) / link bandwidth + link latency  (0 when t = 1)
    step     = max((weights + kv) / HBM bandwidth, flops / peak) + (1 - overlap) x 2 x layers
               x all-reduce + overhead;  throughput = b / step (the whole group of t GPUs)

Choices, stated: the embedding and LM head are split by vocab as vLLM's VocabParallelEmbedding
and ParallelLMHead do (vocab padding to a multiple of 64 ignored); norms are replicated. When
kv_heads < t each GPU keeps one whole KV head (vLLM replicates KV heads then, so t must be a
multiple of kv_heads). The link's latency is one figure per collective, independent of t: what
vLLM's one-shot custom all-reduce and NCCL's small-message path come to on one node, to first
order (a pure ring would pay 2 (t-1) hops, growing with t). Left out: the embedding's own
all-reduce and the logits gather (2 collectives a step beside the 2 x layers), kernel
efficiency (real decode reaches 60-80% of HBM peak), biases and q/k norms (<0.1% of weights),
and quantisation scales. Spec-sheet constants below are labelled; link latencies are
assumptions, to be replaced by a measurement. This is a model, not a measurement.

The other ways to spend two GPUs, pipeline stages and a second replica, are priced beside this
model, from its shapes, GPUs, links and steps, in `lablib.mechanisms.pipeline`.
"""

import math
from dataclasses import dataclass
from typing import Any

from lablib.mechanisms.gpus import GPU_PEAKS
from lablib.mechanisms.kv import kv_bytes_per_token
from lablib.validate import integer, number, refuse

GB = 1e9  # spec sheets count 1 GB as 10^9 bytes
GiB = 2**30
ACT_BYTES = 2  # bf16 activations in the all-reduces (and mechanisms.pipeline's hand-offs)
RESERVE_BYTES = int(2.25 * GiB)  # CUDA context + one step's activations + CUDA graphs, as lablib.hardware.fit allows


@dataclass(frozen=True)
class DenseShape:
    """A Llama-style dense decoder, as plain numbers (from its config.json)."""

    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    intermediate: int  # intermediate_size (the MLP's width)
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads (GQA); must divide heads
    head_dim: int  # head_dim, usually hidden / heads
    vocab: int  # vocab_size
    weight_bytes: float = 2  # bytes per weight element: 2 bf16, 1 FP8, 0.5 W4A16 (scales ignored)
    kv_bytes: int = 2  # bytes per KV element: 2 bf16, 1 FP8
    tied_embeddings: bool = False  # LM head shares the embedding matrix (one copy)

    def __post_init__(self) -> None:
        fix = "read it from the model's config.json."
        for name in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab", "kv_bytes"):
            integer("DenseShape", name, getattr(self, name), fix)
        if self.heads % self.kv_heads:
            raise refuse("DenseShape", "kv_heads", self.kv_heads, f"a divisor of heads={self.heads}", fix)
        number("DenseShape", "weight_bytes", self.weight_bytes, "2 for bf16, 1 for FP8, 0.5 for W4A16.", 0, low_open=True)

    @classmethod
    def from_config(cls, cfg: dict[str, Any], weight_bytes: float = 2, kv_bytes: int = 2) -> "DenseShape":
        """The shape of a Llama/Qwen/Mistral config.json dict (e.g. lablib.models.architecture.architectures())."""
        heads = cfg["num_attention_heads"]
        return cls(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], heads,
                   cfg.get("num_key_value_heads", heads), cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   cfg["vocab_size"], weight_bytes, kv_bytes, bool(cfg.get("tie_word_embeddings")))


@dataclass(frozen=True)
class Link:
    """The GPU-to-GPU link an all-reduce runs over."""

    name: str
    bandwidth: float  # bytes/s per direction per GPU (spec sheet)
    latency_s: float  # fixed cost of one collective, seconds (an assumption unless measured)

    def __post_init__(self) -> None:
        number("Link", "bandwidth", self.bandwidth, "bytes/s per direction, e.g. 450e9 for NVLink 4.", 0, low_open=True)
        number("Link", "latency_s", self.latency_s, "seconds per collective, e.g. 5e-6.", 0)


@dataclass(frozen=True)
class Gpu:
    """One GPU's memory and speed limits."""

    name: str
    memory_bytes: float  # capacity (spec sheet)
    hbm_bandwidth: float  # bytes/s (spec sheet)
    peak_flops: float  # dense bf16 tensor FLOP/s (spec sheet)
    overhead_s: float = 0.0  # fixed cost of every step (launches, sampling, scheduler): measure it, then replace()

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "hbm_bandwidth", "peak_flops"):
            number("Gpu", name, getattr(self, name), "take it from the GPU's datasheet.", 0, low_open=True)
        number("Gpu", "overhead_s", self.overhead_s, "seconds per step, e.g. 3e-4; 0 to ignore it.", 0)


# Links. Bandwidths are spec-sheet figures per direction per GPU; latencies are assumptions (order of
# nccl-tests / vLLM custom all-reduce at small messages), not from any datasheet: measure and replace().
NVLINK4 = Link("NVLink 4", 450 * GB, 5e-6)  # NVIDIA H100/H200 SXM datasheet: 900 GB/s bidirectional per GPU
PCIE_GEN4_X16 = Link("PCIe Gen4 x16", 32 * GB, 15e-6)  # PCI-SIG: 16 GT/s x 16 lanes, ~31.5 GB/s per direction
PCIE_GEN5_X16 = Link("PCIe Gen5 x16", 64 * GB, 15e-6)  # PCI-SIG: 32 GT/s x 16 lanes, ~63 GB/s per direction
H200_HBM3E = Link("H200 HBM3e (for comparison: memory, not a link)", GPU_PEAKS["H200"].peak_bw, 0.0)
LINKS = {link.name: link for link in (NVLINK4, PCIE_GEN4_X16, PCIE_GEN5_X16)}

# GPUs from the project's spec-sheet table (mechanisms.gpus): capacity, HBM bandwidth, dense bf16 FLOP/s.
def _from_table(key: str, name: str) -> Gpu:
    peak = GPU_PEAKS[key]
    return Gpu(name, peak.memory_gb * GB, peak.peak_bw, peak.bf16_flops)


H200 = _from_table("H200", "H200 SXM")  # 141 GB HBM3e, 4.8 TB/s, 989.5 TFLOP/s
H100_SXM = _from_table("H100 SXM", "H100 SXM")  # 80 GB, 3.35 TB/s, 989.5 TFLOP/s
A100_80GB = _from_table("A100 80GB SXM", "A100 80GB SXM")  # 80 GB, 2,039 GB/s, 312 TFLOP/s
L40S = _from_table("L40S", "L40S")  # 48 GB GDDR6, 864 GB/s, 362.05 TFLOP/s
GPUS = {gpu.name: gpu for gpu in (H200, H100_SXM, A100_80GB, L40S)}

# Published config.json shapes (meta-llama/Llama-3.1-8B and -70B), bf16.
LLAMA_3_1_8B = DenseShape(32, 4096, 14336, 32, 8, 128, 128256)
LLAMA_3_1_70B = DenseShape(80, 8192, 28672, 64, 8, 128, 128256)


def valid_tp_sizes(shape: DenseShape) -> list[int]:
    """The t vLLM accepts: t divides heads and intermediate, and kv_heads divides by t or t by kv_heads."""
    return [t for t in range(1, shape.heads + 1) if shape.heads % t == 0 and shape.intermediate % t == 0
            and (shape.kv_heads % t == 0 or t % shape.kv_heads == 0)]


def _check_t(owner: str, shape: DenseShape, t: Any) -> int:
    integer(owner, "t", t, "pass the number of GPUs the model is split across (tensor_parallel_size).")
    allowed = valid_tp_sizes(shape)
    if t not in allowed:
        raise refuse(owner, "t", t, f"{', '.join(map(str, allowed))} (t must divide heads={shape.heads} and "
                     f"intermediate={shape.intermediate}, and divide or be a multiple of kv_heads={shape.kv_heads})",
                     "pick one of those; vLLM refuses the same tensor_parallel_size.")
    return t


def check_load(owner: str, batch: Any, context: Any) -> None:
    """Refuse a batch below one or a negative context, naming `owner` (shared with mechanisms.pipeline)."""
    integer(owner, "batch", batch, "pass the number of sequences decoding together, e.g. 1 or 64.")
    integer(owner, "context", context, "pass the tokens already in each sequence's KV cache.", 0)


def kv_heads_per_gpu(shape: DenseShape, t: int) -> int:
    """KV heads each GPU holds: kv_heads / t, but never below one (replicated when kv_heads < t)."""
    return max(shape.kv_heads // _check_t("kv_heads_per_gpu", shape, t), 1)


def _kv_bytes(shape: DenseShape, t: int, context: int, batch: int) -> int:
    """KV bytes one GPU holds (and reads each step) for `batch` sequences of `context` tokens."""
    return kv_bytes_per_token(shape.layers, kv_heads_per_gpu(shape, t), shape.head_dim, shape.kv_bytes) * context * batch


def layer_params(shape: DenseShape, t: int) -> tuple[int, int]:
    """(matmul params, norm params) of one layer on one GPU under TP=t (t=1: a whole layer, as a pipeline stage holds it)."""
    h, hd, q = shape.hidden, shape.head_dim, shape.heads // t
    attn = h * q * hd + 2 * h * max(shape.kv_heads // t, 1) * hd + q * hd * h  # q, k and v, o
    return attn + 3 * h * (shape.intermediate // t), 2 * h


def params_per_gpu(shape: DenseShape, t: int) -> int:
    """Parameters one GPU holds under TP=t (t=1: the whole model, same count as lablib.models' formula)."""
    _check_t("params_per_gpu", shape, t)
    matmul, norms = layer_params(shape, t)
    embed = math.ceil(shape.vocab / t) * shape.hidden * (1 if shape.tied_embeddings else 2)
    return shape.layers * (matmul + norms) + embed + shape.hidden


@dataclass(frozen=True)
class AllReduce:
    """One ring all-reduce, in its two parts."""

    bandwidth_s: float  # 2 (t-1)/t x message bytes / link bandwidth
    latency_s: float  # the link's per-collective latency (0 when t = 1)

    @property
    def total_s(self) -> float:
        return self.bandwidth_s + self.latency_s  # one collective, end to end


def ring_allreduce(message_bytes: int, t: int, link: Link) -> AllReduce:
    """Time of one all-reduce of `message_bytes` across t GPUs; zero when t = 1."""
    integer("ring_allreduce", "message_bytes", message_bytes, "pass batch x hidden x 2 for bf16 activations.", 0)
    integer("ring_allreduce", "t", t, "pass the number of GPUs taking part.")
    if t == 1:
        return AllReduce(0.0, 0.0)
    return AllReduce(2 * (t - 1) / t * message_bytes / link.bandwidth, link.latency_s)


@dataclass(frozen=True)
class DecodeStep:
    """One decode step under TP=t, per GPU, with every part of its time."""

    t: int
    batch: int
    context: int
    weight_bytes: float  # weights each GPU reads: all it holds but the input embedding, of which only b rows
    kv_bytes: int  # KV each GPU reads
    flops: int  # FLOPs each GPU does
    allreduces: int  # collectives per step: 2 x layers (0 when t = 1)
    allreduce_bytes: int  # their messages summed: allreduces x batch x hidden x 2
    weights_s: float  # weight_bytes / HBM bandwidth
    kv_s: float  # kv_bytes / HBM bandwidth
    compute_s: float  # flops / peak
    allreduce_bandwidth_s: float  # all the step's all-reduces, bandwidth part
    allreduce_latency_s: float  # all the step's all-reduces, latency part
    overlap: float  # fraction of the communication hidden behind the step
    overhead_s: float  # the GPU's fixed per-step cost
    latency_s: float  # the step's time = per-token latency
    throughput_tok_s: float  # batch / latency, the whole group of t GPUs

    @property
    def communication_s(self) -> float:
        """The communication the step waits for (what overlap does not hide)."""
        return (1 - self.overlap) * (self.allreduce_bandwidth_s + self.allreduce_latency_s)

    @property
    def communication_share(self) -> float:
        """Fraction of the step spent waiting on all-reduces: near 1 means communication dominates."""
        return self.communication_s / self.latency_s

    @property
    def throughput_per_gpu_tok_s(self) -> float:
        return self.throughput_tok_s / self.t  # what each of the t GPUs earns

    @property
    def dominant(self) -> str:
        """The largest part of the step as it adds up (weights/kv when memory-bound, else compute)."""
        hidden = 1 - self.overlap
        memory_bound = self.weights_s + self.kv_s >= self.compute_s
        parts = {"weights": self.weights_s if memory_bound else 0.0, "kv": self.kv_s if memory_bound else 0.0,
                 "compute": 0.0 if memory_bound else self.compute_s,
                 "allreduce_bandwidth": hidden * self.allreduce_bandwidth_s,
                 "allreduce_latency": hidden * self.allreduce_latency_s, "overhead": self.overhead_s}
        return max(parts, key=parts.__getitem__)


def decode_step(shape: DenseShape, batch: int, context: int, t: int, gpu: Gpu = H200, link: Link = NVLINK4,
                *, overlap: float = 0.0) -> DecodeStep:
    """The cost of one decode step of `batch` sequences of `context` tokens under TP=t (see the module doc)."""
    check_load("decode_step", batch, context)
    _check_t("decode_step", shape, t)
    number("decode_step", "overlap", overlap, "0 (no overlap, the default) to 1 (all hidden).", 0, 1)
    lookup = 0 if shape.tied_embeddings else math.ceil(shape.vocab / t) * shape.hidden  # the embedding: b rows read
    weight_bytes = (params_per_gpu(shape, t) - lookup) * shape.weight_bytes
    kv = _kv_bytes(shape, t, context, batch)
    matmul = shape.layers * layer_params(shape, t)[0] + math.ceil(shape.vocab / t) * shape.hidden  # + LM head
    flops = 2 * matmul * batch + 4 * shape.layers * (shape.heads // t) * shape.head_dim * context * batch
    count = 0 if t == 1 else 2 * shape.layers
    one = ring_allreduce(batch * shape.hidden * ACT_BYTES, t, link)
    weights_s, kv_s, compute_s = weight_bytes / gpu.hbm_bandwidth, kv / gpu.hbm_bandwidth, flops / gpu.peak_flops
    bw_s, lat_s = count * one.bandwidth_s, count * one.latency_s
    step = max(weights_s + kv_s, compute_s) + (1 - overlap) * (bw_s + lat_s) + gpu.overhead_s
    return DecodeStep(t, batch, context, weight_bytes, kv, flops, count, count * batch * shape.hidden * ACT_BYTES,
                      weights_s, kv_s, compute_s, bw_s, lat_s, overlap, gpu.overhead_s, step, batch / step)


@dataclass(frozen=True)
class MemoryFit:
    """What one GPU must hold under TP=t, against what it has."""

    t: int
    weight_bytes: float  # weights on this GPU
    kv_bytes: int  # KV for batch sequences of context tokens, this GPU's heads
    reserve_bytes: int  # activations, CUDA context and graphs
    need_bytes: float  # the three summed
    budget_bytes: float  # utilization x the GPU's memory (vLLM's gpu_memory_utilization)
    fits: bool


def memory_fit(shape: DenseShape, batch: int, context: int, t: int, gpu: Gpu = H200, *,
               reserve_bytes: int = RESERVE_BYTES, utilization: float = 0.9) -> MemoryFit:
    """Does TP=t hold the weights and `batch` sequences of `context` tokens on each GPU?"""
    check_load("memory_fit", batch, context)
    _check_t("memory_fit", shape, t)
    integer("memory_fit", "reserve_bytes", reserve_bytes, "bytes kept for activations, e.g. 2.25 GiB.", 0)
    number("memory_fit", "utilization", utilization, "vLLM's gpu_memory_utilization, 0.9 by default.", 0, 1, low_open=True)
    weights = params_per_gpu(shape, t) * shape.weight_bytes
    kv = _kv_bytes(shape, t, context, batch)
    need, budget = weights + kv + reserve_bytes, utilization * gpu.memory_bytes
    return MemoryFit(t, weights, kv, reserve_bytes, need, budget, need <= budget)


def smallest_fitting_tp(shape: DenseShape, batch: int, context: int, gpu: Gpu = H200,
                        tps: tuple[int, ...] = (1, 2, 4, 8), **fit: Any) -> int | None:
    """The smallest t in `tps` at which memory_fit fits, or None when none does."""
    return next((t for t in sorted(tps) if memory_fit(shape, batch, context, t, gpu, **fit).fits), None)


def tp_sweep(shape: DenseShape, tp: tuple[int, ...] = (1, 2, 4, 8), batches: tuple[int, ...] = (1, 8, 64, 256),
             context: int = 1024, gpu: Gpu = H200, link: Link = NVLINK4, *, overlap: float = 0.0) -> list[dict[str, Any]]:
    """One row per (t, batch): each part's time, what dominates, latency, throughput, speedup and efficiency vs t=1."""
    rows = []
    for b in batches:
        base = decode_step(shape, b, context, 1, gpu, link, overlap=overlap)
        for t in tp:
            s = decode_step(shape, b, context, t, gpu, link, overlap=overlap)
            row = {k: getattr(s, k) for k in ("t", "batch", "context", "weights_s", "kv_s", "compute_s",
                                              "allreduce_bandwidth_s", "allreduce_latency_s", "overhead_s",
                                              "dominant", "latency_s", "throughput_tok_s", "throughput_per_gpu_tok_s",
                                              "communication_share")}
            speedup = base.latency_s / s.latency_s
            rows.append(row | {"speedup": speedup, "efficiency": speedup / t, "link": link.name, "gpu": gpu.name,
                               "fits": memory_fit(shape, b, context, t, gpu).fits})
    return rows
