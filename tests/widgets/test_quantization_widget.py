"""Lab 06's explorer, headless: its numbers are the package's own (weights_alone, predicted_bytes, storage, the quality
gate, the speed rows), the controls redraw, a missing recording draws nothing and says why, and bad settings are
refused in lablib's one message shape.

The quality table and the speed rows are hand-built in the shapes `quality_table` and `speed_rows` return (the
quantizer does not run here: ~20 s a scheme; nothing is recorded on the GPU yet); the bf16 storage row is `storage`
of the embedded target itself, read from its headers. What the browser gets is read back from the Output widget's
state, as tests/widgets/test_widgets.py does.
"""
from __future__ import annotations

import pytest

from lablib import widgets
from lablib.experiments.quantization import measures, recording, sizes, speed_runs
from lablib.hardware.fit import RESERVE_BYTES
from lablib.mechanisms.gpus import GPU_PEAKS
from lablib.models import architectures, embedded_path, kv_bytes_per_token
from lablib.models.quantize import SCHEMES
from lablib.plots.style import shown_text
from lablib.session import Shown
from lablib.widgets import quantization as qw
from lablib.widgets.figure import PLOTLY_MIME

RECORDED = "recorded on NVIDIA H200, 2026-12-02"
NOT_RECORDED = ("lab 06's speed and memory per scheme on the synthetic 8B is not recorded yet: a GPU session records "
                "it with `scripts/record_reference.py --steps quantization` (then scripts/pack_reference.py)")
CPU = "measured on this machine's CPU (test CPU), torch 2.x, transformers 5.x, 1 thread(s)"


def _quality() -> list[dict]:
    rows = [{"scheme": "bf16", "ppl": 10.0, "ppl_change_pct": 0.0, "agreement": 1.0, "mean_first_divergence": 16.0,
             "identical": "4/4", "eval": "evaluation@v1[:16], 8176 predicted tokens", "provenance": CPU}]
    for s, pct, agree in (("fp8-dynamic", 0.2, 0.94), ("gptq-w4a16", 1.6, 0.67), ("w8a8-int8", 0.4, 0.88)):
        rows.append({"scheme": s, "ppl": 10.0 * (1 + pct / 100), "ppl_change_pct": pct, "agreement": agree,
                     "mean_first_divergence": 9.5, "identical": "1/4", "eval": rows[0]["eval"], "provenance": CPU})
    return rows


def _stored() -> list[dict]:
    bf16 = {**sizes.storage(embedded_path("target"), "bf16"), "vs_bf16": 1.0}
    return [bf16, *({**bf16, "scheme": s, "file_bytes": int(bf16["file_bytes"] * v), "vs_bf16": v,
                     "bits_per_weight": b} for s, v, b in (("fp8-dynamic", 0.61, 8.06), ("gptq-w4a16", 0.42, 4.25),
                                                           ("w8a8-int8", 0.61, 8.06)))]


def _speed() -> list[dict]:
    return [{"scheme": s, "batch": b, "decode_tok_s": v, "of_roofline": 0.7, "weight_gib": g, "kv_tokens": k,
             "model": "synthetic:llama-3.1-8b", "provenance": RECORDED}
            for s, g, k, vs in (("bf16", 14.99, 700_000, (210, 1500, 8786, 20000)),
                                ("fp8", 8.5, 760_000, (299, 2100, 11890, 26000)),
                                ("gptq-w4a16", 5.4, 790_000, (278, 2000, 8783, 15000)))
            for b, v in zip(speed_runs.BATCHES, vs)]


def _shown(e: qw.QuantizationExplorer) -> dict:
    state = e.area.output.get_state()
    assert len(state["outputs"]) == 1 and state["outputs"][0]["output_type"] == "display_data"
    return state["outputs"][0]["data"][PLOTLY_MIME]


def _bars(shown: dict, name: str) -> dict:
    found = [t for t in shown["data"] if t.get("name") == name]
    assert len(found) == 1, [t.get("name") for t in shown["data"]]
    return found[0]


