"""Lab 10's object (`advisor.lab.JourneyLab`) and its Checks cell: each goal advised kept once, in order, for the
summary and the checks; the Checks cell refused until the road ran and a goal was advised, then asserted on a
road of stand-in Results (the real road runs end to end in the notebook under nbval)."""
from __future__ import annotations

import dataclasses

import pytest

from lablib.experiments.advisor import checks, plan
from lablib.experiments.advisor.lab import JourneyLab
from lablib.results.reference import load_reference
from lablib.results.store import ResultStore


@pytest.fixture
def lab(tmp_path) -> JourneyLab:
    return JourneyLab(store=ResultStore(tmp_path / "10.jsonl"))


def test_each_goal_advised_is_kept_once_in_order(lab):
    chat, batch = plan.Goal(concurrency=256), plan.Goal(concurrency=1)
    table = lab.advise(chat)
    assert table.to_dict("records") == plan.advise(chat)
    lab.advise(batch)
    lab.advise(chat)
    assert lab.goals == [chat, batch]
    assert lab.advice_lines() == "\n".join(plan.lines([chat, batch]))


def test_the_checks_cell_needs_the_road_and_a_goal(lab):
    with pytest.raises(ValueError, match=r"lab\.run"):
        checks.checks(lab)
    with pytest.raises(ValueError, match=r"lab\.run\(\.\.\.\) first"):
        lab.side_roads()


def test_the_checks_cell_asserts_on_the_road_lab_run_made(lab):
    """`requests` is what lab.run asked for: a live rung that served fewer fails the first claim."""
    recorded = load_reference("vllm-8b-journey")[0]
    live = [dataclasses.replace(recorded, step=s, provenance="live", summary={**recorded.summary, "requests": n},
                                workload={**recorded.workload, "name": "journey"}) for s, n in
            (("hf-naive", 8), ("hf-static-b8", 7))]
    lab.requests, lab.batch_sizes, lab.results, lab.skipped = 8, [1, 8], live, []
    lab.shown = live
    lab.advise(plan.Goal())
    with pytest.raises(AssertionError, match="every request answered"):
        checks.checks(lab)
    lab.results = lab.shown = [dataclasses.replace(live[1], summary={**live[1].summary, "requests": 8}), live[0]]
    with pytest.raises(AssertionError, match="the road holds a rung of every lab"):  # the first three pass
        checks.checks(lab)
