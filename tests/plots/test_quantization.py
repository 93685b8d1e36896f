"""Lab 06's figures (lablib.plots.quantization) under the figure rules of tests/plots/test_rules.py (with the
instruments of tests/plots/rules.py): units on every axis, provenance said once (or that nothing is recorded yet),
one colour per scheme in every figure, log axes for speed by batch, no clipped labels; drawn from rows shaped like
the experiment's, with and without speed runs."""
from __future__ import annotations

import pytest

from lablib.models import LABEL
from lablib.plots import quantization as qp
from tests.plots import rules

NOT_RECORDED = ("lab 06's speed and memory per scheme on the synthetic 8B is not recorded yet: a GPU session records "
                "it with `scripts/record_reference.py --steps quantization` (then scripts/pack_reference.py)")
SCHEMES = ("fp8-dynamic", "gptq-w4a16", "w8a8-int8", "awq-w4a16")


def _stored():
    rows = [{"scheme": "bf16", "file_bytes": 9_480_648, "linear_bytes": 7_372_800, "lm_head_bytes": 0,
             "rest_bytes": 2_102_784, "bits_per_weight": 16.0, "vs_bf16": 1.0}]
    for s, linear, bits in (("fp8-dynamic", 3_710_720, 8.05), ("gptq-w4a16", 1_958_960, 4.25),
                            ("w8a8-int8", 3_710_720, 8.05), ("awq-w4a16", 1_987_760, 4.31)):
        size = linear + 2_102_784 + 9_000
        rows.append({"scheme": s, "file_bytes": size, "linear_bytes": linear, "lm_head_bytes": 0,
                     "rest_bytes": 2_102_784, "bits_per_weight": bits, "vs_bf16": size / 9_480_648})
    return rows


def _quality():
    rows = [{"scheme": "bf16", "ppl": 10.86, "ppl_change_pct": 0.0, "agreement": 1.0, "mean_first_divergence": 16.0,
             "eval": "evaluation@v1[:16], 8176 predicted tokens", "greedy": "4 journey prompts x 16 tokens"}]
    for s, pct, agree, first in (("fp8-dynamic", 0.21, 0.62, 10.0), ("gptq-w4a16", 1.56, 0.67, 8.5),
                                 ("w8a8-int8", 0.08, 0.55, 8.8), ("awq-w4a16", 2.39, 0.27, 2.2)):
        rows.append({"scheme": s, "ppl": 10.86 * (1 + pct / 100), "ppl_change_pct": pct, "agreement": agree,
                     "mean_first_divergence": first, "eval": rows[0]["eval"], "greedy": rows[0]["greedy"]})
    return rows


def _speed():
    rows = []
    for s, gib, rates in (("bf16", 15.0, (210, 1600, 8786, 15000)), ("fp8", 8.5, (299, 2100, 11890, 20000)),
                          ("gptq-w4a16", 5.4, (278, 1900, 8783, 12000)), ("awq-w4a16", 5.4, (270, 1850, 8500, 11800)),
                          ("w8a8-int8", 8.5, (290, 2050, 11000, 19000)), ("bf16-kv-fp8", 15.0, (212, 1610, 9000, 16500))):
        for b, v in zip((1, 8, 64, 256), rates):
            rows.append({"scheme": s, "batch": b, "decode_tok_s": v, "weight_gib": gib,
                         "roofline_tok_s": b * 4.8e12 / (gib * 2**30 + 131072 * b * 192),
                         "provenance": "recorded on NVIDIA H200, 2026-12-02"})
    return rows


@pytest.fixture(scope="module")
def figures():
    stored, quality, speed = _stored(), _quality(), _speed()
    return {
        "storage_figure": qp.storage_figure(stored),
        "quality_figure": qp.quality_figure(quality, 1.0),
        "quality_figure/two-schemes": qp.quality_figure(quality[:3], 2.5),
        "speed_figure": qp.speed_figure(speed, "recorded on NVIDIA H200, 2026-12-02"),
        "speed_figure/not-recorded": qp.speed_figure(None, NOT_RECORDED),
        "summary_figure": qp.summary_figure(quality, stored, speed, "recorded on NVIDIA H200, 2026-12-02", 1.0),
        "summary_figure/not-recorded": qp.summary_figure(quality, stored, None, NOT_RECORDED, 1.0),
    }


def test_every_public_builder_is_drawn(figures):
    assert rules.builders(qp) == {k.split("/")[0] for k in figures}


