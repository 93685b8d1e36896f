"""Lab 06's quality half on the CPU: what each quantization scheme costs the embedded target, with transformers.

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
  reference's (the user sets it; the seeds claim "under 1%").

How a quantized checkpoint runs here. transformers loads a compressed-tensors folder through its
integration and decompresses the weights on the first forward: each weight becomes exactly the value
the checkpoint stores (int4 or int8 or FP8 times its scale) in float32. Where the scheme quantizes
activations (fp8-dynamic, w8a8-int8), compressed-tensors' forward fake-quantizes each token's inputs
to FP8 or int8 as it arrives. The matmuls run in float32: this is the scheme's arithmetic, not vLLM's
kernels (Machete, Marlin, CUTLASS FP8 need a GPU), which accumulate differently; speed here means nothing.
The reference is the bf16 checkpoint computed in float32 on the same path.

The rest of lab 06 lives here too. On the CPU: `quantize_all` makes (or reuses) the checkpoints that
`quality_table` scores, `storage` reads what each one stores from its safetensors headers, `lm_head_rows`
measures lm_head kept 16-bit against quantized, `weights_alone` does the same byte arithmetic on the
published 8B and 70B shapes, and `claims` answers each seed claim from those numbers. On the GPU:
`prepare_checkpoints` quantizes a synthetic Llama-3.1-8B in the quantization environment, then
`vllm_speed_runs` measures decode speed and memory per scheme and batch through vLLM, each against its
own bandwidth roofline, and `record` is scripts/record_reference.py's step `quantization`; `speed` is the
notebook's one call, live on a GPU, recorded elsewhere.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import shutil
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import validate
from ..config import BenchConfig, VLLMConfig
from ..hardware.device import device_facts, library_versions
from ..models import LABEL as SYNTHETIC_LABEL
from ..models import embedded_path, parameter_count
from ..models.quantize import KERNEL_GROUPS, SCHEMES, default_group_size, linear_widths, quantize, read_facts
from ..results.record import Result
from ..results.store import ResultStore
from ..session import Shown, live_label, live_or_recorded
from ..workloads import Workload, load_workload

OWNER = "quantization"


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
    import torch

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
        first.append(next((i for i, s in enumerate(same) if not s), None))
    return Agreement(tuple(matched), tuple(first), n)


def greedy_tokens(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32) -> list[list[int]]:
    """Each prompt's greedy continuation, exactly max_new_tokens (EOS ignored): one forward per token, KV cached."""
    import torch

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
    import importlib.util
    import json

    import torch
    from transformers import AutoModelForCausalLM

    cfg = json.loads((Path(folder) / "config.json").read_text())
    if cfg.get("quantization_config") and importlib.util.find_spec("compressed_tensors") is None:
        raise validate.refuse(OWNER, "folder", str(folder), "a folder transformers can load here (this one is "
                              "compressed-tensors: that package is missing)", "pip install 'lablib[quant]'.")
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def weight_bytes(folder: str | Path) -> int:
    """Bytes of the weight files on disk (*.safetensors)."""
    return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))


def provenance(threads: int) -> str:
    import torch
    import transformers

    cpu = device_facts().get("cpu") or "unknown CPU"
    return (f"measured on this machine's CPU ({cpu}), torch {torch.__version__}, "
            f"transformers {transformers.__version__}, {threads} thread(s): weights decompressed from the checkpoint, "
            "activations fake-quantized where the scheme says, matmuls in float32 (the scheme's numerics, "
            "not vLLM's GPU kernels)")


def _quantized(model_dir: Path, folder: Path, scheme: str, num_samples: int, python: str | None,
               threads: int, fresh: bool) -> dict[str, Any]:
    """Reuse `folder` when it holds this very quantization, else (re)make it."""
    facts = read_facts(folder)
    want_group = default_group_size(linear_widths(model_dir)) if SCHEMES[scheme].grouped else None
    want_samples = num_samples if SCHEMES[scheme].calibrated else None
    same = facts is not None and facts.get("scheme") == scheme and facts.get("group_size") == want_group and \
        facts.get("model_dir") == str(model_dir.resolve()) and \
        (facts.get("calibration") or {}).get("samples") == want_samples
    if same and not fresh:
        return {**facts, "reused": True}
    if facts is not None:  # a folder this function wrote before, for other settings
        shutil.rmtree(folder)
    return {**quantize(model_dir, folder, scheme, num_samples=num_samples, python=python, threads=threads),
            "reused": False}


def quality_table(schemes: Sequence[str] = tuple(SCHEMES), *, work_dir: str | Path = "results/quantized",
                  eval_texts: int | None = None, prompts: int = 4, max_new_tokens: int = 32,
                  max_increase_pct: float = 1.0, num_samples: int = 64, threads: int = 1,
                  python: str | None = None, fresh: bool = False) -> list[dict[str, Any]]:
    """Quantize the embedded target with every scheme (live, on this CPU) and score each against bf16.

    One row per scheme after a bf16 row: weight bytes on disk, seconds to quantize (llm-compressor's
    oneshot; `quantize_wall_s` adds the worker's start and the save), perplexity on the evaluation set
    (`eval_texts`: the first N windows; all 64 by default) and its change, the gate at `max_increase_pct`,
    greedy agreement and mean first divergence on the first `prompts` journey prompts x max_new_tokens.
    Checkpoints go to work_dir/<scheme> and are reused when they hold the same quantization.
    """
    import torch

    for s in schemes:
        validate.choice(OWNER, "schemes", s, list(SCHEMES), f"pick from {list(SCHEMES)}.")
    validate.integer(OWNER, "prompts", prompts, "pass a number of journey prompts, e.g. 4.")
    validate.integer(OWNER, "max_new_tokens", max_new_tokens, "pass e.g. 32.")
    validate.integer(OWNER, "threads", threads, "pass e.g. 1 (a shared CPU).")
    model_dir, work = embedded_path("target"), Path(work_dir)
    evaluation = evaluation_set(eval_texts)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ref = load_model(model_dir)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        texts = evaluation.prompt_ids(tokenizer)
        journey = load_workload("journey", limit=prompts).prompt_ids(tokenizer)
        ppl_ref = perplexity(ref, tokenizer, texts)
        ref_tokens = greedy_tokens(ref, journey, max_new_tokens)
        label = provenance(threads)
        rows = [{"scheme": "bf16", "summary": "the checkpoint as trained (bf16 weights)",
                 "weight_bytes": weight_bytes(model_dir), "quantize_s": None, "quantize_wall_s": None,
                 "ppl": ppl_ref.ppl, "ppl_change_pct": 0.0, "gate": None, "agreement": 1.0,
                 "mean_first_divergence": float(max_new_tokens), "identical": f"{len(journey)}/{len(journey)}",
                 "eval": f"{evaluation.label}, {ppl_ref.tokens} predicted tokens",
                 "greedy": f"{len(journey)} journey prompts x {max_new_tokens} tokens", "provenance": label}]
        del ref
        for scheme in schemes:
            facts = _quantized(model_dir, work / scheme, scheme, num_samples, python, threads, fresh)
            torch.set_num_threads(threads)
            model = load_model(work / scheme)
            ppl = perplexity(model, tokenizer, texts)
            agree = agreement(ref_tokens, greedy_tokens(model, journey, max_new_tokens))
            gate = quality_gate(ppl.ppl, ppl_ref.ppl, max_increase_pct)
            rows.append({"scheme": scheme, "summary": SCHEMES[scheme].summary, "group_size": facts["group_size"],
                         "weight_bytes": facts["weight_bytes"], "quantize_s": facts["seconds"],
                         "quantize_wall_s": facts["wall_s"], "ppl": ppl.ppl, "ppl_change_pct": gate.increase_pct,
                         "gate": gate.sentence, "agreement": agree.agreement,
                         "mean_first_divergence": agree.mean_first_divergence,
                         "identical": f"{agree.identical}/{len(journey)}",
                         "first_divergence": list(agree.first_divergence),
                         "calibration": facts["calibration"], "reused": facts["reused"],
                         "eval": rows[0]["eval"], "greedy": rows[0]["greedy"], "provenance": label})
            del model
    finally:
        torch.set_num_threads(before)
    versions = library_versions()
    for r in rows:
        r["versions"] = {k: versions.get(k) for k in ("torch", "transformers")}
    return rows


