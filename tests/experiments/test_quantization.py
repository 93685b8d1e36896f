"""Quality measures of lab 06: perplexity against hand-computed values on fake models whose logits are set,
and against transformers' own loss on the embedded model; greedy agreement and first divergence on a hand
case; the quality gate (pass, fail, the boundary, refusals); the evaluation set disjoint from calibration;
and one live quality table (fp8-dynamic only, 2 evaluation windows, 2 prompts x 8 tokens, ~20 s on this CPU),
then the same call again reusing the checkpoint.

The notebook's other steps: what a checkpoint stores, read from hand-written safetensors headers and from the
bf16 target; the byte formula against compressed-tensors' layout by hand, the architectures' parameter counts
and a live fp8 checkpoint exactly; 8B and 70B weights alone; why group 64; the seeds' claims' verdicts on hand
rows; lm_head kept against quantized, live on fp8 (~15 s). The GPU half on the fake vLLM: vLLM's log read for
kernels and memory, fixed-length prompts, refusals before any engine, the speed runs, the recording step, and
the notebook's live and not-recorded-yet paths.
"""
import dataclasses
import json
import math
import re
import sys
from types import SimpleNamespace

import pytest

from lablib.experiments.quantization import (
    checkpoints as quantization_checkpoints,
    measures,
    quality as quantization_quality,
    record as quantization_record,
    recording as quantization_recording,
    sizes,
    speed_runs as quantization_speed_runs,
    verdicts,
    vllm_ppl as quantization_vllm_ppl,
)
from lablib.workloads import Workload, load_workload

torch = pytest.importorskip("torch")
pytest.importorskip("transformers").utils.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = r"^{owner}\.{field}=.*: allowed .+; Fix: .+"
LOG = math.log


class TableModel:
    """A fake causal LM: the logits at position t are log P(. | token at t), from a fixed table."""

    def __init__(self, table):
        self.table = torch.tensor(table, dtype=torch.float64).log()
        self.config = SimpleNamespace(max_position_embeddings=16)

    def __call__(self, input_ids, **kwargs):
        return SimpleNamespace(logits=self.table[input_ids])


class SplitTokenizer:
    def __call__(self, text):
        return {"input_ids": [int(t) for t in text.split()]}


UNIFORMISH = [[0.5, 0.25, 0.125, 0.125]] * 4  # the same distribution after every token


def test_perplexity_is_exp_of_the_mean_nll_over_predicted_tokens_pooled_over_texts():
    model = TableModel(UNIFORMISH)
    one = measures.perplexity(model, None, [[0, 0, 1, 2]])  # predicts 0, 1, 2: p = 1/2, 1/4, 1/8
    assert one.tokens == 3 and one.texts == 1
    assert one.nll == pytest.approx((LOG(2) + LOG(4) + LOG(8)) / 3, abs=1e-12)
    assert one.ppl == pytest.approx(4.0, abs=1e-12)
    two = measures.perplexity(model, SplitTokenizer(), ["0 0 1 2", "3 3"])  # one more token, p = 1/8
    assert two.tokens == 4 and two.ppl == pytest.approx(2 ** 2.25, abs=1e-12)  # token-weighted, not mean of ppls
    assert measures.perplexity(model, None, [[0, 0, 1, 2, 3, 3]], max_length=4).ppl == pytest.approx(4.0)


def test_perplexity_scores_the_next_token_not_the_current_one():
    model = TableModel([[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.4, 0.1], [0.25] * 4, [0.25] * 4])
    got = measures.perplexity(model, None, [[0, 1, 2]])  # P(1|0) = 0.6, P(2|1) = 0.4
    assert got.ppl == pytest.approx(1 / math.sqrt(0.24), abs=1e-12)  # 2.0412; shifted by one it would differ


def test_from_logprobs_is_the_same_formula_and_refuses_nonsense():
    assert measures.from_logprobs([[LOG(0.5), LOG(0.25), LOG(0.125)], [LOG(0.125)]]).ppl == pytest.approx(2 ** 2.25)
    for bad in ([[]], [[0.3]], [[float("nan")]]):
        with pytest.raises(ValueError, match=SHAPE.format(owner="from_logprobs", field="logprobs")):
            measures.from_logprobs(bad)
    with pytest.raises(ValueError, match="at least one predicted token"):
        measures.perplexity(TableModel(UNIFORMISH), None, [[1]])
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="max_length")):
        measures.perplexity(TableModel(UNIFORMISH), None, [list(range(4)) * 5])  # 20 tokens, context 16


def test_perplexity_agrees_with_transformers_loss_on_the_embedded_model():
    from lablib.models import embedded_path
    from transformers import AutoTokenizer

    model, tok = measures.load_model(embedded_path("target")), AutoTokenizer.from_pretrained(str(embedded_path("target")))
    ids = measures.evaluation_set(2).prompt_ids(tok)
    with torch.inference_mode():
        losses = [model(torch.tensor([i]), labels=torch.tensor([i])).loss.item() for i in ids]
    got = measures.perplexity(model, tok, ids)
    assert got.tokens == 1022 and got.ppl == pytest.approx(math.exp(sum(losses) / 2), rel=1e-5)  # equal lengths


def test_greedy_agreement_and_first_divergence_on_a_hand_case():
    a = measures.agreement([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 9, 4], [5, 6, 7, 8]])
    assert a.matched == (0.75, 1.0) and a.first_divergence == (2, None)
    assert a.agreement == pytest.approx(0.875) and a.identical == 1
    assert a.mean_first_divergence == pytest.approx(3.0)  # (2 + 4) / 2: a request that never diverges counts 4
    with pytest.raises(ValueError, match=SHAPE.format(owner="agreement", field="tokens")):
        measures.agreement([[1, 2]], [[1, 2, 3]])
    with pytest.raises(ValueError, match=SHAPE.format(owner="agreement", field="tokens")):
        measures.agreement([[1, 2]], [])


def test_the_quality_gate_passes_within_the_users_threshold_and_fails_beyond_it():
    g = measures.quality_gate(16.7, 16.5, 2.0)
    assert g.passed and bool(g) and g.increase_pct == pytest.approx(100 * (16.7 / 16.5 - 1))
    assert g.sentence.startswith("passes: perplexity 16.700 is 1.21% above the reference's 16.500, within the 2%")
    f = measures.quality_gate(16.7, 16.5, 1.0)
    assert not f.passed and not f and "more than the 1% allowed" in f.sentence
    assert measures.quality_gate(16.5, 16.5, 0.0).passed  # no increase passes a zero threshold
    better = measures.quality_gate(16.4, 16.5, 0.0)
    assert better.passed and "below" in better.sentence
    for args, field in (((0.0, 16.5, 1.0), "ppl"), ((16.5, float("nan"), 1.0), "ppl_ref"),
                        ((16.5, 16.5, -1.0), "max_increase_pct")):
        with pytest.raises(ValueError, match=SHAPE.format(owner="quality_gate", field=field)):
            measures.quality_gate(*args)


def test_the_evaluation_set_is_disjoint_from_calibration_and_an_overlap_is_refused():
    cal, ev = load_workload("calibration"), measures.evaluation_set()
    assert len(ev) == 64 and len(measures.evaluation_set(2)) == 2
    measures.check_disjoint(cal, ev)
    leaky = Workload("evaluation", 1, "leaky", ev.requests[:1] + cal.requests[:1], ev.manifest)
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="evaluation")):
        measures.check_disjoint(cal, leaky)
    shared = Workload("evaluation", 1, "shared files", ev.requests, {**ev.manifest,
                      "source_files": ev.manifest["source_files"] + cal.manifest["source_files"][:1]})
    with pytest.raises(ValueError, match="share 1 source files"):
        measures.check_disjoint(cal, shared)


