"""Lab 06 run live on the GPU doubles as its recordings, as lab 08's does (`ResultStore.keep_facts`), on the fake vLLM.

The quality step (`gpu_quality`, step `quantization-quality`): kept on record's settings when every engine ran, as
exactly the dict `record` writes for the same run (one function makes both); not kept on any other setting (named
in a line), nor when an engine fails. The speed step (`speed`, step `quantization-a`): kept when it ran record's
QUANT_A on record's grid, its rows naming the Results they were made from (step and recorded_at), which
scripts/pack_reference.py then takes. Record's settings are shrunk here (one scheme, two windows, tiny lengths) so a
run takes seconds; which settings are compared is what the tests pin down.
"""
import json
import types
from pathlib import Path

import pytest

from lablib.experiments.quantization import (
    checkpoints,
    quality,
    record as quantization_record,
    recording as quantization_recording,
    speed_runs,
    vllm_ppl as quantization_vllm_ppl,
)
from lablib.experiments.quantization import recording, vllm_ppl
from lablib.models.quantize import read_facts
from lablib.results import ResultStore

torch = pytest.importorskip("torch")
pytest.importorskip("transformers").utils.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {"schemes": ("fp8-dynamic",), "eval_texts": 2, "num_samples": 2, "prompts": 2, "max_new_tokens": 4,
         "max_increase_pct": 1.0}


@pytest.fixture
def on_the_h200(start, monkeypatch, tmp_path):
    """The fake vLLM on the fake H200 (device_facts sees it too), record's settings shrunk to SMALL, its work folder
    in tmp_path."""
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    for module in (vllm_ppl, quantization_record):  # the lab's call reads RECORD, the recording step both
        monkeypatch.setattr(module, "RECORD", SMALL)
    monkeypatch.setattr(quantization_record, "GPU_WORK", str(tmp_path / "work"))
    return tmp_path / "work" / "embedded"


def _cpu_rows(work, **kw):
    knobs = {"eval_texts": 2, "prompts": 2, "max_new_tokens": 4, "num_samples": 2, **kw}
    with checkpoints.quiet_progress():
        return quality.quality_table(("fp8-dynamic",), work_dir=work, **knobs)


def _timeless(facts):
    """facts as JSON holds them, without each engine's wall time (the one field two runs never share)."""
    facts = json.loads(json.dumps(facts, default=str))
    for r in facts["rows"]:
        r.pop("engine_s")
    return facts


def test_the_lab_run_on_records_settings_is_the_quality_recording(on_the_h200, tmp_path, capsys, load_script):
    facts = {}
    quantization_record.record_quality(tmp_path, None, facts, schemes=SMALL["schemes"], eval_texts=2, num_samples=2)
    store = ResultStore(tmp_path / "lab" / "results" / "06_quantization.jsonl")
    cpu = _cpu_rows(on_the_h200)  # the lab's own CPU table, on the checkpoints record made (reused, as the lab's)
    shown = quantization_vllm_ppl.gpu_quality(SMALL["schemes"], cpu_rows=cpu, work_dir=on_the_h200, eval_texts=2, store=store,
                           force=True)
    kept = json.loads(store.facts_path("quantization_quality").read_text())
    assert shown.live and "Kept as step quantization-quality's recording" in capsys.readouterr().out
    assert _timeless(kept) == _timeless(facts["quantization_quality"])  # exactly what record writes
    assert [r["scheme"] for r in kept["rows"]] == ["bf16", "bf16-kv-fp8", "fp8-dynamic"] and kept["complete"]
    assert {r["provenance"] for r in kept["rows"]} == {f"recorded on NVIDIA H200, {kept['date']}"}
    assert kept["made"] == [{"scheme": "fp8-dynamic", "group_size": None, "quantize_s": cpu[1]["quantize_s"],
                             "device": read_facts(on_the_h200 / "fp8-dynamic")["device"]}]
    got, dates, results = load_script("pack_reference").lab_facts([tmp_path / "lab"])
    assert got == {"quantization_quality": kept} and dates == {"quantization_quality": kept["date"]} and results == []


@pytest.mark.parametrize("other", ["eval_texts", "gate", "greedy", "schemes"])
def test_a_run_on_other_settings_is_not_the_recording_and_says_which(on_the_h200, tmp_path, capsys, monkeypatch,
                                                                     other):
    checkpoints.quantize_all(("fp8-dynamic",), work_dir=on_the_h200, num_samples=2)
    store = ResultStore(tmp_path / "r.jsonl")
    cpu = _cpu_rows(on_the_h200, **{"gate": {"max_increase_pct": 0.01}, "greedy": {"max_new_tokens": 5}}.get(other, {}))
    if other == "schemes":  # record scores AWQ too (RECORD's schemes); this run did not
        monkeypatch.setattr(vllm_ppl, "RECORD", {**SMALL, "schemes": ("fp8-dynamic", "awq-w4a16")})
    quantization_vllm_ppl.gpu_quality(("fp8-dynamic",), cpu_rows=cpu, work_dir=on_the_h200, eval_texts=3 if other == "eval_texts" else 2,
                   store=store, force=True)
    line = capsys.readouterr().out
    assert not store.facts_path("quantization_quality").exists()
    assert "Not kept as step quantization-quality's recording" in line
    assert {"eval_texts": "eval_texts 3 (record's: 2)", "gate": "gated at another threshold (record's: 1%)",
            "greedy": "x 5 tokens", "schemes": "awq-w4a16"}[other] in line


