"""The figure builders, from Results made here (live and recorded) and from the simulators."""
import math

import pytest

from lablib import plots
from lablib.mechanisms import batching, kv, paging
from lablib.plots.kv import FREE
from lablib.results import RequestRecord, Result, ResultStore

H200 = {"gpu": "NVIDIA H200"}


def _requests(n: int, step_s: float, out: int = 4, finished_late: float = 0.0) -> list[RequestRecord]:
    reqs = []
    for i in range(n):
        first = 0.01 * (i + 1)
        times = [first + k * step_s for k in range(out)]
        reqs.append(RequestRecord(f"r{i}", prompt_tokens=10, output_tokens=out, arrival=0.0, start=0.005 * i,
                                  first_token=first, last_token=times[-1], finished=times[-1] + finished_late,
                                  token_times=times))
    return reqs


def _result(step: str, batch: int, engine: str = "hf-static", provenance: str = "live", ceiling=None,
            memory: dict | None = None, finished_late: float = 0.0) -> Result:
    reqs = _requests(3, 0.02 / batch, finished_late=finished_late)
    return Result(lab="test", step=step, engine=engine, config={"batch_size": batch}, model={"name": "m"},
                  workload={"name": "w"}, requests=reqs, wall_s=0.1 / batch,
                  memory=memory or {}, roofline={"ceiling_tok_s": "unknown" if ceiling is None else ceiling},
                  hardware=H200 if provenance == "recorded" else {"gpu": None}, provenance=provenance,
                  recorded_at="2026-11-01T10:00:00+0000")


@pytest.fixture
def live() -> list[Result]:
    return [_result(f"hf-static-b{b}", b) for b in (8, 1, 4)]


@pytest.fixture
def recorded() -> list[Result]:
    return [_result(f"h200-b{b}", b, provenance="recorded", ceiling=300.0 * b) for b in (1, 8)]


def test_throughput_vs_batch_lines_roofline_and_unknown_note(live, recorded):
    fig = plots.throughput_vs_batch(live + recorded)
    names = [t.name for t in fig.data]
    assert len(fig.data) == 3  # live line, recorded line, recorded roofline
    assert names[0] == "hf-static"
    assert list(fig.data[0].x) == [1, 4, 8]
    by_batch = {r.config["batch_size"]: r.summary["output_tok_s"] for r in live}
    assert list(fig.data[0].y) == [by_batch[1], by_batch[4], by_batch[8]]
    # live and recorded runs of one engine: one colour, the recorded line marked, provenance once in the title
    assert names[1] == "hf-static" + plots.RECORDED_MARK and names[2].endswith(plots.RECORDED_MARK)
    assert fig.data[0].line.color == fig.data[1].line.color == plots.colour("hf-static")
    assert not any("recorded" in n for n in names)
    assert list(fig.data[2].y) == [300.0, 2400.0] and fig.data[2].line.dash == "dash"
    assert any(a.text == plots.ROOFLINE_UNKNOWN for a in fig.layout.annotations)
    assert "* recorded on NVIDIA H200, 2026-11-01; the rest live on this CPU" in fig.layout.title.text


def test_throughput_vs_batch_known_roofline_has_no_unknown_note_and_skips_runs_without_batch(recorded):
    assert not any(a.text == plots.ROOFLINE_UNKNOWN for a in plots.throughput_vs_batch(recorded).layout.annotations)
    odd = _result("vllm", 1, engine="vllm")
    odd.config = {"gpu_memory_utilization": 0.9, "max_num_seqs": 16}
    fig = plots.throughput_vs_batch(recorded + [odd])
    assert len(fig.data) == 2
    assert any("not drawn" in a.text and "vllm" in a.text for a in fig.layout.annotations)
    fig = plots.throughput_vs_batch(recorded + [odd], batch_keys=("batch_size", "max_num_seqs"))
    assert [list(t.x) for t in fig.data if t.name == "vllm"] == [[16]]
    with pytest.raises(ValueError, match="no Results"):
        plots.throughput_vs_batch([])


@pytest.mark.parametrize("metric", ["ttft", "tpot", "e2e", "itl"])
def test_latency_cdf_each_metric_ends_at_one(live, recorded, metric):
    fig = plots.latency_cdf(live + recorded, metric)
    assert len(fig.data) == 5
    for trace, r in zip(fig.data, live + recorded):
        assert trace.y[-1] == pytest.approx(1.0)
        assert list(trace.x) == sorted(trace.x)
        if metric == "itl":
            assert len(trace.x) == sum(len(q.itls) for q in r.requests)
        else:
            assert list(trace.x) == pytest.approx(sorted(getattr(q, metric) * 1e3 for q in r.requests))
    assert fig.data[3].name == "h200-b1" + plots.RECORDED_MARK and "recorded on NVIDIA H200" in fig.layout.title.text
    assert fig.layout.xaxis.title.text.endswith("(ms)") or fig.layout.xaxis.title.text.endswith("log scale)")


