"""Lab 06's layers quantized apart (`layer_rows`, live on fp8-dynamic: data-free, ~30 s on this CPU), and the verdicts
and Checks-cell claims computed from a run's numbers: attention against MLP with lm_head kept, the same test set
before and after (disjoint from calibration), the gate's verdicts, int4 against 8-bit, the kernels vLLM logged."""
import json
import struct

import pytest

from lablib.experiments.quantization import (
    checkpoints,
    layers,
    measures,
    quality as quantization_quality,
    sizes,
    verdicts,
)
from lablib.session import Shown

SHAPE = r"^{owner}\.{field}=.*: allowed .+; Fix: .+"


def _dtypes(folder):
    """Each tensor's dtype, from the safetensors header."""
    out = {}
    for f in folder.glob("*.safetensors"):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            out.update({k: v["dtype"] for k, v in json.loads(fh.read(n)).items() if k != "__metadata__"})
    return out


@pytest.mark.usefixtures("one_thread")
def test_layer_rows_quantize_each_part_alone_live_on_fp8(tmp_path):
    pytest.importorskip("llmcompressor", reason="install lablib[quant]")
    kw = {"work_dir": tmp_path, "eval_texts": 2, "prompts": 2, "max_new_tokens": 4, "num_samples": 2}
    with checkpoints.quiet_progress():
        quality = quantization_quality.quality_table(("fp8-dynamic",), **kw)
        rows = layers.layer_rows("fp8-dynamic", quality=quality, **kw)
    every, mlp, attn = rows
    assert [r["quantized"] for r in rows] == ["every Linear", "MLP only", "attention only"]
    assert (every["linears"], mlp["linears"], attn["linears"]) == (35, 15, 20)  # 5 layers x (4 attention + 3 MLP)
    assert every["reused"] and every["ppl"] == quality[1]["ppl"] and not mlp["reused"]  # step 3's checkpoint reused
    d_mlp, d_attn = _dtypes(tmp_path / "fp8-dynamic+mlp-only"), _dtypes(tmp_path / "fp8-dynamic+attention-only")
    q, up = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"
    assert (d_mlp[q], d_mlp[up]) == ("BF16", "F8_E4M3") and (d_attn[q], d_attn[up]) == ("F8_E4M3", "BF16")
    assert 0 < attn["saved_pct"] < mlp["saved_pct"] < every["saved_pct"]  # the MLP holds most Linear weights
    bf16 = quality[0]["weight_bytes"]  # bytes saved add up over the parts, to the headers' few hundred bytes
    assert (bf16 - mlp["weight_bytes"]) + (bf16 - attn["weight_bytes"]) == pytest.approx(
        bf16 - every["weight_bytes"], abs=4096)
    assert all(r["cost_per_saved"] == pytest.approx(r["ppl_change_pct"] / r["saved_pct"]) for r in rows)
    assert "Per percent of the checkpoint saved, attention costs" in layers.layer_sentence(rows)
    again = layers.layer_rows("fp8-dynamic", quality=quality, **kw)
    assert all(r["reused"] for r in again) and [r["ppl"] for r in again] == [r["ppl"] for r in rows]
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="quality")):
        layers.layer_rows("fp8-dynamic", quality=quality, **{**kw, "max_new_tokens": 5})  # rows of other greedy lengths


def _quality(calibrated_on="calibration@v1[:16]", other_eval=False):
    ev = "evaluation@v1[:2], 1022 predicted tokens"
    rows = [{"scheme": "bf16", "ppl": 10.0, "ppl_change_pct": 0.0, "agreement": 1.0, "eval": ev, "gate": None}]
    for s, p in (("fp8-dynamic", 0.2), ("w8a8-int8", 0.1), ("gptq-w4a16", 1.6)):
        rows.append({"scheme": s, "ppl": 10.0 * (1 + p / 100), "ppl_change_pct": p, "agreement": 0.5,
                     "mean_first_divergence": 4.0, "quantize_s": 0.1, "group_size": 64,
                     "calibration": None if s == "fp8-dynamic" else {"workload": calibrated_on, "samples": 16},
                     "gate": measures.quality_gate(10.0 * (1 + p / 100), 10.0, 1.0).sentence, "eval": ev,
                     "weight_bytes": 1})
    if other_eval:
        rows[3]["eval"] = "evaluation@v1[:4], 2044 predicted tokens"
    return rows