def gate_rows(rows: Sequence[dict[str, Any]], max_increase_pct: float) -> list[dict[str, Any]]:
    """The quality table's rows re-judged at another threshold (the user's X), nothing re-measured."""
    ref = next(r["ppl"] for r in rows if r["scheme"] == "bf16")
    return [{"scheme": r["scheme"], **asdict(quality_gate(r["ppl"], ref, max_increase_pct))}
            for r in rows if r["scheme"] != "bf16"]


# ---------------------------------------------------------------------------------------------------------------
# The notebook's other steps on the CPU: the checkpoints made (or reused), what each one stores, lm_head kept or
# quantized, weights alone for the 8B and 70B shapes, and the seeds' claims answered from this run's numbers.
# ---------------------------------------------------------------------------------------------------------------

LAB = "06_quantization"
QUANTIZED_DTYPES = {"F8_E4M3": "fp8 e4m3", "I8": "int8", "I32": "int4, 8 packed per int32"}


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No progress bars while checkpoints load: transformers and compressed-tensors draw one per loading phase
    (weights, quantization config, decompression) on stderr, a dozen per scheme in a notebook. tqdm reads its
    TQDM_DISABLE only at import, so here each new bar is made disabled until the block ends."""
    import tqdm
    from transformers.utils import logging as hf_logging

    init, was = tqdm.tqdm.__init__, hf_logging.is_progress_bar_enabled()

    def disabled(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **{**kwargs, "disable": True})

    hf_logging.disable_progress_bar()
    tqdm.tqdm.__init__ = disabled
    try:
        yield
    finally:
        tqdm.tqdm.__init__ = init
        if was:
            hf_logging.enable_progress_bar()


def quantize_all(schemes: Sequence[str] = tuple(SCHEMES), *, work_dir: str | Path = "results/quantized",
                 num_samples: int = 64, threads: int = 1, python: str | None = None,
                 fresh: bool = False) -> list[dict[str, Any]]:
    """Quantize the embedded target with each scheme, live (llm-compressor in its own process), or reuse a checkpoint
    that holds the same quantization; one row per scheme with what it took.

    `quality_table` with the same work_dir and num_samples scores these very folders (it reuses them), so a
    notebook can make the checkpoints, show a recipe, then measure quality, in that order.
    """
    for s in schemes:
        validate.choice(OWNER, "schemes", s, list(SCHEMES), f"pick from {list(SCHEMES)}.")
    validate.integer(OWNER, "threads", threads, "pass e.g. 1 (a shared CPU).")
    model_dir, work = embedded_path("target"), Path(work_dir)
    rows = []
    for s in schemes:
        f = _quantized(model_dir, work / s, s, num_samples, python, threads, fresh)
        cal = f.get("calibration")
        rows.append({"scheme": s, "group_size": f["group_size"],
                     "calibration": cal["workload"] if cal else "none (data-free)",
                     "calibration_tokens": cal["tokens"] if cal else 0, "quantize_s": f["seconds"],
                     "quantize_wall_s": f["wall_s"], "weight_bytes": f["weight_bytes"], "reused": f["reused"],
                     "device": f.get("device"), "folder": str(work / s)})
    return rows


def group_size_rows(model_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Which of vLLM's 4-bit group sizes tile the model's Linear input widths (a group must tile every one: llm-compressor
    refuses at initialize, vLLM's loader fails), one row per distinct width, and the size `quantize` picks."""
    widths = linear_widths(model_dir or embedded_path("target"))
    rows = []
    for w in sorted(set(widths.values())):
        mods = [m for m, x in widths.items() if x == w]
        rows.append({"input_width": w, "modules": ", ".join(sorted({m.rsplit(".", 1)[-1] for m in mods})),
                     "linears": len(mods), **{f"tiles_{g}": f"{w} = {w // g} x {g}" if w % g == 0 else
                                              f"no ({w / g:g} x {g})" for g in KERNEL_GROUPS},
                     "default_group_size": default_group_size(widths)})
    return rows


def recipe_text(work_dir: str | Path, scheme: str) -> str:
    """The recipe llm-compressor wrote beside a checkpoint (recipe.yaml): the modifiers and their arguments."""
    path = Path(work_dir) / scheme / "recipe.yaml"
    if not path.is_file():
        raise validate.refuse(OWNER, "scheme", scheme, f"a scheme quantized into {work_dir} (no {path})",
                              "run quantize_all([scheme], work_dir=...) first.")
    return path.read_text()


def _tensors(folder: Path) -> dict[str, dict[str, Any]]:
    """Every tensor of a folder's safetensors files, from the headers alone: {name: {dtype, shape, bytes}}."""
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                start, end = t["data_offsets"]
                out[name] = {"dtype": t["dtype"], "shape": t["shape"], "bytes": end - start}
    return out


