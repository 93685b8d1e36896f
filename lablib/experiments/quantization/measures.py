"""Lab 06's quality measures on the CPU: what a quantization scheme costs the embedded target, with transformers.

Three measures, each against the unquantized (bf16) model:

- Perplexity on the `evaluation` set (64 windows of 512 tokens from files the calibration set never
  saw: `check_disjoint` asserts it): exp of the mean negative log-likelihood over every predicted token,
  pooled over the texts (token-weighted, not a mean of per-text perplexities). The first token of a text
  is never predicted. `from_logprobs` computes the same number from per-token log-probabilities (vLLM's
  `prompt_logprobs`), so the GPU half uses the same formula.
- Greedy agreement: the same journey prompts decoded greedily, 32 tokens each, by both models; the share
  of positions holding the same token, and the first position where they differ. After the first
  difference the two continue from different texts, so the first divergence is the sharper measure.
- The quality gate: a scheme passes when its perplexity is at most `max_increase_pct` percent above the
  reference's (the user sets it; a common claim is "under 1%").

How a quantized checkpoint runs here. transformers loads a compressed-tensors folder through its
integration and decompresses the weights on the first forward: each weight becomes exactly the value
the checkpoint stores (int4 or int8 or FP8 times its scale) in float32. Where the scheme quantizes
activations (fp8-dynamic, w8a8-int8), compressed-tensors' forward fake-quantizes each token's inputs
to FP8 or int8 as it arrives. The matmuls run in float32: this is the scheme's arithmetic, not vLLM's
kernels (Machete, Marlin, CUTLASS FP8 need a GPU), which accumulate differently; speed here means nothing.
The reference is the bf16 checkpoint computed in float32 on the same path.
"""
from __future__ import annotations

import importlib.util
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import validate
from ...hardware.device import device_facts
from ...results.compare import first_divergence
from ...results.store import results_dir
from ...workloads import Workload, load_workload

OWNER = "quantization"


def work_folder(work_dir: str | Path | None = None) -> Path:
    """Where the embedded target's checkpoints go: `work_dir`, or by default results_dir()/"quantized" (the lab's
    WORK), wherever the process was started (a relative "results/..." would follow the working directory)."""
    return Path(work_dir) if work_dir is not None else results_dir() / "quantized"


@dataclass(frozen=True)
class Perplexity:
    """exp(mean negative log-likelihood) over the predicted tokens of some texts."""

    ppl: float  # exp(nll)
    nll: float  # mean negative log-likelihood per predicted token, in nats
    tokens: int  # predicted tokens: each text's length minus one, summed
    texts: int  # texts scored


def from_logprobs(logprobs: Iterable[Sequence[float]]) -> Perplexity:
    """Perplexity from each text's log-probabilities of its predicted tokens (vLLM: prompt_logprobs[1:])."""
    total, count, texts = 0.0, 0, 0
    for row in logprobs:
        values = [float(v) for v in row]
        if any(math.isnan(v) or v > 0 for v in values):
            raise validate.refuse("from_logprobs", "logprobs", values[:4], "log-probabilities (<= 0, not NaN)",
                                  "pass each token's log-probability (vLLM: the chosen token's logprob).")
        total, count, texts = total - sum(values), count + len(values), texts + 1
    if count == 0:
        raise validate.refuse("from_logprobs", "logprobs", count, "at least one predicted token",
                              "pass texts of two tokens or more (the first token of a text is never predicted).")
    return Perplexity(math.exp(total / count), total / count, count, texts)


def _ids(tokenizer: Any, text: str | Sequence[int]) -> list[int]:
    return list(tokenizer(text)["input_ids"]) if isinstance(text, str) else [int(t) for t in text]


def perplexity(model: Any, tokenizer: Any, texts: Iterable[str | Sequence[int]], *,
               max_length: int | None = None) -> Perplexity:
    """Perplexity of `model` on `texts` (strings, tokenized with bos; or lists of ids), one text per forward.

    Each text is scored on its own (no context carried over); `max_length` cuts each to its first tokens.
    Log-softmax and sums in float64 (the logits of a 512-token window are 2M numbers: cheap).
    """
    import torch  # deferred: torch

    validate.optional_integer(OWNER, "max_length", max_length, "pass a token count >= 2, e.g. 512.", 2)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    rows = []
    with torch.inference_mode():
        for text in texts:
            ids = _ids(tokenizer, text)[:max_length]
            if limit is not None and len(ids) > limit:
                raise validate.refuse(OWNER, "max_length", max_length, f"at most the model's context ({limit})",
                                      f"pass max_length={limit} or shorter texts.")
            if len(ids) < 2:
                rows.append([])
                continue
            logits = model(torch.tensor([ids]), use_cache=False).logits[0, :-1].double()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1))
            rows.append(logp.squeeze(-1).double().tolist())
    return from_logprobs(rows)


@dataclass(frozen=True)
class Agreement:
    """Greedy tokens of a model against the reference's, per request."""

    matched: tuple[float, ...]  # per request: share of the positions where both chose the same token
    first_divergence: tuple[int | None, ...]  # per request: first position (0-based) that differs; None: none does
    new_tokens: int  # tokens per request

    @property
    def agreement(self) -> float:
        return statistics.fmean(self.matched)

    @property
    def identical(self) -> int:
        """Requests whose tokens are all the reference's."""
        return sum(d is None for d in self.first_divergence)

    @property
    def mean_first_divergence(self) -> float:
        """Mean first divergence, a request that never diverges counted at new_tokens (so a lower bound)."""
        return statistics.fmean(self.new_tokens if d is None else d for d in self.first_divergence)


