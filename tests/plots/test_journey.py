"""The ladder figure: one model up the ladder per panel (live and recorded, and different models, never in one
panel), in the journey's order, on a log throughput axis, each bar labelled with its factor over the rung before,
over naive generate and its MBU."""
import math

import pytest

from lablib.experiments import journey as jx
from lablib.plots import style
from lablib.plots.journey import ROW_PX, bar_text, ladder_figure, ladder_panels, where
from lablib.results import RequestRecord, Result
from lablib.results.reference import load_reference, reference_steps

CPU = {"gpu": None, "cpu": "Test CPU 9000", "cpu_cores_logical": 2}
LIVE = "live on this machine (CPU: Test CPU 9000, 2 cores)"


def live_run(step: str, engine: str, batch: int, wall_s: float, workload: str = "journey") -> Result:
    reqs = [RequestRecord(f"r{i}", prompt_tokens=10, output_tokens=8, start=0.0, first_token=0.1,
                          last_token=0.1 + 7 * 0.01) for i in range(4)]
    return Result(lab="test", step=step, engine=engine, config={"batch_size": batch}, model={"name": "embedded"},
                  workload={"name": workload, "requests": 4}, requests=reqs, wall_s=wall_s, hardware=CPU)


@pytest.fixture
def live() -> list[Result]:
    """Three live rungs, deliberately out of the ladder's order."""
    return [live_run("hf-static-b4", "hf-static", 4, 0.2), live_run("hf-naive", "hf-naive", 1, 0.25),
            live_run("hf-static-b2", "hf-static", 2, 0.3)]


def panel_steps(fig) -> list[list[str]]:
    """Each panel's bars, top to bottom."""
    return [list(t.y) for t in fig.data]


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


def test_road_grows_with_a_new_rung(live, monkeypatch):
    ladder = jx.ladder
    on_ladder = {n for s in ladder([1, 2, 4]) for n in (s.name, *s.recorded)}
    name = next(n for n in sorted(reference_steps()) if n not in on_ladder)  # a recording no rung names yet
    monkeypatch.setattr(jx, "ladder", lambda sizes: ladder(sizes) + [jx.Step("new", lambda m: None, recorded=(name,))])
    assert [r.step for r in jx.road(live, [1, 2, 4])][-1] == name


def test_road_keeps_unknown_steps_and_never_doubles_a_recording(live):
    extra = live_run("my-experiment", "hf-naive", 1, 0.5)
    vllm = load_reference("vllm-8b-journey")
    road = jx.road(live + vllm + [extra], [1, 2, 4])
    steps = [r.step for r in road]
    assert steps.count("vllm-8b-journey") == 1 and steps[-1] == "my-experiment"


def test_one_panel_per_model_and_place_in_the_roads_order(live):
    """The live embedded rungs, the H200's 8B rungs and the H200's embedded rungs: three panels, none mixed."""
    road = jx.road(live, [1, 2, 4])
    panels = ladder_panels(road)
    keys = [(p["model"], p["recorded"]) for p in panels]
    assert len(set(keys)) == len(keys) and keys[0] == ("embedded", False)
    assert ("synthetic:llama-3.1-8b", True) in keys and ("embedded", True) in keys
    for p in panels:
        assert {r.model.get("name") for r in p["runs"]} == {p["model"]}
        assert {r.provenance == "recorded" for r in p["runs"]} == {p["recorded"]}
        assert all(r.workload.get("name") == "journey" for r in p["runs"])
        assert [r.step for r in p["runs"]] == [r.step for r in road if r in p["runs"]]  # the road's order
    drawn = sum(len(p["runs"]) + len(p["other_workloads"]) for p in panels)
    assert drawn == len(road)  # every run is in one panel: drawn, or counted under it
    assert panels[0]["title"] == f"embedded: {LIVE}"
    fig = ladder_figure(road)
    assert panel_steps(fig) == [[r.step for r in p["runs"]] for p in panels]
    assert [a.text for a in fig.layout.annotations][:len(panels)] == [p["title"] for p in panels]