def storage(folder: str | Path, name: str | None = None) -> dict[str, Any]:
    """What one checkpoint stores, read from its safetensors headers (no torch): the decoder's Linear layers, lm_head,
    and the rest (embeddings, norms).

    A Linear's bytes include everything stored for it (the fp8/int8 weight or the packed int4 `weight_packed`,
    its scales, zero points and shape); its weights are out x in (a packed int32 holds 32 / bits of them).
    bytes_per_weight is the Linear layers' bytes over their weights: 2 for bf16, 1 plus a scale per output row
    for the 8-bit schemes, 0.5 plus a 16-bit scale (and, asymmetric, a 4-bit zero point) per group for int4.
    A tied lm_head has no tensor of its own: it multiplies by the embedding's table.
    """
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    qc = cfg.get("quantization_config") or {}
    bits = next((g["weights"]["num_bits"] for g in (qc.get("config_groups") or {}).values() if g.get("weights")), 16)
    tensors = _tensors(folder)
    mains = {n.rpartition(".")[0]: t for n, t in tensors.items()
             if n.rpartition(".")[2] in ("weight", "weight_packed") and len(t["shape"]) == 2 and "embed" not in n}
    linear = {"bytes": 0, "params": 0, "dtypes": set()}
    head = {"bytes": 0, "params": 0, "dtypes": set()}
    rest_bytes = 0
    for n, t in tensors.items():
        module, _, kind = n.rpartition(".")
        if module not in mains or not kind.startswith("weight"):
            rest_bytes += t["bytes"]
            continue
        part = head if module.endswith("lm_head") else linear
        part["bytes"] += t["bytes"]
        if kind in ("weight", "weight_packed"):
            out_dim, in_dim = t["shape"]
            part["params"] += out_dim * in_dim * (32 // bits if kind == "weight_packed" else 1)
            part["dtypes"].add(t["dtype"])
    if head["params"]:
        dtype = min(head["dtypes"])
        lm_head = f"quantized ({QUANTIZED_DTYPES[dtype]})" if dtype in QUANTIZED_DTYPES else f"its own {dtype} tensor"
    else:
        lm_head = "tied to the embedding (no tensor of its own)" if cfg.get("tie_word_embeddings") else "absent"
    per_weight = linear["bytes"] / linear["params"] if linear["params"] else None
    return {"scheme": name or folder.name, "file_bytes": weight_bytes(folder),
            "tensor_bytes": sum(t["bytes"] for t in tensors.values()), "linear_params": linear["params"],
            "linear_bytes": linear["bytes"], "bytes_per_weight": per_weight,
            "bits_per_weight": None if per_weight is None else 8 * per_weight,
            "linear_dtype": ", ".join(QUANTIZED_DTYPES.get(d, d) for d in sorted(linear["dtypes"])),
            "lm_head": lm_head, "lm_head_bytes": head["bytes"], "rest_bytes": rest_bytes,
            "rest_dtypes": ", ".join(sorted({t["dtype"] for n, t in tensors.items()
                                             if n.rpartition(".")[0] not in mains})),
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings"))}


def storage_rows(schemes: Sequence[str], work_dir: str | Path = "results/quantized") -> list[dict[str, Any]]:
    """storage() of the bf16 target and of each scheme's checkpoint in work_dir, each with its size against bf16."""
    rows = [storage(embedded_path("target"), "bf16")] + [storage(Path(work_dir) / s, s) for s in schemes]
    for r in rows:
        r["vs_bf16"] = r["file_bytes"] / rows[0]["file_bytes"]
        r["provenance"] = "read from the checkpoints made on this machine"
    return rows


@contextlib.contextmanager
def _on_cpu(threads: int) -> Iterator[None]:
    """torch on `threads` threads (a shared CPU) and no progress bars, both restored after the block."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with quiet_progress():
            yield
    finally:
        torch.set_num_threads(before)


def _reference(eval_texts: int | None, prompts: int, max_new_tokens: int, with_ppl: bool = True) -> dict[str, Any]:
    """The bf16 target's side of every comparison: tokenizer, evaluation ids, journey prompts, its ppl and tokens."""
    from transformers import AutoTokenizer

    model_dir = embedded_path("target")
    evaluation = evaluation_set(eval_texts)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    texts = evaluation.prompt_ids(tokenizer)
    journey = load_workload("journey", limit=prompts).prompt_ids(tokenizer)
    ref = load_model(model_dir)
    predicted = sum(len(t) - 1 for t in texts if len(t) >= 2)
    out = {"tokenizer": tokenizer, "texts": texts, "journey": journey,
           "ppl": perplexity(ref, tokenizer, texts).ppl if with_ppl else None,
           "tokens": greedy_tokens(ref, journey, max_new_tokens),
           "eval": f"{evaluation.label}, {predicted} predicted tokens",
           "greedy": f"{len(journey)} journey prompts x {max_new_tokens} tokens"}
    del ref
    return out


def _reuse_or_quantize(model_dir: Path, folder: Path, scheme: str, num_samples: int, ignore: tuple[str, ...],
                       python: str | None, threads: int | None) -> dict[str, Any]:
    """Like _quantized, and the ignored modules must match too (the lm_head step's second checkpoint)."""
    facts = read_facts(folder)
    want_samples = num_samples if SCHEMES[scheme].calibrated else None
    if facts is not None and facts.get("scheme") == scheme and facts.get("ignore") == list(ignore) and \
            facts.get("model_dir") == str(model_dir.resolve()) and \
            (facts.get("calibration") or {}).get("samples") == want_samples:
        return {**facts, "reused": True}
    if facts is not None:
        shutil.rmtree(folder)
    return {**quantize(model_dir, folder, scheme, num_samples=num_samples, ignore=ignore, python=python,
                       threads=threads), "reused": False}


def lm_head_rows(scheme: str = "gptq-w4a16", *, quality: Sequence[dict[str, Any]] | None = None,
                 work_dir: str | Path = "results/quantized", eval_texts: int | None = None, prompts: int = 4,
                 max_new_tokens: int = 32, num_samples: int = 64, max_increase_pct: float = 1.0, threads: int = 1,
                 python: str | None = None) -> list[dict[str, Any]]:
    """The seeds' "embeddings and lm_head in full precision", measured both ways on the embedded target (live).

    Two checkpoints of `scheme`: the default recipe (ignore=("lm_head",): lm_head stays 16-bit) and one that
    quantizes lm_head too (ignore=()); each row its size, what lm_head became, perplexity and greedy agreement
    against bf16 on the same texts. The embedded target ties lm_head to the embedding (one 4096 x 256 table,
    22% of its weights): quantizing lm_head unties it, since the embedding is a lookup that stays 16-bit, so
    the checkpoint gains a quantized copy of the table instead of losing bytes. On an untied model (Llama-3.1-8B)
    quantizing lm_head saves its bytes instead.

    quality: quality_table's rows for the same eval_texts, prompts and max_new_tokens; the default recipe's scores
    and bf16's perplexity are then taken from there, not measured again (rows made on other texts are refused).
    """
    validate.choice(OWNER, "scheme", scheme, list(SCHEMES), f"pick from {list(SCHEMES)}.")
    validate.integer(OWNER, "threads", threads, "pass e.g. 1 (a shared CPU).")
    model_dir, work = embedded_path("target"), Path(work_dir)
    with _on_cpu(threads):
        made = [("kept 16-bit", work / scheme, _quantized(model_dir, work / scheme, scheme, num_samples, python,
                                                          threads, False)),
                ("quantized too", work / f"{scheme}+lm_head",
                 _reuse_or_quantize(model_dir, work / f"{scheme}+lm_head", scheme, num_samples, (), python, threads))]
        ref = _reference(eval_texts, prompts, max_new_tokens, with_ppl=quality is None)
        earlier = None if quality is None else next((r for r in quality if r["scheme"] == scheme), None)
        if quality is not None:
            if earlier is None or (quality[0]["eval"], quality[0]["greedy"]) != (ref["eval"], ref["greedy"]):
                raise validate.refuse(OWNER, "quality", [r["scheme"] for r in quality],
                                      f"quality_table rows holding {scheme!r}, scored on {ref['eval']} and "
                                      f"{ref['greedy']}", "pass the rows quality_table made with the same "
                                      "eval_texts, prompts and max_new_tokens, or quality=None to measure here.")
            ref["ppl"] = quality[0]["ppl"]
        cfg = json.loads((model_dir / "config.json").read_text())
        share = cfg["vocab_size"] * cfg["hidden_size"] / parameter_count(cfg)
        rows = []
        for label, folder, facts in made:
            if label == "kept 16-bit" and earlier is not None:
                score = {k: earlier[k] for k in ("ppl", "agreement", "mean_first_divergence", "first_divergence")}
            else:
                model = load_model(folder)
                agree = agreement(ref["tokens"], greedy_tokens(model, ref["journey"], max_new_tokens))
                score = {"ppl": perplexity(model, ref["tokenizer"], ref["texts"]).ppl, "agreement": agree.agreement,
                         "mean_first_divergence": agree.mean_first_divergence,
                         "first_divergence": list(agree.first_divergence)}
                del model
            gate = quality_gate(score["ppl"], ref["ppl"], max_increase_pct)
            st = storage(folder)
            rows.append({"scheme": scheme, "lm_head": label, "stored_as": st["lm_head"],
                         "weight_bytes": facts["weight_bytes"], "lm_head_bytes": st["lm_head_bytes"],
                         "rest_bytes": st["rest_bytes"], **score, "ppl_ref": ref["ppl"],
                         "ppl_change_pct": gate.increase_pct, "gate": gate.sentence, "reused": facts["reused"],
                         "lm_head_share": share, "eval": ref["eval"], "greedy": ref["greedy"],
                         "provenance": provenance(threads)})
    rows[1]["size_vs_kept_pct"] = 100.0 * (rows[1]["weight_bytes"] / rows[0]["weight_bytes"] - 1.0)
    rows[0]["size_vs_kept_pct"] = 0.0
    return rows


def lm_head_sentence(rows: Sequence[dict[str, Any]]) -> str:
    """lm_head_rows' finding in one sentence, from its numbers."""
    kept, both = rows
    grew = "larger" if both["size_vs_kept_pct"] > 0 else "smaller"
    return (f"{kept['scheme']}: lm_head is {kept['lm_head_share']:.0%} of the target's weights. Quantizing it too made "
            f"the checkpoint {abs(both['size_vs_kept_pct']):.1f}% {grew} ({kept['weight_bytes']:,} -> "
            f"{both['weight_bytes']:,} bytes; lm_head {both['stored_as']}) and moved perplexity from "
            f"{kept['ppl_change_pct']:+.2f}% to {both['ppl_change_pct']:+.2f}% of bf16's; greedy agreement "
            f"{kept['agreement']:.0%} -> {both['agreement']:.0%}.")


# bits per stored weight, group size (None: one scale per output row), symmetric (False: a zero point per group)
WEIGHT_FORMATS: dict[str, tuple[int, int | None, bool]] = {
    "bf16": (16, None, True), "fp8 / int8, per channel": (8, None, True), "w4a16 g128, symmetric (GPTQ)": (4, 128, True),
    "w4a16 g128, asymmetric (AWQ)": (4, 128, False), "w4a16 g64, symmetric (GPTQ)": (4, 64, True)}


def linear_shapes(cfg: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(name, out, in) of every decoder Linear of a Llama-style config, layer by layer (q, k, v, o, gate, up, down)."""
    h, i, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    kv, hd = cfg.get("num_key_value_heads", heads), cfg.get("head_dim") or cfg["hidden_size"] // heads
    one = [("q_proj", heads * hd, h), ("k_proj", kv * hd, h), ("v_proj", kv * hd, h), ("o_proj", h, heads * hd),
           ("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
    return [(f"model.layers.{n}.{name}", o, k) for n in range(cfg["num_hidden_layers"]) for name, o, k in one]


def linear_bytes(out_dim: int, in_dim: int, bits: int, group: int | None, symmetric: bool) -> float:
    """Bytes one Linear stores in a format: its weights, a 16-bit scale per output row (or per group), and for an
    asymmetric format a zero point per group at the weights' width (compressed-tensors' layout; the 16-byte shape
    tensor of a packed weight left out)."""
    if bits == 16:
        return out_dim * in_dim * 2.0
    scales = out_dim * (in_dim // group if group else 1)
    return out_dim * in_dim * bits / 8 + 2.0 * scales + (0.0 if symmetric else scales * bits / 8)


def predicted_bytes(cfg: dict[str, Any], fmt: str, quantize_lm_head: bool = False) -> float:
    """Weight bytes of a Llama-style config in one of WEIGHT_FORMATS: decoder Linears in the format; embedding, norms
    (and lm_head unless quantize_lm_head) at 2 bytes; a tied lm_head stores nothing unless it is quantized."""
    bits, group, symmetric = WEIGHT_FORMATS[fmt]
    h, v, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    total = sum(linear_bytes(o, k, bits, group, symmetric) for _, o, k in linear_shapes(cfg))
    total += v * h * 2.0 + (2 * n + 1) * h * 2.0  # the embedding and the norms
    if quantize_lm_head:
        total += linear_bytes(v, h, bits, group, symmetric)
    elif not cfg.get("tie_word_embeddings"):
        total += v * h * 2.0
    return total


def weights_alone(models: Sequence[str] = ("llama-3.1-8b", "llama-3.1-70b"), gpu: str = "H200",
                  context: int = 8192) -> list[dict[str, Any]]:
    """Weight bytes of real shapes in each of WEIGHT_FORMATS, by arithmetic on their published config.json, and whether
    weights plus one `context`-token sequence's bf16 KV plus the engine's reserve fit in 90% of one `gpu`.

    No weights are read: the same formula (`predicted_bytes`) gives the embedded target's checkpoints to within
    their shape tensors and header (tests/experiments/test_quantization.py). What vLLM really holds per scheme on
    the H200 is the speed step's `model_load_gib`.
    """
    from ..hardware.fit import RESERVE_BYTES
    from ..mechanisms.gpus import GPU_PEAKS
    from ..models import architectures, kv_bytes_per_token

    validate.choice(OWNER, "gpu", gpu, list(GPU_PEAKS))
    archs = architectures()
    rows = []
    for m in models:
        validate.choice(OWNER, "models", m, list(archs))
        cfg = archs[m]
        heads = cfg["num_attention_heads"]
        kv = kv_bytes_per_token(cfg["num_hidden_layers"], cfg.get("num_key_value_heads", heads),
                                cfg.get("head_dim") or cfg["hidden_size"] // heads, 2) * context
        bf16 = predicted_bytes(cfg, "bf16")
        for fmt in WEIGHT_FORMATS:
            w = predicted_bytes(cfg, fmt)
            rows.append({"model": m, "parameters_B": parameter_count(cfg) / 1e9, "format": fmt, "weights_GB": w / 1e9,
                         "vs_bf16": w / bf16, "kv_GB_one_sequence": kv / 1e9,
                         f"fits_one_{gpu}": w + kv + RESERVE_BYTES <= 0.9 * GPU_PEAKS[gpu].memory_gb * 1e9,
                         "provenance": f"arithmetic on {cfg.get('_source', m)}"})
    return rows


def under_one_percent(rows: Sequence[dict[str, Any]], threshold_pct: float = 1.0) -> str:
    """The seeds' "the accuracy loss is under 1%", answered scheme by scheme from a quality table."""
    parts = [f"{r['scheme']} {r['ppl_change_pct']:+.2f}% ({'under' if r['ppl_change_pct'] < threshold_pct else 'not under'})"
             for r in rows if r["scheme"] != "bf16"]
    under = [r["scheme"] for r in rows if r["scheme"] != "bf16" and r["ppl_change_pct"] < threshold_pct]
    over = [r["scheme"] for r in rows if r["scheme"] != "bf16" and r["ppl_change_pct"] >= threshold_pct]
    verdict = ("holds for every scheme run" if not over else "holds for none of the schemes run" if not under else
               f"holds for {', '.join(under)}; not for {', '.join(over)}")
    return (f"'under {threshold_pct:g}%' (perplexity against bf16's {rows[0]['ppl']:.3f}, {rows[0]['eval']}): "
            f"{'; '.join(parts)}. Verdict: {verdict}.")


def headline(stored: Sequence[dict[str, Any]], quality: Sequence[dict[str, Any]], max_increase_pct: float) -> str:
    """This run's numbers per scheme in one line each: bytes against bf16, bits per Linear weight, quality, the gate."""
    q = {r["scheme"]: r for r in quality}
    lines = []
    for r in stored[1:]:
        g = quality_gate(q[r["scheme"]]["ppl"], quality[0]["ppl"], max_increase_pct)
        lines.append(f"{r['scheme']}: x{r['vs_bf16']:.2f} of bf16's bytes, {r['bits_per_weight']:.2f} bits per Linear "
                     f"weight; perplexity {g.increase_pct:+.2f}%, {q[r['scheme']]['agreement']:.0%} of greedy tokens "
                     f"as bf16's; {'passes' if g else 'fails'} your {max_increase_pct:g}% gate")
    return "\n".join(lines)


def _verdict(held: Sequence[bool]) -> str:
    return "holds" if held and all(held) else "does not hold" if not any(held) else "holds only in part"


def claims(quality: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]], lm_head: Sequence[dict[str, Any]],
           weights: Sequence[dict[str, Any]], speed: Shown | None = None) -> list[dict[str, str]]:
    """Each seed claim the issue lists: a verdict, the evidence in this run's numbers, and where they come from.

    quality: quality_table's rows; stored: storage_rows'; lm_head: lm_head_rows'; weights: weights_alone's (with
    llama-3.1-70b); speed: what `speed()` returned (its rows, or nothing recorded yet). A claim this machine
    cannot measure says so ("not measured here") rather than borrow a number.
    """
    here, arith = "live on this CPU (embedded model)", "arithmetic on the published config"
    gpu_where = speed.label if speed is not None else "no speed runs passed"
    out: list[dict[str, str]] = []

    def add(claim: str, verdict: str, evidence: str, where: str) -> None:
        out.append({"claim": claim, "verdict": verdict, "evidence": evidence, "where": where})

    by = {(w["model"], w["format"]): w for w in weights}
    gb = {f: by[("llama-3.1-70b", f)]["weights_GB"] for f in WEIGHT_FORMATS if ("llama-3.1-70b", f) in by}
    small = ", ".join(f"{r['scheme']} x{r['vs_bf16']:.2f}" for r in stored if r["scheme"] in ("fp8-dynamic", "w8a8-int8"))
    share = lm_head[0]["lm_head_share"]  # the tied embedding / lm_head table's share of the target's weights
    params = parameter_count(json.loads((embedded_path("target") / "config.json").read_text()))
    if gb:
        ratio = gb["fp8 / int8, per channel"] / gb["bf16"]
        add("a 70B model from FP16 to INT8 halves its memory", _verdict([0.45 <= ratio <= 0.55]),
            f"Llama-3.1-70B weights {gb['bf16']:.1f} GB -> {gb['fp8 / int8, per channel']:.1f} GB (x{ratio:.3f}: "
            "embeddings and lm_head stay 16-bit; the KV cache is not halved)" +
            (f"; the embedded model's checkpoints {small}: its 16-bit embedding is {share:.0%} of its weights"
             if small else ""),
            arith + (f"; {here}" if small else ""))
        g128, awq, g64 = (gb[f] for f in ("w4a16 g128, symmetric (GPTQ)", "w4a16 g128, asymmetric (AWQ)",
                                          "w4a16 g64, symmetric (GPTQ)"))
        add("4-bit GPTQ/AWQ compress 140 GB to under 40 GB", _verdict([g128 < 40, awq < 40, g64 < 40]),
            f"Llama-3.1-70B bf16 {gb['bf16']:.1f} GB -> GPTQ g128 {g128:.1f} GB, AWQ g128 {awq:.1f} GB (its zero "
            f"points), g64 {g64:.1f} GB" + (": under 40 at group 128 only" if g128 < 40 <= g64 else "") +
            "; weights alone, before any KV cache", arith)
    run = [r for r in quality if r["scheme"] != "bf16"]
    add("the accuracy loss is under 1%", _verdict([r["ppl_change_pct"] < 1.0 for r in run]),
        "; ".join(f"{r['scheme']} {r['ppl_change_pct']:+.2f}%" for r in run) + f" perplexity vs bf16 ({quality[0]['eval']})",
        here)
    gptq, awq_r = (next((r for r in run if r["scheme"] == s), None) for s in ("gptq-w4a16", "awq-w4a16"))
    claim = "AWQ keeps more salient weights and suits generation better than GPTQ"
    if gptq and awq_r:
        add(claim, _verdict([awq_r["ppl_change_pct"] < gptq["ppl_change_pct"], awq_r["agreement"] > gptq["agreement"]]),
            "; ".join(f"{name} {r['ppl_change_pct']:+.2f}% perplexity, {r['agreement']:.0%} greedy agreement, first "
                      f"divergence {r['mean_first_divergence']:.1f} tokens on average"
                      for name, r in (("AWQ", awq_r), ("GPTQ", gptq))) +
            f" (both group {gptq.get('group_size')}, {(gptq.get('calibration') or {}).get('samples')} calibration "
            f"windows, a {params / 1e6:.1f}M-parameter model)", here)
    else:
        add(claim, "not measured here", "needs both 'gptq-w4a16' and 'awq-w4a16' in SCHEMES", here)
    rows = (speed.value if speed is not None else None) or []
    at = {(r["scheme"], r["batch"]): r for r in rows}
    fp8 = next((r for r in run if r["scheme"] == "fp8-dynamic"), None)
    online = [(b, at[("fp8", b)]["decode_tok_s"], at[("bf16", b)]["decode_tok_s"])
              for s, b in sorted(at) if s == "fp8" and ("bf16", b) in at]
    evidence = (f"fp8-dynamic took no calibration data and {fp8['quantize_s']:.2f} s to quantize" if fp8
                else "fp8-dynamic not in SCHEMES")
    evidence += ("; on the GPU, online fp8 (no checkpoint) vs bf16: " +
                 ", ".join(f"batch {b} {x:,.0f} vs {y:,.0f} tok/s" for b, x, y in online) if online
                 else "; Hopper speed not measured here")
    add("FP8 is Hopper's native format, no offline quantization needed",
        ("holds" if online and all(x > y for _, x, y in online) else "holds for the data-free part" if fp8
         else "not measured here"), evidence, f"{here}; {gpu_where}")
    lm = {r["lm_head"]: r for r in lm_head}
    add("attention dynamic, MLP static, embeddings kept in full precision", "holds only in part",
        f"embeddings stay bf16 in every checkpoint ({all('BF16' in r['rest_dtypes'] for r in stored)}); quantizing "
        f"lm_head too: checkpoint {lm['quantized too']['size_vs_kept_pct']:+.1f}% (the tied table is untied), "
        f"perplexity {lm['kept 16-bit']['ppl_change_pct']:+.2f}% -> {lm['quantized too']['ppl_change_pct']:+.2f}%; "
        "'attention dynamic, MLP static' not tested: every scheme here quantizes activations per token at run "
        "time, in attention and MLP alike", here)
    add("validate quality with the same business test set before and after", "followed here",
        f"bf16 and every scheme scored on the same {quality[0]['eval']}, disjoint from the calibration set "
        "(check_disjoint; calibrating on 'evaluation' is refused)", here)
    int4 = [(b, at[("gptq-w4a16", b)]["decode_tok_s"], at[("bf16", b)]["decode_tok_s"])
            for s, b in sorted(at) if s == "gptq-w4a16" and ("bf16", b) in at]
    add("fewer bytes per weight, faster decode (int4's ~3.5x fewer bytes)",
        _verdict([x > y for _, x, y in int4]) if int4 else "not measured here",
        "; ".join(f"batch {b}: GPTQ {x:,.0f} vs bf16 {y:,.0f} decode tok/s" for b, x, y in int4)
        or "the H200 speed runs are not recorded yet", gpu_where)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The GPU half: speed and memory on a synthetic Llama-3.1-8B per scheme and batch, through vLLM 0.26.
