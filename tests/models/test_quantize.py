"""The quantizer: every refusal before any work (each naming its field, in the project's message shape),
the widths and default group size read from the embedded target with no torch, and one real GPTQ W4A16
quantization of the embedded target (4 calibration windows, ~15-25 s on this CPU) that loads back in
transformers and scores a finite perplexity.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lablib.models import embedded_path
from lablib.models import quantize as q

SHAPE = r"^{owner}\.{field}=.*: allowed .+; Fix: .+"
TARGET = embedded_path("target")


def refused(field: str, fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as err:
        fn(*args, **kwargs)
    msg = str(err.value)
    assert re.match(SHAPE.format(owner="quantize", field=field), msg, re.S), msg
    return msg


@pytest.fixture
def no_worker(monkeypatch):
    """Any attempt to start the worker fails the test: refusals come before any work."""
    def boom(*a, **k):
        raise AssertionError("the worker was started before the refusal")

    monkeypatch.setattr(q.subprocess, "Popen", boom)


def test_the_embedded_targets_widths_come_from_the_safetensors_header():
    widths = q.linear_widths(TARGET)
    assert len(widths) == 35  # 5 layers x (q, k, v, o, gate, up, down); lm_head is tied and ignored
    assert set(widths.values()) == {256, 704}
    assert widths["model.layers.0.mlp.down_proj"] == 704
    assert "lm_head" not in widths and q.linear_widths(TARGET, ())["lm_head"] == 256
    assert len(q.linear_widths(TARGET, ("re:.*mlp.*", "lm_head"))) == 20


def test_default_group_size_is_128_where_it_fits_and_64_on_the_embedded_target():
    assert q.default_group_size({"a": 4096, "b": 14336}) == 128
    assert q.default_group_size(q.linear_widths(TARGET)) == 64  # 704 = 11 x 64
    assert q.default_group_size({"a": 48}) is None
    assert q.plan(TARGET, "/tmp/unused-q", "gptq-w4a16", num_samples=2)["group_size"] == 64
    assert q.plan(TARGET, "/tmp/unused-q", "fp8-dynamic")["group_size"] is None


def test_an_unknown_scheme_is_refused_listing_the_allowed(tmp_path, no_worker):
    msg = refused("scheme", q.quantize, TARGET, tmp_path / "out", "int3-magic")
    assert all(name in msg for name in q.SCHEMES)
    assert not (tmp_path / "out").exists()


def test_a_group_size_that_does_not_divide_names_the_layer_its_width_and_the_sizes_that_work(tmp_path, no_worker):
    msg = refused("group_size", q.quantize, TARGET, tmp_path / "out", "gptq-w4a16", group_size=128)
    assert "down_proj takes 704" in msg and "[32, 64]" in msg and "group_size=64" in msg
    refused("group_size", q.quantize, TARGET, tmp_path / "out", "awq-w4a16", group_size=0)
    msg = refused("group_size", q.quantize, TARGET, tmp_path / "out", "fp8-dynamic", group_size=64)
    assert "output channel" in msg


def test_a_missing_calibration_set_is_refused(tmp_path, monkeypatch, no_worker):
    refused("calibration", q.quantize, TARGET, tmp_path / "out", "gptq-w4a16", calibration="no-such-set")
    refused("calibration", q.quantize, TARGET, tmp_path / "out", "gptq-w4a16", calibration=None)
    refused("calibration", q.quantize, TARGET, tmp_path / "out", "awq-w4a16", calibration="evaluation")
    data = tmp_path / "data"  # the manifest names calibration.jsonl, the file is gone
    (data / "workloads").mkdir(parents=True)
    shutil.copy(Path(q.__file__).parents[2] / "data" / "workloads" / "manifest.json", data / "workloads")
    monkeypatch.setenv("LABLIB_DATA", str(data))
    msg = refused("calibration", q.quantize, TARGET, tmp_path / "out", "w8a8-int8")
    assert "missing" in msg
    assert q.plan(TARGET, tmp_path / "out", "fp8-dynamic")["calibration"] is None  # FP8 needs none


def test_num_samples_beyond_the_set_is_refused(tmp_path, no_worker):
    msg = refused("num_samples", q.quantize, TARGET, tmp_path / "out", "gptq-w4a16", num_samples=65)
    assert "1..64" in msg


def test_an_output_folder_that_is_not_empty_is_refused_an_empty_one_is_not(tmp_path, no_worker):
    out = tmp_path / "out"
    out.mkdir()
    assert q.plan(TARGET, out, "fp8-dynamic")["out_dir"] == str(out.resolve())
    (out / "old.txt").write_text("keep me")
    refused("out_dir", q.quantize, TARGET, out, "fp8-dynamic")
    assert (out / "old.txt").read_text() == "keep me"


def test_an_already_quantized_or_missing_model_folder_is_refused(tmp_path, no_worker):
    model = tmp_path / "model"
    shutil.copytree(TARGET, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors"}
    (model / "config.json").write_text(json.dumps(cfg))
    msg = refused("model_dir", q.quantize, model, tmp_path / "out", "gptq-w4a16")
    assert "already quantized" in msg and "compressed-tensors" in msg
    msg = refused("model_dir", q.quantize, tmp_path / "nowhere", tmp_path / "out", "fp8-dynamic")
    assert "does not exist" in msg


def test_ignoring_every_linear_or_a_bad_ignore_is_refused(tmp_path, no_worker):
    refused("ignore", q.quantize, TARGET, tmp_path / "out", "fp8-dynamic", ignore=("re:.*",))
    refused("ignore", q.quantize, TARGET, tmp_path / "out", "fp8-dynamic", ignore=("",))


def tokenizerless(tmp_path: Path, synthetic: bool, vocab: int | None = None) -> Path:
    """The embedded target's config and weights without its tokenizer files; `synthetic`: marked as lablib's synthetic
    checkpoints are (synthetic.json), which carry no tokenizer."""
    model = tmp_path / ("synthetic" if synthetic else "bare")
    model.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(TARGET / f, model / f)
    if vocab is not None:
        cfg = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**cfg, "vocab_size": vocab}))
    if synthetic:
        (model / "synthetic.json").write_text(json.dumps({"architecture": "test", "label": "synthetic"}))
    return model


def test_a_folder_without_a_tokenizer_is_refused_before_the_worker(tmp_path, no_worker):
    """Without this, transformers builds an empty Qwen2 tokenizer from config.json alone: every calibration text
    becomes [] and llm-compressor fails in the worker on a float 'indices' tensor (seen on the H200, 2026-12-03)."""
    msg = refused("model_dir", q.quantize, tokenizerless(tmp_path, False), tmp_path / "out", "gptq-w4a16")
    assert "tokenizer.json" in msg and "save_pretrained" in msg
    msg = refused("model_dir", q.quantize, tokenizerless(tmp_path, True, vocab=100), tmp_path / "out2", "fp8-dynamic")
    assert "vocab_size is 100" in msg


def test_a_synthetic_checkpoint_takes_the_embedded_tokenizer_and_its_own_folder_keeps_its_own(tmp_path):
    assert q.plan(TARGET, tmp_path / "a", "gptq-w4a16")["tokenizer_dir"] == str(TARGET.resolve())
    assert q.plan(tokenizerless(tmp_path, True), tmp_path / "b", "gptq-w4a16")["tokenizer_dir"] == \
        str(TARGET.resolve())


@pytest.mark.parametrize("name", sorted(__import__("lablib.models.architecture", fromlist=["x"]).architectures()))
def test_every_shipped_synthetic_shape_plans_with_every_scheme(tmp_path, name, no_worker):
    """Every check but the weights themselves, on each architecture the lab offers: its widths from the config (the
    quantizer's *.bin fallback), its tokenizer the embedded one. The Qwen2.5-0.5B/1.5B and Llama-3.2-1B shapes
    once failed inside the worker (no tokenizer); the group size must tile every width of every shape."""
    from lablib.models.architecture import architectures

    folder = tmp_path / name
    folder.mkdir()
    cfg = {k: v for k, v in architectures()[name].items() if not k.startswith("_")}
    (folder / "config.json").write_text(json.dumps({**cfg, "dtype": "bfloat16"}))
    (folder / "pytorch_model.bin").write_bytes(bytes(2048))  # the widths come from the config (no safetensors)
    (folder / "synthetic.json").write_text(json.dumps({"architecture": name}))
    for scheme in q.SCHEMES:
        job = q.plan(folder, tmp_path / f"out-{scheme}", scheme, num_samples=2)
        assert job["tokenizer_dir"] == str(TARGET.resolve())
        if q.SCHEMES[scheme].grouped:
            assert job["group_size"] == 128, (name, scheme)  # the standard size tiles every shipped shape


@pytest.fixture
def vllm_env(monkeypatch, tmp_path):
    """This process as in vLLM's environment: llm-compressor does not import, no quantization environment named
    or made, vLLM's packages on PYTHONPATH (what the worker must not inherit)."""
    real = q.importlib.util.find_spec
    monkeypatch.setattr(q.importlib.util, "find_spec", lambda name, *a: None if name == "llmcompressor" else
                        real(name, *a))
    for var in (q.QUANT_PYTHON, q.QUANT_SITE):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(q, "QUANT_VENV", tmp_path / "no-venv-quant")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "vllm-site"))


