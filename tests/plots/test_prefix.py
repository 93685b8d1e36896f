"""Lab 07's figures (lablib.plots.prefix): drawn from the simulator on the embedded tokenizer's ids and from vLLM
rows in the shape `experiments.prefix.on_off` returns, each checked against the data and the figure rules."""

import pytest

from lablib.engines.hf import HFEngine
from lablib.experiments.prefix import runs, simulated, workloads
from lablib.plots import prefix as figures
from lablib.plots import style
from lablib.results.reference import NotRecorded
from lablib.session import Shown
from tests.plots import rules


@pytest.fixture(scope="module")
def hf():
    return HFEngine("embedded")  # only its tokenizer is used


def _run(model, wl, shared, caching, ttft, hits=None, queries=1000, kind="shared-first"):
    return {"model": model, "workload": wl, "kind": kind, "shared_tokens": shared, "caching": caching,
            "requests": 32, "ttft_p50_s": ttft, "ttft_p99_s": 2 * ttft, "output_tok_s": 1000.0, "total_tok_s": 5000.0,
            "vllm_hits": hits, "vllm_queries": queries, "hit_rate": None if hits is None else hits / queries,
            "step": f"prefix-{caching}-{wl}"}


def _on_off_rows():
    rows = []
    for model, base in (("embedded", 0.05), ("synthetic:llama-3.1-8b", 0.4)):
        for n in (128, 200, 512, 1024):
            rows.append(_run(model, f"shared-prefix-{n}", n, "off", base * n / 128))
            rows.append(_run(model, f"shared-prefix-{n}", n, "on", base, hits=n * 31 // 16 * 16, queries=32 * (n + 40)))
        rows.append(_run(model, "shared-prefix-512-shared-after", 7, "on", base * 4, hits=0, kind="shared-after"))
    return rows


@pytest.fixture(scope="module")
def figs(hf):
    return {"block_states": figures.block_states(simulated.eviction_demo()),
            "hit_rate_vs_prefix": figures.hit_rate_vs_prefix(simulated.prefix_length_rows(hf)),
            "cached_per_request": figures.cached_per_request(runs.advice(hf)),
            "scarce_memory": figures.scarce_memory(simulated.scarce_memory_rows()),
            "on_off_figure": figures.on_off_figure(_on_off_rows(), where="recorded on NVIDIA H200, 2026-12-01"),
            "on_off_figure/h200": figures.on_off_figure(runs.on_off(force=False)),  # the shipped recording
            "on_off_figure/not-recorded": figures.on_off_figure(Shown(None, False, str(NotRecorded(
                runs.ON_OFF_KEY, runs.ON_OFF_STEP))))}


def test_block_states_colours_every_block_by_its_state_at_every_step():
    demo = simulated.eviction_demo()
    fig = figures.block_states(demo)
    heat = fig.data[0]
    kinds = {"free": 0, "cached": 1}
    for j, snap in enumerate(demo.snapshots):
        for b, state in enumerate(snap.states()):
            want = kinds.get(state, 2 if snap.ref_counts[b] == 1 else 3)
            assert heat.z[b][j] == want, (j, b)
            held = sorted(r for r, t in snap.block_tables.items() if b in t)
            assert heat.text[b][j] == ",".join(map(str, held))
    assert any(3 in row for row in heat.z)  # the popular prefix's blocks are shared by the two running requests
    evicted = next(t for t in fig.data if t.name == figures.EVICTED)
    assert sum(evicted.y) == demo.evictions > 0
    assert [t.name for t in rules.legend(fig)] == [name for name, _ in figures.STATES] + [figures.EVICTED]
    assert "r1: 48" in fig.layout.annotations[0].text  # request 1 shares request 0's 3 prefix blocks, both running


def test_block_states_refuses_a_run_without_snapshots():
    res = runs.simulate([[1] * 20, [1] * 20], keep_snapshots=False)
    with pytest.raises(ValueError, match="keep_snapshots=True"):
        figures.block_states(res)


def test_hit_rate_vs_prefix_draws_the_rows_and_the_partial_block(hf, figs):
    rows = simulated.prefix_length_rows(hf)
    fig = figs["hit_rate_vs_prefix"]
    rate = next(t for t in fig.data if t.name == "hit rate")
    assert list(rate.x) == [128, 200, 512, 1024] and list(rate.y) == pytest.approx([100 * r["hit_rate"] for r in rows])
    cached = next(t for t in fig.data if t.name == "cached per later request")
    assert list(cached.y) == [128, 192, 512, 1024] and "192 of 200" in cached.text


def test_cached_per_request_draws_one_line_per_variant(hf, figs):
    adv = runs.advice(hf)
    fig = figs["cached_per_request"]
    assert [t.name for t in fig.data] == list(adv)
    for t in fig.data:
        assert list(t.y) == list(adv[t.name].cached_tokens) and t.x[0] == 1
    assert any("per-request line first: 0 of" in a.text for a in fig.layout.annotations)


def test_scarce_memory_lists_each_order_once_and_marks_where_the_prefixes_fit(figs):
    fig = figs["scarce_memory"]
    assert [t.name for t in rules.legend(fig)] == list(workloads.ORDERS)
    assert [s.x0 for s in fig.layout.shapes] == [64, 64]  # 8 prefixes x 8 blocks


def test_on_off_figure_colours_by_caching_and_dashes_by_model(figs):
    fig = figs["on_off_figure"]
    names = [t.name for t in rules.legend(fig)]
    assert names == ["prefix caching on · embedded", "prefix caching off · embedded",
                     "prefix caching on · llama-3.1-8b (synthetic)", "prefix caching off · llama-3.1-8b (synthetic)"]
    by_name = {t.name: t for t in rules.legend(fig)}
    assert by_name[names[0]].line.color == by_name[names[2]].line.color == style.colour(figures.ON)
    assert by_name[names[1]].line.color == style.colour(figures.OFF) != style.colour(figures.ON)
    assert by_name[names[0]].line.dash == "solid" and by_name[names[2]].line.dash == "dash"
    assert list(by_name[names[1]].x) == [128, 200, 512, 1024]  # the shared-after run is not on a length axis
    assert list(by_name[names[3]].y) == pytest.approx([0.4 * n / 128 for n in (128, 200, 512, 1024)])
    assert fig.layout.yaxis.title.text == "TTFT p50 (s)"  # seconds: the slowest reaches 3.2 s
    small = figures.on_off_figure([r for r in _on_off_rows() if r["model"] == "embedded"], where="live on NVIDIA H200")
    assert small.layout.yaxis.title.text == "TTFT p50 (ms)" and list(small.data[0].y) == pytest.approx([50.0] * 4)
    assert [t.name for t in rules.legend(small)] == [figures.ON, figures.OFF]  # one model: no model in the names
    hit = [t for t in fig.data if t.xaxis == "x2"]
    assert len(hit) == 2 and all(t.showlegend is False for t in hit)  # caching on only
    assert fig.layout.title.text.count("synthetic weights") == 1


def test_on_off_figure_not_recorded_yet_says_which_step_records_it(figs):
    fig = figs["on_off_figure/not-recorded"]
    assert not fig.data and "--steps prefix-on-off" in fig.layout.title.text
    shown = Shown({"runs": _on_off_rows(), "agreement": []}, False, "recorded on NVIDIA H200, 2026-12-01")
    assert figures.on_off_figure(shown).layout.title.text.count("recorded on NVIDIA H200") == 1
    h200 = figs["on_off_figure/h200"]
    assert h200.data and h200.layout.title.text.count("recorded on NVIDIA H200") == 1


def test_the_figure_rules_hold(figs):
    for key, fig in figs.items():
        rules.check_legend(key, fig)
        named = [t.name for t in rules.legend(fig) if rules.PROVENANCE.search(t.name)]
        assert not named, f"{key}: provenance in a legend entry: {named}"
        stated = rules.stating(fig, rules.STATES_OR_NOT_YET)
        assert len(stated) == 1, f"{key}: provenance stated {len(stated)} times"
        for name, axis, values in rules.axes(fig):
            if rules.numeric(axis, values):
                assert rules.UNIT.search(axis.title.text or ""), f"{key}.{name} has no unit: {axis.title.text!r}"
                assert not rules.spans_decades(values) or axis.type == "log", f"{key}.{name}: decades, linear"
        assert fig.layout.xaxis.automargin and fig.layout.yaxis.automargin
    assert rules.colour_clashes(figs, style.base_name) == {}
