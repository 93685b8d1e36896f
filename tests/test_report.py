"""The main job's report: the whole road at the top (live rungs and the H200's recorded ones, each labelled),
the numbers in units a person reads, sentences whose numbers come from the data, provenance collapsed,
and one file that works offline (plotly.js inlined exactly once, nothing from a CDN)."""
import dataclasses
import json
import re

import pytest
from bs4 import BeautifulSoup
from plotly.offline import get_plotlyjs

from lablib.experiments.journey import road
from lablib.plots.journey import tok_s_text
from lablib.hardware.contention import ADVICE, CpuShare
from lablib.plots.journey import ladder_panels, model_name
from lablib.report import headline, idle_slot_fraction, rung_rows, write_report
from lablib.results import RequestRecord, Result
from lablib.results.reference import load_reference

CPU = {"gpu": None, "cpu": "Test CPU 9000", "cpu_cores_logical": 2, "ram_bytes": 8 * 2**30}
LIVE = "live on this machine (CPU: Test CPU 9000, 2 cores)"
MODEL = {"name": "embedded", "parameters": 4_737_792, "weight_bytes": 18_951_168, "dtype": "float32"}
PLOTLY_HEADER = get_plotlyjs()[:40]  # "/**\n* plotly.js v4.1.1\n* Copyright ..."


def live_run(step: str, engine: str, batch: int, step_s: float, outputs: list[int], prefill_s: float = 0.05) -> Result:
    """A live CPU run: batches of `batch` requests start together, prefill, then decode one token per step_s."""
    reqs, t = [], 0.0
    for i in range(0, len(outputs), batch):
        group = outputs[i:i + batch]
        for j, n in enumerate(group):
            first = t + prefill_s
            reqs.append(RequestRecord(f"r{i + j}", prompt_tokens=20, output_tokens=n, start=t, first_token=first,
                                      last_token=first + (n - 1) * step_s, finished=first + (max(group) - 1) * step_s))
        t += prefill_s + (max(group) - 1) * step_s
    return Result(lab="journey", step=step, engine=engine, config={"batch_size": batch}, model=MODEL,
                  workload={"name": "journey", "requests": len(outputs)}, requests=reqs, wall_s=t, hardware=CPU,
                  memory={"source": "rss", "peak_bytes": 3 * 2**29}, roofline={"mbu": "unknown", "achieved_bw": 4.2e9})


OUTPUTS = [8, 2, 8, 4, 6, 8, 2, 2]


def rows_of(results: list[Result]) -> dict[str, dict[str, str]]:
    return {row["rung"]: row for row in rung_rows(results)}


def journey_results(static_step_s: float, static_prefill_s: float = 0.05) -> list[Result]:
    return [live_run("hf-naive", "hf-naive", 1, 0.004, OUTPUTS),
            live_run("hf-static-b4", "hf-static", 4, static_step_s, OUTPUTS, static_prefill_s)]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[list[Result], str]:
    results = road(journey_results(0.012), [1, 4])
    skipped = [{"step": "vllm", "why": "no NVIDIA GPU visible"}]
    path = write_report(results, tmp_path_factory.mktemp("report") / "journey.html", skipped=skipped)
    return results, path.read_text(encoding="utf-8")


def rows(html: str) -> dict[str, dict[str, str]]:
    """The numbers table, as {rung: {column: cell}}."""
    soup = BeautifulSoup(html, "html.parser")
    table = next(t for t in soup.find_all("table") if t.find("th", string="rung"))
    head = [th.get_text() for th in table.find("tr").find_all("th")]
    out = {}
    for tr in table.find_all("tr")[1:]:
        cells = [td.get_text() for td in tr.find_all("td")]
        out[cells[0]] = dict(zip(head, cells))
    return out


