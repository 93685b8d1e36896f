"""Lab 06's checkpoints of the embedded target: made live (llm-compressor in its own process) or reused.

`quantize_all` makes one checkpoint per scheme in a work folder, or reuses the one already there when it
holds this very quantization (scheme, group size, source model, calibration windows); `quality_table` and
`lm_head_rows` score those very folders, so a notebook can make the checkpoints, show a recipe
(`recipe_text`), then measure quality, in that order. `group_size_rows` says which of vLLM's 4-bit group
sizes tile the model's Linear widths, and `quiet_progress` silences the loading bars while they load.
"""
from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ... import validate
from ...models import embedded_path
from ...models.quantize import (
    KERNEL_GROUPS,
    SCHEMES,
    default_group_size,
    linear_widths,
    quantize,
    read_facts,
)
from .measures import OWNER, work_folder


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No progress bars while checkpoints load: transformers and compressed-tensors draw one per loading phase
    (weights, quantization config, decompression) on stderr, a dozen per scheme in a notebook. tqdm reads its
    TQDM_DISABLE only at import, so here each new bar is made disabled until the block ends."""
    import tqdm  # deferred: tqdm
    from transformers.utils import logging as hf_logging  # deferred: transformers

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


def quantized_folder(model_dir: Path, folder: Path, scheme: str, num_samples: int, python: str | None,
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


def reuse_or_quantize(model_dir: Path, folder: Path, scheme: str, num_samples: int, ignore: tuple[str, ...],
                       python: str | None, threads: int | None, group_size: int | None = None) -> dict[str, Any]:
    """Like quantized_folder, and the ignored modules must match too (the lm_head step's second checkpoint, the layer
    step's); `group_size` (None: the quantizer's default for the Linears left) must match when given."""
    facts = read_facts(folder)
    want_samples = num_samples if SCHEMES[scheme].calibrated else None
    if facts is not None and facts.get("scheme") == scheme and facts.get("ignore") == list(ignore) and \
            facts.get("model_dir") == str(model_dir.resolve()) and \
            (facts.get("calibration") or {}).get("samples") == want_samples and \
            (group_size is None or facts.get("group_size") == group_size):
        return {**facts, "reused": True}
    if facts is not None:
        shutil.rmtree(folder)
    return {**quantize(model_dir, folder, scheme, group_size=group_size, num_samples=num_samples, ignore=ignore,
                       python=python, threads=threads), "reused": False}


def quantize_all(schemes: Sequence[str] = tuple(SCHEMES), *, work_dir: str | Path | None = None,
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
    model_dir, work = embedded_path("target"), work_folder(work_dir)
    rows = []
    for s in schemes:
        f = quantized_folder(model_dir, work / s, s, num_samples, python, threads, fresh)
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
