"""Quality measures of lab 06: perplexity against hand-computed values on fake models whose logits are set,
and against transformers' own loss on the embedded model; greedy agreement and first divergence on a hand
case; the quality gate (pass, fail, the boundary, refusals); the evaluation set disjoint from calibration;
and one live quality table (fp8-dynamic only, 2 evaluation windows, 2 prompts x 8 tokens, ~20 s on this CPU),
then the same call again reusing the checkpoint.
"""
import math
import re
from types import SimpleNamespace

import pytest

from lablib.experiments import quantization as qe
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
    one = qe.perplexity(model, None, [[0, 0, 1, 2]])  # predicts 0, 1, 2: p = 1/2, 1/4, 1/8
    assert one.tokens == 3 and one.texts == 1
    assert one.nll == pytest.approx((LOG(2) + LOG(4) + LOG(8)) / 3, abs=1e-12)
    assert one.ppl == pytest.approx(4.0, abs=1e-12)
    two = qe.perplexity(model, SplitTokenizer(), ["0 0 1 2", "3 3"])  # one more token, p = 1/8
    assert two.tokens == 4 and two.ppl == pytest.approx(2 ** 2.25, abs=1e-12)  # token-weighted, not mean of ppls
    assert qe.perplexity(model, None, [[0, 0, 1, 2, 3, 3]], max_length=4).ppl == pytest.approx(4.0)


def test_perplexity_scores_the_next_token_not_the_current_one():
    model = TableModel([[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.4, 0.1], [0.25] * 4, [0.25] * 4])
    got = qe.perplexity(model, None, [[0, 1, 2]])  # P(1|0) = 0.6, P(2|1) = 0.4
    assert got.ppl == pytest.approx(1 / math.sqrt(0.24), abs=1e-12)  # 2.0412; shifted by one it would differ


def test_from_logprobs_is_the_same_formula_and_refuses_nonsense():
    assert qe.from_logprobs([[LOG(0.5), LOG(0.25), LOG(0.125)], [LOG(0.125)]]).ppl == pytest.approx(2 ** 2.25)
    for bad in ([[]], [[0.3]], [[float("nan")]]):
        with pytest.raises(ValueError, match=SHAPE.format(owner="from_logprobs", field="logprobs")):
            qe.from_logprobs(bad)
    with pytest.raises(ValueError, match="at least one predicted token"):
        qe.perplexity(TableModel(UNIFORMISH), None, [[1]])
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="max_length")):
        qe.perplexity(TableModel(UNIFORMISH), None, [list(range(4)) * 5])  # 20 tokens, context 16


def test_perplexity_agrees_with_transformers_loss_on_the_embedded_model():
    from lablib.models import embedded_path
    from transformers import AutoTokenizer

    model, tok = qe.load_model(embedded_path("target")), AutoTokenizer.from_pretrained(str(embedded_path("target")))
    ids = qe.evaluation_set(2).prompt_ids(tok)
    with torch.inference_mode():
        losses = [model(torch.tensor([i]), labels=torch.tensor([i])).loss.item() for i in ids]
    got = qe.perplexity(model, tok, ids)
    assert got.tokens == 1022 and got.ppl == pytest.approx(math.exp(sum(losses) / 2), rel=1e-5)  # equal lengths


def test_greedy_agreement_and_first_divergence_on_a_hand_case():
    a = qe.agreement([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 9, 4], [5, 6, 7, 8]])
    assert a.matched == (0.75, 1.0) and a.first_divergence == (2, None)
    assert a.agreement == pytest.approx(0.875) and a.identical == 1
    assert a.mean_first_divergence == pytest.approx(3.0)  # (2 + 4) / 2: a request that never diverges counts 4
    with pytest.raises(ValueError, match=SHAPE.format(owner="agreement", field="tokens")):
        qe.agreement([[1, 2]], [[1, 2, 3]])
    with pytest.raises(ValueError, match=SHAPE.format(owner="agreement", field="tokens")):
        qe.agreement([[1, 2]], [])


def test_the_quality_gate_passes_within_the_users_threshold_and_fails_beyond_it():
    g = qe.quality_gate(16.7, 16.5, 2.0)
    assert g.passed and bool(g) and g.increase_pct == pytest.approx(100 * (16.7 / 16.5 - 1))
    assert g.sentence.startswith("passes: perplexity 16.700 is 1.21% above the reference's 16.500, within the 2%")
    f = qe.quality_gate(16.7, 16.5, 1.0)
    assert not f.passed and not f and "more than the 1% allowed" in f.sentence
    assert qe.quality_gate(16.5, 16.5, 0.0).passed  # no increase passes a zero threshold
    better = qe.quality_gate(16.4, 16.5, 0.0)
    assert better.passed and "below" in better.sentence
    for args, field in (((0.0, 16.5, 1.0), "ppl"), ((16.5, float("nan"), 1.0), "ppl_ref"),
                        ((16.5, 16.5, -1.0), "max_increase_pct")):
        with pytest.raises(ValueError, match=SHAPE.format(owner="quality_gate", field=field)):
            qe.quality_gate(*args)


def test_the_evaluation_set_is_disjoint_from_calibration_and_an_overlap_is_refused():
    cal, ev = load_workload("calibration"), qe.evaluation_set()
    assert len(ev) == 64 and len(qe.evaluation_set(2)) == 2
    qe.check_disjoint(cal, ev)
    leaky = Workload("evaluation", 1, "leaky", ev.requests[:1] + cal.requests[:1], ev.manifest)
    with pytest.raises(ValueError, match=SHAPE.format(owner="quantization", field="evaluation")):
        qe.check_disjoint(cal, leaky)
    shared = Workload("evaluation", 1, "shared files", ev.requests, {**ev.manifest,
                      "source_files": ev.manifest["source_files"] + cal.manifest["source_files"][:1]})
    with pytest.raises(ValueError, match="share 1 source files"):
        qe.check_disjoint(cal, shared)


def test_a_live_quality_table_for_fp8_then_reused(tmp_path):
    pytest.importorskip("llmcompressor", reason="install lablib[quant]")
    kwargs = dict(work_dir=tmp_path, eval_texts=2, prompts=2, max_new_tokens=8, max_increase_pct=1.0)
    rows = qe.quality_table(("fp8-dynamic",), **kwargs)
    ref, fp8 = rows
    assert ref["scheme"] == "bf16" and ref["ppl_change_pct"] == 0.0 and ref["agreement"] == 1.0
    assert fp8["scheme"] == "fp8-dynamic" and not fp8["reused"] and fp8["calibration"] is None
    assert math.isfinite(fp8["ppl"]) and abs(fp8["ppl_change_pct"]) < 5.0
    assert fp8["weight_bytes"] < ref["weight_bytes"] and 0.0 <= fp8["agreement"] <= 1.0
    assert re.match(r"(passes|fails): perplexity", fp8["gate"])
    assert all(r["provenance"].startswith("measured on this machine's CPU") for r in rows)
    again = qe.quality_table(("fp8-dynamic",), **kwargs)[1]
    assert again["reused"] and again["ppl"] == fp8["ppl"] and again["first_divergence"] == fp8["first_divergence"]
    assert [r["passed"] for r in qe.gate_rows(rows, 100.0)] == [True]