def test_a_live_quality_table_for_fp8_then_reused(tmp_path):
    pytest.importorskip("llmcompressor", reason="install lablib[quant]")
    kwargs = dict(work_dir=tmp_path, eval_texts=2, prompts=2, max_new_tokens=8, max_increase_pct=1.0)
    rows = quantization_quality.quality_table(("fp8-dynamic",), **kwargs)
    ref, fp8 = rows
    assert ref["scheme"] == "bf16" and ref["ppl_change_pct"] == 0.0 and ref["agreement"] == 1.0
    assert fp8["scheme"] == "fp8-dynamic" and not fp8["reused"] and fp8["calibration"] is None
    assert math.isfinite(fp8["ppl"]) and abs(fp8["ppl_change_pct"]) < 5.0
    assert fp8["weight_bytes"] < ref["weight_bytes"] and 0.0 <= fp8["agreement"] <= 1.0
    assert re.match(r"(passes|fails): perplexity", fp8["gate"])
    assert all(r["provenance"].startswith("measured on this machine's CPU") for r in rows)
    again = quantization_quality.quality_table(("fp8-dynamic",), **kwargs)[1]
    assert again["reused"] and again["ppl"] == fp8["ppl"] and again["first_divergence"] == fp8["first_divergence"]
    assert [r["passed"] for r in quantization_quality.gate_rows(rows, 100.0)] == [True]


# ------------------------------------------------ the notebook's other steps: storage, lm_head, weights alone, claims


def _write_checkpoint(folder, tensors, config):
    """A safetensors file with only a header and zero bytes of the right sizes (no torch): what storage() reads."""
    import json as _json
    import struct

    folder.mkdir(parents=True, exist_ok=True)
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = _json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)
    (folder / "config.json").write_text(_json.dumps(config))
    return folder


def test_storage_splits_linear_layers_lm_head_and_the_rest_from_the_headers(tmp_path):
    gptq = {"quantization_config": {"config_groups": {"group_0": {"weights": {"num_bits": 4}}}},
            "tie_word_embeddings": False}
    folder = _write_checkpoint(tmp_path / "gptq", {
        "model.embed_tokens.weight": ("BF16", [10, 8], 160),
        "model.layers.0.mlp.down_proj.weight_packed": ("I32", [4, 2], 32),  # 4 x 16 int4 weights in 32 bytes
        "model.layers.0.mlp.down_proj.weight_scale": ("BF16", [4, 1], 8),  # one scale per group of 16
        "model.layers.0.mlp.down_proj.weight_shape": ("I64", [2], 16),
        "model.norm.weight": ("BF16", [8], 16),
        "lm_head.weight": ("BF16", [10, 8], 160)}, gptq)
    s = sizes.storage(folder)
    assert (s["linear_params"], s["linear_bytes"]) == (64, 56) and s["bytes_per_weight"] == pytest.approx(56 / 64)
    assert s["linear_dtype"] == "int4, 8 packed per int32" and s["lm_head"] == "its own BF16 tensor"
    assert (s["lm_head_bytes"], s["rest_bytes"], s["tensor_bytes"]) == (160, 176, 392)
    tied = _write_checkpoint(tmp_path / "tied", {"model.embed_tokens.weight": ("BF16", [10, 8], 160),
                                                 "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", [8, 8], 64)},
                             {"tie_word_embeddings": True})
    t = sizes.storage(tied)
    assert t["lm_head"].startswith("tied") and t["bits_per_weight"] == 8.0 and t["linear_dtype"] == "fp8 e4m3"


def test_storage_of_the_bf16_target_is_two_bytes_per_linear_weight():
    from lablib.models import embedded_path

    s = sizes.storage(embedded_path("target"), "bf16")
    assert s["bytes_per_weight"] == 2.0 and s["linear_params"] == 3_686_400  # 5 x (q, k, v, o, gate, up, down)
    assert s["lm_head"].startswith("tied") and s["rest_dtypes"] == "BF16"
    assert s["tensor_bytes"] == sizes.predicted_bytes(json.loads((embedded_path("target") / "config.json").read_text()),
                                                   "bf16")


def test_linear_bytes_is_compressed_tensors_layout_by_hand():
    # down_proj of the embedded target at group 64: I32 [256, 88] packed weights, BF16 [256, 11] scales,
    # and for AWQ (asymmetric) I32 [32, 11] zero points, as the checkpoints' headers show
    assert sizes.linear_bytes(256, 704, 4, 64, True) == 256 * 88 * 4 + 256 * 11 * 2
    assert sizes.linear_bytes(256, 704, 4, 64, False) == 256 * 88 * 4 + 256 * 11 * 2 + 32 * 11 * 4
    assert sizes.linear_bytes(256, 704, 8, None, True) == 256 * 704 + 256 * 2  # fp8/int8: a bf16 scale per output row
    assert sizes.linear_bytes(256, 704, 16, None, True) == 256 * 704 * 2


def test_predicted_bf16_bytes_are_the_architectures_parameter_count_times_two():
    from lablib.models import architectures, parameter_count

    for name in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b"):  # untied, untied, tied
        cfg = architectures()[name]
        assert sizes.predicted_bytes(cfg, "bf16") == parameter_count(cfg) * 2, name


def test_weights_alone_70b_fits_one_h200_at_8_bits_not_16_and_the_claims_read_it():
    rows = {(r["model"], r["format"]): r for r in sizes.weights_alone()}
    bf16, int8 = rows[("llama-3.1-70b", "bf16")], rows[("llama-3.1-70b", "fp8 / int8, per channel")]
    assert 141 < bf16["weights_GB"] < 141.2 and not bf16["fits_one_H200"] and int8["fits_one_H200"]
    assert 0.51 < int8["vs_bf16"] < 0.52  # not exactly half: embeddings and lm_head stay 16-bit
    g128, g64 = rows[("llama-3.1-70b", "w4a16 g128, symmetric (GPTQ)")], rows[("llama-3.1-70b",
                                                                             "w4a16 g64, symmetric (GPTQ)")]
    assert g128["weights_GB"] < 40 < g64["weights_GB"]  # "under 40 GB" holds at group 128 only
    assert all(r["fits_one_H200"] for (m, _), r in rows.items() if m == "llama-3.1-8b")
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="models")):
        sizes.weights_alone(("no-such-model",))


def test_group_size_rows_show_why_64_on_the_embedded_target():
    rows = {r["input_width"]: r for r in quantization_checkpoints.group_size_rows()}
    assert set(rows) == {256, 704} and rows[704]["modules"] == "down_proj" and rows[704]["linears"] == 5
    assert rows[704]["tiles_128"] == "no (5.5 x 128)" and rows[704]["tiles_64"] == "704 = 11 x 64"
    assert {r["default_group_size"] for r in rows.values()} == {64}


def _quality(pcts, agree=None, first=None):
    rows = [{"scheme": "bf16", "ppl": 10.0, "ppl_change_pct": 0.0, "agreement": 1.0, "eval": "evaluation@v1[:2]",
             "greedy": "2 journey prompts x 8 tokens"}]
    for s, p in pcts.items():
        rows.append({"scheme": s, "ppl": 10.0 * (1 + p / 100), "ppl_change_pct": p,
                     "agreement": (agree or {}).get(s, 0.5), "mean_first_divergence": (first or {}).get(s, 4.0),
                     "quantize_s": 0.1, "group_size": 64, "calibration": {"samples": 16},
                     "gate": "passes" if p <= 1 else "fails", "weight_bytes": 1})
    return rows