def test_a_failing_engine_keeps_the_engines_before_it_as_a_recording_cut_short(on_the_h200, tmp_path, monkeypatch):
    """On record's settings the facts are kept after every engine, so an engine that dies (or a time limit) leaves
    the rows of those that ended, "complete": False, as record's own facts are when cut short."""
    import lablib.engines.vllm as engine

    checkpoints.quantize_all(("fp8-dynamic",), work_dir=on_the_h200, num_samples=2)
    cpu = _cpu_rows(on_the_h200)
    real, calls = engine.VLLMEngine.prompt_logprobs, []

    def third_fails(self, texts):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("engine core died")
        return real(self, texts)

    monkeypatch.setattr(engine.VLLMEngine, "prompt_logprobs", third_fails)
    store = ResultStore(tmp_path / "r.jsonl")
    with pytest.raises(RuntimeError, match="engine core died"):
        quantization_vllm_ppl.gpu_quality(("fp8-dynamic",), cpu_rows=cpu, work_dir=on_the_h200, eval_texts=2, store=store, force=True)
    cut = json.loads(store.facts_path("quantization_quality").read_text())
    assert len(calls) == 3 and not cut["complete"] and [r["scheme"] for r in cut["rows"]] == ["bf16", "bf16-kv-fp8"]
    monkeypatch.setattr(engine.VLLMEngine, "prompt_logprobs", real)  # the same settings, every engine running
    quantization_vllm_ppl.gpu_quality(("fp8-dynamic",), cpu_rows=cpu, work_dir=on_the_h200, eval_texts=2, store=store, force=True)
    whole = json.loads(store.facts_path("quantization_quality").read_text())
    assert whole["complete"] and [r["scheme"] for r in whole["rows"]] == ["bf16", "bf16-kv-fp8", "fp8-dynamic"]


# ------------------------------------------------ the speed step: quantization-a


@pytest.fixture
def quant_a(on_the_h200, tmp_path, monkeypatch):
    """Step quantization-a's grid shrunk to the embedded model (batch 2, 16 in / 4 out) in a fresh work folder (no
    checkpoint made: what can run is the three vLLM switches); the knobs the notebook's speed() is called with."""
    grid = {**recording.QUANT_A_GRID, "batches": (2,), "model": "embedded", "work_dir": str(tmp_path / "speed"),
            "prompt_len": 16, "output_len": 4, "gpu_memory_utilization": 0.3, "max_model_len": 256}
    monkeypatch.setattr(recording, "QUANT_A_GRID", grid)
    return {k: v for k, v in grid.items() if k != "schemes"}


def test_the_lab_speed_run_on_quant_a_is_that_recording(quant_a, tmp_path, capsys, load_script):
    facts = {}
    quantization_record.record(tmp_path, ResultStore(tmp_path / "rec.jsonl"), facts, schemes=quantization_recording.QUANT_A,
                               **quant_a)
    store = ResultStore(tmp_path / "lab" / "results" / "06_quantization.jsonl")
    shown = quantization_recording.speed(force=True, store=store, **quant_a)  # the notebook's call: schemes=None, what can run
    kept = json.loads(store.facts_path("quantization").read_text())
    assert shown.live and "Kept as step quantization-a's recording" in capsys.readouterr().out
    recorded = json.loads(json.dumps(facts["quantization"], default=str))
    lab = store.load()
    assert [(r["step"], r["recorded_at"]) for r in kept["rows"]] == [
        (f"quant-{s}-b2", next(x.recorded_at for x in lab if x.step == f"quant-{s}-b2")) for s in quantization_recording.QUANT_A]
    assert [r["step"] for r in kept["rows"]] == [r["step"] for r in recorded["rows"]]  # record's steps, its order
    # the same dict as record's, but for what two runs never share: their Results' moments, the fake's tok/s
    for d in (kept, recorded):
        d.pop("kv")
        for r in d["rows"]:
            r.pop("recorded_at")
    assert kept == recorded and kept["asked"] == list(quantization_recording.QUANT_A) and kept["complete"] and kept["failed"] == {}
    assert "x2.00" in speed_runs.kv_sentence(shown.value)
    got, dates, results = load_script("pack_reference").lab_facts([tmp_path / "lab"])
    assert list(got) == ["quantization"] and dates == {"quantization": kept["date"]}
    assert sorted((r["step"], r["recorded_at"]) for r in results) == sorted((r.step, r.recorded_at) for r in lab)
    assert {r["provenance"] for r in results} == {"recorded"}