def test_latency_cdf_switches_to_seconds_and_a_log_axis_when_values_span_decades(live):
    slow = _result("hf-naive", 1, engine="hf-naive")
    for i, q in enumerate(slow.requests):
        q.first_token = 0.05 * 10 ** i  # 50 ms, 0.5 s, 5 s: the queue ahead of naive generate's last request
    fig = plots.latency_cdf([slow], "ttft")
    assert fig.layout.xaxis.type == "log" and "(s, log scale)" in fig.layout.xaxis.title.text
    assert list(fig.data[0].x) == pytest.approx([0.05, 0.5, 5.0])
    assert "live on this CPU" in fig.layout.title.text


def test_latency_cdf_rejects_unknown_metric(live):
    with pytest.raises(ValueError, match="allowed 'ttft', 'tpot', 'e2e', 'itl'"):
        plots.latency_cdf(live, "p99")


def test_memory_timeline_units_and_source_in_title():
    rss = _result("cpu", 1, memory={"source": "rss", "t_s": [0, 0.1, 0.2], "used_bytes": [100 * 2**20] * 3})
    fig = plots.memory_timeline([rss])
    assert "RSS" in fig.layout.title.text and fig.layout.yaxis.title.text == "used (MiB)"
    assert list(fig.data[0].y) == [100.0] * 3
    gpu = _result("h200", 8, provenance="recorded",
                  memory={"source": "nvml", "t_s": [0, 1], "used_bytes": [2 * 2**30, 3 * 2**30]})
    fig = plots.memory_timeline([gpu, _result("no-memory", 1)])
    assert "GPU memory" in fig.layout.title.text and fig.layout.yaxis.title.text == "used (GiB)"
    assert list(fig.data[0].y) == [2.0, 3.0] and fig.data[0].name == "h200" + plots.RECORDED_MARK
    assert "* recorded on NVIDIA H200" in fig.layout.title.text
    assert fig.layout.showlegend  # one trace: the legend (and the recorded label) must still show
    assert any("no-memory" in a.text for a in fig.layout.annotations)


def test_phase_breakdown_stacks_prefill_and_decode(live, recorded):
    results = live + recorded
    fig = plots.phase_breakdown(results)
    assert fig.layout.barmode == "stack" and [t.name for t in fig.data] == ["prefill (s)", "decode (s)"]
    assert list(fig.data[0].y) == pytest.approx([r.summary["prefill_s"] for r in results])
    assert list(fig.data[1].y) == pytest.approx([r.summary["decode_s"] for r in results])
    assert list(fig.data[0].x) == ["hf-static-b8", "hf-static-b1", "hf-static-b4", "h200-b1 *", "h200-b8 *"]
    assert fig.data[0].text[0] == f"{results[0].summary['prefill_s'] / (results[0].summary['prefill_s'] + results[0].summary['decode_s']):.0%}"
    assert "recorded on NVIDIA H200" in fig.layout.title.text and fig.layout.yaxis.title.text.endswith("(s)")


def test_journey_throughput_and_ttft_panels(live, recorded):
    results = live + recorded + [live[0]]  # a repeated step stays a separate bar
    fig = plots.journey(results)
    assert [t.name for t in fig.data] == ["output tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)"]
    assert list(fig.data[0].y) == pytest.approx([r.summary["output_tok_s"] for r in results])
    assert list(fig.data[1].y) == pytest.approx([r.summary["ttft_s"]["p50"] * 1e3 for r in results])
    assert len(set(fig.data[0].x)) == len(results)
    assert fig.data[1].yaxis == "y2"


