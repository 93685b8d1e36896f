"""Real architectures as shapes: the one parameter-count and KV-bytes formula.

Speed and memory depend on a model's shape (layers, hidden size, heads, KV heads, vocab,
dtype), not on what its weights say. The shapes come from the published `config.json`
files, kept in `data/synthetic/architectures.json` (source named per entry); a model
folder's own config goes through the same two formulas (`ModelSpec`), so the fit check,
the roofline, lab 00's table and the KV calculator never disagree.

Per token, every layer stores a key and a value vector for each KV head:
`2 × layers × kv_heads × head_dim × bytes`. Pure Python.
"""
from __future__ import annotations

import json
from typing import Any

from ..config import DATA_DIR
from ..validate import integer as _integer

LABEL = "synthetic weights: speed and memory are real, the text is not"


ARCH_FILE = DATA_DIR / "synthetic" / "architectures.json"


def architectures() -> dict[str, dict[str, Any]]:
    return json.loads(ARCH_FILE.read_text())


def parameter_count(cfg: dict[str, Any]) -> int:
    """Parameters of a Llama/Qwen/Mistral-style decoder from its config (no weights needed)."""
    h, i, n, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or h // heads
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if cfg.get("model_type") == "qwen2":
        attn += heads * hd + 2 * kv * hd  # q/k/v biases
    if cfg.get("model_type") == "qwen3":
        attn += 2 * hd  # q/k norms
    layer = attn + 3 * h * i + 2 * h
    embed = v * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return n * layer + embed + h


DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}


def bytes_per_element(dtype: str) -> int:
    """Bytes per K/V element for a dtype name in DTYPE_BYTES."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not a known KV cache dtype: use one of {sorted(DTYPE_BYTES)}.")
    return DTYPE_BYTES[dtype]


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int | str) -> int:
    """K and V bytes one token adds to the cache; dtype_bytes may be a byte count or a DTYPE_BYTES name."""
    if isinstance(dtype_bytes, str):
        dtype_bytes = bytes_per_element(dtype_bytes)
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        _integer("kv_bytes_per_token", name, value, "read it from the model's config.json.")
    _integer("kv_bytes_per_token", "dtype_bytes", dtype_bytes, f"pass a byte count or a name from {sorted(DTYPE_BYTES)}.")
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def shape(cfg: dict[str, Any]) -> dict[str, Any]:
    """The facts memory and roofline arithmetic need, from a config.json (None where the config lacks one)."""
    heads = cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads and cfg.get("hidden_size") else None)
    return {"layers": cfg.get("num_hidden_layers"), "hidden": cfg.get("hidden_size"), "heads": heads,
            "kv_heads": cfg.get("num_key_value_heads", heads), "head_dim": head_dim,
            "vocab": cfg.get("vocab_size"), "context": cfg.get("max_position_embeddings"),
            "dtype": cfg.get("dtype") or cfg.get("torch_dtype"),
            # absent from a config: untied (transformers' Llama, Qwen and Mistral default); no config: unknown
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings")) if cfg else None}
