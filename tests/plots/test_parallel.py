"""Lab 09's figures: the cost model's parts, curves and fit drawn from exactly the rows they are given, and the
house rules of tests/plots/test_rules.py (units, one colour per name, provenance once, log axes) on each, with the
instruments of tests/plots/rules.py."""
from __future__ import annotations

import pytest

from lablib.experiments.parallel import fit, model, runs, study
from lablib.plots import parallel as fig_
from lablib.plots import style
from lablib.session import Shown
from tests.plots import rules

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@pytest.fixture(scope="module")
def rows():
    return model.cost_rows(batches=BATCHES)


def _recorded_tp1() -> Shown:
    """A stand-in for the tp1 recording: the prediction's own numbers, labelled as recorded on another date."""
    made = []
    for r in study.prediction_rows(batches=(1, 8, 64)):
        ms = r["latency_s"] * 1e3 * 1.5
        made.append({"model": r["model"], "scheme": r["scheme"], "t": 1, "batch": r["batch"], "status": "measured",
                     "tpot_ms": ms, "decode_tok_s": r["batch"] / ms * 1e3, "predicted_ms": r["latency_s"] * 1e3,
                     "measured_over_predicted": 1.5, "provenance": "recorded on NVIDIA H200, 2027-01-05"})
    made.append(runs.not_measured("llama-3.1-70b", "fp8", 1, 128, "the disk is too small") | {
        "provenance": "recorded on NVIDIA H200, 2027-01-05"})
    return Shown(made, False, "recorded on NVIDIA H200, 2027-01-05")


MEASURED_ON = "recorded on 4 x NVIDIA H200, 2027-01-06"


def _measured_tp(rows) -> list[dict]:
    """Synthetic TP rows as tp_scaling() returns them: the 8B at t = 1, 2, 4 at 1.4x the model's NVLink step, TP=4
    at batch 64 not measured, and rows the TP curve must leave out (NCCL, PP, the 70B)."""
    made = []
    for r in rows:
        if (r["model"], r["link"]) == ("llama-3.1-8b", "NVLink 4") and r["batch"] in (1, 64) and r["t"] <= 4:
            ms = r["latency_s"] * 1e3 * 1.4
            made.append({"model": "llama-3.1-8b", "scheme": "bf16", "t": r["t"], "pp": 1, "all_reduce": "custom",
                         "batch": r["batch"], "status": "measured", "tpot_ms": ms, "decode_tok_s": r["batch"] / ms * 1e3,
                         "predicted_ms": r["latency_s"] * 1e3, "context": 260.0, "provenance": MEASURED_ON})
    made = [r for r in made if (r["t"], r["batch"]) != (4, 64)]
    made.append(runs.not_measured("llama-3.1-8b", "bf16", 4, 64, "needs 4 GPUs") | {"provenance": MEASURED_ON})
    made.append({**made[0], "t": 2, "all_reduce": "nccl", "tpot_ms": 1e3})
    made.append({**made[0], "pp": 2, "tpot_ms": 2e3})
    made.append({**made[0], "model": "llama-3.1-70b", "tpot_ms": 3e3})
    return made


@pytest.fixture(scope="module")
def figures(rows):
    from lablib.results.reference import NotRecorded

    tp1_missing = Shown(None, False, str(NotRecorded("tp1", "tp1")))  # what tp1_baseline shows in a tree without it
    return {
        "step_parts": fig_.step_parts(rows, "llama-3.1-8b"),
        "step_parts/pcie-70b": fig_.step_parts(rows, "llama-3.1-70b", "PCIe Gen4 x16", (1, 8, 256)),
        "tp_scaling": fig_.tp_scaling(rows, "llama-3.1-8b"),
        "tp_scaling/70b": fig_.tp_scaling(rows, "llama-3.1-70b", (1, 64, 256)),
        "tp_scaling/measured": fig_.tp_scaling(rows, "llama-3.1-8b", measured=_measured_tp(rows)),
        "tp_scaling/not-recorded": fig_.tp_scaling(rows, "llama-3.1-8b", measured=study.tp_scaling(force=False)),
        "communication_share": fig_.communication_share(rows, "llama-3.1-8b"),
        "fit_heatmap": fig_.fit_heatmap(fit.fit_rows()),
        "two_gpus": fig_.two_gpus(model.two_gpu_rows()),
        "two_gpus/70b": fig_.two_gpus(model.two_gpu_rows("llama-3.1-70b")),
        "tp1_figure/not-recorded": fig_.tp1_figure(study.prediction_rows(), {"fixed shapes": tp1_missing,
                                                                          "labs 01-03": study.recorded_tp1_points()}),
        "tp1_figure/recorded": fig_.tp1_figure(study.prediction_rows(), {"fixed shapes": _recorded_tp1(),
                                                                      "labs 01-03": study.recorded_tp1_points()}),
    }


# --- the data drawn is the data given ------------------------------------------------------------


def test_step_parts_stack_to_the_step(rows, figures):
    fig = figures["step_parts"]
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert names == [name for _, name in fig_.PARTS]
    for col, b in enumerate((1, 64)):
        bars = [t for t in fig.data if t.xaxis == ("x" if col == 0 else f"x{col + 1}")]
        want = sorted((r for r in rows if (r["model"], r["link"], r["batch"]) == ("llama-3.1-8b", "NVLink 4", b)),
                      key=lambda r: r["t"])
        totals = [sum(t.y[i] for t in bars) for i in range(len(want))]
        assert totals == pytest.approx([r["latency_s"] * 1e3 for r in want], rel=1e-9)  # the parts add up to the step
        assert list(bars[0].x) == ["TP=1", "TP=2", "TP=4", "TP=8"]
        ar = [t for t in bars if t.name.startswith("all-reduce")]
        assert all(v == 0 for t in ar for v in t.y[:1])  # TP=1: no communication
    assert fig.layout.barmode == "stack"


def test_step_parts_draw_compute_only_where_it_binds(rows, figures):
    fig = figures["step_parts/pcie-70b"]
    big = [t for t in fig.data if t.xaxis == "x3"]  # batch 256
    r = next(r for r in rows if (r["model"], r["link"], r["batch"], r["t"]) == ("llama-3.1-70b", "PCIe Gen4 x16", 256, 1))
    compute = next(t for t in big if t.name == "compute").y[0]
    weights = next(t for t in big if t.name == "weights").y[0]
    assert (compute > 0) == (r["compute_s"] > r["weights_s"] + r["kv_s"]) and (weights > 0) != (compute > 0)


def test_tp_scaling_lines_are_the_rows_and_unfit_points_are_open(rows, figures):
    fig = figures["tp_scaling/70b"]
    nv = [t for t in fig.data if t.name == "NVLink 4"]
    latency_b1 = nv[0]
    want = sorted((r for r in rows if (r["model"], r["link"], r["batch"]) == ("llama-3.1-70b", "NVLink 4", 1)),
                  key=lambda r: r["t"])
    assert list(latency_b1.x) == [1, 2, 4, 8]
    assert list(latency_b1.y) == pytest.approx([r["latency_s"] * 1e3 for r in want])
    assert list(latency_b1.marker.symbol) == ["circle-open", "circle", "circle", "circle"]  # 70B bf16: not on one H200
    ideal = [t for t in fig.data if t.name == "ideal (t=1 time / t)"]
    assert list(ideal[0].y) == pytest.approx([want[0]["latency_s"] * 1e3 / t for t in (1, 2, 4, 8)])
    assert {t.name for t in rules.legend(fig)} == {"NVLink 4", "PCIe Gen5 x16", "PCIe Gen4 x16", "ideal (t=1 time / t)"}


def test_tp_scaling_draws_the_measured_plain_tp_points_on_the_model(rows, figures):
    fig = figures["tp_scaling/measured"]
    points = [t for t in fig.data if t.name == fig_.MEASURED]
    made = {(r["t"], r["batch"]): r for r in _measured_tp(rows)[:5]}  # the plain-TP rows measured
    by_panel = {t.xaxis: t for t in points}
    assert list(by_panel["x"].x) == [1, 2, 4] and list(by_panel["x"].y) == pytest.approx(
        [made[(t, 1)]["tpot_ms"] for t in (1, 2, 4)])  # latency, batch 1, in the panel's ms
    assert list(by_panel["x2"].y) == pytest.approx([made[(t, 1)]["decode_tok_s"] for t in (1, 2, 4)])
    assert list(by_panel["x3"].x) == [1, 2]  # batch 64: TP=4 not measured, so no point
    assert sum(t.showlegend is not False for t in points) == 1
    latency = [v for t in points if t.xaxis in ("x", "x3") for v in t.y]  # ms; the NCCL, PP, 70B rows are 1-3 s
    assert len(latency) == 5 and max(latency) < 1e3  # not on the 8B's plain-TP curve
    assert f"diamonds: vLLM {MEASURED_ON}, context ~260 tokens" in fig.layout.title.text
    assert not any("not measured" in a.text for a in fig.layout.annotations)


def test_tp_scaling_without_measured_rows_says_so_and_draws_no_point(figures):
    fig = figures["tp_scaling/not-recorded"]
    assert all(len(t.x) == 0 for t in fig.data if t.name == fig_.MEASURED)
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "vLLM at TP=t: not measured for llama-3.1-8b bf16" in notes and "tp_scaling is not recorded yet" in notes
    only_70b = fig_.tp_scaling(model.cost_rows(batches=(1, 64)), "llama-3.1-8b",
                               measured=[{**r, "model": "llama-3.1-70b"} for r in _measured_tp(model.cost_rows())[:2]])
    assert "hold no measured row of this model and scheme" in " ".join(a.text for a in only_70b.layout.annotations)


def test_communication_share_panels_hold_each_t(rows, figures):
    fig = figures["communication_share"]
    pcie2 = next(t for t in fig.data if t.name == "PCIe Gen4 x16" and t.xaxis == "x")
    want = sorted((r for r in rows if (r["model"], r["link"], r["t"]) == ("llama-3.1-8b", "PCIe Gen4 x16", 2)),
                  key=lambda r: r["batch"])
    assert list(pcie2.x) == list(BATCHES) and list(pcie2.y) == pytest.approx([r["communication_share"] for r in want])
    assert fig.layout.yaxis.tickformat == ".0%"


def test_fit_heatmap_says_the_smallest_t(figures):
    hm = figures["fit_heatmap"].data[0]
    rows = fit.fit_rows()
    i = next(k for k, r in enumerate(rows) if (r["model"], r["scheme"]) == ("llama-3.1-70b", "bf16"))
    j = list(hm.x).index("H200")
    assert hm.text[i][j] == "2" and hm.z[i][j] == 1
    t4 = list(hm.x).index("T4")
    assert hm.text[i][t4] == "> 8" and hm.z[i][t4] == 4  # grey: not even 8
    assert len(hm.y) == 9 and len(hm.x) == 7


def test_two_gpus_marks_plans_that_do_not_fit(figures):
    fig = figures["two_gpus/70b"]
    replicas = [t for t in fig.data if t.name == "2 replicas (TP=1 each)"]
    assert all(list(t.text) == ["does not fit", "does not fit"] and list(t.y) == [0, 0] for t in replicas)
    tp2 = next(t for t in fig.data if t.name == "TP=2")
    assert all(v > 1 for v in tp2.y) and list(tp2.text) == ["", ""]


def test_tp1_figure_says_what_is_not_recorded_and_skips_rows_not_measured(figures):
    missing = figures["tp1_figure/not-recorded"]
    notes = " ".join(a.text for a in missing.layout.annotations)
    assert "tp1 is not recorded yet" in notes and "--steps tp1" in notes
    names = [t.name for t in rules.legend(missing)]
    assert "llama-3.1-8b bf16: vLLM, labs 01-03" in names and not any("fixed shapes" in n for n in names)
    rec = figures["tp1_figure/recorded"]
    assert "recorded on NVIDIA H200, 2026-11-29 and 2027-01-05" in rec.layout.title.text  # one phrase, two dates
    fixed = next(t for t in rec.data if t.name == "llama-3.1-70b fp8: vLLM, fixed shapes")
    assert list(fixed.x) == [1, 8, 64]  # the not-measured batch-128 row is not drawn
    assert style.synthetic_line(True).replace("<br>", "") in rec.layout.title.text


# --- the house rules (tests/plots/test_rules.py), on these figures -------------------------------


def test_every_builder_is_drawn(figures):
    assert rules.builders(fig_) <= {k.split("/")[0] for k in figures}, rules.builders(fig_)


def test_units_on_every_numeric_axis(figures):
    missing = [f"{key}.{name}: {axis.title.text!r}" for key, fig in figures.items()
               for name, axis, values in rules.axes(fig) if rules.numeric(axis, values)
               and not (axis.matches and axis.showticklabels is not True)
               and not rules.UNIT.search(axis.title.text or "")]
    assert not missing, missing


def test_one_colour_per_name_and_no_repeated_legend_names(figures):
    for key, fig in figures.items():
        rules.check_legend(key, fig)
    assert rules.colour_clashes(figures, style.base_name) == {}


def test_series_of_one_figure_get_distinct_colours(figures):
    for key in ("step_parts", "tp_scaling", "communication_share", "two_gpus"):
        colours = [rules.trace_colour(t) for t in rules.legend(figures[key])]
        assert len(colours) == len(set(colours)), key


def test_provenance_once_and_never_in_a_legend(figures):
    for key, fig in figures.items():
        stated = rules.stating(fig)
        assert len(stated) == 1, (key, stated)
        assert all(stated[0].count(p) <= 1 for p in ("recorded on", "live on", "simulated")), stated[0]
        assert not [t.name for t in rules.legend(fig) if rules.PROVENANCE.search(t.name)], key
    assert "a model, not a measurement" in figures["tp_scaling"].layout.title.text


def test_decades_sit_on_log_axes(figures):
    flat = []
    for key, fig in figures.items():
        for name, axis, values in rules.axes(fig):
            stacked = name.startswith("yaxis") and fig.layout.barmode == "stack"  # stacked bars cannot be log
            if rules.numeric(axis, values) and rules.spans_decades(values) and axis.type != "log" and not stacked:
                flat.append(f"{key}.{name}")
    assert not flat, flat


def test_text_outside_bars_is_not_clipped(figures):
    for key, fig in figures.items():
        assert all(t.cliponaxis is False for t in fig.data if getattr(t, "textposition", None) == "outside"), key
        assert fig.layout.xaxis.automargin and fig.layout.yaxis.automargin, key


def test_a_builder_refuses_rows_it_cannot_draw(rows):
    with pytest.raises(ValueError, match="no rows with"):
        fig_.step_parts(rows, "qwen2.5-72b")
    with pytest.raises(ValueError, match="fit_rows"):
        fig_.fit_heatmap([])
    with pytest.raises(ValueError, match="two_gpu_rows"):
        fig_.two_gpus([])



def test_every_figure_fits_a_1024_px_page(figures):
    assert not {key: unfit for key, fig in figures.items() if (unfit := rules.unfit_text(fig))}
