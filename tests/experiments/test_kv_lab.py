"""Lab 03's object (`kv.KVLab`) and its Checks cell (`kv.checks`), without an engine: the arithmetic's and the
simulators' steps kept on the object, the block table's snapshots, a VRAM chart followed through the sweep, a step
that reads an earlier one refused until that one ran, and the Checks cell passing on this run's simulators with vLLM
not measured here, naming a claim that fails, and refusing naming what did not run. The engine steps run end to end
in the notebook under nbval and in the rehearsal."""
from __future__ import annotations

import pytest

from lablib.experiments import kv
from lablib.mechanisms import replay_block_allocation, simulate_fragmentation
from lablib.results.store import ResultStore
from lablib.session import Shown


@pytest.fixture
def lab(tmp_path) -> kv.KVLab:
    return kv.KVLab("journey", store=ResultStore(tmp_path / "03.jsonl"))


def test_the_arithmetic_and_simulator_steps_keep_what_they_made(lab, capsys):
    lab.arithmetic()
    assert lab.llama8b == 131072 and "128 KiB per token" in capsys.readouterr().out
    report = lab.fragmentation(budget_tokens=65536, block_size=16, max_model_len=2048)
    assert report is lab.report and report.rows() == simulate_fragmentation(
        lab.workload.lengths, budget_tokens=65536, block_size=16, max_model_len=2048).rows()
    lab.block_table(requests=12, num_blocks=160, block_size=16, max_num_seqs=6)
    snaps = replay_block_allocation(lab.workload.lengths[:12], num_blocks=160, block_size=16, max_num_seqs=6)
    assert lab.num_blocks == 160 and len(lab.snaps) == len(snaps)
    assert lab.snapshot(1, 3).block_tables == snaps[len(snaps) // 3].block_tables
    assert lab.snapshot(2, 3).free_blocks == snaps[2 * len(snaps) // 3].free_blocks


def test_the_sweep_follows_a_chart_while_it_runs(lab, monkeypatch):
    class Chart:  # a VRAMChart's part the sweep uses: a context and marks
        def __init__(self) -> None:
            self.events: list[str] = []

        def __enter__(self):
            self.events.append("enter")
            return self

        def __exit__(self, *exc):
            self.events.append("exit")

        def mark(self, text: str) -> None:
            self.events.append(text)

    def rows(values, store=None, on_row=None):
        for g in values:
            on_row({"gpu_memory_utilization": g})
        return Shown([], True, "live")

    monkeypatch.setattr(kv, "gpu_memory_utilization_rows", rows)
    chart = Chart()
    assert lab.gmu_sweep([0.1, 0.3], chart=chart) is lab.sweep
    assert chart.events == ["enter", "gmu=0.1 closed", "gmu=0.3 closed", "exit"]


def test_a_step_that_reads_an_earlier_one_is_refused_until_it_ran(lab):
    for step, first in ((lab.fragmentation_table, "fragmentation"), (lab.summary, "fragmentation"),
                        (lambda: lab.snapshot(1, 3), "block_table")):
        with pytest.raises(ValueError, match=rf"run lab\.{first}\(\) first"):
            step()


def _ran(lab: kv.KVLab) -> kv.KVLab:
    lab.arithmetic()
    lab.fragmentation()
    lab.block_table()
    lab.start = lab.sweep = Shown(None, False, "recorded on NVIDIA H200")
    return lab


def test_the_checks_cell_passes_on_the_simulators_with_vllm_not_measured_here(lab, capsys):
    kv.checks(_ran(lab))
    assert "4 checks on this run passed; 3 need a live GPU run" in capsys.readouterr().out


def test_the_checks_cell_names_the_claim_that_fails(lab):
    lab = _ran(lab)
    lab.start = Shown({"kv_over_estimate": 1.1}, True, "live")
    with pytest.raises(AssertionError, match=r"within 10% of lablib's estimate \(1\.1\)"):
        kv.checks(lab)


def test_the_checks_cell_names_the_steps_that_did_not_run(lab):
    assert lab.missing() == sorted(["arithmetic", "cold_start", "fragmentation", "block_table", "gmu_sweep"])
    lab.arithmetic()
    with pytest.raises(ValueError, match="run every step above first") as e:
        kv.checks(lab)
    assert "'arithmetic'" not in str(e.value) and "'block_table'" in str(e.value)
