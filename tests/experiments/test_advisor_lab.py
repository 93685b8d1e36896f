"""Lab 10's object (`advisor.lab.JourneyLab`) and its Checks cell: each goal advised kept once, in order, for the
summary and the checks; the Checks cell refused until the road ran and a goal was advised, then asserted on a
road of stand-in Results (the real road runs end to end in the notebook under nbval)."""
from __future__ import annotations

import dataclasses

import pytest

from lablib.experiments import journey
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
    lab.under_load(plan.Goal(concurrency=32, tpot_slo_ms=20))
    lab.check_advice()  # on this CPU: the H200's recording (or a label saying which step records it)
    lab.served()
    with pytest.raises(AssertionError, match="every request answered"):
        checks.checks(lab)
    lab.results = lab.shown = [dataclasses.replace(live[1], summary={**live[1].summary, "requests": 8}), live[0]]
    with pytest.raises(AssertionError, match="the road holds a rung of every lab"):  # the first three pass
        checks.checks(lab)


def test_under_load_and_the_advice_checked_without_a_gpu(lab, capsys):
    goal = plan.Goal(concurrency=64, prompt_tokens=1024, shared_prefix_tokens=512, output_tokens=256, tpot_slo_ms=8)
    table = lab.under_load(goal)
    assert list(table["figure"]) == ["TTFT", "TPOT", "ITL"] and {"p50", "p90", "p99"} <= set(table.columns)
    assert "[predicted: lab 04's simulator" in capsys.readouterr().out and lab.loads[goal]["rate_rps"] > 0
    lab.check_advice()  # this CPU machine: the recording
    if lab.checked.value is None:  # not shipped yet: the label names the step that records it
        assert "scripts/record_reference.py --steps advisor-check" in capsys.readouterr().out
    else:
        assert set(lab.checked.value) == {"chat-shared-prefix", "long-context", "assistant-batch-1"}
    assert "under_load" not in lab.missing() and "check_advice" not in lab.missing()


@pytest.mark.parametrize("model, want", [
    ("embedded", {"requests": 8, "batch_sizes": [1, 8], "max_new_tokens": 32}),
    ("synthetic:llama-3.1-8b", {"requests": 64, "batch_sizes": [1, 64], "max_new_tokens": 128}),
])
def test_the_road_is_sized_by_the_model_it_climbs(lab, monkeypatch, capsys, model, want):
    """A CPU climbs the embedded model quickly; a GPU its real-size shape on all 64 journey requests (outputs capped,
    said in the Results' config), HF batches of 1 and what the GPU holds; the size is printed before the climb."""
    asked = {}

    def run_journey(model, **kw):
        asked.update(model=model, **kw)
        return [], []

    monkeypatch.setattr(journey, "default_model", lambda: model)
    monkeypatch.setattr(journey, "default_batch_sizes", lambda m: [1, 8] if m == "embedded" else [1, 64])  # (what
    # an H200 holds: a 40 GB GPU's would be 32)
    monkeypatch.setattr(journey, "run_journey", run_journey)
    monkeypatch.setattr(journey, "road", lambda results, batch_sizes: load_reference("vllm-8b-journey"))
    lab.run()
    got = {"requests": asked["requests"], "batch_sizes": asked["batch_sizes"],
           "max_new_tokens": asked["bench"].max_new_tokens}
    assert asked["model"] == model and got == want and (lab.requests, lab.batch_sizes) == (want["requests"],
                                                                                          want["batch_sizes"])
    assert asked["bench"].tags["max_new_tokens"] == want["max_new_tokens"]  # in every Result's config
    assert capsys.readouterr().out.startswith(f"{model}: {want['requests']} journey requests, HF batch sizes "
                                              f"{want['batch_sizes']}, each output capped at {want['max_new_tokens']}")
    lab.run(requests=4, max_new_tokens=None)  # the caller's own size; None: the workload's lengths
    assert (asked["requests"], asked["bench"].max_new_tokens) == (4, None)
    assert "the journey's own output lengths" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"JourneyLab\.run: batch=\.\.\.: allowed \['batch_sizes', 'max_new_tokens', "
                                         r"'requests'\].*Fix"):
        lab.run(batch=8)