def test_recorded_h200_rungs_labelled_recorded_and_live_rungs_live(page):
    results, html = page
    recorded = [r for r in results if r.provenance == "recorded"]
    assert {r.step for r in recorded} >= {"hf-static-b64-8b-journey", "vllm-8b-journey", "serve-rate-inf"}
    table = rows(html)
    assert list(table) == [r.step for r in results]  # the table keeps the road's order
    for r in results:
        want = LIVE if r.provenance == "live" else f"recorded on NVIDIA H200, {r.recorded_at[:10]}"
        assert table[r.step]["measured"] == want
    for p in ladder_panels(results):  # the ladder figure's panels say it too: one model and place each
        assert f'"text":"{p["title"]}"' in html
    assert table["vllm-8b-journey"]["output tok/s"] == f"{recorded[1].summary['output_tok_s']:,.0f}"


def test_plotly_js_inlined_exactly_once_and_nothing_from_a_cdn(page):
    _, html = page
    assert html.count(PLOTLY_HEADER) == 1
    assert html.count("Plotly.newPlot(") == 6  # the ladder and five figures of this machine's runs
    assert not re.search(r"<script[^>]*\bsrc=", html) and "<link" not in html  # no file fetched at all
    # plotly.js itself names cdn.plot.ly once, as the default topojsonURL of geo maps (which the page never draws)
    assert html.count("cdn.plot.ly") == get_plotlyjs().count("cdn.plot.ly") == 1
    assert html.index(PLOTLY_HEADER) < html.index("Plotly.newPlot(")


def test_sections_in_order_whole_road_first(page):
    _, html = page
    marks = ["One model up the ladder", "<h2>Reading the road", "<h2>Every rung in numbers", "<h2>Steps not run",
             "<h2>This machine", "<h2>Provenance"]
    positions = [html.index(m) for m in marks]
    assert positions == sorted(positions)
    assert html.index("Plotly.newPlot(") < html.index("<h2>Reading the road")  # the picture comes first


def test_provenance_collapsed_in_details_and_no_json_at_top_level(page):
    results, html = page
    soup = BeautifulSoup(html, "html.parser")
    for pre in soup.find_all("pre"):
        assert pre.find_parent("details") is not None
    top = [d for d in soup.find_all("details") if d.find_parent("details") is None]
    assert [d.summary.b.get_text() for d in top] == [r.step for r in results]
    assert not any(d.has_attr("open") for d in soup.find_all("details"))
    record = json.loads(top[1].find("pre").get_text())
    assert record["step"] == results[1].step and "requests" not in record and "hardware" in record
    assert "Test CPU 9000" in top[0].get_text() and "NVIDIA H200" in top[-1].get_text()


def test_units_a_person_reads(page):
    results, html = page
    table = rows(html)
    naive, vllm = results[0], next(r for r in results if r.step == "vllm-8b-journey")
    assert table["hf-naive"]["wall time (s)"] == f"{naive.wall_s:.1f}"
    assert table["hf-naive"]["TPOT p50 (ms)"] == f"{naive.summary['tpot_s']['p50'] * 1e3:.1f}"
    assert table["hf-naive"]["peak memory (GiB)"] == "1.50 (process RSS)"  # 3 * 2**29 bytes
    assert table["hf-naive"]["decode bandwidth (GB/s)"] == "4.2"
    assert table["hf-naive"]["% of roofline (MBU)"].startswith("unknown")
    assert table["vllm-8b-journey"]["% of roofline (MBU)"] == f"{vllm.roofline['mbu'] * 100:.1f}%"
    assert table["vllm-8b-journey"]["peak memory (GiB)"].startswith(f"{vllm.memory['peak_bytes'] / 2**30:.2f} (GPU")
    ttft = vllm.summary["ttft_s"]
    assert table["vllm-8b-journey"]["TTFT p50 / p99"] == f"{ttft['p50'] * 1e3:,.0f} ms / {ttft['p99'] * 1e3:,.0f} ms"
    slow = next(r for r in results if r.step == "hf-static-b64-8b-journey").summary["ttft_s"]
    assert slow["p50"] < 10 and table["hf-static-b64-8b-journey"]["TTFT p50 / p99"].endswith(" ms")
    naive_ttft = {**naive.summary["ttft_s"], "p50": 20.0871, "p99": 58.62}
    long = dataclasses.replace(naive, summary={**naive.summary, "ttft_s": naive_ttft})  # a copy: `page` is shared
    assert rows_of([long])["hf-naive"]["TTFT p50 / p99"] == "20.1 s / 58.6 s"  # not "20,087 ms"


