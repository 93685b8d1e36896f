"""Lab 06's quality table: every scheme's checkpoint scored against the bf16 target, live on this CPU.

`quality_table` quantizes (or reuses) a checkpoint per scheme and sets its bytes, perplexity, greedy
agreement and gate verdict beside bf16's; `gate_rows` re-judges those rows at another threshold without
measuring again. `lm_head_rows` puts a common recipe's "lm_head in full precision" to the test both ways on one
scheme, and `lm_head_sentence` says what it found.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ... import validate
from ...hardware.device import library_versions
from ...models import embedded_path, parameter_count
from ...models.quantize import SCHEMES
from ...workloads import load_workload
from .checkpoints import quantized_folder, reuse_or_quantize, quiet_progress
from .measures import (
    OWNER,
    agreement,
    evaluation_set,
    greedy_tokens,
    load_model,
    perplexity,
    provenance,
    quality_gate,
    work_folder,
)
from .sizes import storage, weight_bytes


def quality_table(schemes: Sequence[str] = tuple(SCHEMES), *, work_dir: str | Path | None = None,
                  eval_texts: int | None = None, prompts: int = 4, max_new_tokens: int = 32,
                  max_increase_pct: float = 1.0, num_samples: int = 64, threads: int = 1,
                  python: str | None = None, fresh: bool = False) -> list[dict[str, Any]]:
    """Quantize the embedded target with every scheme (live: llm-compressor on this machine's GPU where there is
    one, else its CPU) and score each against bf16 (on the CPU, in float32).

    One row per scheme after a bf16 row: weight bytes on disk, seconds to quantize (llm-compressor's
    oneshot; `quantize_wall_s` adds the worker's start and the save), perplexity on the evaluation set
    (`eval_texts`: the first N windows; all 64 by default) and its change, the gate at `max_increase_pct`,
    greedy agreement and mean first divergence on the first `prompts` journey prompts x max_new_tokens.
    Checkpoints go to work_dir/<scheme> (by default results_dir()/"quantized") and are reused when they hold the
    same quantization.
    """
    import torch  # deferred: torch

    for s in schemes:
        validate.choice(OWNER, "schemes", s, list(SCHEMES), f"pick from {list(SCHEMES)}.")
    validate.integer(OWNER, "prompts", prompts, "pass a number of journey prompts, e.g. 4.")
    validate.integer(OWNER, "max_new_tokens", max_new_tokens, "pass e.g. 32.")
    validate.integer(OWNER, "threads", threads, "pass e.g. 1 (a shared CPU).")
    model_dir, work = embedded_path("target"), work_folder(work_dir)
    evaluation = evaluation_set(eval_texts)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ref = load_model(model_dir)
        from transformers import AutoTokenizer  # deferred: transformers

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
            facts = quantized_folder(model_dir, work / scheme, scheme, num_samples, python, threads, fresh)
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


@contextlib.contextmanager
def on_cpu(threads: int) -> Iterator[None]:
    """torch on `threads` threads (a shared CPU) and no progress bars, both restored after the block."""
    import torch  # deferred: torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with quiet_progress():
            yield
    finally:
        torch.set_num_threads(before)


def bf16_reference(eval_texts: int | None, prompts: int, max_new_tokens: int, with_ppl: bool = True) -> dict[str, Any]:
    """The bf16 target's side of every comparison: tokenizer, evaluation ids, journey prompts, its ppl and tokens."""
    from transformers import AutoTokenizer  # deferred: transformers

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


def earlier_row(quality: Sequence[dict[str, Any]] | None, scheme: str, ref: dict[str, Any]) -> dict[str, Any] | None:
    """`scheme`'s quality_table row, its bf16 perplexity set into `ref`; refused when the rows were scored on other
    texts or lengths than `ref`'s (None: no rows given, measure here)."""
    if quality is None:
        return None
    earlier = next((r for r in quality if r["scheme"] == scheme), None)
    if earlier is None or (quality[0]["eval"], quality[0]["greedy"]) != (ref["eval"], ref["greedy"]):
        raise validate.refuse(OWNER, "quality", [r["scheme"] for r in quality],
                              f"quality_table rows holding {scheme!r}, scored on {ref['eval']} and "
                              f"{ref['greedy']}", "pass the rows quality_table made with the same "
                              "eval_texts, prompts and max_new_tokens, or quality=None to measure here.")
    ref["ppl"] = quality[0]["ppl"]
    return earlier


def score_checkpoint(folder: Path, ref: dict[str, Any], max_new_tokens: int,
           earlier: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint's perplexity and greedy agreement against `ref`'s (`bf16_reference`): `earlier`'s when given (the
    quality table scored this very folder on the same texts), else measured here on the CPU."""
    keys = ("ppl", "agreement", "mean_first_divergence", "first_divergence")
    if earlier is not None:
        return {k: earlier[k] for k in keys}
    model = load_model(folder)
    agree = agreement(ref["tokens"], greedy_tokens(model, ref["journey"], max_new_tokens))
    out = {"ppl": perplexity(model, ref["tokenizer"], ref["texts"]).ppl, "agreement": agree.agreement,
           "mean_first_divergence": agree.mean_first_divergence, "first_divergence": list(agree.first_divergence)}
    del model
    return out


def lm_head_rows(scheme: str = "gptq-w4a16", *, quality: Sequence[dict[str, Any]] | None = None,
                 work_dir: str | Path | None = None, eval_texts: int | None = None, prompts: int = 4,
                 max_new_tokens: int = 32, num_samples: int = 64, max_increase_pct: float = 1.0, threads: int = 1,
                 python: str | None = None) -> list[dict[str, Any]]:
    """A common recipe's "embeddings and lm_head in full precision", measured both ways on the embedded target (live).

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
    model_dir, work = embedded_path("target"), work_folder(work_dir)
    with on_cpu(threads):
        made = [("kept 16-bit", work / scheme, quantized_folder(model_dir, work / scheme, scheme, num_samples, python,
                                                          threads, False)),
                ("quantized too", work / f"{scheme}+lm_head",
                 reuse_or_quantize(model_dir, work / f"{scheme}+lm_head", scheme, num_samples, (), python, threads))]
        ref = bf16_reference(eval_texts, prompts, max_new_tokens, with_ppl=quality is None)
        earlier = earlier_row(quality, scheme, ref)
        cfg = json.loads((model_dir / "config.json").read_text())
        share = cfg["vocab_size"] * cfg["hidden_size"] / parameter_count(cfg)
        rows = []
        for label, folder, facts in made:
            score = score_checkpoint(folder, ref, max_new_tokens, earlier if label == "kept 16-bit" else None)
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
