"""Lab 04's object (`scheduling.SchedulingLab`) and its Checks cell (`scheduling.checks`), without an engine: the
simulator's steps kept on the object, the batch starts of a static run counted as its Gantt chart draws them, a step
that reads an earlier one refused until that one ran, and the Checks cell passing on this run's simulator with vLLM
not measured here, naming a claim that fails, and refusing naming what did not run. The engine steps run end to end
in the notebook under nbval and in the rehearsal."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from lablib.experiments import scheduling
from lablib.mechanisms import continuous_batching
from lablib.results.store import ResultStore
from lablib.session import Shown


@pytest.fixture
def lab(tmp_path) -> scheduling.SchedulingLab:
    return scheduling.SchedulingLab("journey", store=ResultStore(tmp_path / "04.jsonl"))


def _request(start: float | None, arrival: float = 0.0, first: float | None = 1.0, end: float | None = 2.0):
    return SimpleNamespace(start=start, arrival=arrival, first_token=first, finished=end, last_token=end)


def test_batch_starts_counts_the_starts_a_gantt_chart_draws():
    requests = [_request(0.0), _request(0.0), _request(5.0), _request(None, arrival=9.0),
                _request(7.0, first=None), _request(8.0, end=None)]  # the last two are not drawn
    assert scheduling.batch_starts(SimpleNamespace(requests=requests)) == 3


def test_the_simulator_steps_keep_what_they_made(lab):
    lab.simulate(requests=24, slots=8)
    assert lab.static.policy == "static" and lab.continuous.policy == "continuous"
    assert len(lab.static.records) == len(lab.continuous.records) == 24
    assert list(lab.simulated_table()["policy"]) == ["static", "continuous"]
    sweep = lab.seq_sweep((1, 64))
    assert sweep is lab.seqs and list(sweep) == ["max_num_seqs=1", "max_num_seqs=64"]
    assert sweep["max_num_seqs=64"].summary == continuous_batching(lab.workload.lengths, max_num_seqs=64).summary


def test_a_step_that_reads_an_earlier_one_is_refused_until_it_ran(lab):
    for step, first in ((lab.simulated_table, "simulate"), (lab.ratio, "journey_race")):
        with pytest.raises(ValueError, match=rf"run lab\.{first}\(\) first"):
            step()


def _ran(lab: scheduling.SchedulingLab) -> scheduling.SchedulingLab:
    lab.simulate(requests=24, slots=8)
    lab.seq_sweep((1, 4, 16, 64))
    lab.hf_live = SimpleNamespace(requests=[_request(float(i // 8)) for i in range(24)])  # three batches of 8
    lab.race = lab.knobs = Shown(None, False, "recorded on NVIDIA H200")
    return lab


def test_the_checks_cell_passes_on_the_simulator_with_vllm_not_measured_here(lab, capsys):
    scheduling.checks(_ran(lab))
    assert "4 checks on this run passed; 3 need a live GPU run" in capsys.readouterr().out


def test_the_checks_cell_names_the_claim_that_fails(lab):
    lab = _ran(lab)
    lab.race = Shown({"ratio": 9.5}, True, "live")
    with pytest.raises(AssertionError, match=r"vLLM over 10x HF static b=64 on the journey \(9\.5x\)"):
        scheduling.checks(lab)


def test_the_checks_cell_names_the_steps_that_did_not_run(lab):
    assert lab.missing() == sorted(["simulate", "hf_static", "seq_sweep", "journey_race", "scheduler_knobs"])
    lab.simulate()
    with pytest.raises(ValueError, match="run every step above first") as e:
        scheduling.checks(lab)
    assert "'simulate'" not in str(e.value) and "'hf_static'" in str(e.value)
