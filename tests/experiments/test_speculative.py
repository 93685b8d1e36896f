"""The greedy speculative loop on the embedded pair, on the CPU: the target's own greedy tokens, token for
token; vLLM's counters, consistent; the formula's report; a perfect draft; refusals before any forward.

The pair is loaded once for the module; 3 journey prompts x 29 new tokens (29 is no multiple of k+1 for
k = 1, 3, 5, so the last step is usually cut). Everything here is deterministic (greedy, no timing asserts).
"""
import copy
import math
import re
from types import SimpleNamespace

import pytest

from lablib.experiments import speculative as spec
from lablib.mechanisms.speculative import SpecCounters
from lablib.workloads import load_workload

torch = pytest.importorskip("torch")
pytest.importorskip("transformers").utils.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (conftest.py)

N, NEW = 3, 29
SHAPE = r"^{owner}\.{field}=.*: allowed .+; Fix: .+"


@pytest.fixture(scope="module")
def pair(one_thread):
    return spec.load_pair()


@pytest.fixture(scope="module")
def prompts(pair) -> list[list[int]]:
    return load_workload("journey", limit=N).prompt_ids(pair[2])


@pytest.fixture(scope="module")
def reference(pair, prompts) -> list[list[int]]:
    """The target's own greedy tokens, from transformers' generate (EOS ignored, as in the loop)."""
    target = pair[0]
    gen = copy.deepcopy(target.generation_config)
    gen.update(do_sample=False, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    out = []
    with torch.inference_mode():
        for p in prompts:
            x = torch.tensor([p])
            ids = target.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)
            out.append(ids[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module")
def runs(pair, prompts) -> dict[int, list[spec.SpeculativeRun]]:
    target, draft, _ = pair
    return {k: [spec.greedy_speculative(target, draft, p, NEW, k) for p in prompts] for k in (1, 3, 5)}


def test_the_naive_loop_is_hf_greedy(pair, prompts, reference):
    assert [spec.greedy(pair[0], p, NEW) for p in prompts] == reference


@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_tokens_are_the_targets_greedy_tokens(runs, reference, k):
    for run, want in zip(runs[k], reference):
        assert run.k == k and len(run.tokens) == NEW
        assert run.tokens == want
        assert [t for s in run.steps for t in s.emitted] == run.tokens


@pytest.mark.parametrize("k", [1, 3, 5])
def test_counters_are_consistent(runs, k):
    for run in runs[k]:
        for s in run.steps[:-1]:
            assert len(s.emitted) == s.accepted + 1 and s.emitted[:s.accepted] == s.drafted[:s.accepted]
        assert 1 <= len(run.steps[-1].emitted) <= run.steps[-1].accepted + 1  # the last step is cut at NEW
        for s in run.steps:
            assert len(s.drafted) == k and s.accepted_mask == tuple(i < s.accepted for i in range(k))
    c = spec.spec_counters(runs[k])
    assert c.num_drafts == sum(len(r.steps) for r in runs[k])
    assert c.num_draft_tokens == k * c.num_drafts  # every step drafts k, the cut last one included
    assert c.num_accepted_tokens <= c.num_draft_tokens
    assert c.num_accepted_tokens == sum(c.accepted_per_pos)
    assert all(a >= b for a, b in zip(c.accepted_per_pos, c.accepted_per_pos[1:]))  # position i needs i-1
    assert c.accepted_per_pos[0] <= c.num_drafts


def test_the_report_sets_measured_beside_the_formula(runs):
    rep = spec.acceptance_report(runs[5])
    assert isinstance(rep.counters, SpecCounters) and rep.k == 5
    assert 0 < rep.alpha < 1
    assert rep.predicted_per_position == pytest.approx([rep.alpha**i for i in range(1, 6)], rel=1e-12)
    assert rep.predicted_length == pytest.approx(sum(rep.alpha**i for i in range(6)), rel=1e-12)
    c, n = rep.counters, rep.counters.num_drafts
    assert rep.measured_length == pytest.approx(1 + c.num_accepted_tokens / n)
    assert rep.measured_per_position == pytest.approx([a / n for a in c.accepted_per_pos])
    assert rep.gap_per_position == pytest.approx([m - p for m, p in zip(rep.measured_per_position,
                                                                         rep.predicted_per_position)])
    assert rep.length_gap == pytest.approx(rep.measured_length - rep.predicted_length)
    assert rep.stderr_per_position == pytest.approx([math.sqrt(p * (1 - p) / n) for p in rep.measured_per_position])
    assert rep.conditional_per_position[0] == pytest.approx(rep.measured_per_position[0])
    row = rep.row()
    assert {"k", "alpha", "measured_length", "length_stderr", "predicted_length", "gap_per_position",
            "num_drafts"} <= set(row)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_the_mean_acceptance_length_matches_the_formula_within_three_standard_errors(runs, k):
    # Deterministic (greedy, fixed prompts); the bound is the sampling error over these ~40-60 steps, 3 sigma.
    # Per-position rates are not asserted: acceptance clusters, the i.i.d. formula misfits the deep positions.
    rep = spec.acceptance_report(runs[k])
    assert rep.length_stderr > 0
    assert abs(rep.length_gap) <= 3 * rep.length_stderr, rep.row()


def test_a_draft_equal_to_the_target_accepts_everything(pair, prompts):
    target = pair[0]
    k = 3
    for p in prompts[:2]:
        run = spec.greedy_speculative(target, target, p, NEW, k)
        assert all(s.accepted == k for s in run.steps)
        assert all(len(s.emitted) == k + 1 for s in run.steps[:-1])
        assert len(run.steps[-1].emitted) == NEW - (k + 1) * (len(run.steps) - 1)  # the cut end
    rep = spec.acceptance_report([run])
    assert rep.measured_length == k + 1 and rep.alpha == 1.0 and rep.predicted_per_position == (1.0,) * k


def test_hf_assisted_generation_with_constant_k_gives_the_same_tokens(pair, prompts, reference):
    target, draft, _ = pair
    saved = draft.generation_config.to_dict()
    assert spec.hf_assisted(target, draft, prompts[0], NEW, 3) == reference[0]
    assert draft.generation_config.to_dict() == saved  # the draft's config is restored


def test_forward_costs_and_a_tiny_study_have_their_fields(pair):
    costs = spec.forward_costs(pair[0], pair[1], [1, 5, 6, 7], ks=(1, 2), repeats=3)
    assert costs["c"] > 0 and set(costs["verify_cost"]) == {1, 2} and "CPU" in costs["provenance"]
    study = spec.cpu_study(n_prompts=1, max_new_tokens=8, ks=(2,), rounds=1, pair=pair)
    row = study["rows"][0]
    assert row["identical_to_greedy"] and row["k"] == 2
    for key in ("tok_s", "baseline_tok_s", "measured_speedup", "predicted_speedup", "c_in_loop",
                "verify_cost_in_loop", "predicted_speedup_in_loop"):
        assert row[key] > 0, key
    assert "measured on this machine's CPU" in study["provenance"]


@pytest.mark.parametrize("kwargs, field", [
    ({"k": 0}, "k"), ({"k": -2}, "k"), ({"k": 1.5}, "k"), ({"k": True}, "k"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": 10**6}, "max_new_tokens"),
    ({"input_ids": []}, "input_ids"), ({"input_ids": [1, 4096]}, "input_ids"),
])
def test_bad_arguments_are_refused(pair, kwargs, field):
    target, draft, _ = pair
    args = {"input_ids": [1, 5, 6], "max_new_tokens": 4, "k": 2, **kwargs}
    with pytest.raises(ValueError, match=SHAPE.format(owner="greedy_speculative", field=field)):
        spec.greedy_speculative(target, draft, **args)


def test_a_draft_with_another_vocabulary_is_refused_before_any_forward(pair):
    other = SimpleNamespace(config=SimpleNamespace(vocab_size=32000))  # would fail on any forward call
    with pytest.raises(ValueError, match=SHAPE.format(owner="greedy_speculative", field=r"draft\.vocab_size")) as e:
        spec.greedy_speculative(pair[0], other, [1, 5, 6], 4, 2)
    assert "4096" in str(e.value)
    with pytest.raises(ValueError, match="draft.vocab_size"):
        spec.hf_assisted(pair[0], other, [1, 5, 6], 4, 2)


def test_counters_of_mixed_k_are_refused(runs):
    with pytest.raises(ValueError, match=re.escape("spec_counters.runs=")):
        spec.spec_counters(runs[1] + runs[3])
