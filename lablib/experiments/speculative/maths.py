"""Lab 08's maths: the i.i.d. formula's tables, and the batch model at 8B scale.

`maths_tables` tabulates the formula of `lablib.mechanisms.speculative` (tokens per step, speedup and break-even
alpha against k and the draft's cost c). `batch_model` puts it on the H200's spec-sheet roofline at 8B scale: the
verify pass of k + 1 tokens is nearly free while decoding is bandwidth-bound, and stops being free as the batch
grows, where the speedup reverses (`pays_then_reverses`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import validate
from ...mechanisms.gpus import GPU_PEAKS
from ...mechanisms.speculative import (
    Roofline,
    acceptance,
    break_even_alpha,
    expected_tokens_per_step,
    optimal_k,
    reversal_batch,
    speedup,
    speedup_vs_batch,
)
from ...models.architecture import architectures, parameter_count

MODEL_BATCHES = tuple(sorted({round(2 ** (i / 8)) for i in range(8 * 9 + 1)}))  # 1..512, 8 points per octave


def maths_tables(alphas: Sequence[float] = (0.5, 0.7, 0.9), ks: Sequence[int] = (2, 4, 8),
                 costs: Sequence[float] = (0.0, 0.05, 0.2, 1.0)) -> dict[str, list[dict[str, Any]]]:
    """The formula's numbers for a few settings: tokens per step and speedup, the break-even alpha, the best k.

    `tokens`: per (alpha, k), E = (1 - alpha^(k+1)) / (1 - alpha), vLLM's acceptance rate (E - 1) / k and the
    speedup E / (k c + 1) for each draft cost c. `break_even`: per (k, c), the alpha below which speculation
    loses (None: even alpha = 1 cannot pay). `optimal_k`: per (alpha, c), the k in 1..16 with the best speedup.
    verify_cost is 1 throughout (a memory-bound target: the verify pass costs one step).
    """
    tokens = [{"alpha": a, "k": k, "tokens_per_step": float(expected_tokens_per_step(a, k)),
               "vllm_acceptance_rate": float(acceptance(a, k).acceptance_rate),
               **{f"speedup_c={c:g}": float(speedup(a, k, c)) for c in costs}} for a in alphas for k in ks]
    even = [{"k": k, "c": c, "break_even_alpha": break_even_alpha(k, c)} for k in ks for c in costs]
    best = [{"alpha": a, "c": c, "best_k": optimal_k(a, c)[0], "speedup": float(optimal_k(a, c)[1])}
            for a in alphas for c in costs]
    return {"tokens": tokens, "break_even": even, "optimal_k": best}


def roofline_of(arch: str, gpu: str = "H200", overhead_s: float = 0.0) -> Roofline:
    """A synthetic architecture in bf16 on a GPU of the spec-sheet table: 2 bytes and 2 FLOPs per parameter."""
    validate.choice("roofline_of", "arch", arch, tuple(architectures()))
    validate.choice("roofline_of", "gpu", gpu, tuple(GPU_PEAKS))
    peak, params = GPU_PEAKS[gpu], parameter_count(architectures()[arch])
    if not peak.bf16_flops:
        raise validate.refuse("roofline_of", "gpu", gpu, "a GPU with a bf16 peak in lablib.mechanisms.gpus",
                              "pick e.g. 'H200' or 'H100 SXM'.")
    return Roofline(2.0 * params, peak.peak_bw, 2.0 * params, peak.bf16_flops, overhead_s)


def batch_model(alpha: float, k: int, batches: Sequence[int] = MODEL_BATCHES, gpu: str = "H200",
                target: str = "llama-3.1-8b", draft: str = "llama-3.2-1b") -> dict[str, Any]:
    """Where speculation stops paying, as a model: the speedup against batch size on the roofline, and the reversal.

    The target and the draft are the synthetic architectures' parameter counts in bf16 on the GPU's spec sheet
    (`roofline_of`), with no launch overhead: the regime where decode is bandwidth-bound. c and verify_cost come
    from the two rooflines at each batch (`speedup_vs_batch`); an n-gram drafter has no forward (c = 0).
    A model, not a measurement: it leaves out KV reads and attention FLOPs, so real reversals come sooner.
    """
    t, d = roofline_of(target, gpu), roofline_of(draft, gpu)
    curves = {"draft model": speedup_vs_batch(alpha, k, batches, t, d),
              "n-gram": speedup_vs_batch(alpha, k, batches, t)}
    reversal = {"draft model": reversal_batch(alpha, k, t, d), "n-gram": reversal_batch(alpha, k, t)}
    peak = GPU_PEAKS[gpu]
    where = (f"simulated (no engine ran): a roofline of {gpu} spec-sheet peaks ({peak.peak_bw / 1e12:.1f} TB/s, "
             f"{peak.bf16_flops / 1e12:.1f} TFLOP/s bf16), {target} target, {draft} draft, bf16, no launch overhead")
    rows = [{"drafter": name, "batch": p.batch, "c": p.draft_cost, "verify_cost": p.verify_cost, "speedup": p.speedup}
            for name, points in curves.items() for p in points if p.batch in (1, 4, 16, 64)]
    return {"alpha": alpha, "k": k, "tokens_per_step": float(expected_tokens_per_step(alpha, k)), "gpu": gpu,
            "target": target, "draft": draft, "curves": curves, "reversal": reversal, "rows": rows, "where": where}


def pays_then_reverses(model: dict[str, Any]) -> bool:
    """`batch_model`'s claim: every drafter pays at batch 1 and is slower than plain decoding from some batch on."""
    return all(points[0].batch == 1 and points[0].speedup > 1 for points in model["curves"].values()) and all(
        b is not None for b in model["reversal"].values())