def test_every_numeric_axis_says_its_unit(figures):
    missing = [f"{key}.{name}: {axis.title.text!r}" for key, fig in figures.items()
               for name, axis, values in rules.axes(fig)
               if rules.numeric(axis, values) and not rules.UNIT.search(axis.title.text or "")]
    assert not missing, missing


def test_each_figure_states_its_provenance_once_and_never_in_a_legend(figures):
    for key, fig in figures.items():
        stated = rules.stating(fig, rules.STATES_OR_NOT_YET)
        assert len(stated) == 1, f"{key}: {stated}"
        assert not [t.name for t in rules.legend(fig) if rules.STATES_OR_NOT_YET.search(t.name)], key
    assert "live on this CPU" in figures["quality_figure"].layout.title.text
    summary = figures["summary_figure"].layout.title.text
    assert summary.count("live on") == 1 and summary.count("recorded on") == 1


def test_the_synthetic_label_is_where_the_8b_runs_are_and_only_there(figures):
    for key, fig in figures.items():
        expected = 1 if key.startswith(("speed", "summary")) else 0
        assert fig.layout.title.text.count(LABEL) == expected, key


def test_a_scheme_has_one_colour_in_every_figure_and_no_legend_name_repeats(figures):
    for key, fig in figures.items():
        rules.check_legend(key, fig)
    assert rules.colour_clashes(figures, lambda name: name.removesuffix(" roofline")) == {}
    assert len({qp.scheme_colour(s) for s in ("bf16", "fp8", *SCHEMES, "bf16-kv-fp8")}) == 7
    assert qp.scheme_colour("fp8-dynamic+lm_head") == qp.scheme_colour("fp8-dynamic")


def test_speed_by_batch_is_log_log_with_a_roofline_per_scheme(figures):
    fig = figures["speed_figure"]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    lines = {t.name for t in fig.data}
    assert {"gptq-w4a16", "gptq-w4a16 roofline", "bf16-kv-fp8 roofline"} <= lines
    gptq = next(t for t in fig.data if t.name == "gptq-w4a16")
    assert list(gptq.x) == [1, 8, 64, 256] and list(gptq.y) == [278, 1900, 8783, 12000]
    summary = figures["summary_figure"]
    assert summary.layout.xaxis.type == "log" and summary.layout.yaxis.type == "log"


def test_without_speed_runs_the_figures_say_why_and_draw_nothing_invented(figures):
    for key in ("speed_figure/not-recorded", "summary_figure/not-recorded"):
        fig = figures[key]
        assert "--steps quantization" in fig.layout.title.text
        assert any("no speed runs to draw yet" in (a.text or "") for a in fig.layout.annotations)
        assert not [t for t in fig.data if t.type == "scatter" and t.showlegend is not False]
    weights = [t for t in figures["summary_figure/not-recorded"].data if t.type == "bar" and t.xaxis == "x2"]
    assert [t.name for t in weights] == ["embedded model, on disk"]  # no GPU bars without GPU runs


def test_the_gate_and_the_numbers_are_drawn_as_given(figures):
    fig = figures["quality_figure"]
    assert any(s.type == "line" and s.y0 == 1.0 for s in fig.layout.shapes)
    pct = {t.name: t.y[0] for t in fig.data if t.xaxis == "x"}
    assert pct == {"fp8-dynamic": 0.21, "gptq-w4a16": 1.56, "w8a8-int8": 0.08, "awq-w4a16": 2.39}
    storage = figures["storage_figure"]
    linear = next(t for t in storage.data if t.name == "decoder Linear layers")
    assert list(linear.text) == ["16.00 bits/weight", "8.05 bits/weight", "4.25 bits/weight", "8.05 bits/weight",
                                 "4.31 bits/weight"]
    assert "lm_head" not in {t.name for t in storage.data}  # tied: nothing stored, nothing drawn
    for key, fig in figures.items():
        for t in fig.data:
            if getattr(t, "textposition", None) in ("outside", "top center"):
                assert t.cliponaxis is False, f"{key}: {t.name}"


def test_empty_rows_are_refused_with_the_call_that_makes_them():
    with pytest.raises(ValueError, match="storage_rows"):
        qp.storage_figure([])
    with pytest.raises(ValueError, match="quality_table"):
        qp.quality_figure(_quality()[:1], 1.0)



def test_every_figure_fits_a_1024_px_page(figures):
    assert not {key: unfit for key, fig in figures.items() if (unfit := rules.unfit_text(fig))}
