"""The figure rules (`lablib.plots.style`), checked on every builder in lablib/plots/ but journey.py.

Each builder is drawn the way the labs draw it, from the runs recorded on the H200 in data/reference/
(and the simulators on the journey's lengths), then checked for what can be checked without a browser:
a trace name has one colour in every figure, whatever order the traces come in; every axis that shows
numbers has a title with its unit in parentheses or brackets; no legend entry carries provenance, and
each figure states its provenance exactly once (title or annotation); no legend name repeats; values
spanning three decades or more sit on a log axis, labelled at 1-2-5 or decades; text drawn outside bars is not
clipped; a title's lines end left of plotly's mode bar. The instruments
(the legend, a trace's colour, the axes, the texts stating provenance) are tests/plots/rules.py, which every
lab's figure tests share.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict

import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from lablib import mechanisms
from lablib.bench.goodput import SLO
from lablib.experiments.scheduling import scheduler_rows
from lablib.experiments.serving import capacity, pareto
from lablib.plots import batching, kv, scheduling, serving, style
from lablib.results.reference import load_reference, recorded_rows
from lablib.workloads import load_workload
from tests.plots import rules

MODULES = (batching, kv, scheduling, serving)


def _live(r, step: str, engine: str, batch: int):
    """A recorded run standing in for one made here (a live run of lab 01), to draw a mixed figure."""
    return dataclasses.replace(r, step=step, engine=engine, config={"batch_size": batch}, provenance="live",
                               hardware={"gpu": None}, roofline={"ceiling_tok_s": "unknown"})


def _figures() -> dict[str, go.Figure]:
    runs = {r.step: r for r in load_reference()}
    offline = [runs["hf-static-b64-8b-journey"], runs["vllm-8b-journey"], runs["vllm-8b-single"]]
    sweep = [runs[s] for s in ("vllm-seqs8-tokNone", "vllm-seqs64-tokNone", "vllm-seqs256-tokNone")]
    here = [_live(runs[f"vllm-gmu-0.{k}"], f"hf-static-b{b}", "hf-static", b) for k, b in ((1, 2), (2, 4), (3, 8))]
    here.append(_live(runs["vllm-gmu-0.4"], "hf-naive", "hf-naive", 1))
    served = load_reference(prefix="serve-rate-")
    wl = load_workload("journey")
    report = mechanisms.simulate_fragmentation(wl.lengths, budget_tokens=65536, block_size=16, max_model_len=2048)
    snaps = mechanisms.replay_block_allocation(wl.lengths[:12], num_blocks=160, block_size=16, max_num_seqs=6)
    static = mechanisms.static_batching(wl.lengths[:24], batch_size=8)
    continuous = mechanisms.continuous_batching(wl.lengths[:24], max_num_seqs=8)
    seqs = {f"max_num_seqs={n}": mechanisms.continuous_batching(wl.lengths, max_num_seqs=n) for n in (1, 4, 16, 64)}
    budget = {f"budget={b}": mechanisms.continuous_batching(wl.lengths, max_num_seqs=64, max_num_batched_tokens=b)
              for b in (128, 512, 2048, 8192)}
    live_gauges = serving.LiveServerMetrics()
    for r in served:
        for sample in r.engine_facts["server_metrics"]["samples"][:40]:
            live_gauges.update(r.config["rate"], sample)
    vllm = runs["vllm-8b-journey"]
    lab04_title = ("vLLM continuous batching on the journey  [recorded on NVIDIA H200, 2026-11-29]"
                   + style.synthetic_note([vllm]))
    figs = {
        "throughput_vs_batch": batching.throughput_vs_batch(offline + sweep, batch_keys=("batch_size", "max_num_seqs")),
        "throughput_vs_batch/mixed": batching.throughput_vs_batch(here + [runs["hf-static-b64-8b-journey"]]),
        "phase_breakdown": batching.phase_breakdown(offline),
        "phase_breakdown/mixed": batching.phase_breakdown(here + offline),
        "memory_timeline": batching.memory_timeline(offline),
        "memory_timeline/mixed": batching.memory_timeline(here + offline),
        "fragmentation_bars": kv.fragmentation_bars(report),
        "block_table_heatmap": kv.block_table_heatmap(snaps[len(snaps) // 3]),
        "gpu_memory_utilization_figure": kv.gpu_memory_utilization_figure(recorded_rows("sweep", "sweep")),
        "gantt/simulated": scheduling.gantt(static.rows(), title="Static batching, 8 per batch (simulated)"),
        "gantt/simulated-both": scheduling.gantt(static.rows() + continuous.rows()),
        "gantt/recorded": scheduling.gantt(scheduling.result_gantt_rows(vllm)),
        "gantt/recorded-lab04-title": scheduling.gantt(scheduling.result_gantt_rows(vllm), title=lab04_title),
        "schedule_tradeoff/seqs": scheduling.schedule_tradeoff(seqs),
        "schedule_tradeoff/budget": scheduling.schedule_tradeoff(budget, ttft_target=1000),
        "scheduler_figure": scheduling.scheduler_figure(scheduler_rows(force=False).value, ttft_target_s=1.0),
        "latency_vs_rate": serving.latency_vs_rate(served, target_ttft_s=1.0),
        "throughput_vs_rate": serving.throughput_vs_rate(served),
        "server_metrics_figure": serving.server_metrics_figure(served),
        "token_gaps": serving.token_gaps([next(r for r in served if r.config["rate"] == math.inf)]),
        "LiveServerMetrics": live_gauges.figure,
        "capacity_figure": serving.capacity_figure(capacity.on_simulator(SLO(ttft_ms=1000, percentile=90)),
                                                   capacity.SIMULATOR),
        "pareto_figure": serving.pareto_figure(pareto.on_simulator(), capacity.SIMULATOR),
    }
    for metric in batching.LATENCY_METRICS:
        figs[f"latency_cdf/{metric}"] = batching.latency_cdf(offline, metric)
        figs[f"latency_cdf/{metric}/mixed"] = batching.latency_cdf(here + offline, metric)
    return figs


@pytest.fixture(scope="module")
def figures() -> dict[str, go.Figure]:
    return _figures()


def _builders() -> set[str]:
    """Every figure builder of the plots modules (journey.py aside), and LiveServerMetrics."""
    return {"LiveServerMetrics"}.union(*(rules.builders(module) for module in MODULES))


def test_every_builder_is_drawn(figures):
    drawn = {name.split("/")[0] for name in figures}
    assert _builders() <= drawn, f"builders with no case here: {sorted(_builders() - drawn)}"


def test_legend_traces_have_their_own_colour_and_names_do_not_repeat(figures):
    for key, fig in figures.items():
        rules.check_legend(key, fig)


def test_a_name_has_one_colour_in_every_figure(figures):
    clashes = rules.colour_clashes(figures, style.base_name)
    assert not clashes, f"names drawn in more than one colour: {clashes}"


def test_runs_drawn_side_by_side_get_distinct_colours(figures):
    for key, fig in figures.items():
        if key.startswith(("latency_cdf", "memory_timeline")):
            colours = [rules.trace_colour(t) for t in rules.legend(fig)]
            assert len(colours) == len(set(colours)), f"{key}: two runs share a colour: {[t.name for t in fig.data]}"


def test_colours_do_not_depend_on_the_order_runs_are_drawn():
    runs = load_reference()
    offline = [r for r in runs if r.step in ("hf-static-b64-8b-journey", "vllm-8b-journey", "vllm-8b-single")]
    for build in (batching.latency_cdf, batching.memory_timeline,
                  lambda rs: batching.throughput_vs_batch(rs, batch_keys=("batch_size", "max_num_seqs"))):
        forward, backward = build(offline), build(offline[::-1])
        colours = [{t.name: rules.trace_colour(t) for t in fig.data} for fig in (forward, backward)]
        assert colours[0] == colours[1]
    assert style.colour("hf-static-b8") == style.colour("hf-static-b8" + style.RECORDED_MARK)
    assert style.colour("vllm") != style.colour("hf-naive") != style.colour("hf-static")
    assert len({style.colour(f"hf-static-b{b}") for b in (1, 2, 4, 8, 16, 32, 64)}) == 7


def test_every_axis_showing_numbers_says_its_unit(figures):
    missing = []
    for key, fig in figures.items():
        for name, axis, values in rules.axes(fig):
            if not rules.numeric(axis, values):
                continue
            if axis.matches and axis.showticklabels is not True:  # a shared axis: titled once, on the bottom row
                continue
            text = axis.title.text or ""
            if not rules.UNIT.search(text):
                missing.append(f"{key}.{name}: {text!r}")
    assert not missing, "axes without a unit:\n" + "\n".join(missing)


def test_no_legend_entry_carries_provenance(figures):
    bad = [f"{key}: {t.name!r}" for key, fig in figures.items() for t in rules.legend(fig)
           if rules.PROVENANCE.search(t.name)]
    assert not bad, "provenance in legend entries:\n" + "\n".join(bad)


def test_each_figure_states_its_provenance_once(figures):
    for key, fig in figures.items():
        stated = rules.stating(fig)
        assert len(stated) == 1, f"{key}: provenance stated {len(stated)} times: {stated}"
        for phrase in ("recorded on", "live on", "simulated"):
            assert stated[0].count(phrase) <= 1, f"{key}: {phrase!r} repeated in {stated[0]!r}"


def test_the_synthetic_label_appears_once_where_runs_are_synthetic(figures):
    label = "synthetic weights: speed and memory are real, the text is not"
    for key in ("throughput_vs_batch", "latency_vs_rate", "server_metrics_figure", "scheduler_figure",
                "gantt/recorded", "gantt/recorded-lab04-title"):
        assert figures[key].layout.title.text.count(label) == 1, key
    assert label not in figures["gpu_memory_utilization_figure"].layout.title.text  # the embedded model


def test_values_spanning_decades_sit_on_a_log_axis(figures):
    flat = []
    for key, fig in figures.items():
        for name, axis, values in rules.axes(fig):
            pos = rules.positive(values)
            if rules.numeric(axis, values) and pos and max(pos) / min(pos) >= 1000 and axis.type != "log":
                title = axis.title.text or ""
                if re.search(r"since|^time \(|log scale", title) or axis.tickformat == ".0%":
                    continue  # a timeline starts at zero; a log already taken; shares
                if name.startswith("yaxis") and fig.layout.barmode == "stack":
                    continue  # stacked bars add up: a log axis cannot stack them
                flat.append(f"{key}.{name}: {min(pos):.3g} to {max(pos):.3g}")
    assert not flat, "values spanning decades on a linear axis:\n" + "\n".join(flat)


def test_labels_are_not_clipped_and_categories_stay_short(figures):
    for key, fig in figures.items():
        for t in fig.data:
            if getattr(t, "textposition", None) == "outside":
                assert t.cliponaxis is False, f"{key}: {t.name} draws text outside its bars but clips it"
        for name, axis, values in rules.axes(fig):
            if axis.type == "category" or any(isinstance(v, str) for v in values):
                long = [v for v in values if isinstance(v, str) and len(v) > 40]
                assert not long, f"{key}.{name}: category labels too long to sit side by side: {long[:2]}"
        assert fig.layout.xaxis.automargin and fig.layout.yaxis.automargin, f"{key}: axes do not grow their margins"


def test_metrics_figure_colours_each_rate_alike_in_every_row_and_lists_it_once(figures):
    fig = figures["server_metrics_figure"]
    by_rate = defaultdict(set)
    for t in fig.data:
        by_rate[t.legendgroup].add(t.line.color)
    assert all(len(c) == 1 for c in by_rate.values()), by_rate  # the burst's spike is drawn in the burst's colour
    assert len({next(iter(c)) for c in by_rate.values()}) == len(by_rate)  # and no two rates share one
    names = [t.name for t in rules.legend(fig)]
    assert len(names) == len(by_rate) == 6 and "burst (all at once)" in names
    burst = [t for t in fig.data if t.name == "burst (all at once)"]
    assert {t.line.color for t in burst} == {serving.BURST_COLOUR}
    live = figures["LiveServerMetrics"]
    assert {t.name: t.line.color for t in live.data} == {t.name: t.line.color for t in fig.data}


def test_gmu_sweep_shows_the_baseline_at_its_own_scale(figures):
    fig = figures["gpu_memory_utilization_figure"]
    rows = recorded_rows("sweep", "sweep")  # the whole recorded sweep, 0.05 to 0.8
    before = next(t for t in fig.data if t.name == "before engine start")
    after = next(t for t in fig.data if t.name == "after close")
    assert list(before.y) == pytest.approx([r["vram_before_bytes"] / 2**20 for r in rows])
    assert list(after.y) == pytest.approx([r["vram_after_close_bytes"] / 2**20 for r in rows])
    lo, hi = fig.layout[f"yaxis{before.yaxis[1:]}"].range
    assert lo > 0 and hi - lo < 2048  # a MiB-scale panel: the 618 MiB baseline fills it, not a sliver of 120 GiB
    peak = next(t for t in fig.data if t.name == "peak during run")
    assert peak.yaxis != before.yaxis and max(peak.y) > 100  # the peaks (GiB) in their own panel
    assert any(a.text == "back to baseline<br>after all 10 engines" for a in fig.layout.annotations)


def _journey_here() -> list:
    """A CPU journey as `lablab` and lab 10 make it: naive, n-gram and draft at batch 1, static b4 and b16, and b16
    again with sdpa (recorded runs standing in for live ones)."""
    runs = [r for r in load_reference() if r.step.startswith("vllm-gmu-")]
    steps = [("hf-naive", "hf-naive", 1), ("hf-naive-ngram-k4", "hf-naive", 1), ("hf-naive-draft-k4", "hf-naive", 1),
             ("hf-static-b4", "hf-static", 4), ("hf-static-b16", "hf-static", 16),
             ("hf-static-b16-sdpa", "hf-static", 16)]
    return [_live(r, step, engine, b) for r, (step, engine, b) in zip(runs, steps)]


def test_variants_of_an_engine_are_series_of_their_own_not_a_line_straight_up():
    """Naive, n-gram and draft all run at batch 1 on the naive engine: three points, not one vertical line; static
    b16 with sdpa is a point of its own, not a step back down the static line; and b16-sdpa has a colour of its
    own in every figure that draws runs side by side."""
    here = _journey_here()
    fig = batching.throughput_vs_batch(here)
    assert not rules.vertical_joins(fig), f"series joined at one batch size: {rules.vertical_joins(fig)}"
    names = {t.name for t in rules.legend(fig)}
    assert {"hf-naive", "hf-naive-ngram-k4", "hf-naive-draft-k4", "hf-static", "hf-static-sdpa"} <= names, names
    assert not rules.shared_colours(fig, style.base_name), rules.shared_colours(fig, style.base_name)
    for metric in batching.LATENCY_METRICS:
        cdf = batching.latency_cdf(here, metric)
        assert not rules.shared_colours(cdf, style.base_name), (metric, rules.shared_colours(cdf, style.base_name))
    assert style.colour("hf-static-b16-sdpa") != style.colour("hf-static-b16")
    assert style.colour("hf-static-b64-8b-journey") == style.colour("hf-static-b64")  # a recording keeps its rung's


def test_log_axes_label_1_2_5_or_decades_in_full_never_plotly_digits(figures):
    """A log axis spanning a decade or more is labelled at 1, 2 and 5 of a decade or at decades (in the axis's font,
    `style.log_axis_ticks`), not with plotly's small digits crowding between them; a shorter one at even steps."""
    checked = 0
    for key, fig in figures.items():
        for name, axis, values in rules.axes(fig):
            pos = rules.positive(values)
            if axis.type != "log" or not pos or max(pos) / min(pos) < 10 or key.startswith("throughput_vs_batch"):
                continue  # throughput_vs_batch labels its own batch sizes
            assert axis.tickmode == "array" and axis.tickvals, f"{key}.{name}: plotly's own log ticks"
            assert all(f"{v:e}"[0] in "125" for v in axis.tickvals), f"{key}.{name}: {axis.ticktext}"
            shown = [v for v in axis.tickvals if min(pos) <= v <= max(pos)]
            assert len(shown) >= 2, f"{key}.{name}: {len(shown)} labels"
            checked += 1
    assert checked >= 10


