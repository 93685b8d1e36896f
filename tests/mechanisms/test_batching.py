"""Static and continuous batching simulators on the toy cost model."""

import random

import pytest

from lablib.mechanisms.batching import (
    CostModel,
    continuous_batching,
    static_batching,
)
from lablib.stats import percentile

COST = CostModel(step_overhead=1.0, prefill_per_token=0.1, decode_per_seq=0.5)


def mixed_workload(n: int = 40, seed: int = 0) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(16, 512), rng.choice([8, 16, 32, 64, 128, 256])) for _ in range(n)]


def check_records(result, requests, arrivals=None):
    arrivals = arrivals or [0.0] * len(requests)
    assert [r.request_id for r in result.records] == list(range(len(requests)))
    for r, (p, o), a in zip(result.records, requests, arrivals):
        assert (r.prompt_len, r.output_len, r.arrival) == (p, o, a)
        assert a <= r.start < r.first_token <= r.finish
        assert r.ttft == r.first_token - a and r.latency == r.finish - a
    assert sum(s.tokens_out for s in result.steps) == sum(o for _, o in requests)
    for earlier, later in zip(result.steps, result.steps[1:]):
        assert earlier.start < earlier.end <= later.start


def test_cost_model_step_time_and_validation():
    assert COST.step_time(prefill_tokens=30, decode_seqs=2) == pytest.approx(1.0 + 3.0 + 1.0)
    with pytest.raises(ValueError, match=r"step_overhead=0 is out of range.*> 0"):
        CostModel(step_overhead=0)
    with pytest.raises(ValueError, match=r"decode_per_seq=-1 is out of range.*>= 0"):
        CostModel(decode_per_seq=-1)
    with pytest.raises(ValueError, match=r"prefill_per_token=nan"):
        CostModel(prefill_per_token=float("nan"))


def test_static_exact_timeline():
    # one prefill step for both (1 + 0.1*30 = 4), then two decode steps of the padded batch (1 + 0.5*2 = 2)
    res = static_batching([(10, 3), (20, 1)], batch_size=2, cost=COST)
    r0, r1 = res.records
    assert (r0.start, r0.first_token, r0.finish) == pytest.approx((0.0, 4.0, 8.0))
    assert (r1.start, r1.first_token, r1.finish) == pytest.approx((0.0, 4.0, 4.0))
    assert [s.decode_seqs for s in res.steps] == [0, 2, 2]  # the finished row still costs a slot
    assert res.summary.makespan == pytest.approx(8.0)
    assert res.summary.throughput == pytest.approx(4 / 8.0)
    assert res.summary.slot_utilisation == pytest.approx(4 / 6)
    assert res.summary.num_steps == 3


def test_continuous_exact_timeline():
    # same prefill step, then only the live sequence decodes (1 + 0.5 = 1.5 per step)
    res = continuous_batching([(10, 3), (20, 1)], max_num_seqs=2, max_num_batched_tokens=100, cost=COST)
    r0, r1 = res.records
    assert (r0.first_token, r0.finish) == pytest.approx((4.0, 7.0))
    assert r1.finish == pytest.approx(4.0)
    assert res.summary.makespan == pytest.approx(7.0)
    assert res.summary.mean_ttft == pytest.approx(4.0)


def test_later_arrivals_join_a_running_batch():
    # request 1 arrives mid-decode: continuous starts it at the next step, static waits for the batch
    reqs, arrivals = [(10, 10), (10, 2)], [0.0, 3.0]
    cont = continuous_batching(reqs, max_num_seqs=2, arrivals=arrivals, cost=COST)
    stat = static_batching(reqs, batch_size=1, arrivals=arrivals, cost=COST)
    check_records(cont, reqs, arrivals)
    check_records(stat, reqs, arrivals)
    assert cont.records[1].start < cont.records[0].finish
    assert stat.records[1].start == pytest.approx(stat.records[0].finish)


def test_idle_server_waits_for_arrival():
    res = continuous_batching([(8, 2)], arrivals=[100.0], cost=COST)
    assert res.records[0].start == 100.0
    assert res.summary.makespan == pytest.approx(res.records[0].finish - 100.0)
    res = static_batching([(8, 2), (8, 2)], batch_size=2, arrivals=[0.0, 50.0], cost=COST)
    assert res.records[0].start == 50.0  # a static batch waits for its last member


