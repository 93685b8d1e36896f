"""Lab 08's figures (lablib.plots.speculative) under the figure rules of tests/plots/test_rules.py (rules.py).

Drawn the way the lab draws them: the formula, a tiny live CPU study of the embedded pair (one prompt, 12
tokens, one round: deterministic acceptance, timings only drawn), the batch model, and vLLM rows shaped
as `vllm_spec_runs` makes them (hand-built: nothing is recorded on the GPU yet), plus the not-recorded case.
Rules checked: one colour per name across these figures, units on every numeric axis, no provenance in a
legend entry, provenance stated once, no repeated legend name, log axes across three decades, no clipped text.
"""
from __future__ import annotations

from types import SimpleNamespace

import plotly.graph_objects as go
import pytest

from lablib.experiments.speculative import eagle_8b, maths, study as speculative_study
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


def _eagle_value() -> dict:
    """Rows shaped as `eagle_8b.eagle_runs` makes them: a pinned bf16 baseline and heads k=1, 2 at three batches,
    FP8 weights with and without the head at batch 1; each Result's roofline ceiling on the row (live rows carry it)."""
    where, rows = "recorded on NVIDIA H200, 2026-12-04", []

    def result(ceiling):
        return SimpleNamespace(roofline={"ceiling_tok_s": ceiling})

    for b, base in ((1, 150.0), (16, 1750.0), (64, 4200.0)):
        rows.append({"name": "baseline, pinned (V1, no async) [8b-eagle-a]", "method": "baseline", "k": None,
                     "batch": b, "pinned": True, "quantization": None, "output_tok_s": base, "speedup": 1.0,
                     "result": result(319.0), "provenance": where})
        for k, factor in ((1, 1.45 - b / 300), (2, 1.55 - b / 250)):
            rows.append({"name": f"EAGLE head k={k} [8b-eagle-a]", "method": "eagle", "k": k, "batch": b,
                         "pinned": True, "quantization": None, "output_tok_s": base * factor, "speedup": factor,
                         "implied_c": 0.13 + b / 300, "mean_acceptance_length": 1.6 + k / 3,
                         "result": result(319.0), "provenance": where})
    rows += [{"name": "baseline, pinned (V1, no async), FP8 weights [8b-eagle-d]", "method": "baseline", "k": None,
              "batch": 1, "pinned": True, "quantization": "fp8", "output_tok_s": 270.0, "speedup": 1.0,
              "result": result(598.0), "provenance": where},
             {"name": "EAGLE head k=4, FP8 weights [8b-eagle-d]", "method": "eagle", "k": 4, "batch": 1, "pinned": True,
              "quantization": "fp8", "output_tok_s": 420.0, "speedup": 1.56, "result": result(598.0), "provenance": where}]
    return {"rows": rows, "label": "synthetic acceptance: the speed is real, the acceptance rate is set",
            "batch1": eagle_8b.batch1_roofline({"rows": rows})}


DRAFT_8B = {"rows": [{"method": "draft_model", "k": 4, "batch": b, "speedup": x, "implied_c": c}
                     for b, x, c in ((1, 0.96, 0.33), (16, 0.92, 0.35), (64, 0.83, 0.41))]}


@pytest.fixture(scope="module")
def study():
    return speculative_study.cpu_study(n_prompts=1, max_new_tokens=12, ks=(2, 4), rounds=1)


@pytest.fixture(scope="module")
def figures(study) -> dict[str, go.Figure]:
    model = maths.batch_model(speculative_study.study_row(study, 4)["alpha"], 4)
    return {"speedup_vs_alpha": sp.speedup_vs_alpha(), "acceptance_figure": sp.acceptance_figure(study),
            "cpu_speed_figure": sp.cpu_speed_figure(study), "batch_figure": sp.batch_figure(model),
            "vllm_speedup_figure": sp.vllm_speedup_figure({"rows": _vllm_rows()}),
            "eagle_figure": sp.eagle_figure(Shown(_eagle_value(), False, "recorded on NVIDIA H200, 2026-12-04"),
                                            DRAFT_8B)}


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


def test_the_eagle_figure_draws_each_k_the_draft_model_and_batch_one_against_both_ceilings(figures):
    fig = figures["eagle_figure"]
    lines = {t.name: t for t in fig.data if t.type == "scatter"}
    assert list(lines) == ["EAGLE head k=1", "EAGLE head k=2", "1B draft model k=4"]  # pinned bf16 only, by k
    assert list(lines["EAGLE head k=2"].x) == [1, 16, 64] and lines["1B draft model k=4"].line.dash == "dash"
    assert lines["EAGLE head k=1"].line.color != lines["EAGLE head k=2"].line.color
    (bars,) = [t for t in fig.data if t.type == "bar"]
    assert list(bars.y) == [150.0, 150.0 * (1.45 - 1 / 300), 150.0 * (1.55 - 1 / 250), 270.0, 420.0]
    ceilings = sorted(a.text for a in fig.layout.annotations if (a.text or "").endswith(("319", "598")))
    assert ceilings == ["bf16 ceiling 319", "fp8 ceiling 598"]
    assert "recorded on NVIDIA H200, 2026-12-04" in fig.layout.title.text


def test_nothing_recorded_yet_is_a_figure_that_says_so():
    label = ("speculative is not recorded yet: a GPU session records it with `scripts/record_reference.py --steps "
             "speculative` (then scripts/pack_reference.py)")
    fig = sp.vllm_speedup_figure(Shown(None, False, label, "no NVIDIA GPU visible"))
    assert not fig.data and "--steps speculative" in fig.layout.title.text
    assert any("nothing to draw here" in (a.text or "") for a in fig.layout.annotations)
    empty = sp.eagle_figure(None)  # the cell run before lab.eagle_head_8b()
    assert not empty.data and any("lab.eagle_head_8b() first" in (a.text or "") for a in empty.layout.annotations)


def test_every_figure_fits_a_1024_px_page(figures):
    assert not {key: unfit for key, fig in figures.items() if (unfit := rules.unfit_text(fig))}
