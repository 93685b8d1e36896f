"""Lab 08's explorer, headless: the curves are the mechanism's numbers, the controls redraw, the measured points are
drawn with their provenance, and bad settings are refused in lablib's one message shape.

The CPU study and vLLM's rows are hand-built in the shapes `cpu_study` and `gpu_study` return (nothing is recorded
on the GPU yet); one test builds the explorer from a real, tiny `cpu_study` of the embedded pair to keep the shapes
honest. What the browser gets is read back from the Output widget's state, as tests/widgets/test_widgets.py does.
"""
from __future__ import annotations

import dataclasses

import pytest

from lablib import widgets
from lablib.experiments.speculative.maths import roofline_of
from lablib.mechanisms.speculative import (
    expected_tokens_per_step,
    optimal_k,
    reversal_batch,
    speedup,
    speedup_vs_batch,
)
from lablib.session import Shown
from lablib.widgets import speculative as sw
from lablib.widgets.figure import PLOTLY_MIME

RECORDED = "recorded on NVIDIA H200, 2026-12-02"
NOT_RECORDED = ("speculative is not recorded yet: a GPU session records it with `scripts/record_reference.py --steps "
                "speculative` (then scripts/pack_reference.py)")


def _shown(explorer: sw.SpeedupExplorer) -> dict:
    state = explorer.area.output.get_state()
    assert len(state["outputs"]) == 1 and state["outputs"][0]["output_type"] == "display_data"
    return state["outputs"][0]["data"][PLOTLY_MIME]


def _trace(shown: dict, name: str, xaxis: str | None = None) -> dict:
    found = [t for t in shown["data"] if t.get("name") == name and (xaxis is None or t.get("xaxis") == xaxis)]
    assert len(found) == 1, [t.get("name") for t in shown["data"]]
    return found[0]


def _study() -> dict:
    rows = [{"k": k, "alpha": a, "measured_length": n, "length_stderr": 0.05, "measured_speedup": m,
             "predicted_speedup": p, "c": 0.4, "verify_cost": v, "tok_s": 100.0}
            for k, a, n, m, p, v in ((2, 0.75, 2.3, 0.92, 0.95, 1.4), (4, 0.72, 2.9, 0.88, 0.9, 1.5))]
    return {"rows": rows, "costs": {"c": 0.4}, "prompts": 4, "max_new_tokens": 32,
            "provenance": "measured on this machine's CPU (test CPU), torch 2.x, 1 thread(s)"}


def _runs() -> dict:
    rows = []
    for b in (1, 16, 64):
        for name, method, k, factor in (("baseline, pinned (V1, no async)", "baseline", None, 1.0),
                                        ("baseline, vLLM defaults", "baseline", None, 1.3),
                                        ("draft model k=4", "draft_model", 4, 0.7 - b / 200),
                                        ("n-gram k=4 (lookup 2-5)", "ngram", 4, 1.4 - b / 100)):
            rows.append({"name": name, "method": method, "k": k, "batch": b, "speedup": factor,
                         "mean_acceptance_length": None if k is None else 2.5, "provenance": RECORDED})
    return {"rows": rows}


def test_the_curves_are_the_mechanisms_numbers_exactly():
    view = sw.speedup_view(0.8, 4, 0.125)
    curve = view["k_curve"]
    assert curve["k"] == list(range(1, 17))
    for k in (1, 2, 4, 9, 16):
        assert curve["speedup"][k - 1] == float(speedup(0.8, k, 0.125))
        assert curve["tokens_per_step"][k - 1] == float(expected_tokens_per_step(0.8, k))
    assert view["speedup"] == float(speedup(0.8, 4, 0.125)) and view["tokens_per_step"] == float(
        expected_tokens_per_step(0.8, 4))
    fig = sw.speedup_figure(view)
    drawn = next(t for t in fig.data if t.name == "formula E / (k c + 1)")
    assert list(drawn.y) == curve["speedup"] and list(drawn.x) == curve["k"]
    assert list(next(t for t in fig.data if t.name == "formula E(alpha, k)").y) == curve["tokens_per_step"]


@pytest.mark.parametrize("alpha, c", [(0.8, 0.125), (0.5, 0.0), (0.95, 0.02), (0.3, 1.0), (0.99, 0.0)])
def test_the_optimum_is_optimal_k(alpha, c):
    view = sw.speedup_view(alpha, 4, c)
    best_k, best = optimal_k(alpha, c, 16)
    assert view["optimum"] == {"k": best_k, "speedup": float(best)}
    star = next(t for t in sw.speedup_figure(view).data if t.name == "best k (optimal_k)")
    assert list(star.x) == [best_k] and list(star.y) == [float(best)]
    assert f"Best k here: {best_k} " in view["text"]


