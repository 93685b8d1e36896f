"""Speculative-decoding acceptance maths, its inverse from vLLM's counters, cost, batch roofline, Monte Carlo."""

import math
from fractions import Fraction as F

import pytest

from lablib.mechanisms.speculative import (
    Roofline,
    SpecCounters,
    acceptance,
    alpha_for_acceptance_length,
    alpha_from_per_position,
    break_even_alpha,
    estimate_alpha,
    expected_tokens_per_step,
    implied_draft_cost,
    optimal_k,
    reversal_batch,
    simulate_acceptance,
    speedup,
    speedup_vs_batch,
)

# H200 spec-sheet numbers (not measured): 4.8e12 B/s HBM3e, 989e12 dense bf16 FLOP/s.
H200_TARGET_8B = Roofline(weight_bytes=16e9, bandwidth=4.8e12, flops_per_token=16e9, peak_flops=989e12)
H200_DRAFT_1B = Roofline(weight_bytes=2e9, bandwidth=4.8e12, flops_per_token=2e9, peak_flops=989e12)


# --- acceptance -------------------------------------------------------------------------------


def test_tokens_per_step_at_the_ends_and_in_between():
    for k in (1, 4, 7):
        assert expected_tokens_per_step(0, k) == 1  # every draft rejected: the target's correction token
        assert expected_tokens_per_step(1, k) == k + 1  # all accepted, plus the bonus token; no 0/0
        assert expected_tokens_per_step(1.0, k) == k + 1
    assert expected_tokens_per_step(F(1, 2), 4) == F(31, 16)
    assert expected_tokens_per_step(0.5, 4) == 31 / 16
    assert expected_tokens_per_step(0.9, 3) == pytest.approx((1 - 0.9**4) / (1 - 0.9), abs=1e-15)


def test_accepted_count_distribution_and_vllm_quantities():
    a = acceptance(F(1, 2), 4)
    assert a.distribution == (F(1, 2), F(1, 4), F(1, 8), F(1, 16), F(1, 16))
    assert sum(a.distribution) == 1
    assert 1 + sum(j * p for j, p in enumerate(a.distribution)) == a.mean_acceptance_length == F(31, 16)
    assert a.per_position == (F(1, 2), F(1, 4), F(1, 8), F(1, 16))
    assert a.acceptance_rate == F(15, 64)  # vLLM's accepted / draft tokens: (E - 1) / k, well below alpha = 1/2
    f = acceptance(0.8, 6)
    assert sum(f.distribution) == pytest.approx(1, abs=1e-15)
    assert 1 + sum(j * p for j, p in enumerate(f.distribution)) == pytest.approx(f.mean_acceptance_length, abs=1e-14)


# --- the inverse: alpha from vLLM's counters ----------------------------------------------------


def test_alpha_round_trips_through_the_acceptance_length():
    for alpha, k in ((0.0, 4), (0.3, 1), (0.7, 4), (0.95, 8), (1.0, 3)):
        e = expected_tokens_per_step(alpha, k)
        assert alpha_for_acceptance_length(e, k) == pytest.approx(alpha, abs=1e-12)


def test_alpha_round_trips_through_per_position_counts():
    drafts = 10_000
    counts = [drafts * F(3, 5) ** i for i in range(1, 5)]  # 6000, 3600, 2160, 1296: exactly drafts x alpha^i
    assert all(c.denominator == 1 for c in counts)
    assert alpha_from_per_position([int(c) for c in counts], drafts) == 0.6
    assert alpha_from_per_position([drafts] * 4, drafts) == 1.0
    assert alpha_from_per_position([0, 0, 0, 0], drafts) == 0.0


def test_project_counters_embedded_pair_k4():
    c = SpecCounters(num_drafts=751, num_draft_tokens=3004, num_accepted_tokens=1399)  # H200 run, facts note
    assert c.mean_acceptance_length == 1 + 1399 / 751
    assert round(c.mean_acceptance_length, 2) == 2.86
    assert c.acceptance_rate == 1399 / 3004  # 0.466: vLLM's rate, not alpha
    alpha = estimate_alpha(c)
    assert expected_tokens_per_step(alpha, 4) == pytest.approx(c.mean_acceptance_length, abs=1e-12)
    assert round(alpha, 4) == 0.7168


# --- cost and speedup ---------------------------------------------------------------------------


def test_speedup_hand_computed():
    # E(0.8, 4) = 1 + 0.8 + 0.64 + 0.512 + 0.4096 = 3.3616; cost 4 x 0.05 + 1 = 1.2
    assert speedup(F(4, 5), 4, F(1, 20)) == F(33616, 12000) == F(2101, 750)
    assert speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2, abs=1e-14)
    assert speedup(0.8, 4, 0) == pytest.approx(3.3616, abs=1e-14)  # n-gram: c ~ 0
    assert speedup(F(1, 2), 4, 0, verify_cost=5) == F(31, 80)  # compute-bound verify of 5 positions


