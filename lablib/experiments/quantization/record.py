"""Lab 06's GPU recording steps (scripts/record_reference.py calls them; the notebook never does).

A GPU session stops a step at its time limit (SIGINT) and a step may meet an engine that fails, so each step here
keeps what it made as it goes: every Result is stored as its run ends, facts[key] is written however the step
ends ("complete": False when cut short), and a scheme that fails is named with its error while the next one runs.
`record` is steps `quantization`, `quantization-a` and `-b` (the speed runs), `record_checkpoints` step
`quantization-prepare`, `record_quality` step `quantization-quality`. A live run of the notebook's `recording.speed`
or `vllm_ppl.gpu_quality` on a step's own settings is kept as that step's recording (`keep_if_recording`).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import validate
from ...models.quantize import SCHEMES
from ...results.record import Result
from ...results.store import ResultStore
from .checkpoints import quantize_all
from .measures import OWNER
from .quality import quality_table
from .recording import KEY, speed_facts
from .speed_runs import (
    BATCHES,
    GPU_WORK,
    SPEED_MODEL,
    SPEED_SCHEMES,
    VLLM_SWITCHES,
    available_speed_schemes,
    prepare_checkpoints,
    vllm_speed_runs,
)
from .vllm_ppl import KEY as QUALITY_KEY, RECORD, beside_cpu, gpu_and_date, made_facts, quality_facts, vllm_quality_rows


def record(out_dir: str | Path, store: ResultStore, facts: dict[str, Any], *, schemes: Sequence[str] | None = None,
           batches: Sequence[int] = BATCHES, key: str = KEY, **kw: Any) -> None:
    """scripts/record_reference.py's steps `quantization` (every scheme that can run), `quantization-a` and
    `quantization-b` (the six split over two commands; the second's facts under key="quantization-2"): the speed
    runs, recorded.

    Run prepare_checkpoints first (step `quantization-prepare`, or its docstring's command). `schemes=None` runs
    what can run now (`available_speed_schemes`) and names each scheme left out, and why, in facts[key]["skipped"].
    One engine per scheme; one that fails (a checkpoint not made, an engine that does not start or crashes) is
    named with its error in facts[key]["failed"] and the others still run. Every Result goes into `store` as it
    ends, with provenance "recorded" (the notebook's recorded path reads them back by step, `quant-<scheme>-b<B>`,
    whichever step recorded them); facts[key] keeps the per-scheme summary (kernels, weight GiB, KV tokens) and the
    checkpoints' own facts (GPU quantize seconds), and is written however the step ends: cut short (the time
    limit's SIGINT), it holds what finished, with "complete": False.
    """
    model, work_dir = kw.pop("model", SPEED_MODEL), kw.pop("work_dir", GPU_WORK)
    asked = list(SPEED_SCHEMES if schemes is None else schemes)
    for s in asked:
        validate.choice(OWNER, "schemes", s, list(VLLM_SWITCHES) + list(SCHEMES))
    validate.integers(OWNER, "batches", batches, "pass batch sizes, e.g. (1, 8, 64, 256).")
    work = Path(work_dir) / model
    ready = available_speed_schemes(model, work_dir) if schemes is None else asked
    skipped = {s: f"no checkpoint in {work / s}: prepare_checkpoints (step quantization-prepare) makes it"
               for s in asked if s not in ready}
    results: list[Result] = []
    failed: dict[str, str] = {}

    def keep(r: Result) -> None:
        results.append(r)
        store.append_recorded(r)

    complete = False
    try:
        for s in (s for s in asked if s in ready):
            try:
                vllm_speed_runs((s,), batches, model=model, work_dir=work_dir, on_result=keep, **kw)
            except Exception as e:  # this engine's runs so far are kept; the next scheme still runs
                failed[s] = f"{type(e).__name__}: {e}"[:2000]
        complete = True
    finally:  # the script writes facts out after the step, or when it is interrupted
        facts[key] = speed_facts(results, asked=asked, batches=batches, model=model, work=work, skipped=skipped,
                                 failed=failed, complete=complete)
        with open(Path(out_dir) / "log.txt", "a") as f:
            f.write(f"{key}: {len(results)} runs; {facts[key]['kv']}; skipped {sorted(skipped)}, failed "
                    f"{sorted(failed)}{'' if complete else ', cut short'}\n")


def record_checkpoints(out_dir: str | Path, store: Any, facts: dict[str, Any], *,
                       schemes: Sequence[str] = SPEED_SCHEMES, key: str = "quantization_checkpoints",
                       **kw: Any) -> None:
    """scripts/record_reference.py's step `quantization-prepare`: prepare_checkpoints one scheme at a time (the
    quantizer's worker in the quantization environment, $LABLIB_QUANT_SITE), each checkpoint's row (folder, bytes,
    seconds, reused) in facts[key]["schemes"] as it is made; a scheme that fails is named with its error in
    facts[key]["failed"] and the next still runs. Cut short (the time limit), the rows made so far are kept
    ("complete": False) and a rerun reuses those checkpoints (a folder that holds the same quantization is
    reused); the one being made when it stopped leaves nothing behind (quantize removes its work folder)."""
    for s in schemes:
        validate.choice(OWNER, "schemes", s, list(SCHEMES) + list(VLLM_SWITCHES))
    made: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    complete = False
    try:
        for s in (s for s in schemes if s not in VLLM_SWITCHES):
            try:
                made.update({row["scheme"]: row for row in prepare_checkpoints((s,), **kw)})
            except Exception as e:  # the checkpoints made so far stand; the next scheme still runs
                failed[s] = f"{type(e).__name__}: {e}"[:2000]
        complete = True
    finally:  # the script writes facts out after the step, or when it is interrupted
        facts[key] = {"model": kw.get("model", SPEED_MODEL), "schemes": made, "failed": failed, "complete": complete}
        with open(Path(out_dir) / "log.txt", "a") as f:
            f.write(f"quantization-prepare: {[(s, r['reused'], r['seconds']) for s, r in made.items()]}; failed "
                    f"{sorted(failed)}{'' if complete else ', cut short'}\n")


def record_quality(out_dir: str | Path, store: Any, facts: dict[str, Any], *,
                   schemes: Sequence[str] = RECORD["schemes"], eval_texts: int = RECORD["eval_texts"],
                   num_samples: int = RECORD["num_samples"]) -> None:
    """scripts/record_reference.py's step `quantization-quality`: the embedded target's checkpoints made on the GPU
    machine (the quantizer's worker in the quantization environment: $LABLIB_QUANT_SITE), the CPU quality table
    there, then vLLM's perplexities beside it; facts[QUALITY_KEY] keeps both, labelled recorded (`quality_facts`)."""
    work = Path(GPU_WORK) / "embedded"
    quantize_all(schemes, work_dir=work, num_samples=num_samples)
    gpu, date = gpu_and_date()
    made = made_facts(schemes, work)

    def keep(rows: list[dict[str, Any]], cpu: list[dict[str, Any]], cpu_error: str | None, complete: bool) -> None:
        """facts[QUALITY_KEY] as it stands: the script writes facts out after the step, or when it is interrupted."""
        facts[QUALITY_KEY] = quality_facts(rows, cpu, made, cpu_error, eval_texts, gpu, date, complete)

    rows = vllm_quality_rows(schemes, work_dir=work, eval_texts=eval_texts,
                             on_row=lambda so_far: keep(so_far, [], "not run: the step was cut short", False))
    cpu, cpu_error = [], None
    try:  # transformers there reads the checkpoints with vLLM's compressed-tensors 0.17, not the CPU lab's 0.19: on
        # this project's CPU machine 0.17 read what 0.19 wrote, with the same perplexities to the last digit (fp8,
        # gptq, w8a8; 2026-12-01), but a machine's pins can differ, so vLLM's rows never hang on it
        cpu = quality_table(schemes, work_dir=work, eval_texts=eval_texts, prompts=RECORD["prompts"],
                            max_new_tokens=RECORD["max_new_tokens"], num_samples=num_samples,
                            max_increase_pct=RECORD["max_increase_pct"])
    except Exception as e:  # vLLM's rows are kept either way; the lab's CPU run sets its own beside them
        cpu_error = f"{type(e).__name__}: {e}"[:2000]
    rows = beside_cpu(rows, cpu)
    keep(rows, cpu, cpu_error, True)
    rows = facts[QUALITY_KEY]["rows"]
    with open(Path(out_dir) / "log.txt", "a") as f:
        f.write(f"quantization-quality: {[(r['scheme'], round(r['ppl_vllm'], 3), r['vllm_vs_cpu_pct']) for r in rows]}\n")