# ---------------------------------------------------------------------------------------------------------------

GPU_WORK = "/tmp/lablib-quantized"  # where the GPU session's quantized synthetic checkpoints go (64 GiB disk there)
SPEED_MODEL = "llama-3.1-8b"
BATCHES = (1, 8, 64, 256)
# schemes that are vLLM switches on the bf16 checkpoint rather than checkpoints of their own
VLLM_SWITCHES: dict[str, dict[str, Any]] = {"bf16": {}, "fp8": {"quantization": "fp8"},
                                            "bf16-kv-fp8": {"kv_cache_dtype": "fp8"}}
SPEED_SCHEMES = ("bf16", "fp8", "gptq-w4a16", "awq-w4a16", "w8a8-int8", "bf16-kv-fp8")
KERNEL_LINE = re.compile(r"(?:Using|Selected) (\w+Kernel) for (\w+)")
LOAD_LINE = re.compile(r"Model loading took ([\d.]+) GiB")
KV_LINE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")


def _gpu_source(model: str, work_dir: Path) -> Path:
    """The synthetic bf16 checkpoint (made if absent) seen through a folder of links with the embedded tokenizer
    beside it: the quantizer tokenizes its calibration texts with it (ids valid in any real vocabulary)."""
    from ..models import synthetic_spec

    spec = synthetic_spec(model)
    src = work_dir / f"{model}-bf16"
    src.mkdir(parents=True, exist_ok=True)
    for f in Path(spec.path).iterdir():
        if not (src / f.name).exists():
            (src / f.name).symlink_to(f)
    for f in embedded_path("target").glob("tokenizer*"):
        if not (src / f.name).exists():
            shutil.copy(f, src / f.name)
    return src