def test_chunked_prefill_splits_long_prompts():
    res = continuous_batching([(100, 2)], max_num_batched_tokens=40, cost=COST)
    assert [s.prefill_tokens for s in res.steps] == [40, 40, 20, 0]
    assert res.records[0].first_token == pytest.approx(res.steps[2].end)
    with pytest.raises(ValueError, match=r"prompt_len=100 > max_num_batched_tokens=40.*chunked_prefill"):
        continuous_batching([(100, 2)], max_num_batched_tokens=40, chunked_prefill=False)


def test_token_budget_is_respected():
    reqs = mixed_workload()
    res = continuous_batching(reqs, max_num_seqs=8, max_num_batched_tokens=256, cost=COST)
    check_records(res, reqs)
    assert all(s.prefill_tokens + s.decode_seqs <= 256 for s in res.steps)
    assert all(s.decode_seqs <= 8 for s in res.steps)
    for s in res.steps:  # never more than max_num_seqs requests in flight
        assert sum(r.start <= s.start < r.finish for r in res.records) <= 8


def test_continuous_beats_static_on_mixed_lengths():
    reqs = mixed_workload()
    stat = static_batching(reqs, batch_size=8, cost=COST)
    cont = continuous_batching(reqs, max_num_seqs=8, max_num_batched_tokens=8192, cost=COST)
    check_records(stat, reqs)
    check_records(cont, reqs)
    assert cont.summary.makespan <= stat.summary.makespan
    assert cont.summary.throughput >= stat.summary.throughput
    assert cont.summary.slot_utilisation > stat.summary.slot_utilisation
    assert cont.summary.mean_latency < stat.summary.mean_latency


@pytest.mark.parametrize("n", [16, 20])
def test_equal_lengths_make_both_schedules_identical(n):
    reqs = [(64, 32)] * n
    stat = static_batching(reqs, batch_size=8, cost=COST)
    cont = continuous_batching(reqs, max_num_seqs=8, max_num_batched_tokens=8 * 64, cost=COST)
    assert cont.summary.makespan == pytest.approx(stat.summary.makespan)
    assert cont.summary.num_steps == stat.summary.num_steps
    for a, b in zip(stat.records, cont.records):
        assert (a.start, a.first_token, a.finish) == pytest.approx((b.start, b.first_token, b.finish))
    if n == 16:
        assert stat.summary.slot_utilisation == pytest.approx(1.0)


def test_deterministic_and_gantt_rows():
    reqs = mixed_workload(12, seed=3)
    assert continuous_batching(reqs) == continuous_batching(reqs)
    row = static_batching(reqs, batch_size=4).rows()[0]
    assert {"policy", "request_id", "start", "first_token", "finish", "ttft", "latency"} <= row.keys()


def test_percentile_matches_linear_interpolation():
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([1, 2, 3, 4], 0) == 1 and percentile([7.0], 99) == 7.0


def test_workload_validation():
    with pytest.raises(ValueError, match=r"static_batching\.batch_size=0: allowed integers >= 1"):
        static_batching([(8, 2)], batch_size=0)
    with pytest.raises(ValueError, match=r"workload\.requests\[0\]\.output_len=-2: allowed integers >= 1"):
        continuous_batching([(8, -2)])
    with pytest.raises(ValueError, match=r"arrivals has 1 entries for 2 requests"):
        continuous_batching([(8, 2), (8, 2)], arrivals=[0.0])
    with pytest.raises(ValueError, match=r"arrivals\[0\]=-1.0 is out of range"):
        static_batching([(8, 2)], batch_size=1, arrivals=[-1.0])
    with pytest.raises(ValueError, match=r"continuous_batching\.max_num_seqs=0: allowed integers >= 1"):
        continuous_batching([(8, 2)], max_num_seqs=0)
    with pytest.raises(ValueError, match=r"workload\.requests=\[\]: allowed at least one \(prompt_len, output_len\) pair"):
        static_batching([], batch_size=1)