def test_the_schemes_are_the_packages_and_each_real_shape_has_its_format():
    assert qw.SCHEMES[0] == "bf16" and set(SCHEMES) <= set(qw.SCHEMES) and set(speed_runs.SPEED_SCHEMES) <= set(qw.SCHEMES)
    assert qw.MODELS == ("embedded", "llama-3.1-8b", "llama-3.1-70b")
    assert qw.weight_format("gptq-w4a16", "llama-3.1-8b") == "w4a16 g128, symmetric (GPTQ)"
    assert qw.weight_format("awq-w4a16", "llama-3.1-70b") == "w4a16 g128, asymmetric (AWQ)"
    assert qw.weight_format("w8a8-int8", "llama-3.1-8b") == qw.weight_format("fp8", "llama-3.1-8b") == \
        "fp8 / int8, per channel"
    assert qw.weight_format("bf16-kv-fp8", "llama-3.1-8b") == "bf16"


@pytest.mark.parametrize("scheme, model", [("gptq-w4a16", "llama-3.1-8b"), ("bf16", "llama-3.1-70b"),
                                           ("fp8-dynamic", "llama-3.1-70b"), ("bf16-kv-fp8", "llama-3.1-8b")])
def test_memory_on_a_real_shape_is_weights_alones_arithmetic(scheme, model):
    view = qw.scheme_view(scheme, 64, model)
    m, fmt = view["memory"], qw.weight_format(scheme, model)
    row = next(r for r in sizes.weights_alone((model,)) if r["format"] == fmt)
    cfg = architectures()[model]
    assert m["weight_bytes"] == sizes.predicted_bytes(cfg, fmt)
    assert m["weight_bytes"] / 1e9 == pytest.approx(row["weights_GB"])
    assert m["vs_bf16"] == row["vs_bf16"] and row["provenance"] in m["where"]
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = kv_bytes_per_token(cfg["num_hidden_layers"], cfg["num_key_value_heads"], head_dim,
                                   1 if scheme == "bf16-kv-fp8" else 2)
    assert m["kv_bytes_per_token"] == per_token and m["tokens_per_sequence"] == m["kv_tokens"] // 64
    if scheme != "bf16-kv-fp8":  # the same budget as weights_alone's fit: one 8k sequence fits iff it says so
        assert m["fits_context"] == row["fits_one_H200"]
    left = 0.9 * GPU_PEAKS["H200"].memory_gb * 1e9 - RESERVE_BYTES - sizes.predicted_bytes(cfg, fmt)
    assert m["kv_tokens"] == max(0, int(left // per_token))
    assert f"{m['weight_bytes'] / 1e9:.4g} GB of weights" in view["text"]


def test_the_70b_in_bf16_leaves_no_kv_and_fp8_kv_doubles_the_8bs_capacity():
    no_room = qw.scheme_view("bf16", 1, "llama-3.1-70b")
    assert no_room["memory"]["kv_tokens"] == 0 and "leave no KV room on one H200" in no_room["text"]
    bf16, fp8_kv = (qw.scheme_view(s, 1, "llama-3.1-8b")["memory"] for s in ("bf16", "bf16-kv-fp8"))
    assert bf16["weight_bytes"] == fp8_kv["weight_bytes"] and fp8_kv["kv_tokens"] == pytest.approx(
        2 * bf16["kv_tokens"], abs=1)


def test_the_embedded_models_memory_and_quality_are_the_labs_rows():
    quality, stored = _quality(), _stored()
    view = qw.scheme_view("gptq-w4a16", 1, "embedded", quality, stored, max_increase_pct=1.0)
    assert view["memory"]["weight_bytes"] == stored[2]["file_bytes"] and view["memory"]["bits_per_weight"] == 4.25
    assert "kv_tokens" not in view["memory"] and "live on this CPU" in view["memory"]["where"]
    gate = measures.quality_gate(quality[2]["ppl"], 10.0, 1.0)
    q = view["quality"]
    assert q["ppl_change_pct"] == gate.increase_pct and q["gate"] == gate.sentence and q["passed"] is False
    assert q["agreement"] == 0.67 and "perplexity +1.60%" in view["text"] and "fails" in view["text"]
    assert qw.scheme_view("gptq-w4a16", 1, "embedded", quality, stored, max_increase_pct=2.0)["quality"]["passed"]
    fp8 = qw.scheme_view("fp8", 1, "embedded", quality, stored)
    assert fp8["memory"]["weight_bytes"] is None and "vLLM switch" in fp8["memory"]["why"]
    assert fp8["quality"]["ppl_change_pct"] is None and "no checkpoint to score" in fp8["quality"]["why"]
    awq = qw.scheme_view("awq-w4a16", 1, "embedded", quality, stored)["quality"]
    assert "not quantized in this run" in awq["why"]
    shape = qw.scheme_view("gptq-w4a16", 1, "llama-3.1-8b", quality, stored)  # a real shape: no quality of its own
    assert shape["quality"] == q and "no trained weights here" in shape["text"] and "no trained weights" in \
        shape["captions"][2]


def test_speed_at_the_batch_is_the_recorded_row_with_its_provenance():
    speed = Shown(_speed(), False, RECORDED)
    view = qw.scheme_view("gptq-w4a16", 64, "llama-3.1-8b", speed=speed)
    assert view["batches"] == list(speed_runs.BATCHES)
    assert view["speed"]["decode_tok_s"] == 8783 and view["speed"]["vs_bf16"] == pytest.approx(8783 / 8786)
    assert view["speed"]["where"] == RECORDED and f"[{RECORDED}]" in view["text"]
    assert view["memory"]["vllm"] == {"weight_gib": 5.4, "kv_tokens": 790_000, "where": RECORDED}
    missing = qw.scheme_view("w8a8-int8", 64, speed=speed)["speed"]["why"]
    assert missing == f"no speed run of w8a8-int8 at batch 64 (there: bf16, fp8, gptq-w4a16; {RECORDED})"
    bars = _bars(qw.scheme_figure(view).to_plotly_json(), "decode tok/s")
    assert list(bars["x"]) == ["bf16", "gptq-w4a16", "fp8"] and list(bars["y"]) == [8786, 8783, 11890]
    assert RECORDED in bars["hovertemplate"]
    assert qw.scheme_view("gptq-w4a16", 64, speed=_speed())["speed"] == view["speed"]  # plain rows work too


def test_moving_a_control_updates_the_text_and_the_figure():
    e = qw.QuantizationExplorer.from_lab(_quality(), _stored(), Shown(_speed(), False, RECORDED), 1.0)
    assert e.settings() == {"scheme": "fp8-dynamic", "batch": 1, "model": "llama-3.1-8b"}
    before = e.area.renders
    e.scheme.value = "gptq-w4a16"
    shown = _shown(e)
    assert e.area.renders == before + 1 and "gptq-w4a16 among the schemes" in shown["layout"]["title"]["text"]
    weights = _bars(shown, "weights (GB)")
    chosen = weights["x"].index("gptq-w4a16")
    assert weights["marker"]["opacity"][chosen] == 1.0 and min(weights["marker"]["opacity"]) == 0.3
    assert weights["y"][chosen] == pytest.approx(qw.scheme_view("gptq-w4a16")["memory"]["weight_bytes"] / 1e9)
    e.batch.value = 256
    assert "at batch 256" in e.text.value and _bars(_shown(e), "decode tok/s")["y"] == [20000, 15000, 26000]
    e.model.value = "embedded"
    weights = _bars(_shown(e), "weights (GB)")
    assert weights["x"] == ["bf16", "gptq-w4a16", "fp8-dynamic", "w8a8-int8"]  # the checkpoints made here
    assert weights["y"][1] == pytest.approx(_stored()[2]["file_bytes"] / 1e9)
    assert e.settings() == {"scheme": "gptq-w4a16", "batch": 256, "model": "embedded"}
    assert e.view == qw.scheme_view(**e.settings(), quality=e.quality, stored=e.stored, speed=e.speed)
    assert e.display() is e.widget and e.area.output in e.widget.children
    assert widgets.QuantizationExplorer is qw.QuantizationExplorer


def test_a_missing_recording_draws_no_speed_and_the_caption_says_why():
    e = qw.QuantizationExplorer(speed=Shown(None, False, NOT_RECORDED, "no NVIDIA GPU visible"))
    shown = _shown(e)
    assert e.view["speed"] == {"decode_tok_s": None, "why": NOT_RECORDED} and e.view["batches"] == list(speed_runs.BATCHES)
    assert not [t for t in shown["data"] if t.get("name") in ("decode tok/s", "perplexity change (%)")]
    assert f"Speed: {NOT_RECORDED}: nothing drawn." in e.caption.value and "--steps quantization" in e.text.value
    # the title says why, word for word, over as many lines as the figure's width takes (read as a reader sees it)
    assert f"Quality: {qw.NO_QUALITY}" in e.caption.value and NOT_RECORDED in shown_text(shown["layout"]["title"]["text"])
    assert "vllm" not in e.view["memory"] and e.view["memory"]["weight_bytes"]  # the arithmetic still answers
    assert qw.NO_SPEED in qw.QuantizationExplorer().caption.value
    assert qw.NO_STORAGE in qw.scheme_view("bf16", model="embedded")["memory"]["why"]


@pytest.mark.parametrize("setting, message", [
    ({"scheme": "int3-magic"}, "QuantizationExplorer.scheme='int3-magic': allowed 'bf16', 'gptq-w4a16', "),
    ({"batch": 3}, "QuantizationExplorer.batch=3: allowed 1, 8, 64, 256; Fix: "),
    ({"batch": 8, "speed": [{"scheme": "bf16", "batch": 1, "decode_tok_s": 200.0}]},
     "QuantizationExplorer.batch=8: allowed 1; Fix: "),
    ({"model": "gpt-5"}, "QuantizationExplorer.model='gpt-5': allowed 'embedded', 'llama-3.1-8b', 'llama-3.1-70b'; "),
    ({"max_increase_pct": -1.0}, "QuantizationExplorer.max_increase_pct=-1.0: allowed a number in [0, inf]; Fix: "),
])
def test_bad_settings_are_refused_in_lablibs_message_shape(setting, message):
    errors = []
    for build in (qw.scheme_view, qw.QuantizationExplorer):  # the panel refuses before any widget is built
        with pytest.raises(ValueError) as refused:
            build(**setting)
        errors.append(str(refused.value))
    assert errors[0].startswith(message) and "; Fix: " in errors[0] and errors[1] == errors[0]


def test_from_lab_reads_the_shipped_recording_or_says_it_is_not_recorded():
    e = qw.QuantizationExplorer.from_lab(_quality(), _stored())
    assert e.scheme.value == "fp8-dynamic"
    # the shipped recording (quantization-a) ran online fp8, never the fp8-dynamic checkpoint: said, not borrowed
    assert e.view["speed"]["decode_tok_s"] is None and "no speed run of fp8-dynamic" in e.view["speed"]["why"]
    shipped = recording.speed(force=False).value
    assert f"there: {', '.join(dict.fromkeys(r['scheme'] for r in shipped))}" in e.view["speed"]["why"]
    online = qw.QuantizationExplorer.from_lab(_quality(), _stored(), scheme="fp8")
    recorded = next(r for r in shipped if (r["scheme"], r["batch"]) == ("fp8", 1))
    assert online.view["speed"]["decode_tok_s"] == recorded["decode_tok_s"]
    assert "Speed: recorded on NVIDIA H200" in online.caption.value


def test_each_panel_says_where_its_numbers_come_from():
    view = qw.scheme_view("gptq-w4a16", 8, "llama-3.1-8b", _quality(), _stored(), Shown(_speed(), False, RECORDED))
    titles = [a["text"] for a in qw.scheme_figure(view).to_plotly_json()["layout"]["annotations"][:3]]
    assert "[arithmetic, 90% of one H200]" in titles[0] and f"[{RECORDED}]" in titles[1]
    assert "[live on this CPU, embedded model]" in titles[2]
    empty = qw.scheme_figure(qw.scheme_view(model="embedded", speed=Shown(None, False, NOT_RECORDED)))
    assert "[not recorded yet]" in empty.layout.annotations[1].text and "[live on this CPU]" in \
        empty.layout.annotations[0].text
    assert not [t for t in empty.data if t.name in ("weights (GB)", "decode tok/s")]  # nothing invented
    e = qw.QuantizationExplorer.from_lab(_quality(), _stored(), Shown(None, False, NOT_RECORDED), scheme="bf16")
    assert e.scheme.value == "bf16"  # a control passed to from_lab wins over the first quantized scheme
