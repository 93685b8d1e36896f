"""Pipeline parallelism at decode, and the three ways to spend two GPUs: TP=2, PP=2 or two replicas.

Pipeline parallelism (GPipe, Huang et al. 2019; vLLM's `pipeline_parallel_size`) cuts the model
the other way from tensor parallelism (`lablib.mechanisms.parallel`): by layers, not within them.
Each of p GPUs holds layers / p whole layers and reads only those each step, but a token still
crosses every stage in turn, handing b x hidden bf16 activations to the next GPU at each of the
p-1 boundaries. So one token's latency is not reduced, it grows by the hand-offs; what p stages
buy is throughput, and only with p microbatches in flight, each stage busy with a different one
(with fewer, the stages left idle are the pipeline's bubbles). The hand-off is one
point-to-point send of a small message, not a collective: p-1 of them a step against TP's
2 x layers all-reduces.

The model, per stage, for one microbatch of b sequences with `context` tokens each (TP=1's
shapes, GPUs, links and per-layer parameter count, from `lablib.mechanisms.parallel`):

    read     = its layers' params (+ the LM head and final norm on the last stage) x bytes per weight
    kv       = its layers' KV (all kv_heads) for b sequences of `context` tokens
    flops    = 2 x its matmul params (+ the LM head) x b + 4 x its layers x heads x head_dim x context x b
    stage    = max((read + kv) / HBM bandwidth, flops / peak)
    send     = b x hidden x 2 / link bandwidth + link latency  (0 when p = 1)
    latency  = sum of the stages + (p-1) x send + overhead
    throughput = b / (slowest stage + send + overhead)  (p microbatches in flight)

Choices, stated: the first stage holds the input embedding (a lookup of b rows, so not read), the
last the LM head (one copy on one stage when p = 1 and the embeddings are tied); the fullest GPU
holds its weights, the KV of all p microbatches for its layers, and the same reserve as TP. The
stages are not overlapped with the sends. This is a model, not a measurement.

`compare_two_gpus` sets the three plans for two GPUs side by side: TP=2 (`decode_step` at t=2:
the latency falls), PP=2 (this model: throughput, not latency), and a second replica (TP=1
twice: double the throughput at TP=1's latency, if the model fits one GPU, `memory_fit`).
"""

from dataclasses import dataclass
from typing import Any

from lablib.mechanisms.kv import kv_bytes_per_token
from lablib.mechanisms.parallel import (
    ACT_BYTES,
    H200,
    NVLINK4,
    RESERVE_BYTES,
    DenseShape,
    Gpu,
    Link,
    check_load,
    decode_step,
    layer_params,
    memory_fit,
)
from lablib.validate import integer, refuse


@dataclass(frozen=True)
class PipelineStep:
    """One decode step split into p pipeline stages of layers / p each (vLLM's pipeline_parallel_size)."""

    p: int
    batch: int  # sequences per microbatch
    stage_s: tuple[float, ...]  # each stage's time for one microbatch (memory- or compute-bound)
    send_s: float  # one activation hand-off: batch x hidden x 2 bytes / bandwidth + latency
    latency_s: float  # one token through every stage: sum(stage_s) + (p-1) sends + overhead
    throughput_tok_s: float  # p microbatches in flight: batch / (slowest stage + send + overhead)
    max_stage_bytes: float  # the fullest GPU: its weights + its layers' KV for p x batch sequences + reserve


def pipeline_step(shape: DenseShape, batch: int, context: int, p: int, gpu: Gpu = H200, link: Link = NVLINK4,
                  *, reserve_bytes: int = RESERVE_BYTES) -> PipelineStep:
    """Pipeline parallelism for comparison: latency is not reduced, throughput with p microbatches ~ p x."""
    check_load("pipeline_step", batch, context)
    integer("pipeline_step", "p", p, "pass the number of pipeline stages (GPUs).")
    if shape.layers % p:
        allowed = ", ".join(str(d) for d in range(1, shape.layers + 1) if shape.layers % d == 0)
        raise refuse("pipeline_step", "p", p, f"{allowed} (divisors of layers={shape.layers})", "pick one of those.")
    (matmul, norms), n, head = layer_params(shape, 1), shape.layers // p, shape.vocab * shape.hidden
    kv_token = kv_bytes_per_token(n, shape.kv_heads, shape.head_dim, shape.kv_bytes)
    stages, most = [], 0.0
    for i in range(p):
        first, last = i == 0, i == p - 1
        read = n * (matmul + norms) + (head + shape.hidden) * last  # the first stage's embedding is a lookup
        held = read + head * (first and not (last and shape.tied_embeddings))
        flops = 2 * (n * matmul + head * last) * batch + 4 * n * shape.heads * shape.head_dim * context * batch
        mem = (read * shape.weight_bytes + kv_token * context * batch) / gpu.hbm_bandwidth
        stages.append(max(mem, flops / gpu.peak_flops))
        most = max(most, held * shape.weight_bytes + kv_token * context * batch * p + reserve_bytes)
    send = 0.0 if p == 1 else batch * shape.hidden * ACT_BYTES / link.bandwidth + link.latency_s
    latency, tick = sum(stages) + (p - 1) * send + gpu.overhead_s, max(stages) + send + gpu.overhead_s
    return PipelineStep(p, batch, tuple(stages), send, latency, batch / tick, most)


def compare_two_gpus(shape: DenseShape, batch: int, context: int = 1024, gpu: Gpu = H200, link: Link = NVLINK4,
                     *, utilization: float = 0.9) -> list[dict[str, Any]]:
    """TP=2 against PP=2 against two TP=1 replicas, `batch` sequences per step each: a model, not a measurement.

    Plans differ in the sequences they keep in flight (TP: batch; PP: 2 microbatches; replicas:
    batch each), so the rows say so. A plan whose GPUs cannot hold it gets None for its times;
    throughput_vs_one_gpu is against TP=1 on one such GPU, memory aside (for a 70B, a GPU that cannot hold it).
    """
    one, tp = decode_step(shape, batch, context, 1, gpu, link), decode_step(shape, batch, context, 2, gpu, link)
    pp, budget = pipeline_step(shape, batch, context, 2, gpu, link), utilization * gpu.memory_bytes
    need = {t: memory_fit(shape, batch, context, t, gpu, utilization=utilization).need_bytes for t in (1, 2)}
    plans = [("TP=2", batch, tp.latency_s, tp.throughput_tok_s, need[2]),
             ("PP=2", 2 * batch, pp.latency_s, pp.throughput_tok_s, pp.max_stage_bytes),
             ("2 replicas (TP=1 each)", 2 * batch, one.latency_s, 2 * one.throughput_tok_s, need[1])]
    rows = []
    for plan, flight, latency, throughput, per_gpu in plans:
        fits = per_gpu <= budget
        rows.append({"plan": plan, "gpus": 2, "sequences_in_flight": flight, "latency_s": latency if fits else None,
                     "throughput_tok_s": throughput if fits else None,
                     "throughput_vs_one_gpu": throughput / one.throughput_tok_s if fits else None,
                     "need_bytes_per_gpu": per_gpu, "budget_bytes_per_gpu": budget, "fits": fits,
                     "label": f"cost model on {gpu.name} over {link.name}, not a measurement"})
    return rows