def test_an_interpreter_without_llm_compressor_is_refused(tmp_path, vllm_env, no_worker):
    refused("python", q.quantize, TARGET, tmp_path / "out", "fp8-dynamic", python=str(tmp_path / "no-python"))
    msg = refused("python", q.quantize, TARGET, tmp_path / "out", "fp8-dynamic")
    assert "lablib[quant]" in msg and "scripts/setup.sh quant" in msg and "LABLIB_QUANT_SITE" in msg
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_the_quantization_environment_is_found_and_never_inherits_vllms_pythonpath(tmp_path, monkeypatch, vllm_env):
    """Where llm-compressor does not import here (vLLM's environment), the worker runs in the quantization
    environment: $LABLIB_QUANT_SITE (a folder for this interpreter: the GPU machine's /tmp/site-q), or
    $LABLIB_QUANT_PYTHON / .venv-quant (another interpreter). Its PYTHONPATH is the project and that folder, never
    this process's (vLLM's compressed-tensors 0.17 would shadow llm-compressor's 0.19). This interpreter has
    llm-compressor itself, so the probe is played by a stand-in that looks only at PYTHONPATH, as vLLM's
    interpreter would find it; the real probe is tested below on the venv's base interpreter."""
    root, vllm_site = str(q.ROOT), str(tmp_path / "vllm-site")
    probed = []

    def probe(exe, pythonpath):
        probed.append((exe, pythonpath))
        return exe != sys.executable or any(Path(p, "llmcompressor").is_dir() for p in pythonpath.split(":"))

    monkeypatch.setattr(q, "_has_llmcompressor", probe)
    site = tmp_path / "site-q"
    (site / "llmcompressor").mkdir(parents=True)
    monkeypatch.setenv(q.QUANT_SITE, str(site))
    exe, path = q.quant_environment()
    assert (exe, path.split(":")) == (sys.executable, [root, str(site)]) and vllm_site not in path
    monkeypatch.setenv(q.QUANT_SITE, str(tmp_path / "empty"))  # named, but llm-compressor is not there
    msg = refused("python", q.quant_environment)
    assert f"Tried without it: $LABLIB_QUANT_SITE ({sys.executable})" in msg
    monkeypatch.delenv(q.QUANT_SITE)
    other = tmp_path / "no-venv-quant" / "bin" / "python"  # .venv-quant: another interpreter, its own packages
    other.parent.mkdir(parents=True)
    other.write_text("")
    assert q.quant_environment() == (str(other), root)
    monkeypatch.setenv(q.QUANT_PYTHON, "/opt/quant/bin/python")  # named first: asked before .venv-quant
    assert q.quant_environment() == ("/opt/quant/bin/python", root) and all(vllm_site not in p for _, p in probed)
    monkeypatch.setattr(q.importlib.util, "find_spec", lambda name, *a: object())  # llm-compressor imports here
    assert q.quant_environment() == (sys.executable, f"{root}:{vllm_site}")  # this environment, kept whole


