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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import DATA_DIR
from .architecture import LABEL, kv_bytes_per_token, shape


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
        """Layer, head and size facts that memory and roofline arithmetic need (`architecture.shape`)."""
        return shape(self.config)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int | None:
        """K and V bytes per token of context (None when the config lacks the shape: a hub preset)."""
        a = self.architecture()
        if None in (a["layers"], a["kv_heads"], a["head_dim"]):
            return None
        return kv_bytes_per_token(a["layers"], a["kv_heads"], a["head_dim"], dtype_bytes)

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, "path": self.path, "source": self.source, **self.architecture()}
        if self.source == "synthetic":
            out["synthetic"] = LABEL
        return out


def embedded_path(which: str = "target") -> Path:
    return DATA_DIR / "models" / which


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
    from transformers import AutoTokenizer  # deferred: transformers

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
    if spec.source == "synthetic":
        spec = ModelSpec("embedded", str(embedded_path()), "embedded", check_model_dir(embedded_path()))
    return load_tokenizer(spec)


def load_hf_model(spec: ModelSpec, device: str = "cpu", dtype: str = "auto", attn_implementation: str | None = None
                  ) -> Any:
    """The transformers model on `device`; float32 on the CPU unless asked otherwise (bf16 matmuls are slow there).

    `attn_implementation` ("eager", "sdpa", "flex_attention"; None: transformers' own choice, sdpa) picks the
    attention kernel every layer calls."""
    import torch  # deferred: torch
    from transformers import AutoModelForCausalLM  # deferred: transformers

    from transformers.utils import is_accelerate_available  # deferred: transformers
    from transformers.utils import logging as hf_logging  # deferred: transformers

    if dtype == "auto":  # a GPU without bf16 arithmetic (compute capability below 8.0: a T4) takes float16
        dtype = "float32" if device == "cpu" else "bfloat16" if torch.cuda.is_bf16_supported(
            including_emulation=False) else "float16"
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "Loading weights" bar per load: five in one lab cell said nothing
    try:
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        if device != "cpu" and is_accelerate_available():  # each tensor read straight onto the GPU (transformers'
            extra["device_map"] = device  # device_map, which needs accelerate), not all of them to host memory first
        model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=getattr(torch, dtype), **extra)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    return model.to(device).eval()
