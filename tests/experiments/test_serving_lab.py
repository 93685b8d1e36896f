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


def test_the_tuning_front_runs_on_the_simulator_without_a_gpu_and_shows_a_recording_where_there_is_one(
        lab, capsys, monkeypatch):
    """Without a GPU or a recording: lab 04's simulator over the cell's settings, labelled; more in flight, more
    tokens per GPU and fewer per user along the front. With the H200's recording (here a stand-in of its form), that,
    labelled with its model, GPU and date. Bad settings are refused naming the field."""
    from lablib.experiments.serving import capacity, pareto
    from lablib.plots.serving import pareto_figure
    from lablib.results.reference import NotRecorded

    monkeypatch.setattr(serving_lab, "mode", lambda: {"live": False, "recorded": "recorded on the H200"})
    monkeypatch.setattr(serving_lab, "recorded_facts", lambda key, step: (_ for _ in ()).throw(NotRecorded(key, step)))
    rows = lab.pareto(max_num_seqs=(16, 64, 256), levels=(1, 4, 16, 64, 256))
    assert lab.tuned_where.startswith(capacity.SIMULATOR) and "--steps pareto" in lab.tuned_where
    assert "load tests on the front" in capsys.readouterr().out
    best = lab.tuned["front"]
    assert len(best) == len(rows) >= 3 and all(p["scheme"] == "simulated" for p in lab.tuned["points"])
    assert [p["tok_s_per_gpu"] for p in best] == sorted(p["tok_s_per_gpu"] for p in best)
    assert [p["tok_s_per_user"] for p in best] == sorted((p["tok_s_per_user"] for p in best), reverse=True)
    assert best[-1]["concurrency"] > best[0]["concurrency"] and best[-1]["tok_s_per_gpu"] > 2 * best[0]["tok_s_per_gpu"]
    assert lab.tuned["points"][-1]["step"].endswith("conc-256")  # 256 requests (the journey 4 times): 256 in flight
    in_flight = [(p["max_num_batched_tokens"], min(p["concurrency"], p["max_num_seqs"])) for p in lab.tuned["points"]]
    assert len(in_flight) == len(set(in_flight))  # a run the server's cap makes the same as another is made once
    fig = pareto_figure(lab.tuned, lab.tuned_where)
    assert [t.name for t in fig.data] == ["every load test", "the front: nothing beats these on both"]
    assert "made-up step costs" in fig.layout.title.text
    recorded = {"points": best, "front": best, "model": "synthetic:llama-3.1-8b", "gpu": "NVIDIA H200",
                "date": "2026-12-06"}
    monkeypatch.setattr(serving_lab, "recorded_facts", lambda key, step: recorded)
    lab.pareto()
    assert lab.tuned is recorded and lab.tuned_where == "recorded on the NVIDIA H200, 2026-12-06, synthetic:llama-3.1-8b"
    for bad, field in (({"max_num_seqs": (0,)}, "max_num_seqs"), ({"levels": (0,)}, "levels"),
                       ({"max_num_batched_tokens": (8,)}, "max_num_batched_tokens"),
                       ({"max_num_seq": 8}, "max_num_seq")):  # refused on any machine, a recording shown or not
        with pytest.raises(ValueError, match=rf"\.{field}=.*allowed.*Fix:"):
            lab.pareto(**bad)
    with pytest.raises(ValueError, match=r"pareto\.on_simulator\.max_num_batched_tokens=\[8\]: allowed .*Fix:"):
        pareto.on_simulator(max_num_seqs=(16,), max_num_batched_tokens=(8,))
    with pytest.raises(ValueError, match=r"concurrency_sweep\.levels=.*Fix:"):
        pareto.on_simulator(levels=(0,))
    with pytest.raises(ValueError, match=r"pareto\.sweep\.schemes=\[\]: allowed at least one"):
        pareto.sweep("embedded", schemes=())
