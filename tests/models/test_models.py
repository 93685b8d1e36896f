"""The embedded models: they load on the CPU, share one tokenizer, decode fast and
deterministically, and a broken model folder is refused with the path and the fix.

Each model is loaded once per module (a few hundred milliseconds each after the imports).
"""

import json
import shutil
import statistics
import time
from pathlib import Path

import pytest

import lablib.models as models
from lablib.models import presets
from lablib.models import PRESETS, check_model_dir, check_tokenizer, load_hf_model, load_tokenizer, resolve_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (conftest.py)

NAMES = {"target": "embedded", "draft": "embedded-draft"}


@pytest.fixture(scope="module")
def loaded(one_thread) -> dict:
    """name → (spec, model, tokenizer), through the same calls the engines make."""
    out = {}
    for which, name in NAMES.items():
        spec = resolve_model(name)
        out[which] = (spec, load_hf_model(spec), load_tokenizer(spec))
    return out


@pytest.fixture
def model_copy(tmp_path: Path) -> Path:
    """A copy of the target's folder to break."""
    dst = tmp_path / "target"
    shutil.copytree(models.embedded_path("target"), dst)
    return dst


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def new_tokens(model, ids: list[int], n: int, **kw) -> list[int]:
    """Exactly n new tokens (EOS does not stop it); greedy unless kw asks to sample."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **kw)
    return out[0, len(ids):].tolist()


# --- loading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", NAMES)
def test_embedded_models_load_on_the_cpu(loaded, which):
    spec, model, tok = loaded[which]
    assert spec.source == "embedded" and spec.is_local
    assert Path(spec.path) == models.embedded_path(which)
    assert spec.config["model_type"] == "llama" and spec.architecture()["context"] == 2048
    p = next(model.parameters())
    assert p.device.type == "cpu" and p.dtype == torch.float32  # CPU default: fp32, not the stored bf16
    assert not model.training
    assert model.config.vocab_size == len(tok) == 4096


@pytest.mark.parametrize("which", NAMES)
def test_plain_from_pretrained_loads_the_same_weights(loaded, which):
    _, model, _ = loaded[which]
    plain = transformers.AutoModelForCausalLM.from_pretrained(models.embedded_path(which), dtype=torch.float32)
    assert type(plain).__name__ == "LlamaForCausalLM"
    ours = dict(model.named_parameters())
    for name, p in plain.named_parameters():
        assert torch.equal(p, ours[name]), name


def test_draft_is_five_to_ten_times_smaller(loaded):
    target, draft = n_params(loaded["target"][1]), n_params(loaded["draft"][1])
    assert 5 <= target / draft <= 10, (target, draft)


# --- the shared tokenizer -----------------------------------------------------------------------


def test_target_and_draft_share_one_tokenizer(loaded):
    t, d = (models.embedded_path(w) / "tokenizer.json" for w in ("target", "draft"))
    assert t.read_bytes() == d.read_bytes()
    tt, td = loaded["target"][2], loaded["draft"][2]
    text = "def f(x):\n    return x + 1\n"
    assert tt(text)["input_ids"] == td(text)["input_ids"]
    for tok in (tt, td):
        assert tok.bos_token and tok.eos_token and tok.pad_token
        assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
        assert tok.bos_token_id == loaded["target"][0].config["bos_token_id"]
        assert tok.eos_token_id == loaded["target"][0].config["eos_token_id"]
        assert tok(text)["input_ids"][0] == tok.bos_token_id  # the tokenizer adds bos itself
        assert tok.padding_side == "left"


def test_chat_template_renders(loaded):
    tok = loaded["target"][2]
    msgs = [{"role": "user", "content": "complete: def add(a, b):"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert "complete: def add(a, b):" in text and text != msgs[0]["content"]
    assert text != tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)


# --- decoding -----------------------------------------------------------------------------------


def test_32_greedy_tokens_in_well_under_a_second(loaded):
    _, model, tok = loaded["target"]
    ids = tok("import os\n\ndef main():\n")["input_ids"]
    new_tokens(model, ids, 32)  # warm-up
    times, outs = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        outs.append(new_tokens(model, ids, 32))
        times.append(time.perf_counter() - t0)
    assert all(len(o) == 32 for o in outs) and outs[0] == outs[1] == outs[2]
    assert statistics.median(times) < 1.0, times


def test_same_seed_same_sample(loaded):
    _, model, tok = loaded["draft"]
    ids = tok("class Parser:\n")["input_ids"]

    def sample(seed: int) -> list[int]:
        torch.manual_seed(seed)
        return new_tokens(model, ids, 32, do_sample=True, temperature=1.0, top_k=0)

    first = sample(1)
    assert sample(1) == first
    assert sample(2) != first  # the seed is what fixed it


# --- refusing what cannot work ------------------------------------------------------------------


def _refused(folder, match: str, named) -> None:
    """resolve_model(folder) raises a ValueError matching `match` that names `named` and says how to fix it."""
    with pytest.raises(ValueError, match=match) as e:
        resolve_model(str(folder))
    assert str(named) in str(e.value) and "Fix" in str(e.value)


def test_missing_folder(tmp_path):
    path = tmp_path / "nowhere"
    _refused(path, "does not exist", named=path)


def test_folder_without_config(model_copy):
    (model_copy / "config.json").unlink()
    _refused(model_copy, "no config.json", named=model_copy)


def test_corrupt_config(model_copy):
    cfg = model_copy / "config.json"
    cfg.write_text(cfg.read_text()[:40])
    _refused(model_copy, "not valid JSON", named=cfg)


def test_lfs_pointer_instead_of_weights(model_copy):
    w = model_copy / "model.safetensors"
    w.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 9480648\n")
    _refused(model_copy, "Git LFS", named=w)


def test_truncated_weights(model_copy):
    w = model_copy / "model.safetensors"
    data = w.read_bytes()
    w.write_bytes(data[:len(data) // 2])  # big enough to pass for a file, but cut off mid-tensor
    _refused(model_copy, "truncated", named=w)


def test_no_weights(model_copy):
    (model_copy / "model.safetensors").unlink()
    _refused(model_copy, "no weights", named=model_copy)


def test_intact_copy_is_accepted(model_copy):
    spec = resolve_model(str(model_copy))
    assert spec.source == "path" and spec.config == check_model_dir(models.embedded_path("target"))


class FakeTokenizer:
    def __init__(self, size: int, bos: int = 1, eos: int = 2):
        self.size, self.bos_token_id, self.eos_token_id = size, bos, eos

    def __len__(self) -> int:
        return self.size


def test_tokenizer_that_does_not_match_the_model(loaded):
    spec, _, tok = loaded["target"]
    check_tokenizer(tok, spec)  # its own tokenizer passes
    check_tokenizer(FakeTokenizer(4096), spec)
    with pytest.raises(ValueError, match="vocab_size=4096") as e:
        check_tokenizer(FakeTokenizer(32000), spec)
    assert spec.path in str(e.value) and "Fix" in str(e.value)
    with pytest.raises(ValueError, match="eos_token_id=7") as e:
        check_tokenizer(FakeTokenizer(4096, eos=7), spec)
    assert spec.path in str(e.value) and "Fix" in str(e.value)
    with pytest.raises(ValueError, match="bos_token_id=9"):
        check_tokenizer(FakeTokenizer(4096, bos=9), spec)


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="not a known model") as e:
        resolve_model("no-such-model")
    for name in [*PRESETS, "embedded", "embedded-draft"]:
        assert name in str(e.value)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_resolve_without_loading(name, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a preset must not touch the disk or the hub")

    monkeypatch.setattr(presets, "check_model_dir", refuse)  # resolve_model's own name for it
    spec = resolve_model(name)
    assert spec.source == "preset" and not spec.is_local
    assert spec.path == PRESETS[name]["hf_id"] and spec.config == {}
    assert json.dumps(spec.describe())  # describable with no config at all


def test_loading_a_model_draws_no_weight_loading_bar_and_leaves_the_setting_as_it_was(capfd):
    """transformers 5 draws a 'Loading weights' bar per load (five in one lab 01 cell): the lab loads quietly."""
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    load_hf_model(resolve_model("embedded"))
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # other code's bars are untouched


def test_a_gpu_load_reads_the_weights_straight_onto_the_device(monkeypatch):
    """On a GPU the weights go straight to it (transformers' device_map, where accelerate is installed) rather than all
    of them to host memory first (an 8B's 16 GB); on the CPU, or without accelerate, no device_map. The calls are
    captured here, not made."""
    seen = []

    class Loaded:
        def to(self, device):
            seen.append(("to", device))
            return self

        def eval(self):
            return self

    def from_pretrained(path, **kwargs):
        seen.append(kwargs)
        return Loaded()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(transformers.utils, "is_accelerate_available", lambda: True)
    spec = resolve_model("embedded")
    load_hf_model(spec, "cuda", "bfloat16", "sdpa")
    assert seen[0] == {"dtype": torch.bfloat16, "attn_implementation": "sdpa", "device_map": "cuda"}
    seen.clear()
    load_hf_model(spec, "cpu", "float32")
    assert seen[0] == {"dtype": torch.float32}
    seen.clear()
    monkeypatch.setattr(transformers.utils, "is_accelerate_available", lambda: False)  # without accelerate: as before
    load_hf_model(spec, "cuda", "bfloat16")
    assert seen == [{"dtype": torch.bfloat16}, ("to", "cuda")]
