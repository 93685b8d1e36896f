"""Lab 06's object (`quantization.lab.QuantizationLab`) and its Checks cell, without quantizing: the steps that need
no checkpoint kept or shown, a refusal printed before any work, a step that reads the quality table refused until it
ran, and the Checks cell on hand-made rows: it passes where every claim holds, names the claim that fails, and
refuses naming what did not run. The steps themselves are tested in test_quantization*.py and run end to end by the
notebook under nbval."""
from __future__ import annotations

import copy

import pytest

from lablib.experiments.quantization import checks, checkpoints, sizes
from lablib.experiments.quantization.lab import QuantizationLab
from lablib.experiments.quantization.measures import quality_gate
from lablib.models.quantize import SCHEMES
from lablib.results.store import ResultStore
from lablib.session import Shown


@pytest.fixture
def lab(tmp_path) -> QuantizationLab:
    lab = QuantizationLab(store=ResultStore(tmp_path / "06.jsonl"))
    lab.work = tmp_path / "quantized"
    return lab


def test_the_steps_without_checkpoints_show_the_modules_tables(lab):
    assert list(lab.scheme_table()["name"]) == list(SCHEMES)
    assert lab.group_sizes().to_dict("records") == checkpoints.group_size_rows()
    assert lab.weights_alone().to_dict("records") == lab.weights == sizes.weights_alone()


def test_a_refusal_is_printed_before_any_work(lab, capsys):
    lab.refusal("int3-magic")
    out = capsys.readouterr().out
    assert "int3-magic" in out and "not refused" not in out and not (lab.work / "refused").exists()


def test_a_step_that_reads_the_quality_table_is_refused_until_it_ran(lab):
    for step in (lab.vllm_quality, lab.gate, lab.under_one_percent, lab.lm_head, lab.layers, lab.claims):
        with pytest.raises(ValueError, match=r"run lab\.score\(\) first"):
            step()
    with pytest.raises(ValueError, match=r"run lab\.storage\(\) first"):
        lab.summary()


def _ran(lab: QuantizationLab) -> QuantizationLab:
    """Every step's value by hand, each claim of the Checks cell holding, vLLM's runs live."""
    ppl = {"bf16": 10.0, "fp8-dynamic": 10.02, "w8a8-int8": 10.05, "gptq-w4a16": 10.3}
    lab.quality = [{"scheme": s, "ppl": p, "ppl_change_pct": (p / 10.0 - 1) * 100,
                    "weight_bytes": 100 if s == "bf16" else 60,
                    "gate": quality_gate(p, 10.0, lab.gate_pct).sentence} for s, p in ppl.items()]
    lab.made = [{"scheme": "fp8-dynamic", "group_size": None, "calibration_tokens": 0},
                {"scheme": "gptq-w4a16", "group_size": 64, "calibration_tokens": 4096}]
    lab.stored = [{"scheme": "gptq-w4a16", "bits_per_weight": 4.26}]
    lab.lm_heads = [{"weight_bytes": 60}, {"weight_bytes": 70}]
    lab.parts = [{"quantized": "every Linear", "saved_pct": 40}, {"quantized": "mlp", "saved_pct": 30},
                 {"quantized": "attention", "saved_pct": 10}]
    lab.speeds = Shown([{"scheme": s, "of_roofline": 0.8, "weight_gib": w, "kv_tokens": kv, "linear_kernels": k}
                        for s, w, kv, k in (("bf16", 15.0, 100, ""), ("bf16-kv-fp8", 15.0, 200, ""),
                                            ("fp8", 8.0, 150, "CutlassFP8ScaledMMLinearKernel"))], True, "live")
    lab.vllm = Shown([{"scheme": "bf16", "vllm_vs_cpu_pct": 0.4, "ppl_vllm": 10.04, "ppl_cpu": 10.0}], True, "live")
    return lab


def test_the_checks_cell_passes_where_every_claim_holds(lab, capsys):
    checks.checks(_ran(lab))
    assert "13 checks on this run passed" in capsys.readouterr().out


@pytest.mark.parametrize("broken, claim", [
    (lambda lab: lab.lm_heads.reverse(), "quantizing the tied lm_head made the checkpoint larger"),
    (lambda lab: lab.speeds.value[1].update(kv_tokens=221), "the FP8 KV cache holds about twice"),
    (lambda lab: lab.vllm.value[0].update(vllm_vs_cpu_pct=1.01), "vLLM's bf16 perplexity is within 1%"),
    (lambda lab: lab.stored[0].update(bits_per_weight=4.32), "about 4.25 bits per Linear weight"),
])
def test_the_checks_cell_names_the_claim_that_fails(lab, broken, claim):
    lab = _ran(lab)
    broken(lab)
    with pytest.raises(AssertionError, match=claim):
        checks.checks(lab)


def test_a_recorded_speed_run_is_not_checked_here(lab, capsys):
    lab = _ran(lab)
    lab.speeds = Shown(copy.deepcopy(lab.speeds.value), False, "recorded on NVIDIA H200")
    lab.speeds.value[1]["kv_tokens"] = 1  # would fail live
    checks.checks(lab)
    assert "9 checks on this run passed; 4 need a live GPU run" in capsys.readouterr().out


def test_the_checks_cell_names_the_steps_that_did_not_run(lab):
    assert lab.missing() == sorted(["quantize", "storage", "score", "vllm_quality", "lm_head", "layers", "speed"])
    lab.weights_alone()
    lab.made = []
    with pytest.raises(ValueError, match="run every step above first") as e:
        checks.checks(lab)
    assert "'quantize'" not in str(e.value) and "'score'" in str(e.value)