def test_project_measured_case_is_slower():
    alpha = alpha_for_acceptance_length(2.86, 4)
    s = speedup(alpha, 4, 1.0)  # tiny draft, tiny target: a draft step costs a target step
    assert s == pytest.approx(2.86 / 5, abs=1e-12) and s < 1
    # measured 293 / 479 tok/s = 0.61x at length 2.86: the draft cost 0.919 target steps
    assert implied_draft_cost(2.86, 4, 293 / 479) == pytest.approx((2.86 * 479 / 293 - 1) / 4, abs=1e-12)
    assert round(implied_draft_cost(2.86, 4, 293 / 479), 3) == 0.919


def test_optimal_k_exact():
    # alpha 1/2, c 1/10: k=1 -> 3/2 / 11/10 = 15/11; k=2 -> 7/4 / 6/5 = 35/24; k=3 -> 15/8 / 13/10 = 75/52
    assert optimal_k(F(1, 2), F(1, 10), k_max=3) == (2, F(35, 24))
    assert optimal_k(F(1, 2), F(1, 10)) == (2, F(35, 24))
    assert optimal_k(F(1, 2), F(1, 4)) == (1, F(6, 5))
    assert optimal_k(0.8, 0.05)[0] == 8  # 3.0921x; k=7 gives 3.0823x, k=9 3.0780x
    assert optimal_k(1, 0, k_max=5) == (5, 6)  # free perfect drafts: the longest allowed
    assert optimal_k(0, 0, k_max=4) == (1, 1)  # every k ties at 1x: the smallest


def test_break_even_alpha_exact():
    assert break_even_alpha(1, 0.25) == pytest.approx(0.25, abs=1e-15)  # 1 + a = 1 + c
    assert break_even_alpha(2, 0.5) == pytest.approx((math.sqrt(5) - 1) / 2, abs=1e-15)  # 1 + a + a^2 = 2
    assert speedup(break_even_alpha(4, 0.3), 4, 0.3) == pytest.approx(1, abs=1e-12)
    assert break_even_alpha(4, 0) == 0.0  # n-gram at memory-bound verify: never slower
    assert break_even_alpha(4, 0, verify_cost=0.5) == 0.0  # a step cheaper than a target step pays at alpha 0
    assert break_even_alpha(4, 1.0, verify_cost=1.5) is None  # costs 5.5 steps, yields at most 5 tokens
    assert break_even_alpha(4, 1.0) == 1.0  # costs 5 steps: only perfect drafts break even


# --- batch size -----------------------------------------------------------------------------------


def test_target_roofline_step_time():
    t = H200_TARGET_8B
    assert t.step_time(1) == 16e9 / 4.8e12  # 3.33 ms: memory-bound
    assert t.step_time(1, 5) == t.step_time(1)  # the verify pass over k+1 positions is free here
    assert t.step_time(512) == 512 * 16e9 / 989e12  # compute-bound
    assert Roofline(16e9, 4.8e12, 16e9, 989e12, overhead=1e-3).step_time(1) == 16e9 / 4.8e12 + 1e-3


def test_speedup_reverses_with_batch_on_the_worked_example():
    points = speedup_vs_batch(0.8, 4, [1, 64, 117, 118, 256], H200_TARGET_8B, H200_DRAFT_1B)
    assert [p.batch for p in points] == [1, 64, 117, 118, 256]
    first, last = points[0], points[-1]
    assert (first.draft_cost, first.verify_cost) == (0.125, 1.0)
    assert first.speedup == pytest.approx(3.3616 / 1.5, abs=1e-12) and first.speedup > 1
    assert last.verify_cost == 5.0 and last.speedup == pytest.approx(3.3616 / 5.5, abs=1e-12) and last.speedup < 1
    assert points[2].speedup > 1 > points[3].speedup
    assert reversal_batch(0.8, 4, H200_TARGET_8B, H200_DRAFT_1B) == 118
    assert reversal_batch(0.8, 4, H200_TARGET_8B) == 139  # n-gram: no draft forward, later reversal
    assert reversal_batch(0.8, 4, H200_TARGET_8B, H200_DRAFT_1B, max_batch=64) is None


# --- Monte Carlo ----------------------------------------------------------------------------------