def _stored_and_lm() -> tuple[list[dict], list[dict]]:
    """storage_rows' and lm_head_rows' shapes for the claims: bf16 and fp8-dynamic stored, lm_head kept and not."""
    stored = [{"scheme": s, "vs_bf16": v, "rest_dtypes": "BF16"} for s, v in (("bf16", 1.0), ("fp8-dynamic", 0.61))]
    lm = [{"scheme": "fp8-dynamic", "lm_head": h, "ppl_change_pct": p, "size_vs_kept_pct": z, "lm_head_share": 0.22}
          for h, p, z in (("kept 16-bit", 0.2, 0.0), ("quantized too", 0.3, 18.2))]
    return stored, lm


def test_under_one_percent_and_the_claims_verdicts_follow_the_numbers():
    from lablib.session import Shown

    quality = _quality({"fp8-dynamic": 0.2, "gptq-w4a16": 1.6, "awq-w4a16": 2.4},
                       agree={"gptq-w4a16": 0.67, "awq-w4a16": 0.27})
    text = verdicts.under_one_percent(quality)
    assert "fp8-dynamic +0.20% (under)" in text and "gptq-w4a16 +1.60% (not under)" in text
    assert text.endswith("Verdict: holds for fp8-dynamic; not for gptq-w4a16, awq-w4a16.")
    stored, lm = _stored_and_lm()
    speed = [{"scheme": s, "batch": b, "decode_tok_s": v} for s, b, v in (
        ("bf16", 1, 210), ("bf16", 64, 8786), ("gptq-w4a16", 1, 278), ("gptq-w4a16", 64, 8783),
        ("fp8", 1, 299), ("fp8", 64, 11890))]
    got = {c["claim"]: c for c in verdicts.claims(quality, stored, lm, sizes.weights_alone(), Shown(speed, False, "recorded"))}
    assert got["the accuracy loss is under 1%"]["verdict"] == "holds only in part"
    assert got["a 70B model from FP16 to INT8 halves its memory"]["verdict"] == "holds"
    assert got["4-bit GPTQ/AWQ compress 140 GB to under 40 GB"]["verdict"] == "holds only in part"  # g64: 40.6 GB
    awq = got["AWQ keeps more salient weights and suits generation better than GPTQ"]
    assert awq["verdict"] == "does not hold" and "AWQ +2.40% perplexity, 27% greedy agreement" in awq["evidence"]
    assert got["FP8 is Hopper's native format, no offline quantization needed"]["verdict"] == "holds"
    faster = got["fewer bytes per weight, faster decode (int4's ~3.5x fewer bytes)"]
    assert faster["verdict"] == "holds only in part" and "batch 1: GPTQ 278 vs bf16 210" in faster["evidence"]
    none = {c["claim"]: c for c in verdicts.claims(quality[:3], stored, lm, sizes.weights_alone(),
                                             Shown(None, False, "not recorded yet"))}
    assert none["AWQ keeps more salient weights and suits generation better than GPTQ"]["verdict"] == \
        "not measured here"
    assert none["fewer bytes per weight, faster decode (int4's ~3.5x fewer bytes)"]["verdict"] == "not measured here"
    assert none["FP8 is Hopper's native format, no offline quantization needed"]["verdict"] == \
        "holds for the data-free part"


def test_the_awq_claim_is_read_from_the_recording_when_the_run_left_awq_out_and_labelled_so():
    from lablib.session import Shown

    quality = _quality({"fp8-dynamic": 0.2, "gptq-w4a16": 1.6})  # a CPU run: no AWQ
    stored, lm = _stored_and_lm()
    recording = {"gpu": "NVIDIA H200", "date": "2026-12-02",
                 "cpu_rows": _quality({"gptq-w4a16": 1.6, "awq-w4a16": 2.43}, agree={"gptq-w4a16": 0.61,
                                                                                     "awq-w4a16": 0.25}),
                 "rows": [{"scheme": "gptq-w4a16", "ppl_change_pct": 1.61}, {"scheme": "awq-w4a16", "ppl_change_pct": 2.38}]}
    speed = [{"scheme": s, "batch": b, "decode_tok_s": v} for s, b, v in (("bf16", 1, 205), ("fp8", 1, 289))]

    def claim(rec, name="AWQ keeps more salient weights and suits generation better than GPTQ"):
        got = verdicts.claims(quality, stored, lm, sizes.weights_alone(), Shown(speed, False, "recorded"), recording=rec)
        return {c["claim"]: c for c in got}[name]

    both = verdicts.claims(_quality({"gptq-w4a16": 1.6, "awq-w4a16": 1.0}, agree={"gptq-w4a16": 0.5, "awq-w4a16": 0.7}),
                     stored, lm, sizes.weights_alone(), Shown(speed, False, "recorded"), recording=recording)
    mine = {c["claim"]: c for c in both}["AWQ keeps more salient weights and suits generation better than GPTQ"]
    assert mine["verdict"] == "holds" and mine["where"] == "live on this CPU (embedded model)"  # the run's own first
    awq = claim(recording)
    assert awq["verdict"] == "does not hold"
    assert "AWQ +2.43% perplexity, 25% greedy agreement" in awq["evidence"]
    assert "served by vLLM: AWQ +2.38%, GPTQ +1.61%" in awq["evidence"]
    assert awq["where"].startswith("recorded on NVIDIA H200, 2026-12-02 (step quantization-quality")
    assert "scored on its CPU and by vLLM" in awq["where"]
    unserved = claim({**recording, "rows": [], "gpu": None})
    assert "served by vLLM" not in unserved["evidence"] and "and by vLLM" not in unserved["where"]
    assert unserved["where"].startswith("recorded on a GPU, 2026-12-02")
    better = claim({**recording, "cpu_rows": _quality({"gptq-w4a16": 1.6, "awq-w4a16": 1.2},
                                                      agree={"gptq-w4a16": 0.5, "awq-w4a16": 0.7})})
    assert better["verdict"] == "holds"  # the verdict follows the recorded numbers, not a fixed answer
    for rec in (None, {**recording, "cpu_rows": _quality({"gptq-w4a16": 1.6})}):  # none, or no AWQ recorded either
        assert claim(rec)["verdict"] == "not measured here"
    faster = claim(recording, "fewer bytes per weight, faster decode (int4's ~3.5x fewer bytes)")
    assert faster["verdict"] == "not measured here"
    assert "not measured yet (step quantization-b)" in faster["evidence"] and "batch 1 x1.41" in faster["evidence"]
    live = {c["claim"]: c for c in verdicts.claims(quality, stored, lm, sizes.weights_alone(), Shown(speed, True, "live on X"))}
    assert live["fewer bytes per weight, faster decode (int4's ~3.5x fewer bytes)"]["evidence"].startswith(
        "GPTQ is not among this run's speed schemes")  # live without its checkpoint: the fix, not a recording step