# static batching 0.8x, 1.5x, 4.3x naive with steps 10x, 4.5x, 0.4x naive's; then 1.4x with a step 1.5x naive's
@pytest.mark.parametrize("static_step_s,prefill_s", [(0.04, 0.05), (0.018, 0.05), (0.0015, 0.05), (0.006, 0.15)])
def test_the_cpu_story_prints_numbers_from_the_data(static_step_s, prefill_s, tmp_path):
    live = journey_results(static_step_s, prefill_s)
    html = write_report(road(live, [1, 4]), tmp_path / "r.html").read_text()
    section = html[html.index("<h2>Reading the road"):html.index("<h2>Every rung")]
    story = BeautifulSoup(section, "html.parser").get_text()
    naive, static = live
    ratio = static.summary["output_tok_s"] / naive.summary["output_tok_s"]
    assert f"({ratio:.2f}× naive)" in story
    assert f", {tok_s_text(static.summary['output_tok_s'])} (" in story
    assert ("slower here than one request at a time" in story) == (ratio <= 1)
    assert ("Batches of 4 gained far less than 4×." in story) == (1 < ratio < 2)
    explained = ratio < 2  # where batching clearly pays, the page does not explain it away
    assert ("On a CPU that is expected" in story) == explained and ("4.7M parameters" in story) == explained
    if explained:
        t1, tb = naive.summary["tpot_s"]["p50"], static.summary["tpot_s"]["p50"]
        assert f"one request's decode step took {t1 * 1e3:.1f} ms" in story
        assert f"a step of 4 requests {tb * 1e3:.1f} ms ({tb / t1:.1f}× as long" in story
        assert ("the cost grew with the batch, so there was little to share" in story) == (tb / t1 >= 2)
        assert ("the batch did share the step's fixed cost" in story) == (tb / t1 < 2)
        assert f"{idle_slot_fraction(static):.0%} of hf-static-b4's decode slots" in story
    hf, vllm = load_reference("hf-static-b64-8b-journey", "vllm-8b-journey")
    assert f"{vllm.summary['output_tok_s'] / hf.summary['output_tok_s']:.1f}× as many" in story
    assert f"{vllm.roofline['mbu']:.0%} of the NVIDIA H200's memory-bandwidth roofline" in story


def lede(html: str) -> str:
    """The page's first paragraph, as text."""
    return BeautifulSoup(html, "html.parser").find("p").get_text()


def test_the_headline_opens_the_page_with_numbers_from_the_results(page):
    results, html = page
    naive, static = results[0], next(r for r in results if r.step == "hf-static-b4")
    hf, vllm = load_reference("hf-static-b64-8b-journey", "vllm-8b-journey")
    a, b = naive.summary["output_tok_s"], static.summary["output_tok_s"]
    x, y = hf.summary["output_tok_s"], vllm.summary["output_tok_s"]
    want = (f"Here, on the CPU: naive generate {tok_s_text(a)} output tok/s → the road's best, hf-static-b4, "
            f"{tok_s_text(b)} output tok/s ({b / a:.2f}×). Recorded on the NVIDIA H200: vLLM {tok_s_text(y)} output "
            f"tok/s, {y / x:.1f}× HF static batching ({tok_s_text(x)} output tok/s), on {model_name(vllm)}.")
    assert lede(html) == want
    assert html.index("Here, on the CPU") < html.index(PLOTLY_HEADER)  # above the figure and its script