@pytest.mark.parametrize("other", ["batches", "schemes"])
def test_a_speed_run_off_quant_a_is_not_that_recording(quant_a, tmp_path, capsys, other):
    store = ResultStore(tmp_path / "r.jsonl")
    kw = {**quant_a, "batches": (1, 2)} if other == "batches" else quant_a
    quantization_recording.speed(force=True, store=store, schemes=("bf16", "fp8") if other == "schemes" else None, **kw)
    line = capsys.readouterr().out
    assert "Not kept as step quantization-a's recording" in line
    assert {"batches": "batches=[1, 2] (quantization-a's: [2])", "schemes": "schemes ['bf16', 'fp8']"}[other] in line
    assert not store.facts_path("quantization").exists() and store.load()  # its Results are kept, as any live run's


def test_a_speed_run_on_quant_a_cut_by_a_failing_engine_keeps_the_runs_before_it(quant_a, tmp_path, fp8_engines_die,
                                                                                 load_script):
    """The facts are kept after every run on record's grid: an engine that dies leaves the earlier schemes' rows,
    "complete": False, each naming a Result the store holds, so pack_reference still takes them."""
    store = ResultStore(tmp_path / "lab" / "results" / "06_quantization.jsonl")
    with pytest.raises(RuntimeError, match="the engine core died"):
        quantization_recording.speed(force=True, store=store, **quant_a)
    cut = json.loads(store.facts_path("quantization").read_text())
    held = {(r.step, r.recorded_at) for r in store.load()}
    assert not cut["complete"] and cut["rows"] and "fp8" not in {r["scheme"] for r in cut["rows"]}
    assert {(r["step"], r["recorded_at"]) for r in cut["rows"]} == held
    got, _, results = load_script("pack_reference").lab_facts([tmp_path / "lab"])
    assert got["quantization"] == cut and {(r["step"], r["recorded_at"]) for r in results} == held


def test_the_speed_runs_defaults_are_step_quantization_as_grid():
    """The notebook calls speed() with no knobs, so "ran record's grid" rests on vllm_speed_runs' own defaults being
    QUANT_A_GRID's: a default changed on one side only would make every live run "not kept"."""
    import inspect

    from lablib.experiments.quantization.speed_runs import vllm_speed_runs

    defaults = {k: p.default for k, p in inspect.signature(vllm_speed_runs).parameters.items()
                if p.default is not inspect.Parameter.empty}
    grid = recording.QUANT_A_GRID
    assert {k: defaults[k] for k in grid if k != "schemes"} == {k: v for k, v in grid.items() if k != "schemes"}


def test_the_notebooks_quality_knobs_are_records():
    """Lab 06's knobs cell (as committed) asks for exactly RECORD's windows, prompts, tokens and gate, so its live
    GPU run is the quality recording; a knob changed on one side only would make it "not kept"."""
    nb = json.loads((Path(__file__).parents[2] / "labs" / "06_quantization.ipynb").read_text())
    src = next("".join(c["source"]) for c in nb["cells"] if "lab.gate_pct =" in "".join(c["source"]))
    lab = types.SimpleNamespace()
    for line in src.splitlines():
        if line.startswith(("lab.gate_pct =", "lab.num_samples, lab.eval_texts, lab.prompts, lab.new_tokens =")):
            exec(line.split("#")[0], {}, {"lab": lab})
    assert (lab.num_samples, lab.eval_texts, lab.prompts, lab.new_tokens, lab.gate_pct) == (
        vllm_ppl.RECORD["num_samples"], vllm_ppl.RECORD["eval_texts"], vllm_ppl.RECORD["prompts"],
        vllm_ppl.RECORD["max_new_tokens"], vllm_ppl.RECORD["max_increase_pct"])


@pytest.mark.parametrize("live", [True, False])
def test_the_labs_default_schemes_are_records_on_a_gpu_and_the_quick_three_on_a_cpu(monkeypatch, live):
    """On a live GPU machine the lab asks for record's schemes by default, so its run can be the recording; on a
    CPU the three that keep the lab quick, which differ from record's (AWQ missing), so a CPU run is never kept."""
    monkeypatch.setattr(vllm_ppl, "mode", lambda: {"live": live})  # the name default_schemes calls
    got = quantization_vllm_ppl.default_schemes()
    if live:
        assert tuple(got) == vllm_ppl.RECORD["schemes"] and "awq-w4a16" in got
    else:
        assert got == ["fp8-dynamic", "gptq-w4a16", "w8a8-int8"] and set(got) < set(vllm_ppl.RECORD["schemes"])