def test_quality_recording_is_the_packed_quantization_quality_step_or_none(monkeypatch):
    from lablib.experiments.quantization import vllm_ppl

    facts = {"quantization_quality": {"rows": [], "cpu_rows": []}}
    monkeypatch.setattr(vllm_ppl, "reference_facts", lambda: facts)  # the name quality_recording calls
    assert vllm_ppl.quality_recording() == facts["quantization_quality"]
    monkeypatch.setattr(vllm_ppl, "reference_facts", lambda: {})
    assert vllm_ppl.quality_recording() is None


def test_quiet_progress_disables_bars_only_inside_the_block():
    import io

    import tqdm

    out = io.StringIO()
    with quantization_checkpoints.quiet_progress():
        assert tqdm.tqdm(range(3), file=out).disable
    assert not tqdm.tqdm(range(3), file=out).disable


def test_quantize_all_storage_and_lm_head_both_ways_live_on_fp8(tmp_path):
    """fp8-dynamic (data-free, a few seconds a checkpoint): the default recipe and lm_head quantized too."""
    pytest.importorskip("llmcompressor", reason="install lablib[quant]")
    from lablib.models import embedded_path

    made = quantization_checkpoints.quantize_all(("fp8-dynamic",), work_dir=tmp_path, num_samples=2)
    assert made[0]["calibration"] == "none (data-free)" and not made[0]["reused"]
    assert "QuantizationModifier" in quantization_checkpoints.recipe_text(tmp_path, "fp8-dynamic")
    stored = sizes.storage_rows(("fp8-dynamic",), tmp_path)
    cfg = json.loads((embedded_path("target") / "config.json").read_text())
    assert stored[1]["tensor_bytes"] == sizes.predicted_bytes(cfg, "fp8 / int8, per channel")  # the formula, exactly
    kwargs = {"work_dir": tmp_path, "eval_texts": 2, "prompts": 2, "max_new_tokens": 4, "num_samples": 2}
    quality = quantization_quality.quality_table(("fp8-dynamic",), **kwargs)
    kept, both = quantization_quality.lm_head_rows("fp8-dynamic", quality=quality, **kwargs)
    assert kept["reused"] and kept["ppl"] == quality[1]["ppl"] and kept["stored_as"].startswith("tied")
    assert both["stored_as"] == "quantized (fp8 e4m3)" and both["lm_head_bytes"] > 0
    assert both["weight_bytes"] > kept["weight_bytes"]  # the tied table gains a quantized copy: larger, not smaller
    assert sizes.storage(tmp_path / "fp8-dynamic+lm_head")["tensor_bytes"] == \
        sizes.predicted_bytes(cfg, "fp8 / int8, per channel", quantize_lm_head=True)
    assert math.isfinite(both["ppl"]) and both["ppl_ref"] == quality[0]["ppl"]
    assert "larger" in quantization_quality.lm_head_sentence([kept, both])
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="quality")):
        quantization_quality.lm_head_rows("fp8-dynamic", quality=quality, **{**kwargs, "max_new_tokens": 5})  # other greedy lengths
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="scheme")):
        quantization_checkpoints.recipe_text(tmp_path, "awq-w4a16")


# ------------------------------------------------ the GPU half, on the fake vLLM


VLLM_LOG = """(EngineCore_DP0 pid=1) INFO 12-01 [compressed_tensors_wNa16.py:114] Using MacheteLinearKernel for CompressedTensorsWNA16
(EngineCore_DP0 pid=1) INFO 12-01 [gpu_model_runner.py:3100] Model loading took 5.4321 GiB and 3.2 seconds
(EngineCore_DP0 pid=1) INFO 12-01 [__init__.py:61] Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod
(EngineCore_DP0 pid=1) INFO 12-01 [gpu_worker.py:300] Available KV cache memory: 113.08 GiB
"""


def test_vllm_log_facts_read_the_kernels_and_memory_vllm_prints():
    f = quantization_speed_runs.vllm_log_facts(VLLM_LOG)
    assert f["linear_kernels"] == {"CompressedTensorsWNA16": "MacheteLinearKernel",
                                   "Fp8LinearMethod": "CutlassFP8ScaledMMLinearKernel"}
    assert (f["model_load_gib"], f["kv_cache_gib"]) == (5.4321, 113.08)
    assert quantization_speed_runs.vllm_log_facts("nothing here") == {"linear_kernels": {}, "model_load_gib": None, "kv_cache_gib": None}


def test_fixed_workload_has_exact_lengths_and_cycles():
    from lablib.models import load_tokenizer, resolve_model

    wl = quantization_speed_runs.fixed_workload(3, 32, 7)
    tok = load_tokenizer(resolve_model("embedded"))
    assert len(wl) == 3 and all(len(tok(r.prompt)["input_ids"]) == 32 and r.max_new_tokens == 7 for r in wl.requests)
    assert len({r.id for r in quantization_speed_runs.fixed_workload(40, 500, 1).requests}) == 40  # more than the windows hold: cycled


def test_speed_runs_refuse_before_any_engine(tmp_path, monkeypatch):
    import lablib.engines.vllm as engine

    for module in (engine, quantization_speed_runs):  # the engine's module, and the name vllm_speed_runs calls
        monkeypatch.setattr(module, "VLLMEngine", lambda *a, **k: pytest.fail("an engine was made before the refusal"))
    with pytest.raises(ValueError, match="prepare_checkpoints"):
        quantization_speed_runs.vllm_speed_runs(("bf16", "gptq-w4a16"), (1,), model="embedded", work_dir=tmp_path)
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="schemes")):
        quantization_speed_runs.vllm_speed_runs(("int3",), (1,), model="embedded", work_dir=tmp_path)
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="batches")):
        quantization_speed_runs.vllm_speed_runs(("bf16",), (0,), model="embedded", work_dir=tmp_path)


def test_speed_not_recorded_yet_names_its_step(monkeypatch):
    monkeypatch.setattr(quantization_recording, "load_reference", lambda *steps, prefix=None: [])  # a tree with no lab 06 runs
    shown = quantization_recording.speed(force=False)
    assert shown.value is None and "--steps quantization" in shown.label
    assert quantization_speed_runs.kv_sentence(shown.value).startswith("FP8 KV cache: not measured here")


