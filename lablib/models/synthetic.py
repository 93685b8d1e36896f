"""Synthetic checkpoints: real architectures with random weights, made locally, no download.

Speed and memory depend on a model's shape (layers, hidden size, heads, KV heads, vocab,
dtype), not on what its weights say. A random-init checkpoint of Llama-3.1-8B's exact
config therefore loads, pages its KV cache and decodes at the same speed as the real one,
on a machine that cannot reach a model hub. What it cannot do is make sense: prompts go
in as token ids (detokenisation off) and the text it returns is noise. Every figure built
from one says "synthetic weights: speed and memory are real, the text is not".

The shapes come from the published `config.json` files, kept in
`data/synthetic/architectures.json` (source named per entry).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import time
from pathlib import Path

from .architecture import ARCH_FILE, LABEL, architectures
from .eagle import check_head_config, head_config, vllm_tensors
from .spec import ModelSpec, check_model_dir


ROOT = Path("/tmp/lablib-synthetic")  # where synthetic checkpoints are made (the GPU machine's disk has room)


def synthetic_folder(name: str, root: str | Path | None = None) -> Path:
    """Where the synthetic checkpoint of architecture `name` is (or will be made): under `root`, by default ROOT."""
    return Path(root if root is not None else ROOT) / name


DUMMY_LABEL = ("vLLM's dummy weights (load_format='dummy': drawn by vLLM at load, none on disk); "
               "speed and memory are real, the text is not")


def _config(name: str) -> dict:
    """Architecture `name`'s config (its published fields, not the file's own `_` notes); an unknown name refused."""
    archs = architectures()
    if name not in archs:
        raise ValueError(f"synthetic model {name!r} is not known: choose one of {sorted(archs)} "
                         f"(shapes in {ARCH_FILE}).")
    return {k: v for k, v in archs[name].items() if not k.startswith("_")}


def synthetic_spec(name: str, root: str | Path | None = None, weights: bool = True) -> ModelSpec:
    """The ModelSpec of a synthetic checkpoint under `root` (default ROOT), made by `make_synthetic` first if absent.

    `weights=False`: a folder with the architecture's config.json only (`<name>-config`), for vLLM's dummy loader
    (`VLLMConfig(load_format="dummy")`), which draws the random weights itself at load: the way to run a shape whose
    bf16 checkpoint the disk cannot hold (Llama-3.1-70B's is 141 GB; a lent H200 machine has 64 GiB of disk).
    The speed and memory are those of the same shape with a checkpoint; only where the random numbers come from
    differs."""
    cfg = _config(name)
    if not weights:
        folder = synthetic_folder(f"{name}-config", root)
        folder.mkdir(parents=True, exist_ok=True)
        from transformers import AutoConfig  # deferred: transformers

        AutoConfig.for_model(**cfg).save_pretrained(folder)  # the config vLLM reads, as save_pretrained writes it
        written = json.loads((folder / "config.json").read_text())
        written["dtype"] = "bfloat16"  # what a checkpoint's says: vLLM's dtype="auto" and the fit check read it
        (folder / "config.json").write_text(json.dumps(written, indent=2))
        (folder / "synthetic.json").write_text(json.dumps({"architecture": name, "weights": "vllm-dummy",
                                                           "label": DUMMY_LABEL}))
        return ModelSpec(f"synthetic:{name}", str(folder), "synthetic",
                         json.loads((folder / "config.json").read_text()))
    folder = synthetic_folder(name, root)
    if not (folder / "config.json").exists():
        make_synthetic(name, folder)
    return ModelSpec(f"synthetic:{name}", str(folder), "synthetic", check_model_dir(folder))


def make_synthetic(name: str, folder: str | Path, seed: int = 0, dtype: str = "bfloat16", *,
                   device: str | None = None, in_child: bool | None = None) -> Path:
    """Write a random-init checkpoint of architecture `name` (on the GPU when there is one: ~25 s for 8B).

    On a GPU the weights are drawn in a child process (`in_child`, by default whenever `device` is CUDA): the CUDA
    context that drawing them makes, and the allocator's cache, end with it, so the notebook never holds the GPU and
    vLLM's worker starts on a GPU as empty as before. The checkpoint is written beside `folder` and moved into place
    whole, so a run cut short leaves no half of one that a later call would take for made."""
    import torch  # deferred: torch

    cfg = _config(name)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    folder = Path(folder)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    args = (name, cfg, str(partial), seed, dtype, device)
    if device == "cuda" if in_child is None else in_child:
        child = mp.get_context("spawn").Process(target=_write, args=args)
        child.start()
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"making the synthetic checkpoint {name!r} failed in its process (exit code "
                               f"{child.exitcode}; its traceback is above). Fix: check the free disk under "
                               f"{folder.parent} and the GPU's free memory (nvidia-smi), then run the cell again.")
    else:
        _write(*args)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def _write(name: str, cfg: dict, folder: str, seed: int, dtype: str, device: str) -> None:
    """The checkpoint itself: config `cfg`, weights drawn on `device` from `seed`, saved with synthetic.json."""
    import torch  # deferred: torch
    from transformers import AutoConfig, AutoModelForCausalLM  # deferred: transformers

    config = AutoConfig.for_model(**cfg)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(folder)
    (Path(folder) / "synthetic.json").write_text(json.dumps(
        {"architecture": name, "seed": seed, "dtype": dtype, "label": LABEL,
         "parameters": sum(p.numel() for p in model.parameters()), "made_s": round(time.perf_counter() - t0, 1)}))


def synthetic_eagle_folder(target: str, root: str | Path | None = None) -> Path:
    """Where the synthetic EAGLE-1 head of architecture `target` is (or will be made): `<target>-eagle` under root."""
    return synthetic_folder(f"{target}-eagle", root)


def synthetic_eagle(target: str, root: str | Path | None = None) -> Path:
    """The folder of a random-weight EAGLE-1 head for the synthetic `target`, made by `make_synthetic_eagle` if absent.

    Random weights: its drafts agree with the target on nothing, so it is run with vLLM's synthetic rejection
    sampler, which sets the acceptance; its cost (one decoder layer plus the target's lm_head) is real."""
    folder = synthetic_eagle_folder(target, root)
    if not (folder / "config.json").exists():
        make_synthetic_eagle(target, folder)
    return folder


def make_synthetic_eagle(target: str, folder: str | Path, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """Write an EAGLE-1 head of `target`'s shape in vLLM 0.26's layout (`eagle.vllm_tensors`: fc and one decoder layer,
    no embedding or lm_head: vLLM shares the target's), weights drawn N(0, 0.02) as transformers initialises a Llama,
    norms 1. Written beside `folder` and moved into place whole; a Llama-family target only (EagleLlamaForCausalLM)."""
    import torch  # deferred: torch
    from safetensors.torch import save_file  # deferred: safetensors, torch

    cfg = _config(target)
    if cfg.get("model_type") != "llama":
        llamas = sorted(n for n, a in architectures().items() if a.get("model_type") == "llama")
        raise ValueError(f"make_synthetic_eagle: target={target!r} is a {cfg.get('model_type')} model; allowed: a "
                         f"llama one ({llamas}): "
                         "vLLM 0.26's EAGLE-1 head class is EagleLlamaForCausalLM. Fix: pick a Llama target.")
    config = {**head_config(cfg), "dtype": dtype}
    check_head_config(config, cfg)
    folder = Path(folder)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    tensors = {name: (torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=gen) * 0.02)
               .to(getattr(torch, dtype)).contiguous() for name, shape in vllm_tensors(config).items()}
    save_file(tensors, str(partial / "model.safetensors"))
    (partial / "config.json").write_text(json.dumps(config, indent=2))
    (partial / "synthetic.json").write_text(json.dumps(
        {"architecture": f"{target}-eagle", "target": target, "seed": seed, "dtype": dtype, "label": LABEL,
         "parameters": sum(t.numel() for t in tensors.values()), "made_s": round(time.perf_counter() - t0, 1)}))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder
