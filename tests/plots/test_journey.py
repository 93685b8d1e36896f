"""The whole-road figure: live rungs and the H200's recorded rungs side by side, in the journey's order,
on a log throughput axis, every bar labelled with where it was measured."""
import math

import pytest

from lablib.experiments import journey as jx
from lablib.plots import style
from lablib.plots.journey import ROW_PX, bars_width, where, whole_road
from lablib.results import RequestRecord, Result
from lablib.results.reference import load_reference, reference_steps
from tests.plots import rules

CPU = {"gpu": None, "cpu": "Test CPU 9000", "cpu_cores_logical": 2}
LIVE = "live on this machine (CPU: Test CPU 9000, 2 cores)"


def live_run(step: str, engine: str, batch: int, wall_s: float) -> Result:
    reqs = [RequestRecord(f"r{i}", prompt_tokens=10, output_tokens=8, start=0.0, first_token=0.1,
                          last_token=0.1 + 7 * 0.01) for i in range(4)]
    return Result(lab="test", step=step, engine=engine, config={"batch_size": batch}, model={"name": "embedded"},
                  workload={"name": "journey", "requests": 4}, requests=reqs, wall_s=wall_s, hardware=CPU)


@pytest.fixture
def live() -> list[Result]:
    """Three live rungs, deliberately out of the ladder's order."""
    return [live_run("hf-static-b4", "hf-static", 4, 0.2), live_run("hf-naive", "hf-naive", 1, 0.25),
            live_run("hf-static-b2", "hf-static", 2, 0.3)]


def bars(fig) -> list:
    """The rungs' bars, one per rung (the legend's entries, one per place, are drawn with no data)."""
    return [t for t in fig.data if t.y[0] is not None]


def steps_of(fig) -> list[str]:
    """The bars' rungs, top to bottom (the category order the y axis draws, reversed so the first is on top)."""
    assert fig.layout.yaxis.autorange == "reversed"
    return [tick.split("<br>")[0] for tick in fig.layout.yaxis.categoryarray]


def test_road_follows_the_ladder_and_adds_each_rungs_recording(live):
    road = jx.road(live, [1, 2, 4])
    shipped = set(reference_steps())  # a rung's recording not shipped yet is left out, never drawn empty
    given = {r.step for r in live}
    expected = [name for step in jx.ladder([1, 2, 4]) for name in
                ([step.name] if step.name in given else []) + [n for n in step.recorded if n in shipped]]
    assert [r.step for r in road] == expected
    assert expected[:3] == ["hf-naive", "hf-static-b2", "hf-static-b4"]  # live first, in ladder order
    assert [r.provenance for r in road] == ["live"] * 3 + ["recorded"] * (len(expected) - 3)
    assert {"vllm-8b-journey", "hf-static-b64-8b-journey"} <= set(expected)
    fig = whole_road(road)
    assert steps_of(fig) == expected
    assert [y for t in bars(fig) for y in t.y] == list(fig.layout.yaxis.categoryarray)  # one bar per rung, in order


def test_road_grows_with_a_new_rung(live, monkeypatch):
    ladder = jx.ladder
    new = jx.Step("vllm-single", lambda m: None, needs="gpu+vllm", recorded=("vllm-8b-single",))
    monkeypatch.setattr(jx, "ladder", lambda sizes: ladder(sizes) + [new])
    fig = whole_road(jx.road(live, [1, 2, 4]))
    assert steps_of(fig)[-1] == "vllm-8b-single"
    assert len(fig.layout.yaxis.categoryarray) == len(jx.road(live, [1, 2, 4]))


def test_road_keeps_unknown_steps_and_never_doubles_a_recording(live):
    extra = live_run("my-experiment", "hf-naive", 1, 0.5)
    vllm = load_reference("vllm-8b-journey")
    road = jx.road(live + vllm + [extra], [1, 2, 4])
    steps = [r.step for r in road]
    assert steps.count("vllm-8b-journey") == 1 and steps[-1] == "my-experiment"


def test_log_axis_with_unit_and_bar_heights_from_the_data(live):
    road = jx.road(live, [1, 2, 4])
    fig = whole_road(road)
    assert fig.layout.xaxis.type == "log"  # horizontal bars: the rungs down the y axis, throughput along x
    assert "tok/s" in fig.layout.xaxis.title.text and "log" in fig.layout.xaxis.title.text
    drawn = {y.split("<br>")[0]: x for t in bars(fig) for x, y in zip(t.x, t.y)}
    assert drawn == pytest.approx({r.step: r.summary["output_tok_s"] for r in road})
    lo, hi = fig.layout.xaxis.range  # log10 units: every bar and its label fits
    assert lo <= math.log10(min(drawn.values())) and hi > math.log10(max(drawn.values()))
    labels = dict(zip(fig.layout.xaxis.tickvals, fig.layout.xaxis.ticktext))  # decades or 1-2-5, full-size labels
    assert {10.0: "10", 100.0: "100", 1000.0: "1k"}.items() <= labels.items()
    assert all(text[0] in "125" for text in labels.values())


def test_every_bar_says_where_it_was_measured_in_its_rungs_colour(live):
    road = jx.road(live, [1, 2, 4])
    fig = whole_road(road)
    assert len(bars(fig)) == len(road)
    places = {}
    for trace, r in zip(bars(fig), road):
        want = LIVE if r.provenance == "live" else f"recorded on NVIDIA H200, {r.recorded_at[:10]}"
        places.setdefault(want, r.provenance == "recorded")
        assert trace.y[0].split("<br>")[0] == r.step
        assert trace.legendgroup == want and trace.showlegend is False  # the legend lists places, not rungs
        assert want in trace.hovertemplate
        assert trace.name == r.step + (style.RECORDED_MARK if r.provenance == "recorded" else "")
        assert trace.marker.color == style.colour(r.step)  # the rung's colour in every figure
        assert trace.marker.pattern.shape == ("/" if r.provenance == "recorded" else "")
    legend = rules.legend(fig)  # each place once, in the order drawn, hatched like its bars, toggling them
    assert [(t.name, t.legendgroup, t.marker.pattern.shape) for t in legend] == [
        (place, place, "/" if recorded else "") for place, recorded in places.items()]
    assert fig.layout.legend.groupclick == "togglegroup"
    title = fig.layout.title.text
    assert "recorded on NVIDIA H200" in title and "live on this CPU" in title  # provenance, once, in the title
    assert "synthetic weights" in title  # the H200 rungs ran the synthetic 8B


def test_where_names_the_gpu_of_a_live_gpu_run():
    r = live_run("vllm", "vllm", 1, 0.1)
    r.hardware = {"gpu": "NVIDIA L4", "cpu": "x"}
    assert where(r) == "live on this machine (GPU: NVIDIA L4)"
    assert where(load_reference("vllm-8b-journey")[0]) == "recorded on NVIDIA H200, 2026-11-29"


def test_no_results_is_a_clear_error():
    with pytest.raises(ValueError, match="whole_road: no Results"):
        whole_road([])


def test_layout_leaves_room_for_every_label(live):
    """Rungs read across on the y axis (never turned or cut), a row each; the legend, a place an entry, lies under
    the x axis's title, in a bottom margin that holds its rows (`style.legend_rows`) as they wrap at the width the
    bars have beside the tick labels (plotly wraps a legend at the plot's width, not the page's)."""
    road = jx.road(live, [1, 2, 4])
    fig = whole_road(road)
    assert all(t.orientation == "h" for t in fig.data) and fig.layout.yaxis.automargin
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.xref == fig.layout.legend.yref == "container"
    places = list(dict.fromkeys(t.legendgroup for t in bars(fig)))
    assert len(rules.legend(fig)) == len(places) < len(road)  # compact: not one entry per rung
    width = bars_width(list(fig.layout.yaxis.categoryarray))
    assert 300 < width < style.LEGEND_WIDTH  # the widest rung's label takes a third of the page
    assert style.legend_rows(fig, width) >= style.legend_rows(fig) >= 1
    assert fig.layout.margin.b >= 60 + 24 * style.legend_rows(fig, width)
    assert fig.layout.height >= fig.layout.margin.t + fig.layout.margin.b + ROW_PX * len(road)