def test_the_recorded_speed_shows_what_a_cell_asked_or_says_what_stands_in(start, monkeypatch, capsys):
    """Issue 11.8, on runs of the fake vLLM recorded as the step would: the knobs they ran with are read back from
    their rows (model, batches, schemes, lengths, engine settings); asked ones shown exactly say nothing, the
    recording is shown whole (issue 28), and every knob it ran otherwise is named. Not recorded: no value, no error."""
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    kw = {"model": "embedded", "prompt_len": 16, "output_len": 4, "gpu_memory_utilization": 0.3, "max_model_len": 256}
    runs = [dataclasses.replace(r, provenance="recorded")
            for r in quantization_speed_runs.vllm_speed_runs(("bf16", "fp8"), (1, 4), **kw)]
    monkeypatch.setattr(quantization_recording, "load_reference", lambda *steps, prefix=None: runs)
    same = quantization_recording.speed(force=False, schemes=("fp8", "bf16"), batches=(1, 4), **kw)
    assert same.stand_ins == {} and len(same.value) == 4 and capsys.readouterr().out == ""
    part = quantization_recording.speed(force=False, batches=(4,), **kw)
    assert part.stand_ins == {"batches": {"asked": [4], "shown": [1, 4]}} and part.value == same.value
    missing, shown_instead = capsys.readouterr().out.splitlines()  # every scheme the recording lacks is named,
    assert missing == (  # with the step that records it; then the one line on the batches shown instead
        "bf16-kv-fp8: not measured on embedded yet (step quantization-a); gptq-w4a16, w8a8-int8, awq-w4a16: not "
        "measured on embedded yet (step quantization-b, after quantization-prepare makes its checkpoints)")
    assert shown_instead.startswith("Shown instead of what this cell asked") and "batches: asked [4]" in shown_instead
    only_b1 = [r for r in quantization_speed_runs.speed_rows(runs) if r["batch"] == 1]  # a scheme recorded at another batch is there
    assert quantization_recording.missing_line(only_b1 + [{**only_b1[0], "scheme": "gptq-w4a16", "batch": 4}],
                                     ("bf16", "gptq-w4a16")) == ""
    lab = quantization_recording.speed(force=False)  # the notebook's call: the synthetic 8B at BATCHES
    assert lab.stand_ins == {"model": {"asked": "synthetic:llama-3.1-8b", "shown": "embedded"},
                             "batches": {"asked": [1, 8, 64, 256], "shown": [1, 4]}} and len(lab.value) == 4
    assert "model: asked synthetic:llama-3.1-8b, shown embedded; batches: asked [1, 8, 64, 256], shown [1, 4]." in (
        capsys.readouterr().out)
    other = quantization_recording.speed(force=False, schemes=("gptq-w4a16",), batches=(1, 4),
                     **(kw | {"prompt_len": 128, "max_model_len": 4096}))
    assert other.stand_ins == {"schemes": {"asked": ["gptq-w4a16"], "shown": ["bf16", "fp8"]},
                               "workload": {"asked": "fixed-128x4", "shown": "fixed-16x4"},
                               "max_model_len": {"asked": 4096, "shown": 256}}
    monkeypatch.setattr(quantization_recording, "load_reference", lambda *steps, prefix=None: [])
    none = quantization_recording.speed(force=False, schemes=("awq-w4a16",), batches=(2,), model="embedded")
    assert none.value is None and none.stand_ins == {} and "--steps quantization" in none.label


def test_speed_runs_and_record_on_the_fake_vllm(start, tmp_path, monkeypatch):
    import pynvml

    from lablib.results import ResultStore

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)  # device_facts sees the fake H200 too
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    kw = {"model": "embedded", "prompt_len": 16, "output_len": 4, "gpu_memory_utilization": 0.3, "max_model_len": 256}
    results = quantization_speed_runs.vllm_speed_runs(("bf16", "fp8", "bf16-kv-fp8"), (1, 4), **kw)
    assert [r.step for r in results] == [f"quant-{s}-b{b}" for s in ("bf16", "fp8", "bf16-kv-fp8") for b in (1, 4)]
    assert [r.summary["requests"] for r in results] == [1, 4] * 3
    assert results[2].config["quantization"] == "fp8" and results[4].config["kv_cache_dtype"] == "fp8"
    rows = quantization_speed_runs.speed_rows(results)
    assert {r["gpu"] for r in rows} == {"NVIDIA H200"}
    assert all(r["decode_tok_s"] > 0 and r["roofline_tok_s"] > 0 for r in rows)  # its 4.8 TB/s, the weights' bytes
    assert rows[0]["linear_kernels"] == "none logged (bf16: cuBLAS)" and rows[0]["kv_tokens"] == 1234 * 16
    assert rows[4]["kv_tokens"] == 2 * 1234 * 16 and "x2.00" in quantization_speed_runs.kv_sentence(rows)  # fp8 KV: half the bytes a token
    store, facts = ResultStore(tmp_path / "r.jsonl"), {}
    quantization_record.record(tmp_path, store, facts, schemes=("bf16",), batches=(2,), **kw)
    assert [r.provenance for r in store.load()] == ["recorded"] and facts["quantization"]["batches"] == [2]
    assert facts["quantization"]["schemes"]["bf16"]["kv_tokens"] == 1234 * 16
    assert "quantization: 1 runs" in (tmp_path / "log.txt").read_text()


KW = {"model": "embedded", "prompt_len": 16, "output_len": 4, "gpu_memory_utilization": 0.3, "max_model_len": 256}


@pytest.fixture
def recording_gpu(start, monkeypatch):
    """The fake vLLM on the fake H200, seen by device_facts too (as the recording steps run)."""
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    return start


def test_the_speed_roofline_leaves_out_an_untied_input_embedding(recording_gpu):
    """A decode step reads only its batch's rows of the input embedding table: with untied embeddings (the 8B's
    128256 x 4096 bf16 table, 1,050,673,152 bytes) the roofline's weight bytes leave it out; tied, the LM head reads
    the whole table every step and nothing is left out; a record that does not say leaves out nothing either.
    weight_gib stays what vLLM holds."""
    from lablib.mechanisms.gpus import GPU_PEAKS

    r = quantization_speed_runs.vllm_speed_runs(("bf16",), (2,), **KW)[0]
    kv, peak = r.engine_facts["kv_bytes_per_token"], GPU_PEAKS["H200"].peak_bw
    assert peak == 4.8e12 and kv > 0 and [(q.prompt_tokens, q.output_tokens) for q in r.requests] == [(16, 4)] * 2
    step_kv = kv * 2 * 18  # two sequences at a mean context of 16 + 4 / 2 tokens

    def with_model(**model):
        arch = {k: v for k, v in r.model.items() if k != "tie_word_embeddings"}
        return dataclasses.replace(r, engine_facts={**r.engine_facts, "model_load_gib": 15.0},
                                   model={**arch, "vocab": 128256, "hidden": 4096, **model})

    untied, tied, unsaid = quantization_speed_runs.speed_rows([with_model(tie_word_embeddings=False), with_model(tie_word_embeddings=True),
                                          with_model()])
    assert untied["roofline_tok_s"] == pytest.approx(2 * peak / (16_106_127_360 - 1_050_673_152 + step_kv), rel=1e-12)
    assert tied["roofline_tok_s"] == pytest.approx(2 * peak / (16_106_127_360 + step_kv), rel=1e-12)
    assert unsaid["roofline_tok_s"] == tied["roofline_tok_s"]
    assert untied["weight_gib"] == tied["weight_gib"] == 15.0
    assert untied["of_roofline"] == pytest.approx(untied["decode_tok_s"] / untied["roofline_tok_s"])


def test_record_runs_what_can_run_and_names_what_it_left_out(recording_gpu, tmp_path):
    """Step quantization with no checkpoint made: the three vLLM switches are recorded, each checkpoint scheme is
    named with why it was left out (where its checkpoint should be, and the step that makes it)."""
    from lablib.results import ResultStore

    store, facts, work = ResultStore(tmp_path / "r.jsonl"), {}, tmp_path / "work"
    quantization_record.record(tmp_path, store, facts, batches=(2,), work_dir=work, **KW)
    got = facts["quantization"]
    assert [r.step for r in store.load()] == ["quant-bf16-b2", "quant-fp8-b2", "quant-bf16-kv-fp8-b2"]
    assert list(got["schemes"]) == ["bf16", "fp8", "bf16-kv-fp8"] and got["asked"] == list(quantization_speed_runs.SPEED_SCHEMES)
    assert sorted(got["skipped"]) == ["awq-w4a16", "gptq-w4a16", "w8a8-int8"]
    assert all(str(work / "embedded" / s) in why and "quantization-prepare" in why for s, why in got["skipped"].items())
    assert got["failed"] == {} and got["checkpoints"] == {} and got["complete"] is True


