"""`lablab`, the main command: a short journey on the CPU writes its Results, the HTML report
and a last stdout line of JSON; bad input exits with code 2 and a message, not a traceback."""

import json

import pytest

from lablib.cli import main
from lablib.hardware.contention import SHARE_FLOOR, CpuMeter, CpuShare
from lablib.results import load_results

torch = pytest.importorskip("torch")
pytest.importorskip("transformers").utils.logging.set_verbosity_error()
pytestmark = [pytest.mark.usefixtures("one_thread")]  # torch on one thread (conftest.py)


def test_journey_writes_results_report_and_summary(tmp_path, capsys):
    tmp = tmp_path
    code = main(["--requests", "4", "--batch-sizes", "1,2", "--max-new-tokens", "8",
                 "--results", str(tmp), "--report", str(tmp / "r.html")])
    out, err = capsys.readouterr()
    assert code == 0, err
    results = load_results(tmp)
    steps = ["hf-naive", "hf-static-b2", "hf-static-b2-sdpa", "hf-static-b2-compile", "hf-continuous-b2",
             "hf-naive-ngram-k4", "hf-naive-draft-k4"]
    assert [r.step for r in results] == steps  # every CPU rung of the ladder, in its order
    assert [r.config["batch_size"] for r in results] == [1, 2, 2, 2, 2, 1, 1]
    assert [r.config["mode"] for r in results] == ["naive", "static", "static", "static", "continuous", "naive",
                                                   "naive"]
    # one change per side road: the speculative rungs keep naive generate's eager kernel
    assert [r.config["attn_implementation"] for r in results] == ["eager", "eager", "sdpa", "sdpa", "sdpa", "eager",
                                                                  "eager"]
    assert [r.config["speculative"] for r in results] == ["", "", "", "", "", "ngram", "draft"]
    assert [r.config["compile"] for r in results] == [False, False, False, True, False, False, False]
    compiled = results[3].engine_facts["compile"]  # sized before the warm-up: one cache length, one compile
    assert compiled["cache_lengths"] == 1 and compiled["max_cache_len"] == \
        max(q.prompt_tokens for q in results[3].requests) + 8 and compiled["first_call_s"] > 0
    for r in results:
        assert r.summary["requests"] == 4 and r.summary["output_tokens"] == 32
        assert r.lab == "journey" and r.workload["requests"] == 4
        assert [q.output_ids for q in r.requests] == [q.output_ids for q in results[0].requests], r.step

    page = (tmp / "r.html").read_text()
    assert "hf-static-b2" in page and "hf-naive" in page
    assert "plotly" in page.lower() and page.count("<script") >= 6

    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary["steps"]) == set(steps)
    for r in results:
        assert summary["steps"][r.step] == round(r.summary["output_tok_s"], 2)
    road = [r for r in results if not r.config["speculative"]]  # lab 08's side roads race naive on their own terms
    best = max(road, key=lambda r: r.summary["output_tok_s"])
    assert summary["best"] == best.step
    assert summary["speedup_over_naive"] == round(best.summary["output_tok_s"] / results[0].summary["output_tok_s"], 2)
    assert summary["results"] == str(tmp / "journey.jsonl") and summary["report"] == str(tmp / "r.html")
    cpu = summary["cpu"]  # the contention check's figures, over the five HF rungs on one torch thread
    assert summary["contended"] == cpu["contended"] and cpu["threads"] == 1 and cpu["floor"] == SHARE_FLOOR
    assert 0 < cpu["cpu_s"] and sum(r.wall_s for r in results) <= cpu["wall_s"] <= summary["wall_s"]


@pytest.mark.parametrize("args,field,hint", [
    (["--batch-sizes", "0"], "batch_sizes=[0]: allowed a non-empty list of integers >= 1 (0 is not)", "Fix"),
    (["--batch-sizes", "1,-4"], "batch_sizes=[1, -4]: allowed a non-empty list of integers >= 1 (-4 is not)", "Fix"),
    (["--requests", "0"], "--requests=0", "Fix"),
    (["--requests", "-3"], "--requests=-3", "Fix"),
    (["--workload", "nope"], "workload 'nope'", "journey"),
    (["--max-new-tokens", "0"], "max_new_tokens=0", "Fix"),
    (["--model", "no-such-model"], "model='no-such-model' is not a known model: allowed", "Fix: one of those"),
    (["--model", "embeded"], "model='embeded'", "Fix: model='embedded', the nearest name."),
    (["--threads", "0"], "--threads=0: allowed integers >= 1", "Fix"),
])
def test_bad_input_exits_2_with_a_message(args, field, hint, tmp_path, capsys):
    code = main([*args, "--results", str(tmp_path), "--report", str(tmp_path / "r.html")])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("lablab: ") and field in err and hint in err, err
    assert "Traceback" not in err + out and "run  " not in out  # refused before any rung started
    assert not (tmp_path / "r.html").exists() and load_results(tmp_path) == []


def test_the_draft_rung_drops_only_transformers_own_assistant_call_notice():
    """Assisted generation's internal call to the draft warns of a kwargs mix lablab's call never passes."""
    import logging

    from lablib.config import HFConfig
    from lablib.engines.hf import HFEngine

    HFEngine("embedded", HFConfig(speculative="draft", attn_implementation="eager")).close()
    log, seen = logging.getLogger("transformers.generation.utils"), []
    handler = logging.Handler()
    handler.emit = seen.append
    log.addHandler(handler)
    try:  # error level: the module set transformers' verbosity to errors, and a filter sees only what passes that
        log.error("Passing `generation_config` together with generation-related arguments=({'max_new_tokens'}) "
                  "is deprecated and will be removed in future versions.")
        log.error("any other notice")
    finally:
        log.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["any other notice"]