def agreement(reference: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]]) -> Agreement:
    """Compare two lists of greedy outputs, request by request (same prompts, same lengths)."""
    if len(reference) != len(tokens) or not reference:
        raise validate.refuse("agreement", "tokens", len(tokens), f"{len(reference)} outputs (one per reference "
                              "request, at least one)", "decode the same prompts with both models.")
    n = len(reference[0])
    if n == 0 or any(len(r) != n for r in reference) or any(len(t) != n for t in tokens):
        raise validate.refuse("agreement", "tokens", [len(t) for t in tokens], f"outputs of {n} tokens each, "
                              "as the reference's", "decode every request to the same max_new_tokens.")
    matched, first = [], []
    for ref, out in zip(reference, tokens):
        same = [a == b for a, b in zip(ref, out)]
        matched.append(sum(same) / n)
        first.append(first_divergence(ref, out))
    return Agreement(tuple(matched), tuple(first), n)


def greedy_tokens(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32) -> list[list[int]]:
    """Each prompt's greedy continuation, exactly max_new_tokens (EOS ignored): one forward per token, KV cached."""
    import torch  # deferred: torch

    validate.integer(OWNER, "max_new_tokens", max_new_tokens, "pass e.g. 32.")
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            out = model(torch.tensor([list(prompt)]), use_cache=True)
            tokens = [int(out.logits[0, -1].argmax())]
            while len(tokens) < max_new_tokens:
                out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
                tokens.append(int(out.logits[0, -1].argmax()))
            outputs.append(tokens)
    return outputs


@dataclass(frozen=True)
class Gate:
    """The quality gate's verdict on one scheme."""

    passed: bool  # perplexity within max_increase_pct of the reference
    ppl: float  # the scheme's perplexity
    ppl_ref: float  # the reference's (bf16)
    increase_pct: float  # 100 * (ppl / ppl_ref - 1); negative when the scheme scores better
    max_increase_pct: float  # the threshold the user set
    sentence: str  # the verdict in words

    def __bool__(self) -> bool:
        return self.passed


def quality_gate(ppl: float, ppl_ref: float, max_increase_pct: float) -> Gate:
    """Pass when `ppl` is at most `max_increase_pct` percent above `ppl_ref`."""
    for field, value in (("ppl", ppl), ("ppl_ref", ppl_ref)):
        validate.number("quality_gate", field, value, "pass a perplexity (>= 1 for a real model).", 0.0,
                        low_open=True)
    validate.number("quality_gate", "max_increase_pct", max_increase_pct, "pass a percentage, e.g. 1.0 for 1%.", 0.0)
    pct = 100.0 * (ppl / ppl_ref - 1.0)
    passed = pct <= max_increase_pct
    where = f"{abs(pct):.2f}% {'above' if pct >= 0 else 'below'} the reference's {ppl_ref:.3f}"
    verdict = "within" if passed else "more than"
    sentence = (f"{'passes' if passed else 'fails'}: perplexity {ppl:.3f} is {where}, {verdict} the "
                f"{max_increase_pct:g}% allowed.")
    return Gate(passed, ppl, ppl_ref, pct, max_increase_pct, sentence)


def check_disjoint(calibration: Workload, evaluation: Workload) -> None:
    """Raise ValueError if the two sets share a source file or a text: a quantizer scored on its calibration."""
    files = [set(w.manifest.get("source_files", ())) for w in (calibration, evaluation)]
    shared = sorted(files[0] & files[1])
    texts = {r.prompt for r in calibration.requests} & {r.prompt for r in evaluation.requests}
    if shared or texts:
        raise validate.refuse(OWNER, "evaluation", evaluation.label, f"a set disjoint from {calibration.label} (they "
                              f"share {len(shared)} source files {shared[:3]} and {len(texts)} texts)",
                              "rebuild the sets with `python scripts/build_workloads.py`, which splits the files.")


def evaluation_set(limit: int | None = None) -> Workload:
    """The evaluation windows (the first `limit`), after checking they are disjoint from the calibration set."""
    evaluation = load_workload("evaluation")
    check_disjoint(load_workload("calibration"), evaluation)
    return evaluation if limit is None else evaluation.head(limit)


def load_model(folder: str | Path) -> Any:
    """A model folder, quantized or not, on the CPU in float32 (weights decompressed), eval mode."""
    import torch  # deferred: torch
    from transformers import AutoModelForCausalLM  # deferred: transformers

    cfg = json.loads((Path(folder) / "config.json").read_text())
    if cfg.get("quantization_config") and importlib.util.find_spec("compressed_tensors") is None:
        raise validate.refuse(OWNER, "folder", str(folder), "a folder transformers can load here (this one is "
                              "compressed-tensors: that package is missing)", "pip install 'lablib[quant]'.")
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def provenance(threads: int) -> str:
    import torch  # deferred: torch
    import transformers  # deferred: transformers

    cpu = device_facts().get("cpu") or "unknown CPU"
    return (f"measured on this machine's CPU ({cpu}), torch {torch.__version__}, "
            f"transformers {transformers.__version__}, {threads} thread(s): weights decompressed from the checkpoint, "
            "activations fake-quantized where the scheme says, matmuls in float32 (the scheme's numerics, "
            "not vLLM's GPU kernels)")