def test_a_failing_engine_is_named_and_the_other_schemes_still_record(recording_gpu, tmp_path, fp8_engines_die):
    from lablib.results import ResultStore

    store, facts = ResultStore(tmp_path / "r.jsonl"), {}
    quantization_record.record(tmp_path, store, facts, schemes=("bf16", "fp8", "bf16-kv-fp8"), batches=(2,), **KW)
    got = facts["quantization"]
    assert got["failed"] == {"fp8": "RuntimeError: the engine core died"} and got["complete"] is True
    assert list(got["schemes"]) == ["bf16", "bf16-kv-fp8"] and "x2.00" in got["kv"]  # the fake: fp8 KV, twice the blocks
    assert [(r.step, r.provenance) for r in store.load()] == [("quant-bf16-b2", "recorded"),
                                                              ("quant-bf16-kv-fp8-b2", "recorded")]
    assert "failed ['fp8']" in (tmp_path / "log.txt").read_text()


def test_a_speed_recording_cut_short_keeps_what_it_ran(recording_gpu, tmp_path, monkeypatch, load_script):
    """gpu_session.sh stops a step at its time limit with SIGINT, here during the second engine's start: bf16's runs
    are stored and facts["quantization"] holds them, marked incomplete; no later step runs."""
    import lablib.engines.vllm as engine
    from lablib.results import ResultStore

    real, calls = engine.VLLMEngine.start, []

    def second_one_interrupted(self):
        if self._proc is None:
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt  # the time limit
        return real(self)

    monkeypatch.setattr(engine.VLLMEngine, "start", second_one_interrupted)
    script, later = load_script("record_reference"), []
    monkeypatch.setitem(script.STEPS, "quantization",
                        lambda o, s, f: quantization_record.record(o, s, f, schemes=("bf16", "fp8"), batches=(2, 3), **KW))
    monkeypatch.setitem(script.STEPS, "smoke", lambda *a: later.append(a))
    monkeypatch.setattr(sys, "argv", ["record_reference.py", "--out", str(tmp_path / "run"),
                                      "--steps", "quantization,smoke"])
    script.main()
    got = json.loads((tmp_path / "run" / "facts-quantization_smoke.json").read_text())["quantization"]
    assert got["complete"] is False and list(got["schemes"]) == ["bf16"] and got["failed"] == {}
    assert [r.step for r in ResultStore(tmp_path / "run" / "reference.jsonl").load()] == ["quant-bf16-b2",
                                                                                         "quant-bf16-b3"]
    assert later == [] and "step quantization INTERRUPTED" in (tmp_path / "run" / "log.txt").read_text()


def test_the_two_command_split_records_all_six_and_the_lab_shows_them_together(recording_gpu, tmp_path, monkeypatch,
                                                                               load_script):
    """Steps quantization-a and quantization-b (facts key quantization-2) between them ask every speed scheme, bf16
    beside bf16-kv-fp8 (kv_sentence compares them), AWQ last; the lab's recorded path reads both steps' Results.
    Here AWQ's checkpoint is not made: named as failed in quantization-2, the other two recorded."""
    import shutil

    import lablib.experiments.quantization.record as package
    from lablib.models import embedded_path
    from lablib.results import ResultStore

    work = tmp_path / "work"
    for s in ("gptq-w4a16", "w8a8-int8"):  # stand-ins for prepare_checkpoints' folders (the fake vLLM loads any)
        shutil.copytree(embedded_path("target"), work / "embedded" / s)
        (work / "embedded" / s / "quantization.json").write_text(json.dumps({"scheme": s, "seconds": 1.5}))
    script = load_script("record_reference")
    assert sorted(script.QUANT_A + script.QUANT_B) == sorted(quantization_speed_runs.SPEED_SCHEMES) and script.QUANT_B[-1] == "awq-w4a16"
    assert {"bf16", "bf16-kv-fp8"} <= set(script.QUANT_A)
    real = package.record
    monkeypatch.setattr(package, "record", lambda o, s, f, **k: real(o, s, f, batches=(2,), work_dir=work, **KW, **k))
    monkeypatch.setattr(sys, "argv", ["record_reference.py", "--out", str(tmp_path / "run"),
                                      "--steps", "quantization-a,quantization-b"])
    script.main()
    facts = json.loads((tmp_path / "run" / "facts-quantization-a_quantization-b.json").read_text())
    a, b = facts["quantization"], facts["quantization-2"]
    assert list(a["schemes"]) == ["bf16", "bf16-kv-fp8", "fp8"] and a["failed"] == {} and a["complete"] is True
    assert list(b["schemes"]) == ["gptq-w4a16", "w8a8-int8"] and list(b["failed"]) == ["awq-w4a16"]
    assert "prepare_checkpoints" in b["failed"]["awq-w4a16"] and b["checkpoints"]["gptq-w4a16"]["seconds"] == 1.5
    runs = ResultStore(tmp_path / "run" / "reference.jsonl").load()
    monkeypatch.setattr(quantization_recording, "load_reference",
                        lambda *steps, prefix=None: [r for r in runs if r.step.startswith(prefix)])
    shown = quantization_recording.speed(force=False, batches=(2,), **KW)
    assert [r["scheme"] for r in shown.value] == ["bf16", "bf16-kv-fp8", "fp8", "gptq-w4a16", "w8a8-int8"]
    assert "x2.00" in quantization_speed_runs.kv_sentence(shown.value)


def test_the_checkpoint_step_keeps_what_it_made_when_cut_short_and_a_rerun_reuses_it(tmp_path, monkeypatch,
                                                                                     load_script):
    """Step quantization-prepare (prepare_checkpoints, here on the embedded target in the synthetic 8B's place, the
    real quantizer with fp8-dynamic): stopped by the time limit while the second scheme was being made, facts keep
    the first one's row, marked incomplete; run again, that checkpoint is reused, not made again."""
    pytest.importorskip("llmcompressor", reason="install lablib[quant]")
    import sys

    import lablib.experiments.quantization.record as package
    from lablib.experiments.quantization import checkpoints, speed_runs
    from lablib.models import embedded_path

    monkeypatch.setattr(speed_runs, "synthetic_spec", lambda model: type("S", (), {"path": str(embedded_path())})())
    real_quantize, made = checkpoints.quantize, []

    def quantize(model_dir, folder, scheme, **k):
        made.append(scheme)
        if scheme == "gptq-w4a16":
            raise KeyboardInterrupt  # the time limit
        return real_quantize(model_dir, folder, scheme, **k)

    monkeypatch.setattr(checkpoints, "quantize", quantize)
    real, work, schemes = package.record_checkpoints, tmp_path / "work", [("fp8-dynamic", "gptq-w4a16")]
    monkeypatch.setattr(package, "record_checkpoints", lambda o, s, f, **k: real(
        o, s, f, schemes=schemes[0], model="embedded", work_dir=work, num_samples=2, threads=1, **k))
    script = load_script("record_reference")
    for run in ("first", "again"):
        monkeypatch.setattr(sys, "argv", ["record_reference.py", "--out", str(tmp_path / run), "--steps",
                                          "quantization-prepare"])
        script.main()
        schemes[0] = ("fp8-dynamic",)
    first, again = (json.loads((tmp_path / run / "facts-quantization-prepare.json").read_text())
                    ["quantization_checkpoints"] for run in ("first", "again"))
    assert made == ["fp8-dynamic", "gptq-w4a16"]  # the rerun made nothing
    assert list(first["schemes"]) == ["fp8-dynamic"] and first["complete"] is False
    assert first["schemes"]["fp8-dynamic"]["reused"] is False and first["schemes"]["fp8-dynamic"]["weight_bytes"] > 0
    assert first["schemes"]["fp8-dynamic"]["out_dir"] == str(work / "embedded" / "fp8-dynamic")
    assert again["complete"] is True and again["failed"] == {} and again["schemes"]["fp8-dynamic"]["reused"] is True
    assert again["schemes"]["fp8-dynamic"]["seconds"] == first["schemes"]["fp8-dynamic"]["seconds"]
    assert not (work / "embedded" / "gptq-w4a16").exists() and not list((work / "embedded").glob(".*partial-*"))


