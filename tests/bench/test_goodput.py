"""Goodput and the SLO capacity search (lablib.bench.goodput, lablib.bench.capacity): vLLM's per-request rule on
records built by hand, the Wilson interval, the search's interval and its refusals, and both against the fake server
and the fake `vllm bench serve --goodput`."""
from __future__ import annotations

import math

import pytest

from lablib.bench import capacity
from lablib.bench.goodput import SLO, bench_goodput, figures_ms, goodput, judge
from lablib.results.record import RequestRecord, Result


def _req(i: int, arrival: float, start: float, first: float, last: float, n: int, gaps: list[float] | None = None):
    times = None if gaps is None else [first + sum(gaps[:k]) for k in range(len(gaps) + 1)]
    return RequestRecord(f"r{i}", 10, n, arrival=arrival, start=start, first_token=first, last_token=last,
                         token_times=times)


def _result(reqs: list[RequestRecord], wall: float, sent: int | None = None) -> Result:
    return Result(lab="05_serving", step="t", engine="vllm-server", config={}, model={}, workload={
        "name": "w", "requests": sent if sent is not None else len(reqs)}, requests=reqs, wall_s=wall)


def test_a_request_is_good_when_every_target_is_met_and_failures_count_against_the_slo():
    reqs = [_req(0, 0.0, 0.0, 0.2, 1.2, 11),  # TTFT 200 ms, TPOT 100 ms
            _req(1, 0.0, 0.4, 0.6, 1.6, 11),  # queued in the client: TTFT 600 ms from arrival, 200 from send
            _req(2, 0.0, 0.0, 0.1, 0.1, 1),  # one token: TPOT 0 (vLLM's rule)
            _req(3, 0.0, 0.0, 0.1, 3.1, 11)]  # TPOT 300 ms
    slo = SLO(ttft_ms=500, tpot_ms=150, percentile=50)
    out = goodput(_result(reqs, 4.0, sent=5), slo)  # a fifth request failed
    assert (out["good"], out["sent"], out["completed"]) == (2, 5, 4)
    assert out["goodput_rps"] == pytest.approx(0.5) and out["attainment"] == pytest.approx(0.4) and not out["holds"]
    assert out["missed"] == {"ttft": 1, "tpot": 1}
    sent = goodput(_result(reqs, 4.0, sent=5), slo, clock="send")  # vllm bench serve's clock: the queue is forgiven
    assert sent["good"] == 3 and sent["holds"]  # 3 of 5 = 60% >= 50%
    assert figures_ms(reqs[2])["tpot"] == 0.0 and figures_ms(RequestRecord("x", 1, 0))["ttft"] is None
    assert figures_ms(reqs[0])["itl"] is None and figures_ms(reqs[2])["itl"] == 0.0  # gaps unknown: no ITL, not 0
    assert not judge([figures_ms(reqs[0])], 1, 1.0, SLO(itl_ms=1000))["good"]  # an unknown gap never meets a target


def test_the_slo_holds_exactly_at_its_percentile_and_an_itl_target_reads_the_worst_gap():
    fine = [{"ttft": 100.0, "tpot": 10.0, "itl": 12.0, "e2el": 500.0}] * 9
    stall = [{"ttft": 100.0, "tpot": 10.0, "itl": 80.0, "e2el": 500.0}]
    assert judge(fine + stall, 10, 1.0, SLO(itl_ms=50, percentile=90))["holds"]  # 9 of 10 = 90%
    assert not judge(fine + stall, 10, 1.0, SLO(itl_ms=50, percentile=91))["holds"]
    r = _req(0, 0.0, 0.0, 0.1, 0.19, 4, gaps=[0.01, 0.07, 0.01])
    assert figures_ms(r)["itl"] == pytest.approx(70.0) and figures_ms(r)["tpot"] == pytest.approx(30.0)


@pytest.mark.parametrize("kw, field", [({"ttft_ms": 0}, "ttft_ms"), ({"tpot_ms": -1}, "tpot_ms"),
                                       ({"ttft_ms": 100, "percentile": 0}, "percentile"),
                                       ({"ttft_ms": 100, "percentile": 100}, "percentile"),
                                       ({"ttft_ms": math.nan}, "ttft_ms"), ({}, "ttft_ms/tpot_ms/itl_ms/e2el_ms")])
def test_bad_targets_are_refused_with_the_field_and_the_fix(kw, field):
    with pytest.raises(ValueError, match=rf"^SLO\.{field}=.*allowed .*; Fix: "):
        SLO(**kw)


def test_vllm_bench_serve_goodput_args_and_its_records_judged_by_the_same_rule():
    assert SLO(ttft_ms=500, tpot_ms=20.5).bench_args() == ["ttft:500", "tpot:20.5"]
    with pytest.raises(ValueError, match=r"SLO\.itl_ms=.*vllm bench serve"):
        SLO(itl_ms=50).bench_args()
    bench = {"duration": 2.0, "ttfts": [0.1, 0.3, 0.1, 0.2], "latencies": [1.1, 1.3, 0.1, 5.2],
             "output_lens": [11, 11, 1, 11], "itls": [[0.1] * 10, [0.1] * 10, [], [0.5] * 10],
             "errors": ["", "", "", ""]}
    out = bench_goodput(bench, SLO(ttft_ms=250, tpot_ms=150, percentile=50))  # good: 0 and 2 (1: TTFT, 3: TPOT)
    assert (out["good"], out["goodput_rps"]) == (2, pytest.approx(1.0))
    bench["errors"][0] = "HTTP 500"
    assert bench_goodput(bench, SLO(ttft_ms=250, tpot_ms=150))["good"] == 1


