"""The referee (lablib.bench.referee, run by lablib.experiments.serving.runs.cross_check) on constructed data
and once end to end against the fake server and the fake `vllm bench serve`.

The statistic: output tokens per second between the times 10% and 90% of a round's tokens had arrived, from the
lab's token_times and from vLLM's --save-detailed start_times + ttfts + itls. The rule: |mean ratio - 1| within
a Welch bound at 99% from both clients' round-to-round standard errors, each client's own spread <= 3%, the bound
<= 5%, every window >= 2 s, the same output tokens from both."""
import math
import os

import pytest

from lablib.bench.referee import _t_quantile, bench_token_times, lab_token_times, referee, steady_rate, welch_agreement
from lablib.bench.vllm_bench import bench_serve_command, summary_of
from lablib.results.record import RequestRecord, Result

FAKE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fake_vllm")


def _burst(rate_tok_s: float, streams: int = 8, tokens: int = 1000, ramp_s: float = 0.05, tail: int = 40):
    """A burst on a constructed clock: `streams` requests of `tokens` tokens at a steady aggregate rate, started
    over a ramp (prefill), the last request's final `tail` tokens 0.1 s apart (a long request alone at the end):
    the edges the window drops (8,000 tokens: 10% is 800, the ramp and the tail hold fewer)."""
    per = streams / rate_tok_s  # each stream's gap at the steady rate
    out = []
    for s in range(streams):
        first = ramp_s * (s + 1) / streams
        times = [first + k * per for k in range(tokens)]
        if s == streams - 1:
            times = times[:-tail] + [times[-tail - 1] + 0.1 * (k + 1) for k in range(tail)]
        out.append(times)
    return out


def test_t_quantiles_match_the_tables():
    assert _t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert _t_quantile(0.995, 6) == pytest.approx(3.7074, abs=1e-4)
    assert _t_quantile(0.995, 2) == pytest.approx(9.9248, abs=1e-4)
    assert _t_quantile(0.975, math.inf) == pytest.approx(1.95996, abs=1e-4)


def test_steady_rate_drops_the_edges_and_reads_both_clients_alike():
    streams = _burst(4000.0)
    flat = [t for s in streams for t in s]
    s = steady_rate(flat)
    assert s["tok_s"] == pytest.approx(4000.0, rel=0.03)  # the steady rate, not the ramp's or the tail's
    whole = len(flat) / (max(flat) - min(flat))
    assert whole < 0.5 * s["tok_s"]  # the whole-burst figure is dragged down by the tail
    n = len(flat)
    assert s["tokens"] == math.ceil(0.9 * (n - 1)) - math.floor(0.1 * (n - 1))
    # the same burst as the lab's records and as vLLM's --save-detailed lists: the same statistic
    recs = [RequestRecord(f"r{i}", 5, len(ts), first_token=ts[0], last_token=ts[-1], token_times=ts)
            for i, ts in enumerate(streams)]
    result = Result(lab="t", step="s", engine="vllm-server", config={}, model={}, workload={}, requests=recs, wall_s=1.0)
    offset = 1234.5  # vLLM's client stamps on its own perf_counter clock
    starts = [offset + ts[0] - 0.01 for ts in streams]
    bench = {"start_times": starts, "ttfts": [0.01] * len(streams), "output_lens": [len(ts) for ts in streams],
             "itls": [[b - a for a, b in zip(ts, ts[1:])] for ts in streams], "errors": [""] * len(streams)}
    assert steady_rate(lab_token_times(result))["tok_s"] == pytest.approx(s["tok_s"])
    assert steady_rate(bench_token_times(bench))["tok_s"] == pytest.approx(s["tok_s"], rel=1e-9)
    assert summary_of(bench)["steady"]["tok_s"] == pytest.approx(s["tok_s"], rel=1e-9)  # kept when the lists go
    failed = {**bench, "errors": ["boom"] + [""] * (len(streams) - 1)}
    assert len(bench_token_times(failed)) == len(flat) - len(streams[0])  # a failed request carries no tokens
    # an event carrying two tokens gives both its time
    assert bench_token_times({"start_times": [0.0], "ttfts": [1.0], "itls": [[1.0]], "output_lens": [4],
                              "errors": [""]}) == [1.0, 1.0, 2.0, 2.0]
    assert steady_rate([1.0] * 5) is None and steady_rate([2.0] * 20) is None