def test_the_probe_asks_the_interpreter_with_only_the_pythonpath_given(tmp_path, monkeypatch):
    base = sys._base_executable  # the venv's base interpreter: no llm-compressor of its own
    if sys.prefix == sys.base_prefix or q.importlib.util.find_spec("llmcompressor") is None or q._has_llmcompressor(
            base, None):
        pytest.skip("needs a venv with llm-compressor over a base interpreter without it (scripts/setup.sh test)")
    assert not q._has_llmcompressor(str(tmp_path / "no-such-python"), None)  # a typo in $LABLIB_QUANT_PYTHON
    monkeypatch.setenv("PYTHONPATH", str(Path(q.importlib.util.find_spec("llmcompressor").origin).parents[1]))
    assert not q._has_llmcompressor(base, None)  # this process's PYTHONPATH is not passed on
    (tmp_path / "llmcompressor").mkdir()
    (tmp_path / "llmcompressor" / "__init__.py").write_text("")
    assert q._has_llmcompressor(base, str(tmp_path))


def test_the_quantizer_loads_nothing_heavy_and_the_worker_no_other_lablib_module():
    code = ("import sys\nclass B:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in {'torch', 'transformers', 'numpy', 'llmcompressor', 'datasets'}:\n"
            "            raise ImportError(name)\nsys.meta_path.insert(0, B())\n"
            "import lablib.models.quantize, lablib.models.quantize_worker\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=q.ROOT)
    assert p.returncode == 0, p.stderr[-1500:]
    source = Path(q.__file__).with_name("quantize_worker.py").read_text()
    assert not re.search(r"^\s*(from|import) (\.|lablib)", source, re.M)


def fake_worker(tmp_path: Path, script: str) -> Path:
    """A stand-in for the worker's interpreter: a shell script run as `EXE -m lablib.models.quantize_worker JOB`."""
    exe = tmp_path / "fake-python"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    return exe


def living_members(pgid: int) -> list[int]:
    """The processes of group `pgid` that are not zombies (a killed orphan may wait a while to be reaped)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while this looked
        if int(pgrp) == pgid and state not in ("Z", "X"):
            pids.append(int(stat.parent.name))
    return pids


def test_a_sigterm_to_the_caller_ends_the_worker_group_and_removes_the_work_folder(tmp_path):
    """The worker (here a shell and a child of its own, both sleeping) runs in a session of its own, so a SIGTERM to
    the caller (a scheduler's, `timeout`'s) would leave it running with the .partial-* folder: quantize turns the
    signal into a KeyboardInterrupt, whose cleanup kills the worker's whole group and removes the folder."""
    if not Path("/proc/self/stat").is_file():
        pytest.skip("reads process groups from /proc (Linux)")
    pidfile = tmp_path / "worker.pid"
    exe = fake_worker(tmp_path, f"sleep 300 &\necho $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}\nwait\n")
    code = ("import sys\nfrom lablib.models import quantize as q\n"
            "q.quant_environment = lambda python=None: (sys.argv[1], '')\n"
            "q.quantize(q.ROOT / 'data' / 'models' / 'target', sys.argv[2], 'fp8-dynamic')\n")
    caller = subprocess.Popen([sys.executable, "-c", code, str(exe), str(tmp_path / "out")], cwd=q.ROOT,
                              env={**os.environ, "PYTHONPATH": str(q.ROOT)}, stderr=subprocess.PIPE, text=True)
    pgid = None
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists():
            assert caller.poll() is None and time.monotonic() < deadline, "the fake worker did not start"
            time.sleep(0.05)
        pgid = int(pidfile.read_text())
        assert len(living_members(pgid)) == 2 and list(tmp_path.glob(".out.partial-*"))  # running, its folder there
        caller.send_signal(signal.SIGTERM)
        err = caller.communicate(timeout=30)[1]
        assert caller.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
        deadline = time.monotonic() + 10
        while living_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert living_members(pgid) == []
        assert not list(tmp_path.glob(".out.partial-*")) and not (tmp_path / "out").exists()
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        if pgid is not None and living_members(pgid):
            os.killpg(pgid, signal.SIGKILL)  # the fake worker this test started, if the fix failed


def test_quantize_puts_the_callers_sigterm_handler_back(tmp_path, monkeypatch):
    exe = fake_worker(tmp_path, "exit 3\n")
    monkeypatch.setattr(q, "quant_environment", lambda python=None: (str(exe), ""))

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with pytest.raises(RuntimeError, match="exit status 3"):
            q.quantize(TARGET, tmp_path / "out", "fp8-dynamic")
        assert signal.getsignal(signal.SIGTERM) is mine
        assert not list(tmp_path.glob(".out.partial-*"))
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_real_gptq_w4a16_quantization_loads_back_and_scores_a_finite_perplexity(tmp_path):
    pytest.importorskip("llmcompressor", reason="install lablib[quant]")
    from lablib.experiments.quantization.measures import evaluation_set, load_model, perplexity

    out = tmp_path / "gptq"
    facts = q.quantize(TARGET, out, "gptq-w4a16", num_samples=4, threads=1)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "recipe.yaml", "quantization.json", "quantize.log",
            "tokenizer.json", "tokenizer_config.json"} <= names
    assert not list(tmp_path.glob(".gptq.partial-*"))  # the work folder is gone
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    weights = cfg["config_groups"]["group_0"]["weights"]
    assert (cfg["quant_method"], weights["num_bits"], weights["group_size"], weights["symmetric"]) == \
        ("compressed-tensors", 4, 64, True)
    assert cfg["ignore"] == ["lm_head"]
    assert "GPTQModifier" in (out / "recipe.yaml").read_text()
    assert json.loads((out / "quantization.json").read_text()) == facts
    assert facts["calibration"] == {"workload": "calibration@v1[:4]", "samples": 4, "tokens": 4 * 512}
    assert facts["versions"]["llmcompressor"].startswith("0.14") and facts["seconds"] > 0
    assert facts["weight_bytes"] < 0.5 * (TARGET / "model.safetensors").stat().st_size

    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(str(out))
    ppl = perplexity(load_model(out), tok, [r.prompt for r in evaluation_set(2).requests])
    assert ppl.tokens == 2 * 511 and 1.0 < ppl.ppl < 100.0  # the bf16 model scores ~16.6 on these two
    refused("model_dir", q.quantize, out, tmp_path / "again", "fp8-dynamic")  # a quantized folder, for real


def test_a_synthetic_checkpoint_without_a_tokenizer_quantizes_and_gets_the_embedded_one(tmp_path):
    """The path every synthetic shape takes: calibrated on the embedded tokenizer's ids, saved with that tokenizer."""
    pytest.importorskip("llmcompressor", reason="install lablib[quant]")
    out = tmp_path / "gptq"
    facts = q.quantize(tokenizerless(tmp_path, True), out, "gptq-w4a16", num_samples=2, threads=1)
    assert facts["tokenizer_dir"] == str(TARGET.resolve()) and facts["calibration"]["samples"] == 2
    from transformers import AutoTokenizer

    text = "def area(r):\n    return 3.14159 * r * r\n"
    assert AutoTokenizer.from_pretrained(str(out))(text)["input_ids"] == \
        AutoTokenizer.from_pretrained(str(TARGET))(text)["input_ids"]
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "compressed-tensors"