def test_the_wilson_interval_and_the_requests_a_percentile_needs():
    lo, hi = capacity.wilson(64, 64)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(64 / (64 + 1.959964 ** 2))
    assert capacity.wilson(0, 0) == (0.0, 1.0)
    for pct in (50, 90, 95, 99):
        n = capacity.requests_to_decide(pct)
        assert capacity.wilson(n, n)[0] * 100 >= pct > capacity.wilson(n - 1, n - 1)[0] * 100


class _Server:
    """A load test's outcome as a function of rate: every request good below `knee`, a share `tail` above it."""

    def __init__(self, knee: float, tail: float = 0.5, n: int = 100):
        self.knee, self.tail, self.n, self.calls = knee, tail, n, []

    def __call__(self, rate: float, seed: int) -> Result:
        self.calls.append((rate, seed))
        good = self.n if rate <= self.knee else int(self.n * self.tail)
        reqs = [_req(i, 0.0, 0.0, 0.1 if i < good else 9.0, 1.0 if i < good else 10.0, 11) for i in range(self.n)]
        return _result(reqs, self.n / rate)


def test_the_search_brackets_the_knee_within_its_tolerance():
    server = _Server(knee=10.0)
    out = capacity.capacity_search(server, SLO(ttft_ms=1000), 1.0, 100.0, requests=100, rel_tol=0.05, rounds=20)
    lo, hi = out["interval_rps"]
    assert lo <= 10.0 < hi and hi / lo <= 1.05 and out["capacity_rps"] == lo
    assert [c[0] for c in server.calls[:2]] == [1.0, 100.0] and "capacity in" in out["verdict"]
    assert all(p["holds"] == (p["rate"] <= 10.0) for p in out["probes"])


def test_a_probe_too_close_to_call_is_measured_again_then_counted_as_failing():
    server = _Server(knee=0.0, tail=0.9)  # 90 of 100 good at every rate: straddles a 90% target
    out = capacity.capacity_search(server, SLO(ttft_ms=1000, percentile=90), 1.0, 8.0, requests=100, repeats=2)
    assert out["interval_rps"] == (None, 1.0) and "fails even at low" in out["verdict"]
    probe = out["probes"][0]
    assert probe["runs"] == 3 and probe["requests"] == 300 and probe["uncertain"] and not probe["holds"]
    assert server.calls == [(1.0, 0), (1.0, 1), (1.0, 2)]  # one seed per repeat: new arrivals, same requests


def test_a_capacity_above_the_bounds_says_so_and_bad_searches_are_refused_before_any_probe():
    out = capacity.capacity_search(_Server(knee=1e9), SLO(tpot_ms=500), 1.0, 8.0, requests=100)
    assert out["interval_rps"] == (8.0, None) and "raise high" in out["verdict"]
    never = lambda rate, seed: pytest.fail("a probe ran")  # noqa: E731
    for kw, field in (({"low": 4.0, "high": 2.0}, "high"), ({"low": 0.0}, "low"), ({"high": math.inf}, "high"),
                      ({"rounds": -1}, "rounds"), ({"rel_tol": 0.0}, "rel_tol"), ({"requests": 8}, "requests")):
        args = {"low": 1.0, "high": 8.0, "requests": 100, **kw}
        with pytest.raises(ValueError, match=rf"capacity_search\.{field}=.*allowed.*Fix:"):
            capacity.capacity_search(never, SLO(ttft_ms=100, percentile=95), args.pop("low"), args.pop("high"),
                                     **args)


def test_the_search_and_the_goodput_referee_on_the_fake_server(fake_vllm_cli, tmp_path):
    """The live path end to end without a GPU: the server started once, each probe a load test kept in the store,
    and `vllm bench serve --goodput`'s request_goodput equal to the lab's rule on vLLM's own records."""
    from lablib.bench.vllm_bench import bench_serve
    from lablib.experiments.serving import capacity as serving_capacity
    from lablib.experiments.serving.runs import prepare, started
    from lablib.results.store import ResultStore

    store = ResultStore(tmp_path / "05.jsonl")
    slo = SLO(ttft_ms=100, percentile=90)
    out = serving_capacity.on_server(slo, None, None, "embedded", repeat=1, out_dir=tmp_path, store=store, rounds=2)
    assert not out["burst"]["holds"], out["burst"]["verdict"]  # the fake's 8 slots: a burst of 64 queues past 100 ms
    assert out["burst_capacity_rps"] > 0 and out["probes"][0]["rate"] == pytest.approx(
        round(out["burst_capacity_rps"] / 16, 3))
    steps = [r.step for r in store.load()]
    assert steps[0] == "capacity-rate-inf" and len(steps) == 1 + sum(p["runs"] for p in out["probes"])
    assert (tmp_path / "server.log").read_text().count("fake api_server") == 1
    easy = serving_capacity.on_server(SLO(ttft_ms=600_000), None, None, "embedded", repeat=1, out_dir=tmp_path / "e")
    assert easy["probes"] == [] and easy["verdict"].startswith("even everything at once meets the SLO")
    wl, cfg, _, _ = prepare("embedded", "journey", 1, tmp_path / "b", {})
    with started(cfg, tmp_path / "b", {"server": {}}) as server:
        bench = bench_serve(server.base_url, server.api_key, server.model, cfg.tokenizer or cfg.model, wl,
                            math.inf, tmp_path / "b", slo=SLO(ttft_ms=400, tpot_ms=50))
    assert "--goodput" in bench["command"] and bench["goodput"]["goodput_rps"] == pytest.approx(
        bench["request_goodput"], rel=1e-12)
