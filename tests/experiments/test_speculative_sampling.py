"""Speculative sampling on the embedded pair keeps the target's distribution: lab 08's second claim, tested.

The chi-square machinery first (no scipy): the survival function against closed forms and published values,
the noncentral one against the exact power of a two-sided z-test, pooling. Then the rule at one position
(200k vectorised trials: the correct rule passes, both wrong rules are rejected), the whole loop against plain
sampling (the token at output position 2, 4 journey prompts x 150 runs a temperature; a wrong rule rejected at a
quarter of that), the greedy limit (T = 1e-8: greedy tokens exactly), and refusals before any forward.

Every random draw comes from a seeded torch.Generator, so each outcome is fixed: the p-values below are the same
run after run (on this torch build). The level is 0.01; what the tests can detect is their `detectable_w`.
"""
import math
from collections import Counter

import pytest

from lablib import stats

from lablib.experiments.speculative import loops, sampling
from lablib.experiments.speculative import sampling as ss

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (conftest.py)
SHAPE = r"^{owner}\.{field}=.*: allowed .+; Fix: .+"  # the pair and its 3 journey prompts: conftest.py's fixtures


# --- the chi-square test ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("x, df, want", [(3.84, 1, 0.0500), (18.31, 10, 0.0500), (6.63, 1, 0.0100),
                                         (23.21, 10, 0.0100), (124.34, 100, 0.0500), (0.0, 1, 1.0), (0.0, 7, 1.0)])
def test_chi2_sf_matches_the_tables(x, df, want):
    assert stats.chi2_sf(x, df) == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("x", [0.01, 0.5, 3.0, 20.0, 80.0])
def test_chi2_sf_matches_closed_forms_at_one_and_two_degrees(x):
    assert stats.chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-10)
    assert stats.chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-10)


@pytest.mark.parametrize("x, df", [(5.0, 6), (30.0, 40), (800.0, 900), (1000.0, 900), (2000.0, 900)])
def test_chi2_sf_matches_the_even_df_sum_on_both_branches(x, df):
    """Q(m, y) = e^-y sum_{i<m} y^i / i! for whole m: the series (y < m + 1) and the continued fraction, far apart."""
    y = x / 2
    want = sum(math.exp(-y + i * math.log(y) - math.lgamma(i + 1)) for i in range(df // 2))
    assert stats.chi2_sf(x, df) == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_the_noncentral_sf_gives_the_z_tests_power():
    """df = 1: the statistic is (Z + sqrt(nc))^2, so its power is Phi(sqrt(nc) - z) + Phi(-sqrt(nc) - z), exactly."""
    z, nc = 1.959963984540054, 10.5
    want = (math.erfc((z - math.sqrt(nc)) / math.sqrt(2)) + math.erfc((z + math.sqrt(nc)) / math.sqrt(2))) / 2
    assert stats.noncentral_chi2_sf(z * z, 1, nc) == pytest.approx(want, rel=1e-9)
    assert stats.noncentral_chi2_sf(3.0, 4, 0.0) == stats.chi2_sf(3.0, 4)
    assert stats.detectable_w(1, 1000, alpha=0.05) == pytest.approx(math.sqrt((z + 1.2815515655446004) ** 2 / 1000), rel=1e-3)


def test_rare_bins_are_pooled_and_exact_counts_score_zero():
    fit = stats.goodness_of_fit([50, 30, 19, 1], [0.5, 0.3, 0.19, 0.01])  # expected 1 < 5: pooled with the 19
    assert (fit["bins"], fit["df"], fit["statistic"], fit["p_value"]) == (3, 2, pytest.approx(0.0), 1.0)
    rare = stats.goodness_of_fit([50, 30, 4, 4, 4, 4, 4], [0.5, 0.3, *[0.04] * 5])  # five bins of 4: one of 20
    assert rare["bins"] == 3 and rare["statistic"] == pytest.approx(0.0)
    same = stats.homogeneity([(Counter({1: 30, 2: 20, 3: 2}), Counter({1: 60, 2: 40, 3: 4}))])
    assert (same["df"], same["statistic"], same["verdict"]) == (1, pytest.approx(0.0), "same distribution")


# --- the rule at one position, exactly ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rule_rows(pair):
    return ss.rule_test(pair)


def test_the_rule_keeps_p_and_the_wrong_rules_are_rejected(rule_rows):
    assert len(rule_rows) == 2 * 2 * 3  # prompts (0, 3) x T (1.0, 0.7) x rules
    for r in rule_rows:
        assert r["n"] == 200_000 and r["df"] >= 3
        if r["rule"] == "leviathan":
            assert r["tv_from_p"] < 1e-12
            assert r["p_value"] >= ss.ALPHA and r["verdict"] == "consistent with p", r
        else:
            assert r["tv_from_p"] > 0.04
            assert r["p_value"] < 1e-12 and r["verdict"] == "rejected", r
        assert r["detectable_w"] < 0.03  # 200k trials, up to ~700 bins: under a third of Cohen's "small" (0.1)


def test_the_closed_form_laws_are_distributions(pair):
    p, q = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64), torch.tensor([[0.2, 0.2, 0.6]], dtype=torch.float64)
    assert torch.allclose(ss.rule_law(p, q, "leviathan"), p)
    for rule in ss.VERIFY_RULES:
        assert float(ss.rule_law(p, q, rule).sum()) == pytest.approx(1.0)


# --- the whole loop, against plain sampling -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def loop_rows(pair):
    return ss.loop_test(pair)  # 2 T x 4 prompts x (150 speculative + 600 plain) runs: ~25 s on one thread


def test_the_loop_samples_what_plain_sampling_samples(loop_rows, rule_rows):
    assert [r["temperature"] for r in loop_rows] == [1.0, 0.7]
    assert sampling.distribution_kept(rule_rows, loop_rows)  # the lab's check
    assert not sampling.distribution_kept([{**r, "rule": "leviathan"} for r in rule_rows], loop_rows)
    for r in loop_rows:
        assert (r["n"], r["n_plain"], r["position"], r["k"]) == (600, 2400, 2, 2)
        assert r["df"] >= 10
        assert r["p_value"] >= ss.ALPHA and r["verdict"] == "same distribution", r
        assert r["detectable_w"] < 0.3  # Cohen's "medium": found 9 times in 10 at level 0.01


def test_the_loop_test_rejects_a_loop_that_keeps_every_draft(pair):
    rows = ss.loop_test(pair, temperatures=(0.7,), runs=40, plain_runs=160, rule="accept_all")
    assert rows[0]["p_value"] < 1e-6 and rows[0]["verdict"] == "differ", rows


# --- the loop itself ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 3])
def test_at_a_tiny_temperature_the_loop_is_greedy(pair, prompts, k):
    target, draft, _ = pair
    for p in prompts:
        want = loops.greedy(target, p, 29)
        assert ss.speculative_sample(target, draft, p, 29, k, 1e-8, seed=k).tokens == want
        assert ss.sample(target, p, 29, 1e-8, n=2, seed=k) == [want, want]


def test_a_run_is_seeded_and_its_steps_add_up(pair, prompts):
    target, draft, _ = pair
    run = ss.speculative_sample(target, draft, prompts[0], 23, 4, 1.0, seed=7)
    assert run.tokens == ss.speculative_sample(target, draft, prompts[0], 23, 4, 1.0, seed=7).tokens
    assert len(run.tokens) == 23 and [t for s in run.steps for t in s.emitted] == run.tokens
    for s in run.steps:
        assert 0 <= s.accepted <= 4 and s.accepted_mask == tuple(i < s.accepted for i in range(4))
        assert list(s.emitted[:s.accepted]) == list(s.drafted[:s.accepted])
    rows = ss.sample(target, prompts[0], 5, 0.7, n=3, seed=1)
    assert len(rows) == 3 and all(len(r) == 5 for r in rows) and rows == ss.sample(target, prompts[0], 5, 0.7, 3, 1)


# --- refusals, before any forward ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [({"k": 0}, "k"), ({"temperature": 0.0}, "temperature"),
                                           ({"temperature": -1.0}, "temperature"), ({"max_new_tokens": 0},
                                                                                    "max_new_tokens"),
                                           ({"seed": -1}, "seed"), ({"rule": "accept_some"}, "rule")])
