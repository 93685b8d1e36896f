"""Lab 05's object (`serving_lab.ServingLab`): a cell run before the step it reads says which step to run (not a bare
NameError), the recorded sweep keeps what it made, and the Checks cell names the steps that did not run. The notebook
runs end to end under nbval."""
from __future__ import annotations

import pytest

from lablib.experiments import serving_lab
from lablib.results.store import ResultStore


@pytest.fixture
def lab(tmp_path) -> serving_lab.ServingLab:
    return serving_lab.ServingLab(store=ResultStore(tmp_path / "05.jsonl"))


def test_a_step_that_reads_the_sweep_is_refused_until_it_ran(lab):
    for step in (lab.results, lab.load_table, lab.referee, lab.burst):
        with pytest.raises(ValueError, match=r"run lab\.rate_sweep\(\) first"):
            step()


def test_the_recorded_sweep_is_kept_and_shown(lab, capsys):
    results = lab.rate_sweep("embedded", repeat=4, max_num_seqs=32, force=False)
    assert "capacity C =" in capsys.readouterr().out
    assert lab.results() is results and lab.burst()[0] in results
    table = lab.load_table()
    assert list(table.columns) == [*serving_lab.LOAD_COLUMNS, "provenance"]
    assert table["output_tok_s"].dtype.kind == "f"  # numbers stay numbers; only their display is formatted
    lab.referee()
    assert lab.verdict is not None


def test_the_checks_cell_names_the_steps_that_did_not_run(lab):
    with pytest.raises(ValueError, match="run every step above first") as e:
        serving_lab.checks(lab)
    assert "'rate_sweep'" in str(e.value) and "'client_ceiling'" in str(e.value)