STORED = [{"scheme": s, "vs_bf16": v, "rest_dtypes": "BF16"} for s, v in (("bf16", 1.0), ("fp8-dynamic", 0.61))]
LM = [{"scheme": "fp8-dynamic", "lm_head": "kept 16-bit", "ppl_change_pct": 0.2, "size_vs_kept_pct": 0.0,
       "lm_head_share": 0.22},
      {"scheme": "fp8-dynamic", "lm_head": "quantized too", "ppl_change_pct": 0.3, "size_vs_kept_pct": 18.2,
       "lm_head_share": 0.22}]


def _parts(attn_cost, mlp_cost):
    return [{"scheme": "gptq-w4a16", "quantized": q, "saved_pct": s, "ppl_change_pct": c * s, "cost_per_saved": c}
            for q, s, c in (("every Linear", 57.0, 0.03), ("MLP only", 42.0, mlp_cost),
                            ("attention only", 15.0, attn_cost))]


def _claim(name, quality=None, parts=None, lm=LM):
    got = {c["claim"]: c for c in verdicts.claims(quality or _quality(), STORED, lm, sizes.weights_alone(),
                                            Shown(None, False, "not recorded yet"), parts)}
    return got[name]


MIXED = "attention dynamic, MLP static, embeddings kept in full precision"
VALIDATE = "validate quality with the same business test set before and after"


def test_the_mixed_precision_verdict_follows_the_layer_and_lm_head_rows():
    both = _claim(MIXED, parts=_parts(attn_cost=0.05, mlp_cost=0.01))  # attention the touchier part, lm_head kept
    assert both["verdict"] == "holds" and "attention is the more sensitive part" in both["evidence"]
    assert "+0.050 vs +0.010 per percent saved" in both["evidence"] and "static against dynamic" in both["evidence"]
    mlp = _claim(MIXED, parts=_parts(attn_cost=-0.004, mlp_cost=0.03))  # this model's finding: the MLP is
    assert mlp["verdict"] == "holds only in part" and "does not match this model" in mlp["evidence"]
    pays = [LM[0], {**LM[1], "size_vs_kept_pct": -9.0, "ppl_change_pct": 0.2}]  # untied: smaller and no worse
    assert _claim(MIXED, parts=_parts(-0.004, 0.03), lm=pays)["verdict"] == "does not hold"
    alone = _claim(MIXED)  # no layer rows: only the lm_head part is judged, and the rest said not measured
    assert alone["verdict"] == "holds" and "attention against MLP: not measured here" in alone["evidence"]


def test_the_validate_verdict_needs_the_same_texts_a_gate_and_a_set_disjoint_from_calibration():
    ok = _claim(VALIDATE)
    assert ok["verdict"] == "followed here" and "evaluation ['evaluation'] against calibration ['calibration']" in \
        ok["evidence"]
    assert _claim(VALIDATE, quality=_quality(other_eval=True))["verdict"] == "not followed here"
    leaked = _claim(VALIDATE, quality=_quality(calibrated_on="evaluation@v1[:16]"))  # calibrated on the test set
    assert leaked["verdict"] == "not followed here" and "NOT disjoint from calibration" in leaked["evidence"]
    ungated = _quality()
    ungated[2]["gate"] = None
    assert "NOT run on every scheme" in _claim(VALIDATE, quality=ungated)["evidence"]


def test_the_checks_cells_claims_can_fail():
    rows = _quality()
    assert verdicts.gate_judged(rows, 1.0) and not verdicts.gate_judged(rows, 2.0)  # gptq's "fails" is not a 2% gate's verdict
    assert not verdicts.gate_judged(rows[:3], 1.0)  # no int4 scheme ran: nothing stated
    assert verdicts.int4_costs_more(rows) and not verdicts.int4_costs_more(rows[:3])
    rows[1]["ppl_change_pct"] = 1.7
    assert not verdicts.int4_costs_more(rows)
    speed = [{"scheme": s, "linear_kernels": k} for s, k in (("bf16", "none logged (bf16: cuBLAS)"),
                                                             ("fp8", "CutlassFP8ScaledMMLinearKernel (Fp8LinearMethod)"),
                                                             ("bf16-kv-fp8", "none logged (bf16: cuBLAS)"))]
    assert verdicts.kernels_logged(speed) and not verdicts.kernels_logged([])
    assert not verdicts.kernels_logged(speed[:1])  # no quantized engine: not vacuously true
    assert not verdicts.kernels_logged([*speed, {"scheme": "gptq-w4a16", "linear_kernels": "none logged"}])
    assert not verdicts.kernels_logged([speed[0], {"scheme": "gptq-w4a16", "linear_kernels": "MacheteLinearKernel (x)"}])