def test_agreeing_steady_clients_agree():
    lab = [20_100, 19_900, 20_050, 19_950]
    ref = [19_980, 20_120, 19_900, 20_000]
    v = welch_agreement(lab, ref)
    assert v["agree"], v["verdict"]
    assert v["lab_cv"] < 0.01 and v["bound"] < 0.02 and v["confidence"] == 0.99
    a, b = v["lab_cv"] ** 2 / 4, v["vllm_cv"] ** 2 / 4
    assert v["se"] == pytest.approx(math.sqrt(a + b))
    assert v["df"] == pytest.approx((a + b) ** 2 / (a ** 2 / 3 + b ** 2 / 3))
    assert v["bound"] == pytest.approx(_t_quantile(0.995, v["df"]) * v["se"])
    assert "they agree" in v["verdict"]


def test_clients_further_apart_than_the_bound_fail():
    lab = [20_100, 19_900, 20_050, 19_950]  # each client steady (cv < 1%), 4% apart: a real gap
    ref = [20_900, 20_750, 20_850, 20_800]
    v = welch_agreement(lab, ref)
    assert not v["agree"] and abs(v["ratio"] - 1) > v["bound"]
    assert any("beyond the measured noise" in f for f in v["failed"]) and len(v["failed"]) == 1


def test_a_noisy_client_fails_instead_of_widening_the_bound():
    lab = [20_000, 20_050, 19_950, 20_000]
    ref = [17_000, 23_000, 18_500, 21_500]  # mean 20,000: the same mean, but vLLM's client scatters 13%
    v = welch_agreement(lab, ref)
    assert not v["agree"] and abs(v["ratio"] - 1) < v["bound"]  # the old rule would have called this agreement
    assert any("vLLM client's own spread" in f and "too noisy" in f for f in v["failed"])
    assert any("cannot resolve" in f for f in v["failed"])
    few = welch_agreement([20_000], [20_000])
    assert not few["agree"] and "too few rounds" in few["verdict"]
    # each client steady enough (2.5% < 3%), but three rounds cannot resolve a 5% gap at 99%: inconclusive
    wide = welch_agreement([20_500, 19_500, 20_000], [19_500, 20_500, 20_000])
    assert not wide["agree"] and wide["bound"] > 0.05 and wide["lab_cv"] < 0.03


def _round(lab_tok_s, ref_tok_s, window_s=5.0, tokens=(1000, 1000, 1000)):
    return {"steady": {"lab": {"tok_s": lab_tok_s, "window_s": window_s},
                       "vllm_bench": {"tok_s": ref_tok_s, "window_s": window_s}},
            "output_tokens": {"lab": tokens[0], "vllm_bench": tokens[1], "expected": tokens[2]}}


def test_referee_on_rounds_needs_long_windows_and_the_same_work():
    good = [_round(20_100, 19_980), _round(19_900, 20_120), _round(20_050, 19_900), _round(19_950, 20_000)]
    assert referee(good)["agree"]
    short = good[:3] + [_round(19_950, 20_000, window_s=1.5)]
    v = referee(short)
    assert not v["agree"] and any("steady window 1.50 s < 2 s" in f for f in v["failed"])
    assert referee(short, min_window_s=1.0)["agree"]
    lost = good[:3] + [_round(19_950, 20_000, tokens=(1000, 990, 1000))]
    assert not referee(lost)["agree"] and "not the same work" in referee(lost)["verdict"]
    missing = good[:3] + [{"steady": {"lab": None, "vllm_bench": None}, "output_tokens": {}}]
    assert not referee(missing)["agree"]


def test_bench_serve_command_caps_concurrency(tmp_path):
    cmd = bench_serve_command("u", "m", "t", tmp_path / "d.jsonl", 3, math.inf, tmp_path, "r", max_concurrency=16)
    assert cmd[cmd.index("--max-concurrency") + 1] == "16"
    assert "--max-concurrency" not in bench_serve_command("u", "m", "t", tmp_path / "d.jsonl", 3, math.inf, tmp_path, "r")
    with pytest.raises(ValueError, match="max_concurrency"):
        bench_serve_command("u", "m", "t", tmp_path / "d.jsonl", 3, math.inf, tmp_path, "r", max_concurrency=0)