def test_the_batch_panel_is_speedup_vs_batch_with_a_draft_c_times_the_target():
    t = roofline_of("llama-3.1-8b", "H200")
    d = dataclasses.replace(t, weight_bytes=t.weight_bytes * 0.125, flops_per_token=t.flops_per_token * 0.125)
    view = sw.speedup_view(0.8, 4, 0.125, batch=32)
    assert view["batch_curve"] == speedup_vs_batch(0.8, 4, sw.MODEL_BATCHES, t, d)
    assert view["at_batch"] == speedup_vs_batch(0.8, 4, [32], t, d)[0]
    assert view["reversal"] == reversal_batch(0.8, 4, t, d) == 118  # the mechanism's worked example: a 1B draft of 8B
    assert all(p.draft_cost == pytest.approx(0.125) for p in view["batch_curve"])  # c the same at every batch
    assert view["batch_curve"][0].speedup == pytest.approx(view["speedup"])  # batch 1: memory-bound, verify_cost 1
    ngram = sw.speedup_view(0.8, 4, 0.0)
    assert ngram["reversal"] == reversal_batch(0.8, 4, t) == 139 and "n-gram drafter" in ngram["captions"][0]
    rev = next(t for t in sw.speedup_figure(view).data if t.name == "reversal batch")
    assert list(rev.x) == [118, 118] and "slower from batch 118" in rev.text[1]
    assert "slower than plain decoding from batch 118" in view["text"]


def test_moving_a_control_updates_the_text_and_the_figure():
    e = sw.SpeedupExplorer(alpha=0.8, k=4, draft_cost=0.125, batch=1)
    assert "alpha 0.80, k = 4" in e.text.value and f"speedup {float(speedup(0.8, 4, 0.125)):.2f}x" in e.text.value
    before = e.area.renders
    e.k.value = 8
    shown = _shown(e)
    assert e.area.renders == before + 1 and "k = 8" in e.text.value
    assert _trace(shown, "your setting", "x2")["x"] == [8]
    assert _trace(shown, "your setting", "x2")["y"] == [pytest.approx(float(speedup(0.8, 8, 0.125)))]
    e.alpha.value = 0.6
    assert _trace(_shown(e), "formula E(alpha, k)")["y"][3] == pytest.approx(float(expected_tokens_per_step(0.6, 4)))
    e.draft_cost.value = 0.5
    assert _trace(_shown(e), "formula E / (k c + 1)")["y"][1] == pytest.approx(float(speedup(0.6, 2, 0.5)))
    e.batch.value = 64
    assert "at batch 64" in e.text.value and _trace(_shown(e), "your setting", "x3")["x"] == [64]
    e.gpu.value = "A100 40GB"
    assert "On the A100 40GB roofline" in e.text.value and "A100 40GB roofline" in str(_shown(e)["layout"])
    e.target.value = "qwen2.5-7b"
    assert "qwen2.5-7b" in e.text.value
    assert e.settings() == {"alpha": 0.6, "k": 8, "draft_cost": 0.5, "batch": 64, "gpu": "A100 40GB",
                            "target": "qwen2.5-7b"}
    assert e.view == sw.speedup_view(**e.settings())
    assert e.display() is e.widget and e.area.output in e.widget.children


@pytest.mark.parametrize("setting, message", [
    ({"alpha": 1.0}, "SpeedupExplorer.alpha=1.0: allowed a number in [0, 0.99]; Fix: "),
    ({"alpha": -0.1}, "SpeedupExplorer.alpha=-0.1: allowed a number in [0, 0.99]; Fix: "),
    ({"k": 0}, "SpeedupExplorer.k=0: allowed integers 1..16; Fix: "),
    ({"k": 17}, "SpeedupExplorer.k=17: allowed integers 1..16; Fix: "),
    ({"k": 2.5}, "SpeedupExplorer.k=2.5: allowed integers 1..16; Fix: "),
    ({"draft_cost": 1.6}, "SpeedupExplorer.draft_cost=1.6: allowed a number in [0, 1.5]; Fix: "),
    ({"batch": 0}, "SpeedupExplorer.batch=0: allowed integers 1..256; Fix: "),
    ({"batch": 512}, "SpeedupExplorer.batch=512: allowed integers 1..256; Fix: "),
    ({"gpu": "T4"}, "SpeedupExplorer.gpu='T4': allowed 'L4', "),  # no bf16 peak: no roofline
    ({"target": "gpt-5"}, "SpeedupExplorer.target='gpt-5': allowed 'llama-3.1-8b', "),
])
def test_bad_settings_are_refused_in_lablibs_message_shape(setting, message):
    args = {"alpha": 0.8, "k": 4, "draft_cost": 0.125} | setting
    with pytest.raises(ValueError) as view_error:
        sw.speedup_view(**args)
    assert str(view_error.value).startswith(message) and "; Fix: " in str(view_error.value)
    with pytest.raises(ValueError) as panel_error:  # before any widget is built
        sw.SpeedupExplorer(**args)
    assert str(panel_error.value) == str(view_error.value)