def test_live_speed_runs_what_is_prepared_on_the_fake_vllm(start, tmp_path):
    assert quantization_speed_runs.available_speed_schemes("embedded", tmp_path) == ["bf16", "fp8", "bf16-kv-fp8"]
    (tmp_path / "embedded" / "gptq-w4a16").mkdir(parents=True)
    (tmp_path / "embedded" / "gptq-w4a16" / "quantization.json").write_text("{}")
    assert quantization_speed_runs.available_speed_schemes("embedded", tmp_path) == ["bf16", "fp8", "gptq-w4a16", "bf16-kv-fp8"]
    (tmp_path / "embedded" / "gptq-w4a16" / "quantization.json").unlink()
    shown = quantization_recording.speed(force=True, model="embedded", work_dir=tmp_path, batches=(2,), prompt_len=16, output_len=4,
                     gpu_memory_utilization=0.3, max_model_len=256)
    assert shown.live and [r["scheme"] for r in shown.value] == ["bf16", "fp8", "bf16-kv-fp8"]
    assert {r["provenance"] for r in shown.value} == {shown.label}


def test_checkpoints_default_to_the_results_folder_wherever_the_process_started(tmp_path, monkeypatch):
    from lablib.experiments.quantization.measures import work_folder
    from lablib.results.store import results_dir

    monkeypatch.chdir(tmp_path)  # a relative "results/quantized" would land here
    assert work_folder() == results_dir() / "quantized" and work_folder().is_absolute()
    assert work_folder(tmp_path / "w") == tmp_path / "w"
    monkeypatch.setenv("LABLIB_RESULTS", str(tmp_path / "r"))
    assert work_folder() == tmp_path / "r" / "quantized"
    assert [r["scheme"] for r in sizes.storage_rows([])] == ["bf16"]  # no scheme: nothing read from the default folder


def test_gpu_quality_on_the_fake_vllm_beside_the_cpu_rows_and_refusals_first(start, tmp_path, monkeypatch):
    """vLLM's perplexity per checkpoint (the fake scores every token by a fixed rule, so each scheme scores the same
    texts alike): from_logprobs of prompt_logprobs on the evaluation windows, its change against vLLM's bf16, the
    gap to the CPU's number for the same scheme; a checkpoint not made is refused before any engine starts."""
    import lablib.engines.vllm as engine
    from lablib.models import load_tokenizer, resolve_model
    from tests.fake_vllm_support import fake_scores

    fake_logprob = fake_scores()

    made = quantization_checkpoints.quantize_all(("fp8-dynamic",), work_dir=tmp_path, num_samples=2)
    texts = measures.evaluation_set(2).prompt_ids(load_tokenizer(resolve_model("embedded")))
    want = measures.from_logprobs([[fake_logprob(a, b) for a, b in zip(t, t[1:])] for t in texts])
    cpu = [{"scheme": "bf16", "ppl": want.ppl * 1.004}, {"scheme": "fp8-dynamic", "ppl": want.ppl * 0.9}]
    from lablib.engines.vllm import VLLMEngine

    configs, real_init = [], VLLMEngine.__init__

    def kept(self, model, config, *a, **k):
        configs.append(config)
        return real_init(self, model, config, *a, **k)

    monkeypatch.setattr(VLLMEngine, "__init__", kept)
    rows = quantization_vllm_ppl.vllm_quality_rows(("fp8-dynamic",), work_dir=tmp_path, eval_texts=2, cpu_rows=cpu)
    assert [c.enforce_eager for c in configs] == [True] * 3  # one prefill pass per text: no decode, no graphs
    assert [r["scheme"] for r in rows] == ["bf16", "bf16-kv-fp8", "fp8-dynamic"]
    assert made[0]["folder"] == str(tmp_path / "fp8-dynamic")
    assert all(math.isclose(r["ppl_vllm"], want.ppl) and r["tokens"] == want.tokens for r in rows)
    assert rows[2]["ppl_change_pct"] == pytest.approx(0.0)
    kv = rows[1]  # bf16 weights, kv_cache_dtype="fp8": twice the KV tokens on the fake, no CPU number to set beside
    assert (kv["kv_cache_dtype"], rows[0]["kv_cache_dtype"]) == ("fp8", "auto")
    assert kv["kv_tokens"] == 2 * rows[0]["kv_tokens"] and kv["ppl_cpu"] is None and kv["vllm_vs_cpu_pct"] is None
    assert rows[0]["vllm_vs_cpu_pct"] == pytest.approx(100 * (1 / 1.004 - 1))
    assert quantization_vllm_ppl.bf16_agrees(rows) and not quantization_vllm_ppl.bf16_agrees(rows, tolerance_pct=0.3)  # 0.4% apart: within 1%, not 0.3%
    shown = quantization_vllm_ppl.gpu_quality(("fp8-dynamic",), cpu_rows=cpu, work_dir=tmp_path, eval_texts=2, force=True)
    text = quantization_vllm_ppl.gpu_quality_lines(shown)
    assert shown.live and "within the 1% the two must agree by" in text and "fp8-dynamic:" in text
    assert "bf16-kv-fp8 (bf16 weights, FP8 KV cache)" in text and "(x2.00) at the same gpu_memory_utilization" in text
    for module in (engine, quantization_vllm_ppl):  # the engine's module, and the name vllm_quality_rows calls
        monkeypatch.setattr(module, "VLLMEngine", lambda *a, **k: pytest.fail("an engine was made before the refusal"))
    with pytest.raises(ValueError, match="quantize_all"):
        quantization_vllm_ppl.vllm_quality_rows(("fp8-dynamic", "gptq-w4a16"), work_dir=tmp_path, eval_texts=2)
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="schemes")):
        quantization_vllm_ppl.vllm_quality_rows(("int3",), work_dir=tmp_path)


def test_gpu_quality_not_recorded_yet_names_its_step(unrecorded):
    unrecorded("quantization_quality")
    shown = quantization_vllm_ppl.gpu_quality(("fp8-dynamic",), cpu_rows=[], force=False)
    assert shown.value is None and "--steps quantization-quality" in shown.label
    assert quantization_vllm_ppl.gpu_quality_lines(shown) == f"[{shown.label}]"


