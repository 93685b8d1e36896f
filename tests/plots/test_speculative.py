"""Lab 08's figures (lablib.plots.speculative) under the figure rules of tests/plots/test_rules.py (rules.py).

Drawn the way the lab draws them: the formula, a tiny live CPU study of the embedded pair (one prompt, 12
tokens, one round: deterministic acceptance, timings only drawn), the batch model, and vLLM rows shaped
as `vllm_spec_runs` makes them (hand-built: nothing is recorded on the GPU yet), plus the not-recorded case.
Rules checked: one colour per name across these figures, units on every numeric axis, no provenance in a
legend entry, provenance stated once, no repeated legend name, log axes across three decades, no clipped text.
"""
from __future__ import annotations

import plotly.graph_objects as go
import pytest

from lablib.experiments.speculative import maths, study as speculative_study
from lablib.plots import speculative as sp
from lablib.plots.style import base_name
from lablib.session import Shown
from tests.plots import rules

pytest.importorskip("torch")
pytest.importorskip("transformers").utils.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")


def _vllm_rows() -> list[dict]:
    rows = []
    for b, base in ((1, 400.0), (16, 3000.0), (64, 9000.0)):
        for name, method, k, factor, length in (
                ("baseline, pinned (V1, no async)", "baseline", None, 1.0, None),
                ("baseline, vLLM defaults", "baseline", None, 1.3, None),
                ("draft model k=4", "draft_model", 4, 0.7 - b / 200, 2.9),
                ("n-gram k=4 (lookup 2-5)", "ngram", 4, 1.4 - b / 100, 2.2)):
            rows.append({"name": name, "method": method, "k": k, "batch": b, "output_tok_s": base * factor,
                         "speedup": factor, "mean_acceptance_length": length,
                         "provenance": "recorded on NVIDIA H200, 2026-12-02"})
    return rows


@pytest.fixture(scope="module")
def study():
    return speculative_study.cpu_study(n_prompts=1, max_new_tokens=12, ks=(2, 4), rounds=1)


@pytest.fixture(scope="module")
def figures(study) -> dict[str, go.Figure]:
    model = maths.batch_model(speculative_study.study_row(study, 4)["alpha"], 4)
    return {"speedup_vs_alpha": sp.speedup_vs_alpha(), "acceptance_figure": sp.acceptance_figure(study),
            "cpu_speed_figure": sp.cpu_speed_figure(study), "batch_figure": sp.batch_figure(model),
            "vllm_speedup_figure": sp.vllm_speedup_figure({"rows": _vllm_rows()})}


def test_every_builder_is_drawn(figures):
    assert rules.builders(sp) <= set(figures), sorted(rules.builders(sp) - set(figures))


def test_legends_have_colours_and_no_repeats_and_names_one_colour_everywhere(figures):
    for key, fig in figures.items():
        rules.check_legend(key, fig)
    assert rules.colour_clashes(figures, base_name) == {}
    assert sp.colour_of("draft model k=4") == sp.colour_of("draft model k=4") != sp.colour_of("draft model k=2")
    assert sp.colour_of("n-gram k=4") == sp.colour_of("n-gram k=4 (lookup 2-5)")  # the model and vLLM alike


def test_axes_say_their_units_and_decades_sit_on_log_axes(figures):
    for key, fig in figures.items():
        for name, axis, values in rules.axes(fig):
            if not rules.numeric(axis, values) or (axis.matches and axis.showticklabels is not True):
                continue
            assert rules.UNIT.search(axis.title.text or ""), f"{key}.{name}: {axis.title.text!r}"
            if rules.spans_decades(values):
                assert axis.type == "log", f"{key}.{name}"


def test_provenance_once_per_figure_and_never_in_a_legend(figures):
    for key, fig in figures.items():
        assert not [t.name for t in rules.legend(fig) if rules.PROVENANCE.search(t.name)], key
        stated = rules.stating(fig)
        assert len(stated) == 1, f"{key}: {stated}"
    assert "live on this CPU" in figures["acceptance_figure"].layout.title.text
    assert "simulated" in figures["batch_figure"].layout.title.text
    assert "recorded on NVIDIA H200, 2026-12-02" in figures["vllm_speedup_figure"].layout.title.text


def test_text_outside_bars_is_not_clipped(figures):
    for key, fig in figures.items():
        for t in fig.data:
            if getattr(t, "textposition", None) == "outside":
                assert t.cliponaxis is False, f"{key}: {t.name}"
        assert fig.layout.xaxis.automargin and fig.layout.yaxis.automargin, key


def test_the_figures_draw_the_data(figures, study):
    acc = figures["acceptance_figure"]
    counted = next(t for t in acc.data if t.name == "counted by the loop (+/- 3 se)")
    assert list(counted.y) == [r["measured_length"] for r in study["rows"]]
    assert list(counted.error_y.array) == pytest.approx([3 * r["length_stderr"] for r in study["rows"]])
    model = figures["batch_figure"]
    assert {t.name for t in model.data} == {"draft model k=4", "n-gram k=4"}
    assert sum("slower from batch" in (a.text or "") for a in model.layout.annotations) == 2
    vllm = figures["vllm_speedup_figure"]
    assert [t.name for t in vllm.data] == ["baseline, vLLM defaults", "draft model k=4", "n-gram k=4 (lookup 2-5)"]
    assert list(vllm.data[1].x) == [1, 16, 64] and vllm.layout.xaxis.type == "log"
    alpha = figures["speedup_vs_alpha"]
    assert len([t for t in alpha.data if t.name == "break-even"]) == 3  # one per k panel, listed once
    assert sum(t.showlegend is not False for t in alpha.data if t.name == "break-even") == 1


def test_nothing_recorded_yet_is_a_figure_that_says_so():
    label = ("speculative is not recorded yet: a GPU session records it with `scripts/record_reference.py --steps "
             "speculative` (then scripts/pack_reference.py)")
    fig = sp.vllm_speedup_figure(Shown(None, False, label, "no NVIDIA GPU visible"))
    assert not fig.data and "--steps speculative" in fig.layout.title.text
    assert any("nothing to draw here" in (a.text or "") for a in fig.layout.annotations)


def test_every_figure_fits_a_1024_px_page(figures):
    assert not {key: unfit for key, fig in figures.items() if (unfit := rules.unfit_text(fig))}
