"""Synthetic checkpoints: the parameter count from a config agrees with transformers' own models,
and make_synthetic writes a checkpoint that loads. Shapes are shrunk so the models build in milliseconds."""

import json
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lablib.config import VLLMConfig
from lablib.hardware.fit import weight_bytes
from lablib.models import check_model_dir, resolve_model, synthetic
from lablib.models.architecture import LABEL, architectures, parameter_count
from lablib.models.synthetic import make_synthetic, synthetic_spec

ARCHS = architectures()

# Totals the model cards publish (Qwen3-0.6B's 0.6B includes its tied embeddings).
PUBLISHED = {"llama-3.1-8b": 8.03e9, "llama-3.2-1b": 1.24e9, "llama-3.2-3b": 3.21e9, "qwen2.5-0.5b": 0.494e9,
             "qwen2.5-1.5b": 1.54e9, "qwen2.5-7b": 7.62e9, "qwen3-0.6b": 0.596e9, "qwen3-8b": 8.19e9,
             "mistral-7b": 7.25e9, "llama-3.1-70b": 70.6e9, "qwen2.5-72b": 72.7e9}


def _config(name: str) -> dict:
    return {k: v for k, v in ARCHS[name].items() if not k.startswith("_")}


def shrink(cfg: dict) -> dict:
    """The same architecture at toy size: GQA ratio, tying, explicit head_dim (or not) and model type kept."""
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    small_kv = min(kv, 2)
    small_heads = small_kv * (heads // kv)
    small = {**cfg, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000,
             "num_attention_heads": small_heads, "num_key_value_heads": small_kv, "bos_token_id": 1, "eos_token_id": 2}
    if "head_dim" in cfg:  # explicit head_dim, deliberately not hidden // heads (transformers wants heads | hidden)
        small.update(hidden_size=small_heads * 16, head_dim=32)
    else:
        small.update(hidden_size=small_heads * 8)
    return small


def test_the_eleven_architectures_are_there():
    assert sorted(PUBLISHED) == sorted(ARCHS)
    for name, cfg in ARCHS.items():
        assert cfg["_source"].endswith("config.json"), name


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_parameter_count_matches_transformers_on_a_shrunk_model(name):
    small = shrink(_config(name))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**small))
    assert model.config.model_type == small["model_type"]
    assert model.config.tie_word_embeddings == small["tie_word_embeddings"]
    assert sum(p.numel() for p in model.parameters()) == parameter_count(small)


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_parameter_count_of_the_real_shape(name):
    cfg = _config(name)
    with torch.device("meta"):  # full size, no memory: the shapes are what is counted
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    counted = parameter_count(cfg)
    assert sum(p.numel() for p in model.parameters()) == counted
    assert counted == pytest.approx(PUBLISHED[name], rel=0.01)


def test_parameter_count_features_each_change_the_count():
    base = shrink(_config("llama-3.1-8b"))
    h, v, hd, kv, heads = base["hidden_size"], base["vocab_size"], base["head_dim"], base["num_key_value_heads"], \
        base["num_attention_heads"]
    n = base["num_hidden_layers"]
    assert parameter_count(base) - parameter_count({**base, "tie_word_embeddings": True}) == v * h
    assert parameter_count({**base, "model_type": "qwen2"}) - parameter_count(base) == n * (heads * hd + 2 * kv * hd)
    assert parameter_count({**base, "model_type": "qwen3"}) - parameter_count(base) == n * 2 * hd
    no_hd = {k: x for k, x in base.items() if k != "head_dim"}  # head_dim falls back to hidden // heads
    assert parameter_count(no_hd) == parameter_count({**base, "head_dim": h // heads})


def test_unknown_architecture_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="'nope' is not known") as e:
        synthetic_spec("nope", root=tmp_path)
    for name in ARCHS:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="llama-3.1-8b"):
        resolve_model("synthetic:nope")
    assert list(tmp_path.iterdir()) == []  # nothing written for a name it refused


@pytest.fixture
def tiny_arch(monkeypatch):
    small = {**shrink(_config("qwen3-0.6b")), "_source": "shrunk qwen3-0.6b for tests"}
    monkeypatch.setattr(synthetic, "architectures", lambda: {"tiny-qwen3": small})
    return small


def test_make_synthetic_writes_a_loadable_checkpoint(tiny_arch, tmp_path):
    folder = make_synthetic("tiny-qwen3", tmp_path / "a", seed=3)
    cfg = check_model_dir(folder)  # config.json and real weights, as every engine needs
    assert cfg["model_type"] == "qwen3" and cfg["hidden_size"] == tiny_arch["hidden_size"] and "_source" not in cfg
    meta = json.loads((folder / "synthetic.json").read_text())
    assert meta["architecture"] == "tiny-qwen3" and meta["seed"] == 3 and meta["label"] == LABEL
    assert meta["parameters"] == parameter_count(tiny_arch)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(tiny_arch)
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, tiny_arch["vocab_size"]) and torch.isfinite(logits).all()
    same = AutoModelForCausalLM.from_pretrained(make_synthetic("tiny-qwen3", tmp_path / "b", seed=3))
    other = AutoModelForCausalLM.from_pretrained(make_synthetic("tiny-qwen3", tmp_path / "c", seed=4))
    w = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(model.state_dict()[w], same.state_dict()[w])  # the seed fixes the weights
    assert not torch.equal(model.state_dict()[w], other.state_dict()[w])


