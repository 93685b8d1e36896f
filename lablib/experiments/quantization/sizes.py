"""Lab 06's bytes: what a checkpoint stores, read from its safetensors headers, and the same by arithmetic.

`storage` reads a checkpoint's headers alone (no torch): the decoder's Linear layers, lm_head and the rest,
and the bytes per Linear weight each scheme pays (its scales and zero points included). `predicted_bytes`
gives the same number from a Llama-style config and one of `WEIGHT_FORMATS` (compressed-tensors' layout),
so `weights_alone` can size the published 8B and 70B shapes without reading a weight.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import validate
from ...hardware.fit import RESERVE_BYTES
from ...mechanisms.gpus import GPU_PEAKS
from ...models import architectures, embedded_path, kv_bytes_per_token, parameter_count
from .measures import OWNER, work_folder

QUANTIZED_DTYPES = {"F8_E4M3": "fp8 e4m3", "I8": "int8", "I32": "int4, 8 packed per int32"}


def weight_bytes(folder: str | Path) -> int:
    """Bytes of the weight files on disk (*.safetensors)."""
    return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))


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


def storage_rows(schemes: Sequence[str], work_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """storage() of the bf16 target and of each scheme's checkpoint in work_dir, each with its size against bf16."""
    rows = [storage(embedded_path("target"), "bf16")] + [storage(work_folder(work_dir) / s, s) for s in schemes]
    for r in rows:
        r["vs_bf16"] = r["file_bytes"] / rows[0]["file_bytes"]
        r["provenance"] = "read from the checkpoints made on this machine"
    return rows


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