def test_cross_check_end_to_end_on_the_fake(monkeypatch, tmp_path):
    """Both clients on one fake server (8 slots, 1 ms a token), 3 rounds at 8 in flight: every round's
    statistic is there for both, the same work delivered, and the verdict states its numbers."""
    from lablib.experiments.serving.runs import cross_check

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FAKE, *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("FAKE_VLLM_TOKEN_DELAY", "0.001")
    monkeypatch.delenv("FAKE_VLLM_BENCH_FAIL", raising=False)
    out = cross_check("embedded", repeat=1, times=3, max_concurrency=8, out_dir=tmp_path, min_window_s=0.1,
                      max_cv=1.0, max_bound=1.0)  # 2 shared CPU cores: the fake's pace is not a steady instrument
    assert [r["lab_first"] for r in out["rounds"]] == [True, False, True]
    assert [r.step for r in out["results"]] == [f"check{i}-rate-inf-conc-8" for i in range(3)]
    expected = sum(r.output_tokens for r in out["results"][0].requests)
    for rnd in out["rounds"]:
        assert rnd["output_tokens"] == {"lab": expected, "vllm_bench": expected, "expected": expected}
        for who in ("lab", "vllm_bench"):
            s = rnd["steady"][who]
            assert s["window_s"] > 0.1 and 0 < s["tok_s"] <= 8 / 0.001 * 1.05  # at most 8 streams at 1 ms a token
    ref = out["referee"]
    assert ref["n"] == [3, 3] and ref["confidence"] == 0.99 and ref["min_window_s"] == 0.1
    assert ref["ratio"] == pytest.approx(sum(r["steady"]["lab"]["tok_s"] for r in out["rounds"]) /
                                         sum(r["steady"]["vllm_bench"]["tok_s"] for r in out["rounds"]))
    assert f"{ref['ratio']:.3f}" in ref["verdict"]  # agreement itself is the H200's test: the fake is no instrument
    assert 0.1 < ref["ratio"] < 10  # but a units or counting bug in either statistic would show
    assert ref["agree"] == (not ref["failed"])
    assert (tmp_path / "server.log").read_text().count("fake api_server") == 1  # one server for every round


def test_the_referee_runs_against_an_endpoint_it_did_not_start(monkeypatch, tmp_path):
    """cross_check_endpoint on a server started elsewhere (here the fake, standing in for `vllm serve` in front of
    a Ray cluster): the same alternating rounds and verdict, the server left running, and a bad address refused."""
    from lablib.config import ServerConfig
    from lablib.engines.server import VLLMServer
    from lablib.experiments.serving.runs import cross_check_endpoint
    from lablib.models import embedded_path

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FAKE, *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("FAKE_VLLM_TOKEN_DELAY", "0.0005")
    monkeypatch.delenv("FAKE_VLLM_BENCH_FAIL", raising=False)
    target = str(embedded_path("target"))
    for bad in ("10.0.0.5:8000", "http://10.0.0.5:8000/v1"):  # no scheme; the client adds /v1 itself
        with pytest.raises(ValueError, match="cross_check_endpoint.base_url"):
            cross_check_endpoint(bad, None, "m", target)
    cfg = ServerConfig(model=target, port=0, served_model_name="cluster-model")
    with VLLMServer(cfg, log_path=tmp_path / "server.log") as server:
        out = cross_check_endpoint(server.base_url + "/", server.api_key, "cluster-model", target, repeat=1, times=2,
                                   max_concurrency=8, out_dir=tmp_path / "check", min_window_s=0.01, max_cv=1.0,
                                   max_bound=1.0)
        assert server.healthy()  # measured, not owned: still up
    assert [r["lab_first"] for r in out["rounds"]] == [True, False]
    assert out["server"] == {"base_url": server.base_url + "/", "model": "cluster-model"}
    assert [r.model["name"] for r in out["results"]] == ["cluster-model"] * 2
    expected = sum(q.output_tokens for q in out["results"][0].requests)
    assert all(r["output_tokens"] == {"lab": expected, "vllm_bench": expected, "expected": expected} for r in out["rounds"])
    assert out["referee"]["n"] == [2, 2] and (tmp_path / "check" / "round1").is_dir()