@pytest.mark.parametrize("argv,threads", [([], 1), (["--threads", "2"], 2)])
def test_torch_threads_are_one_unless_asked(argv, threads, monkeypatch, tmp_path):
    """The CLI pins torch's threads as the notebooks do, and meters the rungs on that many."""
    from lablib import cli

    seen = {}

    def fake_run_journey(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(cli, "run_journey", fake_run_journey)  # the name main calls
    assert main([*argv, "--results", str(tmp_path)]) == 2
    assert seen["cpu_threads"] == threads and seen["cpu"].threads == threads


def span_meter(spans: list[tuple[float, float]], threads: int = 1, cores: int = 2,
               loads: list[float | None] | None = None) -> CpuMeter:
    """A CpuMeter fed numbers: each span (wall s, CPU s) measured in turn, each with its load average."""
    ticks = iter([t for wall, cpu in spans for t in (0.0, wall)])
    cpu_ticks = iter([t for wall, cpu in spans for t in (0.0, cpu)])
    load_it = iter(loads or [None] * len(spans))
    meter = CpuMeter(threads, cores, clock=lambda: next(ticks), cpu_clock=lambda: next(cpu_ticks),
                     load_avg=lambda: next(load_it))
    for _ in spans:
        with meter.measure():
            pass
    return meter


@pytest.mark.parametrize("spans,threads,cores,share,contended", [
    ([(140.0, 73.5)], 1, 2, 0.525, True),  # measured: the naive rung beside three busy processes on two cores
    ([(60.0, 40.0), (60.0, 40.0)], 1, 2, 2 / 3, True),  # three one-thread runs on two cores
    ([(100.0, 97.0)], 1, 2, 0.97, False),  # alone: Python between torch's ops is CPU time too
    ([(100.0, 80.0)], 1, 2, 0.8, False),  # at the floor: a fifth of the core lost passes
    ([(100.0, 79.0)], 1, 2, 0.79, True),
    ([(100.0, 120.0)], 4, 2, 0.6, None),  # 4 threads on 2 cores: judged against 2 cores, but not judged at all
    ([(0.5, 0.1)], 1, 2, None, None),  # half a second: too short to judge
])
def test_the_contention_verdict_from_numbers(spans, threads, cores, share, contended):
    got = span_meter(spans, threads, cores).result()
    assert (got.share is None) if share is None else got.share == pytest.approx(share)
    assert got.contended is contended
    assert got.to_dict()["contended"] is contended and got.to_dict()["floor"] == SHARE_FLOOR == 0.8


def test_the_meter_adds_spans_keeps_the_highest_load_and_counts_a_span_that_raises():
    ticks, cpu_ticks, loads = iter([0.0, 10.0, 50.0, 80.0]), iter([0.0, 5.0, 7.0, 22.0]), iter([4.2, 3.9])
    meter = CpuMeter(1, 2, clock=lambda: next(ticks), cpu_clock=lambda: next(cpu_ticks), load_avg=lambda: next(loads))
    with meter.measure():
        pass
    with pytest.raises(RuntimeError), meter.measure():
        raise RuntimeError("a rung failed")  # its time still counts: it ran on the CPU all the same
    got = meter.result()
    assert (got.wall_s, got.cpu_s, got.load_avg) == (40.0, 20.0, 4.2) and got.share == 0.5
    assert got.figures() == ("50% of 1 core (20.0 s of CPU time in 40.0 s of wall time on 1 torch thread), "
                             "load average up to 4.2 on 2 cores")
    quiet = CpuShare(40.0, 39.0, 1, 2, None)  # no load average on this OS: the share alone
    assert quiet.figures() == "98% of 1 core (39.0 s of CPU time in 40.0 s of wall time on 1 torch thread)"


def test_unparseable_batch_sizes_are_an_argparse_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--batch-sizes", "one,two", "--results", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--batch-sizes" in err and "comma-separated integers" in err and "Traceback" not in err


def test_the_fp8_rung_is_on_the_ladder_and_says_it_is_not_recorded_yet(monkeypatch):
    """Lab 06's rung joins the ladder; until a GPU session records it, the road leaves it out and says which step
    records it (never a made-up bar)."""
    import importlib.util
    from pathlib import Path

    from lablib.experiments.journey import FP8_RECORDED, available, ladder, road
    from lablib.results.reference import reference_steps

    from lablib.experiments import journey

    step = next(s for s in ladder([1, 4]) if s.name == "vllm-fp8")
    assert step.needs == "gpu+vllm" and step.recorded == (FP8_RECORDED,)
    monkeypatch.setattr(journey, "mode", lambda: {"live": False, "why": "no NVIDIA GPU visible"})  # as on a CPU
    monkeypatch.setattr(journey, "reference_steps", lambda: [s for s in reference_steps() if s != FP8_RECORDED])
    ok, why = available(step)  # before the recording ships
    assert not ok and "not recorded yet" in why and "--steps journey-fp8" in why
    assert FP8_RECORDED not in {r.step for r in road([], [1, 4])}
    monkeypatch.setattr(journey, "reference_steps", lambda: [*reference_steps(), FP8_RECORDED])
    ok, why = available(step)  # once it ships, the report shows it
    assert not ok and f"the report shows its run recorded on the H200 ({FP8_RECORDED})" in why
    path = Path(__file__).resolve().parents[1] / "scripts" / "record_reference.py"
    spec = importlib.util.spec_from_file_location("record_reference", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.STEPS["journey-fp8"] is script.step_journey_fp8
