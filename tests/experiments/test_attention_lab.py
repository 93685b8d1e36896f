"""Lab 02's object (`attention.lab.AttentionLab`) and its Checks cell, without running a kernel: the IO model's
prediction kept on the object, a step that reads an earlier one refused until that one ran, and the Checks cell on
this run's prediction with hand-made measurements: it passes where every claim holds, names the claim that fails,
and refuses naming what did not run. The steps themselves are tested in test_attention.py and run end to end by the
notebook under nbval."""
from __future__ import annotations

import pytest

from lablib.experiments.attention import checks, findings
from lablib.experiments.attention.lab import AttentionLab
from lablib.session import Shown


@pytest.fixture
def lab() -> AttentionLab:
    return AttentionLab()


def test_the_prediction_step_keeps_the_rows_and_their_summary(lab, capsys):
    assert lab.predict() is lab.pred and lab.pred == findings.prediction()
    assert lab.summary == findings.prediction_summary(lab.pred)
    lab.prediction_summary()
    assert capsys.readouterr().out.strip() == findings.describe_prediction(lab.summary).strip()


def test_a_step_that_reads_an_earlier_one_is_refused_until_it_ran(lab):
    for step, first in ((lab.prediction_summary, "predict"), (lab.sweep_table, "kernel_sweep"),
                        (lab.speedups, "kernel_sweep"), (lab.hf_table, "hf_prefill_here"),
                        (lab.observations, "predict")):
        with pytest.raises(ValueError, match=rf"run lab\.{first}\(\) first"):
            step()


def _ran(lab: AttentionLab) -> AttentionLab:
    """This run's prediction; the CPU's kernels, HF prefill and the rung by hand, each claim holding; the GPU's
    measurements recorded (not checked here)."""
    lab.predict()
    kernels = ("naive", "sdpa_math", "sdpa_flash", "flex")
    lab.here = Shown({"rows": [{"panel": "prefill", "kernel": k, "status": "ok", "within_tol": True,
                                "max_abs_err": 1e-6} for k in kernels],
                       "provenance": {"config": {"dtype": "float32"}}}, True, "live")
    lab.hf_here = Shown({"rows": [{"impl": i, "prompt_tokens": n, "status": "ok", "same_next_token": True}
                                  for i in ("eager", "sdpa") for n in (64, 128)]}, True, "live")
    lab.gpu = lab.hf_gpu = lab.backends = Shown(None, False, "recorded on NVIDIA H200")
    same = {"identical": 16, "of": 16, "diverged": []}
    lab.rung = Shown({"float32": same, "agreement": same, "identical": True, "dtype": "float32"}, True, "live")
    return lab


def test_the_checks_cell_passes_where_every_claim_holds(lab, capsys):
    checks.checks(_ran(lab))
    assert "7 checks on this run passed; 6 need a live GPU run" in capsys.readouterr().out


def test_the_checks_cell_names_the_claim_that_fails(lab):
    lab = _ran(lab)
    lab.rung.value["float32"] = {"identical": 15, "of": 16, "diverged": []}
    with pytest.raises(AssertionError, match="keeps the eager rung's greedy tokens"):
        checks.checks(lab)


def test_the_checks_cell_names_the_steps_that_did_not_run(lab):
    assert lab.missing() == sorted(["predict", "kernels_here", "kernel_sweep", "hf_prefill_here", "hf_prefill_gpu",
                                    "vllm_backends", "journey_rung"])
    lab.predict()
    with pytest.raises(ValueError, match="run every step above first") as e:
        checks.checks(lab)
    assert "'predict'" not in str(e.value) and "'journey_rung'" in str(e.value)