def test_measured_points_are_drawn_with_their_provenance():
    study, runs = _study(), _runs()
    e = sw.SpeedupExplorer(alpha=0.72, k=4, draft_cost=0.4, study=study, runs=Shown(runs, False, RECORDED))
    shown = _shown(e)
    counted = _trace(shown, "counted by the loop (+/- 3 se)")
    assert counted["x"] == [2, 4] and counted["y"] == [2.3, 2.9] and counted["error_y"]["array"] == [
        pytest.approx(0.15)] * 2
    assert _trace(shown, "this run (median of rounds)")["y"] == [0.92, 0.88]
    assert _trace(shown, "formula: forwards timed alone")["y"] == [0.95, 0.9]
    assert "live on this CPU" in counted["hovertemplate"]
    draft = _trace(shown, "vLLM draft model k=4")
    assert draft["x"] == [1, 16, 64] and draft["y"] == pytest.approx([0.695, 0.62, 0.38])
    assert draft["xaxis"] == "x3" and RECORDED in draft["hovertemplate"]
    names = [t["name"] for t in shown["data"]]
    assert "vLLM n-gram k=4 (lookup 2-5)" in names and not [n for n in names if "baseline" in n]
    title = shown["layout"]["title"]["text"]
    assert "dots live on this CPU" in title and f"squares {RECORDED}" in title
    assert "Dots: live on this CPU: the embedded pair, 4 journey prompts x 32 new tokens" in e.caption.value
    assert f"Squares: vLLM, {RECORDED}" in e.caption.value
    assert sw.speedup_view(0.72, 4, 0.4, runs=runs)["vllm"] == e.view["vllm"]  # a plain dict of rows works too


def test_a_missing_recording_draws_no_points_and_the_caption_says_why():
    e = sw.SpeedupExplorer(runs=Shown(None, False, NOT_RECORDED, "no NVIDIA GPU visible"))
    shown = _shown(e)
    assert e.view["vllm"] == {} and e.view["cpu"] == []
    assert not [t for t in shown["data"] if t["name"].startswith("vLLM") or t["name"].startswith("counted")]
    assert f"vLLM: nothing drawn: {NOT_RECORDED}" in e.caption.value and "--steps speculative" in e.caption.value
    assert "no study given" in e.caption.value and "vLLM not drawn" in shown["layout"]["title"]["text"]
    assert sw.NO_RUNS in sw.SpeedupExplorer().caption.value  # no runs at all: said too


def test_from_lab_starts_at_the_studys_alpha_and_c():
    study = _study()
    e = sw.SpeedupExplorer.from_lab(study, Shown(None, False, NOT_RECORDED))
    assert (e.alpha.value, e.k.value, e.draft_cost.value) == (0.72, 4, 0.4)
    e = sw.SpeedupExplorer.from_lab(study, _runs(), k=2, batch=16)
    assert (e.alpha.value, e.k.value, e.batch.value) == (0.75, 2, 16) and e.view["vllm"]
    study["rows"][1]["alpha"], study["costs"]["c"] = 1.0, 2.0  # beyond the sliders: clamped to their ends
    e = sw.SpeedupExplorer.from_lab(study, {}, k=4)
    assert (e.alpha.value, e.draft_cost.value) == (sw.ALPHA_MAX, sw.COST_MAX)
    assert widgets.SpeedupExplorer is sw.SpeedupExplorer


@pytest.mark.usefixtures("one_thread")
def test_from_lab_on_a_real_cpu_study_and_the_shipped_recording():
    pytest.importorskip("transformers").utils.logging.set_verbosity_error()
    from lablib.experiments.speculative import study as speculative_study

    study = speculative_study.cpu_study(n_prompts=1, max_new_tokens=8, ks=(2, 4), rounds=1)
    e = sw.SpeedupExplorer.from_lab(study)  # vLLM: the recording, or "not recorded yet"
    row = speculative_study.study_row(study, 4)
    assert e.alpha.value == pytest.approx(min(row["alpha"], sw.ALPHA_MAX), abs=1e-9)
    assert e.draft_cost.value == pytest.approx(min(study["costs"]["c"], sw.COST_MAX), abs=1e-9)
    assert _trace(_shown(e), "counted by the loop (+/- 3 se)")["y"] == [r["measured_length"] for r in study["rows"]]
    assert bool(e.view["vllm"]) or "not recorded yet" in e.caption.value
