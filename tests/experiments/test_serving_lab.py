"""Lab 05's object (`serving_lab.ServingLab`): a cell run before the step it reads says which step to run (not a bare
NameError), the recorded sweep keeps what it made, and the Checks cell names the steps that did not run. The notebook
runs end to end under nbval."""
from __future__ import annotations

import pytest

from lablib.experiments.serving import checks as serving_checks, lab as serving_lab
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
        serving_checks.checks(lab)
    assert "'rate_sweep'" in str(e.value) and "'client_ceiling'" in str(e.value) and "'capacity'" in str(e.value)


def test_the_capacity_step_runs_on_the_simulator_without_a_gpu_and_refuses_bad_targets(lab, capsys, monkeypatch):
    from lablib.experiments.serving import capacity
    from lablib.plots.serving import capacity_figure

    monkeypatch.setattr(serving_lab, "mode", lambda: {"live": False})
    rows = lab.capacity(ttft_ms=1000, percentile=90)
    lo, hi = lab.found["interval_rps"]
    assert 1.0 < lo < hi < 64.0 and lab.found_where == capacity.SIMULATOR
    assert f"[{capacity.SIMULATOR}]" in capsys.readouterr().out
    assert list(rows["rate"])[:2] == [1.0, 64.0] and bool(rows["holds"][0]) and not bool(rows["holds"][1])
    fig = capacity_figure(lab.found, lab.found_where)
    assert {t.name for t in fig.data} == {"holds", "fails"} and "TTFT <= 1000 ms" in str(fig.layout.annotations)
    for bad, field in (({"ttft_ms": 0}, "ttft_ms"), ({"ttft_ms": -5}, "ttft_ms"), ({"percentile": 100}, "percentile"),
                       ({"ttft_ms": None, "tpot_ms": None}, "ttft_ms/tpot_ms/itl_ms/e2el_ms"), ({"low": 8.0, "high": 4.0}, "high")):
        with pytest.raises(ValueError, match=rf"\.{field}=.*allowed.*Fix:"):
            lab.capacity(**{"ttft_ms": 1000, **bad})