def test_a_speculative_side_road_is_not_the_roads_best(tmp_path):
    """Prompt lookup on the journey can outrun static batching on the CPU; the headline races like with like."""
    naive, static = journey_results(0.012)
    ngram = dataclasses.replace(live_run("hf-naive-ngram-k4", "hf-naive", 1, 0.0005, OUTPUTS, 0.001),
                                config={"batch_size": 1, "speculative": "ngram"})
    assert ngram.summary["output_tok_s"] > static.summary["output_tok_s"]
    assert "the road's best, hf-static-b4," in headline([naive, static, ngram])
    assert headline([naive]) == ""  # nothing to race and no recording: no headline, never a made-up one


@pytest.mark.parametrize("share,contended", [(CpuShare(140.0, 73.5, 1, 2, 4.02), True),
                                             (CpuShare(100.0, 97.0, 1, 2, 1.1), False), (None, None)])
def test_a_contended_run_says_so_before_the_figure(share, contended, tmp_path):
    html = write_report(road(journey_results(0.012), [1, 4]), tmp_path / "r.html", cpu=share).read_text()
    soup = BeautifulSoup(html, "html.parser")
    warn = soup.find("p", class_="warn")
    assert (warn is not None) == bool(contended)
    if contended:
        text = warn.get_text()
        assert text.startswith(ADVICE[0].upper() + ADVICE[1:]) and "run it alone" in text
        assert "52% of 1 core (73.5 s of CPU time in 140.0 s of wall time" in text and "up to 4.0 on 2 cores" in text
        assert html.index('class="warn"') < html.index(PLOTLY_HEADER)
    assert ("had their CPU to themselves: 97% of 1 core" in html) == (contended is False)


def test_idle_slot_fraction_counts_what_a_batch_waits_for():
    static = journey_results(0.01)[1]  # batches [8, 2, 8, 4] and [6, 8, 2, 2]: 64 slots, 40 tokens
    assert idle_slot_fraction(static) == pytest.approx(1 - 40 / 64)
    assert idle_slot_fraction(journey_results(0.01)[0]) is None  # one request at a time waits for nobody


def test_no_results_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no Results to report"):
        write_report([], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.usefixtures("one_thread")  # torch on one thread (conftest.py)
@pytest.mark.filterwarnings("ignore:MemoryMonitor. no GPU:RuntimeWarning")  # the CPU fallback
def test_the_main_job_reports_its_live_rungs_beside_the_recorded_road(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers").utils.logging.set_verbosity_error()
    from lablib.cli import main
    from lablib.session import mode

    code = main(["--requests", "2", "--batch-sizes", "1,2", "--max-new-tokens", "4",
                 "--results", str(tmp_path), "--report", str(tmp_path / "r.html")])
    out, err = capsys.readouterr()
    assert code == 0, err
    table = rows((tmp_path / "r.html").read_text(encoding="utf-8"))
    live = [k for k, row in table.items() if row["measured"].startswith("live on this machine (")]
    assert live == ["hf-naive", "hf-static-b2", "hf-static-b2-sdpa", "hf-static-b2-compile", "hf-continuous-b2",
                    "hf-naive-ngram-k4", "hf-naive-draft-k4"]
    assert list(table)[:3] == live[:3]  # labs 01 and 02's rungs, then lab 02's rung's H200 recording
    summary = json.loads(out.strip().splitlines()[-1])
    if not mode()["live"]:  # no vLLM here: the road's vLLM rungs are the H200's, each after its own rung
        recorded = [k for k, row in table.items() if row["measured"].startswith("recorded on NVIDIA H200, ")]
        assert sorted(recorded + live) == sorted(table) and {"vllm-8b-journey", "serve-rate-inf"} <= set(recorded)
        assert list(table).index("hf-static-b64-8b-journey") == 3
        assert list(summary["recorded"]) == recorded
