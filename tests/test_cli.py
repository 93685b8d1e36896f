"""`lablab`, the main command: a short journey on the CPU writes its Results, the HTML report
and a last stdout line of JSON; bad input exits with code 2 and a message, not a traceback."""

import json

import pytest

from lablib.cli import main
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
    steps = ["hf-naive", "hf-static-b2", "hf-static-b2-sdpa", "hf-naive-ngram-k4", "hf-naive-draft-k4"]
    assert [r.step for r in results] == steps  # every CPU rung of the ladder, in its order
    assert [r.config["batch_size"] for r in results] == [1, 2, 2, 1, 1]
    # one change per side road: the speculative rungs keep naive generate's eager kernel
    assert [r.config["attn_implementation"] for r in results] == ["eager", "eager", "sdpa", "eager", "eager"]
    assert [r.config["speculative"] for r in results] == ["", "", "", "ngram", "draft"]
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
    best = max(results, key=lambda r: r.summary["output_tok_s"])
    assert summary["best"] == best.step
    assert summary["speedup_over_naive"] == round(best.summary["output_tok_s"] / results[0].summary["output_tok_s"], 2)
    assert summary["results"] == str(tmp / "journey.jsonl") and summary["report"] == str(tmp / "r.html")


@pytest.mark.parametrize("args,field,hint", [
    (["--batch-sizes", "0"], "batch_sizes=[0]: allowed a non-empty list of integers >= 1 (0 is not)", "Fix"),
    (["--batch-sizes", "1,-4"], "batch_sizes=[1, -4]: allowed a non-empty list of integers >= 1 (-4 is not)", "Fix"),
    (["--requests", "0"], "--requests=0", "Fix"),
    (["--requests", "-3"], "--requests=-3", "Fix"),
    (["--workload", "nope"], "workload 'nope'", "journey"),
    (["--max-new-tokens", "0"], "max_new_tokens=0", "Fix"),
    (["--model", "no-such-model"], "model='no-such-model'", "qwen2.5-0.5b"),
])
def test_bad_input_exits_2_with_a_message(args, field, hint, tmp_path, capsys):
    code = main([*args, "--results", str(tmp_path), "--report", str(tmp_path / "r.html")])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("lablab: ") and field in err and hint in err, err
    assert "Traceback" not in err + out
    assert not (tmp_path / "r.html").exists() and load_results(tmp_path) == []


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

    from lablib import session
    from lablib.experiments import journey

    step = next(s for s in ladder([1, 4]) if s.name == "vllm-fp8")
    assert step.needs == "gpu+vllm" and step.recorded == (FP8_RECORDED,)
    monkeypatch.setattr(session, "mode", lambda: {"live": False, "why": "no NVIDIA GPU visible"})  # as on a CPU
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
