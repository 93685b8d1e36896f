"""Which model a lab runs: the embedded default, real models by preset, or a local folder.

The embedded models in `data/models/` (a 4.7M-parameter Llama target and its 0.9M
distilled draft, trained on Python's own source; see the model card there) make every lab
run with no download: in CI, on a laptop, on a GPU machine that reaches no hub. Users with
a hub pick a real model by preset name; presets are grouped by the smallest GPU that holds
them in bf16 with room for a useful KV cache.

`resolve_model` turns a name into a `ModelSpec` and checks it before any work starts:
a folder that is missing, has no config, or no weights, or a tokenizer that does not
match the model's vocabulary, is refused with the path, what is wrong and the fix.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_DIR = Path(os.environ.get("LABLIB_DATA", Path(__file__).resolve().parent.parent / "data"))
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


@dataclass(frozen=True)
class ModelSpec:
    """A model the engines can load: where it is and what it is."""

    name: str  # what the user asked for
    path: str  # a local folder or a hub id
    source: str  # "embedded", "preset", "path" or "synthetic" (random weights of a real architecture)
    config: dict[str, Any] = field(default_factory=dict, compare=False)  # config.json, when local

    @property
    def is_local(self) -> bool:
        return self.source != "preset"

    def architecture(self) -> dict[str, Any]:
        """Layer, head and size facts that memory and roofline arithmetic need."""
        c = self.config
        heads = c.get("num_attention_heads")
        head_dim = c.get("head_dim") or (c["hidden_size"] // heads if heads else None)
        return {"layers": c.get("num_hidden_layers"), "hidden": c.get("hidden_size"), "heads": heads,
                "kv_heads": c.get("num_key_value_heads", heads), "head_dim": head_dim,
                "vocab": c.get("vocab_size"), "context": c.get("max_position_embeddings"),
                "dtype": c.get("dtype") or c.get("torch_dtype")}

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int | None:
        a = self.architecture()
        if None in (a["layers"], a["kv_heads"], a["head_dim"]):
            return None
        return 2 * a["layers"] * a["kv_heads"] * a["head_dim"] * dtype_bytes

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, "path": self.path, "source": self.source, **self.architecture()}
        if self.source == "synthetic":
            from .synthetic import LABEL

            out["synthetic"] = LABEL
        return out


def embedded_path(which: str = "target") -> Path:
    return DATA_DIR / "models" / which


def resolve_model(name: str | os.PathLike = DEFAULT_MODEL) -> ModelSpec:
    """A preset name, an embedded name or a local folder → a checked ModelSpec."""
    key = str(name)
    if key in EMBEDDED:
        path = embedded_path(EMBEDDED[key])
        return ModelSpec(key, str(path), "embedded", check_model_dir(path))
    if key in PRESETS:
        return ModelSpec(key, PRESETS[key]["hf_id"], "preset")
    if key.startswith("synthetic:"):
        from .synthetic import synthetic_spec

        return synthetic_spec(key.split(":", 1)[1])
    path = Path(key).expanduser()
    if path.exists() or os.sep in key or key.startswith("."):
        return ModelSpec(key, str(path), "path", check_model_dir(path))
    raise ValueError(
        f"model={key!r} is not a known model: use one of the embedded models {sorted(EMBEDDED)}, "
        f"a preset {sorted(PRESETS)}, 'synthetic:<architecture>' (random weights, see lablib.synthetic), or the path of a local model folder (with config.json and weights).")


def check_model_dir(path: Path) -> dict[str, Any]:
    """Refuse a folder that cannot be a model, before anything loads; returns its config."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"model folder {path} does not exist. Fix: pass an existing folder, or use "
                         f"model='embedded' (the lab's own model in data/models/).")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"model folder {path} has no config.json, so it is not a Hugging Face model folder. "
                         "Fix: point at the folder that save_pretrained() wrote.")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e}): the folder is corrupt. Fix: restore it "
                         "(git checkout data/models, or re-run save_pretrained).") from None
    weights = list(path.glob("*.safetensors")) + list(path.glob("*.bin"))
    if not weights:
        raise ValueError(f"model folder {path} has no weights (*.safetensors or *.bin). Fix: restore the "
                         "weights file (git checkout data/models) or point at a complete folder.")
    for w in weights:
        if w.stat().st_size < 1024:
            raise ValueError(f"weights file {w} is only {w.stat().st_size} bytes: it is truncated or a Git LFS "
                             "pointer. Fix: restore the real file (git lfs pull, or git checkout data/models).")
        if w.suffix == ".safetensors" and (want := _safetensors_size(w)) != w.stat().st_size:
            raise ValueError(f"weights file {w} is {w.stat().st_size} bytes but its header describes "
                             f"{want if want is not None else 'no readable'} bytes: it is truncated or corrupt. "
                             "Fix: restore the real file (git lfs pull, or git checkout data/models).")
    return cfg


def _safetensors_size(path: Path) -> int | None:
    """The file size a safetensors header promises (8-byte length, JSON header, tensor data); None if unreadable."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 0 < n <= 100 * 2**20 else None
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        return 8 + n + max(ends, default=0)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def check_tokenizer(tokenizer: Any, spec: ModelSpec) -> None:
    """A tokenizer whose ids the model cannot embed is refused (wrong tokenizer for this model)."""
    vocab = spec.config.get("vocab_size")
    if vocab is None:
        return
    size = len(tokenizer)
    if size > vocab:
        raise ValueError(
            f"tokenizer of {size} tokens does not match model {spec.path} (vocab_size={vocab}): its ids would "
            "index past the embedding table. Fix: load the tokenizer saved with this model (same folder).")
    for attr in ("bos_token_id", "eos_token_id"):
        tid, want = getattr(tokenizer, attr, None), spec.config.get(attr)
        if tid is not None and want is not None and tid != want:
            raise ValueError(
                f"tokenizer {attr}={tid} but model {spec.path} expects {want}: the tokenizer belongs to another "
                "model. Fix: load the tokenizer saved with this model (same folder).")


def load_tokenizer(spec: ModelSpec, tokenizer_path: str | None = None) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path or spec.path)
    check_tokenizer(tok, spec)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def prompt_tokenizer(spec: ModelSpec) -> Any:
    """The tokenizer that turns a workload into this model's prompt ids.

    A synthetic checkpoint has none: it takes the embedded tokenizer's ids, which are valid in any real vocabulary.
    """
    return load_tokenizer(resolve_model("embedded") if spec.source == "synthetic" else spec)


def load_hf_model(spec: ModelSpec, device: str = "cpu", dtype: str = "auto") -> Any:
    """The transformers model on `device`; float32 on the CPU unless asked otherwise (bf16 matmuls are slow there)."""
    import torch
    from transformers import AutoModelForCausalLM

    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=getattr(torch, dtype))
    return model.to(device).eval()
