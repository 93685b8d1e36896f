"""Lab 07's object (`prefix.lab.PrefixLab`) and its Checks cell, without an engine: the simulator's steps that need
no tokenizer kept on the object, a step that reads an earlier one refused until that one ran, the Checks cell
refused naming what did not run. The steps themselves are tested in test_prefix.py and run end to end by the
notebook under nbval."""
from __future__ import annotations

import pytest

from lablib.experiments.prefix import checks, simulated
from lablib.experiments.prefix.lab import PrefixLab
from lablib.results.store import ResultStore


@pytest.fixture
def lab(tmp_path) -> PrefixLab:
    return PrefixLab(store=ResultStore(tmp_path / "07.jsonl"))


def test_the_simulators_steps_keep_what_they_made(lab):
    demo = lab.eviction_demo()
    assert lab.demo is demo and demo.evictions == simulated.eviction_demo().evictions
    assert lab.scarce_memory() == lab.scarce == simulated.scarce_memory_rows()


def test_a_step_that_reads_an_earlier_one_is_refused_until_it_ran(lab):
    for step, first in ((lab.on_off_pairs, "on_off"), (lab.agreement, "on_off"), (lab.summary, "repeats")):
        with pytest.raises(ValueError, match=rf"run lab\.{first}\(\) first"):
            step()


def test_the_checks_cell_names_the_steps_that_did_not_run(lab):
    lab.eviction_demo()
    with pytest.raises(ValueError, match="run every step above first") as e:
        checks.checks(lab)
    assert "'eviction_demo'" not in str(e.value) and "'counters(1)'" in str(e.value) and "'repeats'" in str(e.value)