def prepare_checkpoints(schemes: Sequence[str] = SPEED_SCHEMES, *, model: str = SPEED_MODEL,
                        work_dir: str | Path = GPU_WORK, num_samples: int = 16, python: str | None = None,
                        threads: int | None = None) -> list[dict[str, Any]]:
    """The GPU session's first command: quantize the synthetic 8B with every checkpoint scheme in `schemes`.

    llm-compressor 0.14 (compressed-tensors 0.19) and vLLM 0.26 (compressed-tensors 0.17) cannot share an
    environment, so on the GPU machine the lab's speed step is two commands (shared/gpu/README.md, "A second
    environment for quantization"), sent while the machine is held (its /tmp goes with it):

        # 1. the quantization environment (staged with ../shared/gpu/stage --no-vllm --site /tmp/site-q
        #    -r ../shared/gpu/llmcompressor-0.14.0.1-deps.txt): make the checkpoints
        PYTHONPATH=/tmp/site-q python -c "from lablib.experiments.quantization import prepare_checkpoints as p; p()"
        # 2. vLLM's environment (/tmp/site): speed and memory per scheme and batch, recorded
        PYTHONPATH=/tmp/site python scripts/record_reference.py --out $OUT --steps quantization

    Checkpoints go to work_dir/<model>/<scheme> and are reused when they hold the same quantization. The
    calibration windows only pace the quantizer here: synthetic weights have no quality to keep, so 16 do.
    Schemes that are vLLM switches (bf16, online fp8, fp8 KV cache) need no checkpoint and are skipped.
    """
    for s in schemes:
        validate.choice(OWNER, "schemes", s, list(SCHEMES) + list(VLLM_SWITCHES))
    work = Path(work_dir)
    src = _gpu_source(model, work)
    rows = []
    for s in (s for s in schemes if s not in VLLM_SWITCHES):
        facts = _reuse_or_quantize(src, work / model / s, s, num_samples, ("lm_head",), python, threads)
        rows.append({k: facts.get(k) for k in ("scheme", "group_size", "seconds", "wall_s", "weight_bytes", "device",
                                               "reused", "out_dir")})
    return rows


