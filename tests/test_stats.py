"""lablib.stats: one percentile everywhere (numpy's default linear interpolation), distributions that skip
missing values, and the spread of repeated measurements. Pure Python (numpy only as the reference)."""

import random

import numpy as np
import pytest

from lablib.stats import PERCENTILES, distribution, percentile, percentile_of, spread

LISTS = [[7.0], [1, 2], [4, 1, 3, 2], [0.5, 0.25, 10.0, 3.0, 3.0], [-2.0, 5.0, 1e-9, 1e9, 0.0, 42.0, 7.5]]


@pytest.mark.parametrize("xs", LISTS)
def test_percentile_equals_numpy(xs):
    for q in (0, 1, 10, 25, 50, 75, 90, 99, 99.9, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-12), (xs, q)


def test_percentile_on_random_lists_and_fixed_points():
    rng = random.Random(0)
    for n in (3, 10, 101):
        xs = [rng.lognormvariate(0, 1) for _ in range(n)]
        for q in (50, 90, 99):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)
    assert percentile([1, 2], 50) == 1.5  # the module's own example: interpolated, not the lower value
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([3, 1, 2], 0) == 1 and percentile([3, 1, 2], 100) == 3
    xs = [3.0, 1.0, 2.0]
    percentile(xs, 50)
    assert xs == [3.0, 1.0, 2.0]  # the input is not sorted in place


def test_percentile_refuses_no_values_and_q_out_of_range():
    with pytest.raises(ValueError, match="at least one value"):
        percentile([], 50)
    for q in (-1, 100.5):
        with pytest.raises(ValueError, match=rf"q={q!r}: allowed 0\.\.100"):
            percentile([1.0], q)


def test_percentile_of_skips_none():
    assert percentile_of([], 50) is None and percentile_of([None, None], 99) is None
    assert percentile_of([3.0, None, 1.0], 50) == 2.0
    assert percentile_of(iter([None, 4.0]), 90) == 4.0  # any iterable


def test_distribution():
    d = distribution([1.0, None, 2.0, 3.0, 4.0])
    assert set(d) == {"mean", *(f"p{q}" for q in PERCENTILES)} and PERCENTILES == (50, 90, 99)
    assert d["mean"] == 2.5 and d["p50"] == 2.5
    assert d["p90"] == pytest.approx(float(np.percentile([1, 2, 3, 4], 90)))
    assert d["p99"] == pytest.approx(float(np.percentile([1, 2, 3, 4], 99)))


def test_distribution_of_nothing_is_all_none():
    empty = {"mean": None, "p50": None, "p90": None, "p99": None}
    assert distribution([]) == empty
    assert distribution([None, None]) == empty
    assert distribution(iter([])) == empty


def test_spread():
    assert spread([10.0, 12.0, 14.0]) == pytest.approx((14 - 10) / 12)
    assert spread([5.0, 5.0]) == 0.0
    assert spread([14702, 17321, 16973]) == pytest.approx((17321 - 14702) / (sum([14702, 17321, 16973]) / 3))
    assert spread([1.0]) is None and spread([]) is None  # one measurement has no spread
    assert spread([-1.0, 1.0]) is None  # a zero mean: no relative spread
    assert spread((2.0, 4.0)) == pytest.approx(2 / 3)  # any sequence