def test_bad_loop_arguments_are_refused(pair, prompts, kwargs, field):
    args = {"max_new_tokens": 8, "k": 2, "temperature": 1.0, **kwargs}
    with pytest.raises(ValueError, match=SHAPE.format(owner="speculative_sample", field=field)):
        ss.speculative_sample(pair[0], pair[1], prompts[0], **args)


@pytest.mark.parametrize("call, owner, field", [
    (lambda: ss.rule_test(n=0), "rule_test", "n"),
    (lambda: ss.rule_test(temperatures=(1.0, 0.0)), "rule_test", "temperature"),
    (lambda: ss.rule_test(rules=("leviathan", "bogus")), "rule_test", "rule"),
    (lambda: ss.rule_test(alpha=1.0), "rule_test", "alpha"),
    (lambda: ss.loop_test(runs=0), "loop_test", "runs"),
    (lambda: ss.loop_test(k=0), "loop_test", "k"),
    (lambda: ss.loop_test(temperatures=()), "loop_test", "temperatures"),
    (lambda: ss.loop_test(temperatures=(-0.5,)), "loop_test", "temperature"),
])
def test_bad_test_settings_are_refused_before_the_models_load(monkeypatch, call, owner, field):
    monkeypatch.setattr(ss, "load_pair", lambda: pytest.fail("a model loaded before the refusal"))
    with pytest.raises(ValueError, match=SHAPE.format(owner=owner, field=field)):
        call()


def test_plain_sampling_refuses_bad_settings(pair, prompts):
    with pytest.raises(ValueError, match=SHAPE.format(owner="sample", field="n")):
        ss.sample(pair[0], prompts[0], 4, 1.0, n=0)
    with pytest.raises(ValueError, match=SHAPE.format(owner="sample", field="temperature")):
        ss.sample(pair[0], prompts[0], 4, 0)
