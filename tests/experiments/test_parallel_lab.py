"""Lab 09's object (`parallel.lab.ParallelLab`) and its Checks cell, without vLLM: the cost model's and the fit's
steps kept on the object, the preflight's refusal and advice, a step that reads an earlier one refused until that
one ran, and the Checks cell passing on this run's cost model with vLLM's runs not measured here, naming a claim that
fails, and refusing naming what did not run. The steps themselves are tested in test_parallel.py and run end to end
by the notebook under nbval."""
from __future__ import annotations

import pytest

from lablib.experiments.parallel import checks, fit, model
from lablib.config import VLLMConfig
from lablib.experiments.parallel.lab import COST_COLUMNS, ParallelLab
from lablib.results.store import ResultStore
from lablib.session import Shown


@pytest.fixture
def lab(tmp_path) -> ParallelLab:
    return ParallelLab(store=ResultStore(tmp_path / "09.jsonl"))


def test_the_cost_model_and_fit_steps_keep_what_they_made(lab):
    assert lab.cost_model(batches=(1, 64)) is lab.rows and lab.rows == model.cost_rows(batches=(1, 64))
    table = lab.cost_table("llama-3.1-8b", batches=(1,))
    assert len(table) and set(table["batch"]) == {1} and list(table.columns) == COST_COLUMNS
    assert lab.fit() is lab.fits and lab.fits == fit.fit_rows()


def test_the_refusal_then_the_advice_and_the_knobs(lab, capsys):
    lab.refusal("llama-3.1-70b", max_model_len=8192)
    lab.advise("H200")
    assert lab.advice == fit.fit_advice("llama-3.1-70b", lab.too_big, "H200")
    lab.try_knobs("H200", tensor_parallel_size=2)
    out = capsys.readouterr().out
    knob = fit.fit_advice("llama-3.1-70b", VLLMConfig(max_model_len=8192, tensor_parallel_size=2), "H200")["advice"]
    assert "check_fit says:" in out and out.strip().endswith(knob.strip())


def test_a_step_that_reads_an_earlier_one_is_refused_until_it_ran(lab):
    for step, first in ((lab.cost_table, "cost_model"), (lab.fit_table, "fit"), (lab.nodes, "fit"),
                        (lab.summary, "cost_model"), (lab.advise, "refusal"), (lab.try_knobs, "refusal")):
        with pytest.raises(ValueError, match=rf"run lab\.{first}\(\) first"):
            step()


def _ran(lab: ParallelLab) -> ParallelLab:
    lab.cost_model()
    lab.fit()
    lab.refusal("llama-3.1-70b", max_model_len=8192)
    lab.advise("H200")
    lab.tp1 = lab.scaling = Shown(None, False, "not recorded yet")
    return lab


def test_the_checks_cell_passes_on_the_cost_model_with_vllm_not_measured_here(lab, capsys):
    checks.checks(_ran(lab))
    assert "7 checks on this run passed; 3 need a live GPU run" in capsys.readouterr().out


def test_the_checks_cell_names_the_claim_that_fails(lab):
    lab = _ran(lab)
    lab.tp1 = Shown([{"status": "measured", "measured_over_predicted": 0.9}], True, "live")
    with pytest.raises(AssertionError, match="no faster than the model's bound"):
        checks.checks(lab)


def test_the_checks_cell_names_the_steps_that_did_not_run(lab):
    assert lab.missing() == sorted(["cost_model", "fit", "advise", "tp1_baseline", "tp_scaling"])
    lab.fit()
    with pytest.raises(ValueError, match="run every step above first") as e:
        checks.checks(lab)
    assert "'fit'" not in str(e.value) and "'cost_model'" in str(e.value)