def vllm_log_facts(log: str) -> dict[str, Any]:
    """What vLLM prints but does not expose: the kernel it chose per quantized layer type, the GiB the weights took
    on the GPU, the GiB left to the KV cache.

    vLLM 0.26 logs "Using MacheteLinearKernel for CompressedTensorsWNA16" (int4: Machete on Hopper, Marlin
    elsewhere) and "Selected CutlassFP8ScaledMMLinearKernel for ..." (8-bit scaled matmuls); a bf16 model logs
    none: its Linears are torch's cuBLAS GEMMs.
    """
    kernels = {layer: kernel for kernel, layer in KERNEL_LINE.findall(log)}
    load, kv = LOAD_LINE.findall(log), KV_LINE.findall(log)
    return {"linear_kernels": kernels, "model_load_gib": float(load[-1]) if load else None,
            "kv_cache_gib": float(kv[-1]) if kv else None}


def fixed_workload(n: int, prompt_len: int = 128, output_len: int = 128) -> Workload:
    """n requests of exactly prompt_len tokens (the embedded tokenizer's, bos included), output_len tokens out each:
    code cut from the calibration windows (speed runs score no quality), cycled when n asks for more."""
    from ..models import load_tokenizer, resolve_model
    from ..workloads import Request

    validate.integer(OWNER, "n", n, "pass a batch size, e.g. 64.")
    validate.integer(OWNER, "prompt_len", prompt_len, "pass e.g. 128.", 2)
    validate.integer(OWNER, "output_len", output_len, "pass e.g. 128.")
    tok = load_tokenizer(resolve_model("embedded"))
    texts: list[str] = []
    for r in load_workload("calibration").requests:
        ids = tok(r.prompt)["input_ids"][1:]
        for start in range(0, len(ids) - prompt_len, prompt_len):
            text = tok.decode(ids[start:start + prompt_len - 1])
            if len(tok(text)["input_ids"]) == prompt_len:
                texts.append(text)
        if len(texts) >= n:
            break
    if not texts:
        raise validate.refuse(OWNER, "prompt_len", prompt_len, "a length the calibration windows (512 tokens) hold",
                              "pass e.g. 128.")
    reqs = tuple(Request(f"fixed-{i:03d}", texts[i % len(texts)], ({"role": "user", "content": texts[i % len(texts)]},),
                         output_len, prompt_len) for i in range(n))
    return Workload(f"fixed-{prompt_len}x{output_len}", 1, "code cut to a fixed token length, fixed output length",
                    reqs)