def test_gantt_from_simulator_rows():
    sched = batching.static_batching([(10, 5), (20, 9), (5, 3)], batch_size=2)
    fig = plots.gantt(sched.rows(), "static")
    names = [t.name for t in fig.data]
    assert names == ["static: waiting", "static: running (start to finish)", "static: first token"]
    run, first = fig.data[1], fig.data[2]
    assert list(run.base) == [r.start for r in sched.records]
    assert list(run.x) == pytest.approx([r.finish - r.start for r in sched.records])
    assert list(first.x) == [r.first_token for r in sched.records]
    both = plots.gantt(sched.rows() + batching.continuous_batching([(10, 5), (20, 9), (5, 3)]).rows())
    assert {t.name.split(":")[0] for t in both.data} == {"static", "continuous"}
    assert fig.layout.xaxis.title.text == "time (cost-model units)"
    with pytest.raises(ValueError, match="request_id"):
        plots.gantt([{"start": 0}])


def test_gantt_from_a_real_result_marks_tokens_returned_late():
    r = _result("h200-static", 2, provenance="recorded", finished_late=0.05)
    rows = plots.result_gantt_rows(r)
    assert [row["finish"] for row in rows] == [q.finished for q in r.requests]
    fig = plots.gantt(rows, "static batching on the H200")
    assert all(t.name.startswith("h200-static: ") for t in fig.data)
    assert fig.layout.title.text.count("recorded on NVIDIA H200, 2026-11-01") == 1
    assert any("last token" in t.name for t in fig.data)
    assert fig.layout.xaxis.title.text == "time (s)"
    r.requests[0].finished = None
    assert plots.result_gantt_rows(r)[0]["finish"] == r.requests[0].last_token


def test_fragmentation_bars():
    report = kv.simulate_fragmentation([(100, 50), (30, 200), (60, 60)], budget_tokens=8192)
    fig = plots.fragmentation_bars(report)
    assert list(fig.data[0].x) == ["contiguous", "paged"]
    assert list(fig.data[0].y) == [report.contiguous.used_tokens, report.paged.used_tokens]
    assert list(fig.data[1].y) == [report.contiguous.reserved_tokens - report.contiguous.used_tokens,
                                   report.paged.reserved_tokens - report.paged.used_tokens]
    assert f"{report.contiguous.waste_fraction:.0%} wasted" in fig.data[1].text[0]
    assert len(plots.fragmentation_bars(report.rows()).data) == 2


def test_block_table_heatmap_colours_owned_blocks_and_leaves_free_blank():
    snaps = paging.replay_block_allocation([(20, 10), (40, 30), (10, 50)], num_blocks=16, block_size=8)
    snap = snaps[3]
    fig = plots.block_table_heatmap(snap)
    cells = [c for row in fig.data[0].z for c in row]
    assert sum(c is not None and c >= 0 for c in cells) == snap.allocated_blocks
    assert cells.count(FREE) == snap.free_blocks
    cols = len(fig.data[0].z[0])
    for rid, table in snap.block_tables.items():
        for phys in table:
            assert fig.data[0].text[phys // cols][phys % cols] == str(rid)
    with pytest.raises(ValueError, match="AllocatorSnapshot"):
        plots.block_table_heatmap(snaps)


def test_figures_render_without_a_kernel_from_stored_results(tmp_path, live, recorded):
    store = ResultStore(tmp_path / "r.jsonl")
    for r in live + recorded:
        store.append(r)
    results = store.load()
    figs = [plots.throughput_vs_batch(results), plots.latency_cdf(results, "e2e"), plots.phase_breakdown(results),
            plots.journey(results), plots.memory_timeline(results), plots.gantt(plots.result_gantt_rows(results[0]))]
    for fig in figs:
        page = fig.to_html(include_plotlyjs=False)
        assert "<div" in page
    assert "recorded on NVIDIA H200" in figs[0].to_html(include_plotlyjs=False)


def test_token_gaps_shows_the_share_read_in_clumps():
    from lablib.plots.serving import token_gaps

    times = [0.1, 0.11, 0.11, 0.11, 0.12]  # two events of one read among four gaps
    rec = RequestRecord(request_id="a", prompt_tokens=3, output_tokens=5, arrival=0.0, start=0.0, first_token=0.1,
                        last_token=0.12, finished=0.12, token_times=times)
    def result(step, requests):
        return Result(lab="t", step=step, engine="vllm-server", config={"rate": float("inf")}, model={"name": "m"},
                      workload={"name": "w"}, requests=requests, wall_s=0.2)

    fig = token_gaps([result("serve-rate-inf", [rec])])
    assert fig.data[0].name == "serve-rate-inf: 50% read in clumps" and len(fig.data[0].x) == 4
    assert min(fig.data[0].x) == pytest.approx(math.log10(0.02))  # the zero gaps sit at the 0.02 ms floor, left of the line
    with pytest.raises(ValueError, match="per-token times"):
        token_gaps([result("x", [])])
