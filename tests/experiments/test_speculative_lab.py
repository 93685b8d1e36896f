"""Lab 08's object (`speculative.lab.SpeculativeLab`) and its Checks cell, without running the CPU study: the maths
step's tables, a step that reads an earlier one refused until that one ran, the Checks cell refused naming what did
not run. The steps themselves are tested in test_speculative*.py and run end to end by the notebook under nbval."""
from __future__ import annotations

import pytest

from lablib.experiments.speculative import checks, maths
from lablib.experiments.speculative.lab import SpeculativeLab
from lablib.results.store import ResultStore


@pytest.fixture
def lab(tmp_path) -> SpeculativeLab:
    return SpeculativeLab(store=ResultStore(tmp_path / "08.jsonl"))


def test_the_maths_step_gives_the_formulas_tables_with_break_even_pivoted(lab):
    tables = lab.maths(alphas=(0.5, 0.9), ks=(2, 4), costs=(0.0, 1.0))
    rows = maths.maths_tables((0.5, 0.9), (2, 4), (0.0, 1.0))
    assert tables["tokens"].to_dict("records") == rows["tokens"]
    assert tables["optimal_k"].to_dict("records") == rows["optimal_k"]
    even = tables["break_even"]
    assert list(even.index) == [2, 4] and list(even.columns) == [0.0, 1.0]
    for r in rows["break_even"]:
        got = even.loc[r["k"], r["c"]]
        assert got == r["break_even_alpha"] or (r["break_even_alpha"] is None and got != got)  # None: NaN


def test_a_step_that_reads_the_loop_is_refused_until_the_loop_ran(lab):
    for step in (lab.costs, lab.batch_model, lab.summary):
        with pytest.raises(ValueError, match=r"run lab\.loop\(\.\.\.\) first"):
            step()
    with pytest.raises(ValueError, match=r"run lab\.vllm\(\.\.\.\) first"):
        lab.cross_check()


def test_the_checks_cell_names_the_steps_that_did_not_run(lab):
    assert lab.missing() == sorted(["assisted", "batch_model", "drafter_acceptance", "harness_runs", "loop",
                                    "ngram_texts", "sampling", "vllm"])
    lab.hf = {"all_identical": True}
    with pytest.raises(ValueError, match="run every step above first") as e:
        checks.checks(lab)
    assert "'assisted'" not in str(e.value) and "'loop'" in str(e.value)