def _speed_engine(scheme: str, model: str, work_dir: Path, gpu_memory_utilization: float, max_num_seqs: int,
                  max_model_len: int) -> tuple[Any, VLLMConfig]:
    """The ModelSpec and VLLMConfig of one speed run; a missing checkpoint is refused naming the command that makes it."""
    from ..models import ModelSpec, check_model_dir

    config = VLLMConfig(gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
                        max_model_len=max_model_len, **VLLM_SWITCHES.get(scheme, {}))
    base = f"synthetic:{model}" if model != "embedded" else "embedded"
    if scheme in VLLM_SWITCHES:
        return base, config
    folder = work_dir / model / scheme
    if read_facts(folder) is None:
        raise validate.refuse(OWNER, "schemes", scheme, f"a scheme whose checkpoint is in {folder} (not made yet)",
                              "make it first in the quantization environment: PYTHONPATH=/tmp/site-q python -c "
                              "\"from lablib.experiments.quantization import prepare_checkpoints as p; p()\" "
                              "(see prepare_checkpoints), or leave the scheme out.")
    source = "synthetic" if model != "embedded" else "path"
    name = f"synthetic:{model}+{scheme}" if model != "embedded" else str(folder)
    return ModelSpec(name, str(folder), source, check_model_dir(folder)), config


def vllm_speed_runs(schemes: Sequence[str] = SPEED_SCHEMES, batches: Sequence[int] = BATCHES, *,
                    model: str = SPEED_MODEL, work_dir: str | Path = GPU_WORK, prompt_len: int = 128,
                    output_len: int = 128, gpu_memory_utilization: float = 0.9, max_model_len: int = 2048,
                    store: ResultStore | None = None, lab: str = LAB,
                    on_result: Callable[[Result], None] | None = None) -> list[Result]:
    """Decode speed and memory of each scheme at each batch size, on vLLM (one engine per scheme, on a GPU).

    For every scheme one engine at `gpu_memory_utilization` (its KV capacity is what is left after the weights),
    then at each batch B a run of B requests of prompt_len in / output_len out, all submitted at once, through
    the lab's timing protocol (`bench.offline.run`: warm-up, fixed lengths). Each Result carries the kernel vLLM
    chose (`engine_facts["linear_kernels"]`, from its log), the GiB its weights took and its KV tokens; step
    `quant-<scheme>-b<B>`. Schemes: bf16 (the synthetic checkpoint), fp8 (vLLM's online FP8: quantization="fp8",
    no checkpoint), bf16-kv-fp8 (bf16 weights, kv_cache_dtype="fp8"), and any of SCHEMES, loaded from the
    checkpoint `prepare_checkpoints` made in the quantization environment first (see there: the two commands).
    The default model is a synthetic shape: synthetic weights, speed and memory are real, the text is not
    (model="embedded" runs the lab's own model, as the tests do on the fake vLLM). Every refusal (an unknown
    scheme, a checkpoint not made yet, a bad batch size) comes before any engine starts.
    """
    from ..bench.offline import run
    from ..engines.vllm import VLLMEngine

    for s in schemes:
        validate.choice(OWNER, "schemes", s, list(VLLM_SWITCHES) + list(SCHEMES))
    validate.integers(OWNER, "batches", batches, "pass batch sizes, e.g. (1, 8, 64, 256).")
    work = Path(work_dir)
    plans = [(s, *_speed_engine(s, model, work, gpu_memory_utilization, max(batches), max_model_len)) for s in schemes]
    workloads = {b: fixed_workload(b, prompt_len, output_len) for b in batches}
    results = []
    for scheme, spec, config in plans:
        with VLLMEngine(spec, config) as eng:
            eng.start()
            eng.facts.update(vllm_log_facts(Path(eng.log_path).read_text(errors="replace")), scheme=scheme)
            for b in batches:
                bench = BenchConfig(progress=False, tags={"scheme": scheme, "batch": b})
                r = run(eng, workloads[b], bench, lab=lab, step=f"quant-{scheme}-b{b}", store=store)
                results.append(r)
                if on_result:
                    on_result(r)
    return results


