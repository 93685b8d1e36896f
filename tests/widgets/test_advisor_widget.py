"""Lab 10's panel, headless: its controls build the Goal the advisor reads, the table is advise()'s rows, and a goal
the advisor refuses shows the refusal instead of raising inside a widget callback."""
from __future__ import annotations

import pytest

from lablib.experiments.advisor.plan import Goal, advise
from lablib.widgets import AdvisorPanel


def test_the_panel_shows_the_advice_for_its_controls_and_follows_them():
    panel = AdvisorPanel(concurrency=64)
    assert panel.view["rows"] == advise(Goal(concurrency=64))
    panel.model.value = "llama-3.1-70b"
    panel.precision.value = "bf16"
    got = {r["knob"]: r["setting"] for r in panel.view["rows"]}
    assert got == {r["knob"]: r["setting"] for r in advise(Goal(model="llama-3.1-70b", concurrency=64,
                                                                lowest_precision="bf16"))}
    assert got["tensor_parallel_size"] == 2 and "tensor_parallel_size=2" in panel.table.value


def test_an_slo_of_zero_means_none_and_a_refused_goal_shows_its_message():
    panel = AdvisorPanel()
    assert panel.goal()["tpot_slo_ms"] is None
    panel.shared.value = 9999  # longer than the prompt
    assert "Goal.shared_prefix_tokens=9999" in panel.view["error"] and "rows" not in panel.view
    assert "Goal.shared_prefix_tokens=9999" in panel.table.value
    panel.shared.value = 0
    assert "rows" in panel.view


def test_a_bad_starting_goal_is_refused_before_the_panel_is_drawn():
    with pytest.raises(ValueError, match="Goal.gpu='B200'"):
        AdvisorPanel(gpu="B200")
