"""Which model a lab runs, by name: the embedded default, real models by preset, synthetic shapes, or a folder.

The embedded models in `data/models/` (a 4.7M-parameter Llama target and its 0.9M
distilled draft, trained on Python's own source; see the model card there) make every lab
run with no download. Users with a hub pick a real model by preset name; presets are
grouped by the smallest GPU that holds them in bf16 with room for a useful KV cache.
`resolve_model` turns a name into a checked `ModelSpec` before any work starts.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from .spec import ModelSpec, check_model_dir, embedded_path
from .synthetic import synthetic_spec

EMBEDDED = {"embedded": "target", "embedded-target": "target", "embedded-draft": "draft"}


DEFAULT_MODEL = "embedded"


# Real models for users with a hub: the smallest GPU tier that holds them in bf16 with KV room.
PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {"hf_id": "Qwen/Qwen2.5-0.5B-Instruct", "tier": "T4 16 GB", "draft": None},
    "qwen3-0.6b": {"hf_id": "Qwen/Qwen3-0.6B", "tier": "T4 16 GB", "draft": None},
    "llama-3.2-1b": {"hf_id": "meta-llama/Llama-3.2-1B-Instruct", "tier": "T4 16 GB", "draft": None},
    "qwen2.5-1.5b": {"hf_id": "Qwen/Qwen2.5-1.5B-Instruct", "tier": "T4 16 GB", "draft": "qwen2.5-0.5b"},
    "llama-3.2-3b": {"hf_id": "meta-llama/Llama-3.2-3B-Instruct", "tier": "L4 24 GB", "draft": "llama-3.2-1b"},
    "qwen2.5-7b": {"hf_id": "Qwen/Qwen2.5-7B-Instruct", "tier": "A100 40 GB", "draft": "qwen2.5-0.5b"},
    "llama-3.1-8b": {"hf_id": "meta-llama/Llama-3.1-8B-Instruct", "tier": "A100 40 GB", "draft": "llama-3.2-1b"},
    "qwen3-8b": {"hf_id": "Qwen/Qwen3-8B", "tier": "A100 40 GB", "draft": "qwen3-0.6b"},
}


def resolve_model(name: str | os.PathLike = DEFAULT_MODEL) -> ModelSpec:
    """A preset name, an embedded name or a local folder → a checked ModelSpec."""
    key = str(name)
    if key in EMBEDDED:
        path = embedded_path(EMBEDDED[key])
        return ModelSpec(key, str(path), "embedded", check_model_dir(path))
    if key in PRESETS:
        return ModelSpec(key, PRESETS[key]["hf_id"], "preset")
    if key.startswith("synthetic:"):
        return synthetic_spec(key.split(":", 1)[1])
    path = Path(key).expanduser()
    if path.exists() or os.sep in key or key.startswith("."):
        return ModelSpec(key, str(path), "path", check_model_dir(path))
    near = difflib.get_close_matches(key, [*EMBEDDED, *PRESETS], n=1, cutoff=0.6)
    raise ValueError(
        f"model={key!r} is not a known model: allowed an embedded model {sorted(EMBEDDED)}, a preset "
        f"{sorted(PRESETS)}, 'synthetic:<architecture>' (random weights, see lablib.models.synthetic), or the path of "
        "a local model folder (with config.json and weights); Fix: "
        + (f"model={near[0]!r}, the nearest name." if near else "one of those names, or a folder's path."))