def speed_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One row per speed run: decode tok/s (batch / median TPOT) against the scheme's own bandwidth roofline.

    The roofline reads every weight once per step plus each sequence's KV cache at its mean context
    (prompt + half the output): batch x peak bandwidth / (weight bytes + KV bytes per token x batch x context),
    with the bytes vLLM reported loading for this scheme (its log), else the checkpoint's size.
    """
    from ..hardware.roofline import decode_ceiling_tok_s, lookup_gpu

    rows = []
    for r in results:
        f, s = r.engine_facts, r.summary
        batch = int(r.config.get("batch") or s["requests"])
        tpot = (s.get("tpot_s") or {}).get("p50")
        weights = f["model_load_gib"] * 2**30 if f.get("model_load_gib") else f.get("weight_bytes")
        context = sum(q.prompt_tokens + q.output_tokens / 2 for q in r.requests) / max(1, len(r.requests))
        peak = lookup_gpu(r.hardware.get("gpu"))
        kv = f.get("kv_bytes_per_token") or 0
        roof = decode_ceiling_tok_s(peak.peak_bw, weights, kv, batch, context) if peak and weights else None
        decode = batch / tpot if tpot else None
        rows.append({"scheme": r.config.get("scheme") or r.step, "batch": batch, "decode_tok_s": decode,
                     "output_tok_s": s["output_tok_s"], "roofline_tok_s": roof,
                     "of_roofline": decode / roof if decode and roof else None,
                     "tpot_ms": tpot * 1e3 if tpot else None, "weight_gib": weights / 2**30 if weights else None,
                     "kv_tokens": f.get("kv_tokens"), "kv_cache_dtype": f.get("kv_cache_dtype"),
                     "linear_kernels": ", ".join(f"{k} ({layer})" for layer, k in (f.get("linear_kernels") or {}).items())
                     or "none logged (bf16: cuBLAS)", "gpu": r.hardware.get("gpu"),
                     "model": r.model.get("name"), "synthetic": bool(r.model.get("synthetic")),
                     "provenance": (f"recorded on {r.hardware.get('gpu') or 'CPU'}, {r.recorded_at[:10]}"
                                    if r.provenance == "recorded" else live_label())})
    return rows


def kv_sentence(rows: Sequence[dict[str, Any]] | None) -> str:
    """FP8 KV cache against bf16 KV: capacity in tokens and throughput at the largest batch, from speed rows."""
    if not rows:
        return "FP8 KV cache: not measured here (the speed runs are not recorded yet)"
    by = {(r["scheme"], r["batch"]): r for r in rows}
    top = max(r["batch"] for r in rows)
    a, b = by.get(("bf16", top)), by.get(("bf16-kv-fp8", top))
    if not (a and b):
        return "FP8 KV cache: the speed runs hold no bf16 and bf16-kv-fp8 pair"
    return (f"KV capacity at the same gpu_memory_utilization: bf16 KV {a['kv_tokens']:,} tokens, FP8 KV "
            f"{b['kv_tokens']:,} (x{b['kv_tokens'] / a['kv_tokens']:.2f}); at batch {top}: {a['decode_tok_s']:,.0f} vs "
            f"{b['decode_tok_s']:,.0f} decode tok/s  [{b['provenance']}]")


def available_speed_schemes(model: str = SPEED_MODEL, work_dir: str | Path = GPU_WORK) -> list[str]:
    """The speed schemes that can run now: vLLM's switches on bf16, and every checkpoint prepare_checkpoints made."""
    return [s for s in SPEED_SCHEMES if s in VLLM_SWITCHES or read_facts(Path(work_dir) / model / s) is not None]


def speed(force: bool | None = None, schemes: Sequence[str] | None = None, **kw: Any) -> Shown[list[dict[str, Any]]]:
    """speed_rows of every scheme and batch on the synthetic 8B: live on a GPU with vLLM (vllm_speed_runs), else the
    runs recorded on the H200 (step `quantization` of scripts/record_reference.py).

    Live, `schemes=None` runs what can run now (`available_speed_schemes`: a checkpoint scheme only once
    prepare_checkpoints has made it in the quantization environment); name them to have a missing one refused.
    """
    from ..results.reference import NotRecorded, load_reference

    def live() -> list[dict[str, Any]]:
        chosen = schemes if schemes is not None else available_speed_schemes(kw.get("model", SPEED_MODEL),
                                                                             kw.get("work_dir", GPU_WORK))
        return speed_rows(vllm_speed_runs(chosen, **kw))

    def recorded() -> list[dict[str, Any]]:
        runs = load_reference(prefix="quant-")
        if not runs:
            raise NotRecorded("lab 06's speed and memory per scheme on the synthetic 8B", "quantization")
        return speed_rows(runs)

    return live_or_recorded(live, recorded, force=force)


def record(out_dir: str | Path, store: ResultStore, facts: dict[str, Any], *, schemes: Sequence[str] = SPEED_SCHEMES,
           batches: Sequence[int] = BATCHES, key: str = "quantization", **kw: Any) -> None:
    """scripts/record_reference.py's step `quantization` (STEPS["quantization"] = this): the speed runs, recorded.

    Run prepare_checkpoints first, in the quantization environment (its docstring has the two commands). Every
    Result goes into `store` with provenance "recorded" (the notebook's recorded path reads them back by step,
    `quant-<scheme>-b<B>`); facts[key] keeps the per-scheme summary (kernels, weight GiB, KV tokens) and the
    checkpoints' own facts (GPU quantize seconds). Six engines of the 8B are about 10 minutes: to split them over
    two commands, pass schemes= a part and key="quantization-2" in the second (facts are overlaid key by key).
    """
    results = vllm_speed_runs(schemes, batches, **kw)
    for r in results:
        store.append(dataclasses.replace(r, provenance="recorded"))
    rows = speed_rows(results)
    work = Path(kw.get("work_dir", GPU_WORK)) / kw.get("model", SPEED_MODEL)
    facts[key] = {
        "model": kw.get("model", SPEED_MODEL), "label": SYNTHETIC_LABEL, "batches": list(batches),
        "schemes": {s: {k: next(r[k] for r in rows if r["scheme"] == s)
                        for k in ("weight_gib", "kv_tokens", "kv_cache_dtype", "linear_kernels")} for s in schemes},
        "kv": kv_sentence(rows),
        "checkpoints": {s: {k: (read_facts(work / s) or {}).get(k) for k in ("seconds", "wall_s", "weight_bytes",
                                                                            "device", "group_size")}
                        for s in schemes if s not in VLLM_SWITCHES}}
    with open(Path(out_dir) / "log.txt", "a") as f:
        f.write(f"quantization: {len(results)} runs; {facts[key]['kv']}\n")