def test_each_bar_says_its_factor_over_the_rung_before_and_over_naive(live):
    road = jx.road(live, [1, 2, 4])
    rows = {row["step"]: row for row in ladder_panels(road)[0]["rows"]}
    tok = {r.step: r.summary["output_tok_s"] for r in live}
    assert rows["hf-naive"]["over_before"] is None and rows["hf-naive"]["over_naive"] is None
    assert rows["hf-static-b2"]["before"] == "hf-naive" and rows["hf-static-b2"]["over_naive"] is None  # said once
    assert rows["hf-static-b4"]["before"] == "hf-static-b2"
    assert rows["hf-static-b4"]["over_before"] == pytest.approx(tok["hf-static-b4"] / tok["hf-static-b2"])
    assert rows["hf-static-b4"]["over_naive"] == pytest.approx(tok["hf-static-b4"] / tok["hf-naive"])
    text = bar_text(rows["hf-static-b4"])
    assert text.startswith(f"{tok['hf-static-b4']:,.0f}") and "over hf-static-b2" in text and "over naive" in text
    assert "MBU" not in text  # a CPU: no GPU bandwidth to share
    eight = next(p for p in ladder_panels(road) if p["model"] == "synthetic:llama-3.1-8b")
    vllm = next(row for row in eight["rows"] if row["step"] == "vllm-8b-journey")
    assert vllm["before"] == "hf-static-b64-8b-journey" and vllm["over_naive"] is None  # no naive recorded there
    assert vllm["mbu"] == pytest.approx(vllm["result"].roofline["mbu"]) and "MBU 57%" in bar_text(vllm)


def test_a_side_road_is_measured_against_its_baseline_and_the_next_rung_skips_it():
    runs = [live_run("hf-naive", "hf-naive", 1, 0.4), live_run("hf-naive-ngram-k4", "hf-naive", 1, 0.2),
            live_run("hf-static-b4", "hf-static", 4, 0.1), live_run("hf-static-b4-sdpa", "hf-static", 4, 0.08),
            live_run("vllm-prefix-on", "vllm", 1, 0.1, workload=jx.PREFIX_WORKLOAD)]
    (panel,) = ladder_panels(runs)
    before = {row["step"]: row["before"] for row in panel["rows"]}
    assert before == {"hf-naive": None, "hf-naive-ngram-k4": "hf-naive", "hf-static-b4": "hf-naive",
                      "hf-static-b4-sdpa": "hf-static-b4"}
    assert [r.step for r in panel["other_workloads"]] == ["vllm-prefix-on"]
    fig = ladder_figure(runs)
    assert any("not drawn" in a.text for a in fig.layout.annotations)  # the rung on its own workload is named
    subset = live_run("hf-naive", "hf-naive", 1, 0.4)
    subset.config["subset"] = "the first 8 of 64 requests"
    assert list(ladder_figure([subset]).data[0].y) == ["hf-naive (subset)"]


def test_log_axes_bars_from_the_data_and_room_for_every_label(live):
    road = jx.road(live, [1, 2, 4])
    fig = ladder_figure(road)
    panels = ladder_panels(road)
    for i, (trace, p) in enumerate(zip(fig.data, panels), start=1):
        axis = fig.layout[f"xaxis{'' if i == 1 else i}"]
        assert axis.type == "log" and trace.orientation == "h"
        assert list(trace.x) == pytest.approx([row["tok_s"] for row in p["rows"]])
        lo, hi = axis.range
        assert lo <= math.log10(min(trace.x)) and hi > math.log10(max(trace.x)) + 1  # the bar's label fits
        assert list(trace.marker.color) == [style.colour(s) for s in trace.y]
        assert trace.marker.pattern.shape == ("/" if p["recorded"] else "")
    assert "tok/s" in fig.layout[f"xaxis{len(panels)}"].title.text
    title = fig.layout.title.text
    assert "recorded on NVIDIA H200" in title and "live on this CPU" in title and "synthetic weights" in title
    rows = sum(len(p["rows"]) for p in panels)
    assert fig.layout.height >= fig.layout.margin.t + fig.layout.margin.b + ROW_PX * rows


def test_where_names_the_gpu_of_a_live_gpu_run():
    r = live_run("vllm", "vllm", 1, 0.1)
    r.hardware = {"gpu": "NVIDIA L4", "cpu": "x"}
    assert where(r) == "live on this machine (GPU: NVIDIA L4)"
    assert where(load_reference("vllm-8b-journey")[0]) == "recorded on NVIDIA H200, 2026-11-29"


def test_no_results_is_a_clear_error():
    with pytest.raises(ValueError, match="ladder_figure: no Results"):
        ladder_figure([])
    with pytest.raises(ValueError, match="ladder_figure: no run of the journey workload"):
        ladder_figure([live_run("vllm-prefix-on", "vllm", 1, 0.1, workload=jx.PREFIX_WORKLOAD)])


def test_a_factor_over_naive_run_on_a_subset_says_so():
    naive = live_run("hf-naive", "hf-naive", 1, 0.4)
    naive.config["subset"] = "the first 8 of 64 requests"
    rows = ladder_panels([naive, live_run("hf-static-b4", "hf-static", 4, 0.2),
                          live_run("hf-static-b64", "hf-static", 64, 0.1)])[0]["rows"]
    assert "(its subset)" not in bar_text(rows[0]) and "x4.0 over naive (its subset)" in bar_text(rows[2])