def test_log_ticks_fit_the_axis_length():
    def shown(lo, hi, length, vertical=False):
        vals, text = style.log_ticks(lo, hi, length, vertical)
        return [t for v, t in zip(vals, text) if lo <= v <= hi]

    assert shown(0.15, 5, 640) == ["0.2", "0.5", "1", "2", "5"]  # 1-2-5 where they fit
    assert shown(8, 14524, 200) == ["10", "100", "1k", "10k"]  # decades where 1-2-5 would crowd
    assert shown(1e-5, 10, 90, vertical=True) == ["10µ", "0.001", "0.1", "10"]  # every other decade on a short axis
    assert shown(64, 256, 640) == [str(v) for v in range(80, 241, 20)]  # within a decade: even steps
    assert shown(3, 25, 275, vertical=True) == ["5", "10", "20"]


def test_titles_wrap_clear_of_the_mode_bar_and_keep_their_provenance_phrases(figures):
    for key, fig in figures.items():
        head = fig.layout.title.text.split("<sup>")[0]
        long = [line for line in head.split("<br>") if len(line) > style.TITLE_CHARS and "<" not in line]
        assert not long, f"{key}: a title line runs under the mode bar: {long}"
    assert style.wrap_title("vLLM continuous batching on the journey  [recorded on NVIDIA H200, 2026-11-29]", 40) == (
        "vLLM continuous batching on the journey<br>[recorded on NVIDIA H200, 2026-11-29]")  # even lines
    assert style.balanced_lines("a " * 30 + "recorded on NVIDIA H200", 40)[-1].count("recorded on") == 1