def test_recorded_gpu_quality_shows_what_was_asked_or_names_what_stands_in(monkeypatch, capsys):
    """The recording's rows, whole (issue 28: a recording is shown as recorded, the asked schemes it holds more than
    named); another evaluation length is named as a stand-in (the perplexities are of other texts), and the CPU
    numbers beside vLLM's are the recording's own."""
    import lablib.results.reference as reference

    rec = [{"scheme": s, "ppl_vllm": p, "ppl_change_pct": c, "tokens": 8160, "texts": 16, "ppl_cpu": q,
            "vllm_vs_cpu_pct": 100 * (p / q - 1), "linear_kernels": "k", "provenance": "recorded on NVIDIA H200, d"}
           for s, p, c, q in (("bf16", 10.0, 0.0, 10.02), ("fp8-dynamic", 10.1, 1.0, 10.08),
                              ("gptq-w4a16", 11.0, 10.0, 10.9))]
    rec.insert(1, {**rec[0], "scheme": "bf16-kv-fp8", "ppl_vllm": 10.03, "ppl_change_pct": 0.3, "ppl_cpu": None,
                   "vllm_vs_cpu_pct": None})
    shipped = reference.reference_facts
    for module in (reference, quantization_vllm_ppl):  # the recordings, and the name quality_recording calls
        monkeypatch.setattr(module, "reference_facts", lambda: {**shipped(), "quantization_quality": {"rows": rec}})
    every = quantization_vllm_ppl.gpu_quality(("fp8-dynamic", "gptq-w4a16"), cpu_rows=[], eval_texts=16, force=False)
    assert every.value == rec and every.stand_ins == {} and capsys.readouterr().out == ""
    same = quantization_vllm_ppl.gpu_quality(("fp8-dynamic",), cpu_rows=[], eval_texts=16, force=False)
    assert [r["scheme"] for r in same.value] == ["bf16", "bf16-kv-fp8", "fp8-dynamic", "gptq-w4a16"]
    assert same.stand_ins == {"schemes": {"asked": ["bf16", "bf16-kv-fp8", "fp8-dynamic"],
                                          "shown": ["bf16", "bf16-kv-fp8", "fp8-dynamic", "gptq-w4a16"]}}
    assert quantization_vllm_ppl.bf16_agrees(same.value) and "-0.20% against transformers' float32 10.020" in quantization_vllm_ppl.gpu_quality_lines(same)
    other = quantization_vllm_ppl.gpu_quality(("fp8-dynamic", "gptq-w4a16"), cpu_rows=[], eval_texts=4, force=False)
    assert other.stand_ins == {"eval_texts": {"asked": 4, "shown": 16}} and "eval_texts" in capsys.readouterr().out


def test_the_quality_recording_step_on_the_fake_vllm(start, tmp_path, monkeypatch):
    """Step quantization-quality: checkpoints made, vLLM's rows, the CPU table beside them, all labelled recorded;
    a CPU table that fails there (transformers with vLLM's compressed-tensors) leaves vLLM's rows and says why."""
    monkeypatch.setattr(quantization_record, "GPU_WORK", str(tmp_path / "work"))
    facts = {}
    quantization_record.record_quality(tmp_path, None, facts, schemes=("fp8-dynamic",), eval_texts=2, num_samples=2)
    got = facts["quantization_quality"]
    assert [r["scheme"] for r in got["rows"]] == ["bf16", "bf16-kv-fp8", "fp8-dynamic"] and got["cpu_error"] is None
    assert all(r["provenance"].startswith("recorded on NVIDIA H200, ") for r in got["rows"])
    assert [r["ppl_cpu"] is not None and r["ppl_cpu"] > 1 for r in got["rows"]] == [True, False, True]
    assert [r["scheme"] for r in got["cpu_rows"]] == ["bf16", "fp8-dynamic"] and got["eval_texts"] == 2
    assert "quantization-quality:" in (tmp_path / "log.txt").read_text()

    def broken(*a, **k):
        raise ImportError("compressed_tensors 0.17 cannot read this")

    monkeypatch.setattr(quantization_record, "quality_table", broken)
    quantization_record.record_quality(tmp_path, None, facts, schemes=("fp8-dynamic",), eval_texts=2, num_samples=2)
    again = facts["quantization_quality"]
    assert again["cpu_error"] == "ImportError: compressed_tensors 0.17 cannot read this"
    assert [r["ppl_cpu"] for r in again["rows"]] == [None] * 3 and not quantization_vllm_ppl.bf16_agrees(again["rows"])


def test_a_quality_recording_cut_short_keeps_the_checkpoints_it_scored(start, tmp_path, monkeypatch,
                                                                       load_script):
    """gpu_session.sh stops a step at its time limit with SIGINT: scripts/record_reference.py writes the facts the
    step had so far (bf16's row, marked incomplete, the CPU table not run) and runs no later step."""
    import json
    import sys

    import lablib.engines.vllm as engine

    monkeypatch.setattr(quantization_record, "GPU_WORK", str(tmp_path / "work"))
    real, calls = engine.VLLMEngine.prompt_logprobs, []

    def second_one_interrupted(self, texts):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the time limit, during the second engine
        return real(self, texts)

    monkeypatch.setattr(engine.VLLMEngine, "prompt_logprobs", second_one_interrupted)
    script = load_script("record_reference")
    later = []
    monkeypatch.setitem(script.STEPS, "quantization-quality",
                        lambda o, s, f: quantization_record.record_quality(o, s, f, schemes=("fp8-dynamic",), eval_texts=2,
                                                                           num_samples=2))
    monkeypatch.setitem(script.STEPS, "smoke", lambda *a: later.append(a))
    monkeypatch.setattr(sys, "argv", ["record_reference.py", "--out", str(tmp_path / "run"),
                                      "--steps", "quantization-quality,smoke"])
    script.main()
    facts = json.loads((tmp_path / "run" / "facts-quantization-quality_smoke.json").read_text())
    got = facts["quantization_quality"]
    assert [r["scheme"] for r in got["rows"]] == ["bf16"] and got["complete"] is False and got["cpu_rows"] == []
    assert got["rows"][0]["ppl_vllm"] > 1 and got["rows"][0]["provenance"].startswith("recorded on ")
    assert got["cpu_error"] == "not run: the step was cut short" and later == []
    assert "step quantization-quality INTERRUPTED" in (tmp_path / "run" / "log.txt").read_text()


def test_the_int4_speed_claim_on_the_shipped_recording_says_how_far_bytes_turned_into_speed():
    """Step quantization-b (H200, 2026-12-02) recorded GPTQ on the synthetic 8B: the claim's verdict follows the
    rows at every batch, and its evidence sets the weights' ratio against the speed's and each step's time against
    the time reading its weights would take."""
    sp = quantization_recording.speed(force=False)
    at = {(r["scheme"], r["batch"]): r for r in sp.value}
    batches = sorted(b for s, b in at if s == "gptq-w4a16" and ("bf16", b) in at)
    assert batches == [1, 8, 64, 256]
    stored, lm = _stored_and_lm()
    got = {c["claim"]: c for c in verdicts.claims(_quality({"gptq-w4a16": 1.6}), stored, lm, sizes.weights_alone(), sp)}
    faster = got["fewer bytes per weight, faster decode (int4's ~3.5x fewer bytes)"]
    wins = [at[("gptq-w4a16", b)]["decode_tok_s"] > at[("bf16", b)]["decode_tok_s"] for b in batches]
    assert wins == [True, True, True, False] and faster["verdict"] == "holds only in part"  # bf16 leads at 256
    g, b16 = at[("gptq-w4a16", 1)], at[("bf16", 1)]
    assert f"(x{g['decode_tok_s'] / b16['decode_tok_s']:.2f})" in faster["evidence"]
    assert f"x{b16['weight_gib'] / g['weight_gib']:.2f} fewer bytes" in faster["evidence"]
    assert f"would take {1e3 / g['roofline_tok_s']:.2f} ms a step for GPTQ" in faster["evidence"]
    assert "Machete" in faster["evidence"] and faster["where"] == sp.label