def test_simulation_matches_the_formula_within_three_standard_errors():
    alpha, k, steps = 0.7, 4, 20_000
    model = acceptance(alpha, k)
    sim = simulate_acceptance(alpha, k, steps, seed=0)
    assert (sim.num_drafts, sim.num_draft_tokens) == (steps, steps * k)
    # Var(accepted) = E[J^2] - E[J]^2 = 5.5657 - 1.7731^2 = 2.4218; se = sqrt(2.4218 / 20000) = 0.0110
    mean_j = model.mean_acceptance_length - 1
    var = sum(j * j * p for j, p in enumerate(model.distribution)) - mean_j**2
    se = math.sqrt(var / steps)
    assert se == pytest.approx(0.011004, abs=1e-6)
    assert abs(sim.mean_acceptance_length - model.mean_acceptance_length) < 3 * se
    for rate, p in zip(sim.per_position_rates, model.per_position):  # binomial se sqrt(p(1-p)/n): 0.0032 .. 0.0030
        assert abs(rate - p) < 3 * math.sqrt(p * (1 - p) / steps)
    # the per-position MLE: se = sqrt(a(1-a) / trials), trials ~ 20000 x (1 + .7 + .49 + .343) = 50660: 0.0020
    assert abs(estimate_alpha(sim) - alpha) < 3 * math.sqrt(alpha * (1 - alpha) / 50_660)
    assert simulate_acceptance(alpha, k, steps, seed=0) == sim  # seeded: the same draws every run
    assert simulate_acceptance(0, 3, 100).num_accepted_tokens == 0
    assert simulate_acceptance(1, 3, 100).accepted_per_pos == (100, 100, 100)


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda: expected_tokens_per_step(1.5, 4),
     r"expected_tokens_per_step\.alpha=1\.5: allowed a number in \[0, 1\]; Fix:"),
    (lambda: acceptance(-0.1, 4), r"acceptance\.alpha=-0\.1: allowed"),
    (lambda: acceptance(F(3, 2), 4), r"acceptance\.alpha=1\.5: allowed"),
    (lambda: speedup(float("nan"), 4, 0.1), r"expected_tokens_per_step\.alpha=nan"),
    (lambda: expected_tokens_per_step(0.5, 0), r"expected_tokens_per_step\.k=0: allowed integers >= 1; Fix:"),
    (lambda: acceptance(0.5, 2.0), r"acceptance\.k=2\.0: allowed integers >= 1"),
    (lambda: speedup(0.5, 4, -0.1), r"speedup\.draft_cost=-0\.1: allowed a number in \[0, inf\]; Fix:"),
    (lambda: speedup(0.5, 4, 0.1, verify_cost=0), r"speedup\.verify_cost=0: allowed a number in \(0, inf\]"),
    (lambda: break_even_alpha(0, 0.1), r"break_even_alpha\.k=0"),
    (lambda: optimal_k(0.5, 0.1, k_max=0), r"optimal_k\.k_max=0"),
    (lambda: simulate_acceptance(0.5, 4, 0), r"simulate_acceptance\.steps=0: allowed integers >= 1; Fix:"),
    (lambda: simulate_acceptance(0.5, 0, 10), r"simulate_acceptance\.k=0"),
    (lambda: alpha_for_acceptance_length(5.5, 4),
     r"alpha_for_acceptance_length\.length=5\.5: allowed a number in \[1, 5\]"),
    (lambda: alpha_from_per_position([3, 5], 10),
     r"alpha_from_per_position\.accepted_per_pos=\[3, 5\]: allowed non-increasing"),
    (lambda: alpha_from_per_position([11], 10), r"alpha_from_per_position\.accepted_per_pos=\[11\]: allowed .*0\.\.10"),
    (lambda: SpecCounters(0, 0, 0), r"SpecCounters\.num_drafts=0"),
    (lambda: SpecCounters(10, 40, 41), r"SpecCounters\.num_accepted_tokens=41: allowed at most num_draft_tokens=40"),
    (lambda: SpecCounters(10, 40, 9, (5, 5)), r"SpecCounters\.accepted_per_pos=\(5, 5\): allowed counts summing to"),
    (lambda: estimate_alpha(SpecCounters(10, 35, 9)),
     r"estimate_alpha\.counters\.num_draft_tokens=35: allowed a multiple"),
    (lambda: implied_draft_cost(2.86, 4, 0), r"implied_draft_cost\.measured_speedup=0"),
    (lambda: Roofline(0, 4.8e12, 16e9, 989e12), r"Roofline\.weight_bytes=0: allowed a number in \(0, inf\]"),
    (lambda: Roofline(16e9, 4.8e12, 16e9, 989e12, overhead=-1), r"Roofline\.overhead=-1"),
    (lambda: H200_TARGET_8B.step_time(0), r"Roofline\.step_time\.batch=0"),
    (lambda: speedup_vs_batch(0.8, 4, [1, 0], H200_TARGET_8B), r"speedup_vs_batch\.batches=\[1, 0\]"),
])
def test_bad_inputs_are_refused_naming_the_field(call, message):
    with pytest.raises(ValueError, match=message):
        call()