def test_every_figure_fits_a_1024_px_page(figures):
    unfit = {key: rules.unfit_text(fig) for key, fig in figures.items()}
    assert not {k: v for k, v in unfit.items() if v}


def test_wrapping_keeps_every_word_whole_and_in_order():
    note = ("lab 06's speed is not recorded yet: a GPU session records it with `scripts/record_reference.py --steps "
            "quantization` (then scripts/pack_reference.py) for w8a8-int8 and fp8-dynamic")
    for width in (12, 30, 60):
        lines = style.wrap(note, width)
        assert " ".join(lines) == note and len(lines) > 1
        assert all(len(line) <= width or " " not in line for line in lines)  # only a word longer than a line overflows
    assert style.shown_text("<b>a</b> b<br><sup>c d</sup>") == "a b c d"


def test_a_long_provenance_breaks_between_its_clauses_and_keeps_its_own_lines():
    where = "memory: " + "m" * 40 + "; speed: " + "s " * 70 + "; quality: live on this CPU<br>second line"
    lines = style.provenance_lines(where, 60)
    assert lines[0] == "memory: " + "m" * 40 + ";" and lines[1].startswith("speed: ")
    assert lines[-1] == "second line" and any(line.endswith("quality: live on this CPU") for line in lines)
    assert all(len(line) <= 60 for line in lines)
    assert style.shown_text("<br>".join(lines)) == style.shown_text(where)
    assert style.provenance_lines("live on this CPU") == ["live on this CPU"]
    fig = style.finish(go.Figure(go.Scatter(x=[1, 2], y=[1, 2])), "A title", where.replace("<br>", "; "))
    sups = re.findall(r"<sup>(.*?)</sup>", fig.layout.title.text)
    assert len(sups) > 1 and all(len(s) <= style.PROVENANCE_CHARS for s in sups)
    assert fig.layout.margin.t == 62 + 22 * len(sups)  # the top margin holds every line