def test_on_a_gpu_the_weights_are_drawn_in_a_child_process(tiny_arch, tmp_path, monkeypatch):
    """The child's checkpoint is the one the notebook's own process would write (same seed, same weights), a GPU
    machine takes that path (the notebook then holds no CUDA context), and a child that fails leaves no folder."""
    import multiprocessing as mp

    import lablib.models.synthetic as synthetic

    here = make_synthetic("tiny-qwen3", tmp_path / "here", seed=3)
    child = make_synthetic("tiny-qwen3", tmp_path / "child", seed=3, in_child=True)
    w = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(AutoModelForCausalLM.from_pretrained(here).state_dict()[w],
                       AutoModelForCausalLM.from_pretrained(child).state_dict()[w])
    assert not (tmp_path / "child.partial").exists()
    started = []

    class Failing:  # what the spawn context would start on a GPU machine
        exitcode = 1

        def __init__(self, target, args):
            started.append((target, args))

        def start(self):
            pass

        def join(self):
            pass

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mp, "get_context", lambda kind: type("Ctx", (), {"Process": Failing}) if kind == "spawn"
                        else pytest.fail(kind))
    with pytest.raises(RuntimeError, match="failed in its process"):
        make_synthetic("tiny-qwen3", tmp_path / "gpu", seed=3)
    assert started[0][0] is synthetic._write and started[0][1][-1] == "cuda"  # drawn on the GPU, in the child
    assert not (tmp_path / "gpu").exists()


def test_synthetic_spec_makes_once_then_reuses(tiny_arch, tmp_path):
    spec = synthetic_spec("tiny-qwen3", root=tmp_path)
    assert spec.name == "synthetic:tiny-qwen3" and spec.source == "synthetic" and spec.is_local
    weights = tmp_path / "tiny-qwen3" / "model.safetensors"
    made = weights.stat().st_mtime_ns
    again = synthetic_spec("tiny-qwen3", root=tmp_path)
    assert again == spec and weights.stat().st_mtime_ns == made  # not made a second time
    assert spec.describe()["synthetic"] == LABEL
    a = spec.architecture()
    assert (a["layers"], a["kv_heads"], a["head_dim"], a["dtype"]) == (2, 2, 32, "bfloat16")
    assert spec.kv_bytes_per_token() == 2 * 2 * 2 * 32 * 2
    # the fit check reads the weights from disk: bf16 parameters plus the safetensors header
    assert 0 < weight_bytes(spec, VLLMConfig()) - 2 * parameter_count(tiny_arch) < 64 * 1024


def test_a_synthetic_eagle_head_is_vllms_layout_for_its_target_and_a_non_llama_target_is_refused(tmp_path,
                                                                                                  monkeypatch):
    """The EAGLE-1 head of a Llama shape (shrunk, so it writes in milliseconds): exactly the tensors vLLM 0.26's
    EagleLlamaForCausalLM loads, checked by the same check `speculative_config('eagle', ...)` runs; random, not zero."""
    from safetensors import safe_open

    from lablib.models import eagle

    small = shrink(_config("llama-3.1-8b"))
    shapes = {"llama-3.1-8b": small, "qwen3-0.6b": _config("qwen3-0.6b")}
    monkeypatch.setattr(synthetic, "architectures", lambda: shapes)
    folder = synthetic.synthetic_eagle("llama-3.1-8b", root=tmp_path)
    assert folder == tmp_path / "llama-3.1-8b-eagle" and not (tmp_path / "llama-3.1-8b-eagle.partial").exists()
    config = eagle.check_head_dir(folder, small)
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["EagleLlamaForCausalLM"]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        fc, norm = f.get_tensor("fc.weight"), f.get_tensor("layers.0.post_attention_layernorm.weight")
    assert fc.dtype == torch.bfloat16 and 0.01 < fc.float().std().item() < 0.03 and bool((norm == 1).all())
    meta = json.loads((folder / "synthetic.json").read_text())
    assert meta["target"] == "llama-3.1-8b" and meta["parameters"] == sum(
        math.prod(s) for s in eagle.vllm_tensors(config).values())
    with pytest.raises(ValueError, match=r"target='qwen3-0.6b' is a qwen3 model; allowed: a llama one"):
        synthetic.make_synthetic_eagle("qwen3-0.6b", tmp_path / "q")