def test_axis_titles_longer_than_their_panel_wrap_and_notes_stay_under_them():
    fig = make_subplots(rows=1, cols=3)
    for col in (1, 2, 3):
        fig.add_scatter(x=[0.1, 0.9], y=[1, 2], row=1, col=col)
    fig.update_xaxes(title_text="per-token acceptance alpha (probability)")
    fig.update_yaxes(title_text="extra memory beyond Q, K, V, O and the rest (MiB)", row=1, col=2)
    fig = style.finish(fig, "Three panels", "simulated", notes=["a note"], height=300)
    for name in ("xaxis", "xaxis2", "xaxis3"):
        lines = fig.layout[name].title.text.split("<br>")
        assert len(lines) == 2 and " ".join(lines) == "per-token acceptance alpha (probability)"
    assert fig.layout.yaxis2.title.text.count("<br>") >= 1 and not rules.unfit_text(fig)
    note = next(a for a in fig.layout.annotations if a.text == "a note")
    assert note.yshift <= -64 - 18  # under the x titles' second line
    assert fig.layout.height - fig.layout.margin.t - fig.layout.margin.b >= style.MIN_PLOT_PX


def test_notes_sit_under_tilted_category_labels_and_never_squash_the_plot():
    names = ["fp8-dynamic", "gptq-w4a16", "w8a8-int8", "awq-w4a16", "bf16-kv-fp8"]
    fig = make_subplots(rows=1, cols=3)
    for col in (1, 2, 3):
        fig.add_bar(x=names, y=[1, 2, 3, 4, 5], row=1, col=col)
    fig = style.finish(fig, "Bars", "live on this CPU", notes=["n"] * 9, height=320)
    assert next(a for a in fig.layout.annotations if a.text == "n").yshift < -64 - 20  # plotly tilts these labels
    assert fig.layout.height - fig.layout.margin.t - fig.layout.margin.b >= style.MIN_PLOT_PX
    flat = style.finish(go.Figure(go.Bar(x=["a", "b"], y=[1, 2])), "Bars", "live on this CPU", notes=["n"])
    assert next(a for a in flat.layout.annotations if a.text == "n").yshift == -64  # short labels stay level
