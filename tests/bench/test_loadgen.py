"""The online-serving experiment end to end without a GPU: lablib.experiments.serving.runs.rate_sweep starts the fake
`vllm.entrypoints.openai.api_server` (tests/fake_vllm; 8 sequence slots, so requests queue under load),
drives it with the Poisson load generator, scrapes its /metrics, and runs the fake `vllm bench serve`
on the same requests; plus the pieces on their own (custom dataset, commands, comparison, figures)."""
import json
import math
import os

import pytest

from lablib import load_workload
from lablib.bench.referee import agreement
from lablib.bench.vllm_bench import bench_serve, bench_serve_command, compare_serve, summary_of, write_custom_dataset
from lablib.experiments.serving.runs import check_fractions, rate_sweep, server_config
from lablib.models import ModelSpec, embedded_path
from lablib.plots import serving as plots_serving
from lablib.results import RequestRecord, Result, ResultStore
from tests.fake_vllm_support import FAKE



@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", os.pathsep.join([FAKE, *filter(None, [os.environ.get("PYTHONPATH")])]))
    mp.setenv("FAKE_VLLM_TOKEN_DELAY", "0.0005")
    out = tmp_path_factory.mktemp("serve")
    store = ResultStore(out / "serve.jsonl")
    seen: dict = {"metrics": [], "results": []}
    try:
        online = rate_sweep("embedded", repeat=1, fractions=[0.5, 2.0], out_dir=out, store=store,
                            on_metrics=lambda rate, s: seen["metrics"].append((rate, s)),
                            on_result=seen["results"].append, metrics_interval_s=0.05)
    finally:
        mp.undo()
    return online, store, seen, out


def test_rate_sweep_measures_capacity_then_fractions_of_it(sweep):
    online, store, seen, _ = sweep
    results = online["results"]
    c = online["capacity_rps"]
    assert c == results[0].summary["requests_s"] > 0
    assert [r.config["rate"] for r in results] == [math.inf, round(0.5 * c, 2), round(2.0 * c, 2)]
    assert [r.step for r in results][0] == "serve-rate-inf"
    # the whole workload went through once (8 tokens each) before the first measurement, and never again
    assert [r.config["warmup_requests"] for r in results] == [64, 0, 0]
    for r in results:
        assert len(r.requests) == 64 and r.notes == [] and r.engine == "vllm-server"
        assert r.config["enable_prefix_caching"] is False and r.config["model"].endswith("models/target")
        assert r.model["name"] == "embedded" and r.model["source"] == "embedded" and r.model["layers"] == 5
        assert r.engine_facts["server_metrics"]["samples"]
    assert [r.step for r in store.load()] == [r.step for r in results]  # stored as measured
    assert seen["results"] == results and {rate for rate, _ in seen["metrics"]} == {r.config["rate"] for r in results}
    assert online["server"]["startup_s"] > 0 and "api_key" not in online["server"]


def test_load_past_capacity_queues_requests(sweep):
    online, *_ = sweep
    _, low, high = online["results"]
    assert high.summary["ttft_s"]["p50"] > low.summary["ttft_s"]["p50"]  # most requests wait, not one stalled
    waiting = [s["vllm:num_requests_waiting"] for s in high.engine_facts["server_metrics"]["samples"]]
    assert max(waiting) > 0


def test_vllm_bench_serve_cross_check_on_the_same_requests(sweep):
    online, _, _, out = sweep
    bench = online["bench_serve"]
    assert bench["completed"] == 64 and bench["rate"] == math.inf and "ttfts" not in bench and bench["errors"] == []
    assert "--api-key" not in bench["command"]  # the key travels as OPENAI_API_KEY (the fake server checks it)
    rows = [json.loads(line) for line in (out / "journey.custom.jsonl").read_text().splitlines()]
    wl = load_workload("journey")
    assert [(r["prompt"], r["output_tokens"]) for r in rows] == [(q.prompt, q.max_new_tokens) for q in wl.requests]
    fig = online["compare"]["figures"]
    assert set(fig) == {"output_tok_s", "requests_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "ttft_from_send_p50_ms"}
    # counted from when each request was sent, the lab's TTFT can only be shorter than from when it was due
    assert fig["ttft_from_send_p50_ms"]["lab"] <= fig["ttft_p50_ms"]["lab"]
    spread = online["compare"]["send_spread_s"]
    assert spread["lab"] >= 0 and spread["vllm_bench"] >= 0 and bench["send_spread_s"] == spread["vllm_bench"]
    assert fig["output_tok_s"]["lab"] == online["results"][0].summary["output_tok_s"]
    # The pairing, exactly: each figure is the two clients' own numbers and their ratio, on the same work. Whether
    # the two agree is a statistical question one burst on 2 shared cores cannot answer (a single pair read 2.2x
    # with another process busy): the referee's repeated rounds answer it, on the H200 (tests/test_gpu_vllm.py).
    assert fig["output_tok_s"]["vllm_bench"] == bench["output_throughput"]
    assert 0.1 < fig["output_tok_s"]["ratio"] < 10  # a units or counting bug (ms for s, tokens twice) shows; noise not
    assert fig["output_tok_s"]["ratio"] == pytest.approx(fig["output_tok_s"]["lab"] / bench["output_throughput"])
    expected = sum(wl.output_lengths)
    assert online["compare"]["output_tokens"] == {"lab": expected, "vllm_bench": expected}
    assert fig["output_tok_s"]["vllm_bench"] == pytest.approx(bench["total_output_tokens"] / bench["duration"], rel=1e-6)
    assert online["compare"]["completed"] == {"lab": 64, "vllm_bench": 64}
    client = online["compare"]["client"]  # the server's own token gaps next to the lab client's
    assert client["server_itl_ms"] > 0 and client["lag"] > 0.5 and client["library"].startswith("aiohttp")


def test_a_failing_vllm_bench_says_why(fake_vllm_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_VLLM_BENCH_FAIL", "ValueError: unknown dataset")
    with pytest.raises(RuntimeError, match=r"(?s)exit 1.*unknown dataset"):
        bench_serve("http://127.0.0.1:1", "k", "m", "tok", load_workload("journey", limit=2), math.inf, tmp_path)
    assert "unknown dataset" in (tmp_path / "bench-serve-journey-rate-inf.log").read_text()


def test_bench_serve_command_and_dataset(tmp_path):
    wl = load_workload("journey", limit=3)
    path = write_custom_dataset(wl, tmp_path / "d" / "x.jsonl")
    assert [json.loads(x)["output_tokens"] for x in path.read_text().splitlines()] == wl.output_lengths
    cmd = bench_serve_command("http://h:1/", "m", "tok", path, 3, 2.5, tmp_path, "r.json", python="py")
    assert cmd[:5] == ["py", "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    for pair in (["--base-url", "http://h:1"], ["--request-rate", "2.5"], ["--custom-output-len", "-1"],
                 ["--num-prompts", "3"], ["--temperature", "0"]):
        i = cmd.index(pair[0])
        assert cmd[i:i + 2] == pair
    assert {"--ignore-eos", "--disable-shuffle", "--skip-chat-template", "--save-result", "--save-detailed"} <= set(cmd)
    assert cmd[cmd.index("--request-rate") + 1] == "2.5"
    assert bench_serve_command("u", "m", "t", path, 3, math.inf, tmp_path, "r")[cmd.index("--request-rate") + 1] == "inf"
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(ValueError, match="rate"):
            bench_serve_command("u", "m", "t", path, 3, bad, tmp_path, "r")
    with pytest.raises(ValueError, match="num_prompts"):
        bench_serve_command("u", "m", "t", path, 0, 1.0, tmp_path, "r")


def _result(rate=math.inf, ttfts=(0.1, 0.2), step=None):
    reqs = [RequestRecord(request_id=f"r{i}", prompt_tokens=10, output_tokens=5, arrival=0.0, first_token=t,
                          last_token=t + 0.4, finished=t + 0.4, token_times=[t + 0.1 * k for k in range(5)])
            for i, t in enumerate(ttfts)]
    return Result(lab="t", step=step or f"serve-rate-{rate:g}", engine="vllm-server", config={"rate": rate},
                  model={}, workload={}, requests=reqs, wall_s=1.0,
                  engine_facts={"server_metrics": {"samples": [{"t": 0.0, "vllm:kv_cache_usage_perc": 0.1,
                                                                 "vllm:num_requests_running": 2,
                                                                 "vllm:num_requests_waiting": 0}]}})


def test_compare_serve_divides_lab_by_vllm():
    r = _result()
    bench = {"output_throughput": 5.0, "request_throughput": 4.0, "median_ttft_ms": 150.0, "p99_ttft_ms": 200.0,
             "median_tpot_ms": 100.0, "completed": 2, "rate": math.inf}
    c = compare_serve(r, bench)["figures"]
    assert c["output_tok_s"] == {"lab": 10.0, "vllm_bench": 5.0, "ratio": 2.0}
    assert c["requests_s"]["ratio"] == 0.5 and c["tpot_p50_ms"]["ratio"] == pytest.approx(1.0)
    assert compare_serve(r, {})["figures"]["output_tok_s"]["ratio"] is None
    # per-request lists dropped; what they say about the client kept: half its token events came in one read
    assert summary_of({"a": 1, "itls": [[1, 0.0001]], "errors": ["", "boom"]}) == {"a": 1, "errors": ["boom"], "clumped": 0.5}


def test_agreement_weighs_the_gap_against_each_client_own_scatter():
    def rounds(lab, ref):
        return [{"figures": {"output_tok_s": {"lab": a, "vllm_bench": b}}} for a, b in zip(lab, ref)]

    # the embedded model on the H200: single rounds from 0.82 to 1.12, vLLM's own client moving 24%
    noisy = agreement(rounds([14702, 17321, 16973], [13847, 17616, 15121]))
    assert noisy["agree"] and noisy["ratio"] == pytest.approx(1.052, abs=1e-3) and noisy["vllm_spread"] > 0.2
    steady = agreement(rounds([6505, 6630], [6514, 6495]))  # the 8B: within the 3% floor
    assert steady["agree"] and steady["tolerance"] == 0.03 and "agree within the noise" in steady["verdict"]
    off = agreement(rounds([5000, 5100], [6514, 6495]))  # 22% apart, each client steady: a real gap
    assert not off["agree"] and "beyond the noise" in off["verdict"]
    with pytest.raises(ValueError, match="cross_check"):
        agreement([])


def test_server_config_and_fractions():
    cfg = server_config("embedded")
    assert cfg.tokenizer is None and cfg.enable_prefix_caching is False and cfg.port == 0 and cfg.name == "embedded"
    syn = ModelSpec("synthetic:llama-3.1-8b", "/tmp/x", "synthetic", {"vocab_size": 128256})
    cfg = server_config(syn, max_num_seqs=16, gpu_memory_utilization=0.9)
    assert cfg.tokenizer == str(embedded_path("target")) and cfg.max_num_seqs == 16 and cfg.gpu_memory_utilization == 0.9
    assert check_fractions((0.5, 1)) == [0.5, 1]
    for bad in ([], [0], [-1.0], [math.inf], [True]):
        with pytest.raises(ValueError, match="fractions"):
            check_fractions(bad)
    with pytest.raises(ValueError, match="fractions"):  # refused before any server starts
        rate_sweep("embedded", fractions=[0])


def test_serving_figures():
    results = [_result(math.inf, (0.1, 0.2)), _result(2.0, (0.05, 0.06)), _result(8.0, (0.3, 0.9))]
    fig = plots_serving.latency_vs_rate(results, target_ttft_s=0.5)
    assert len(fig.data) == 6 and all(t.showlegend is not False for t in fig.data)
    assert list(fig.data[0].x) == [2.0, 8.0, 8.0 * 1.3]  # sorted by rate, the burst drawn past the largest rate
    assert fig.data[1].y[1] == pytest.approx(900.0, rel=0.02)  # TTFT p99 at 8 req/s, in ms
    assert len(plots_serving.throughput_vs_rate(results).data) == 1
    assert len(plots_serving.server_metrics_figure(results).data) == 9
    with pytest.raises(ValueError, match="rate"):
        plots_serving.latency_vs_rate([Result(lab="t", step="x", engine="e", config={}, model={}, workload={},
                                              requests=[], wall_s=1.0)])
    with pytest.raises(ValueError, match="metrics"):
        plots_serving.server_metrics_figure([Result(lab="t", step="x", engine="e", config={"rate": 1.0}, model={},
                                                    workload={}, requests=[], wall_s=1.0)])


def test_live_server_metrics_grows_with_each_sample():
    live = plots_serving.LiveServerMetrics()
    for t in range(3):
        live.update(4.0, {"t": t * 0.25, "vllm:kv_cache_usage_perc": 0.1 * t, "vllm:num_requests_running": t,
                          "vllm:num_requests_waiting": 0})
    live.update(8.0, {"t": 0.0, "vllm:kv_cache_usage_perc": 0.5, "vllm:num_requests_running": 9,
                      "vllm:num_requests_waiting": 3})
    assert len(live.samples[4.0]) == 3 and len(live.figure.data) == 6
    shown = live.area.shown()  # what the Output widget holds: rate 4's lines whole, drawn when rate 8 arrived
    assert len(shown["data"]) == 6 and list(shown["data"][1]["y"]) == [0, 1, 2]


def test_concurrency_sweep_reuses_one_server(fake_vllm_cli, tmp_path):
    from lablib.experiments.serving.runs import concurrency_sweep

    out = concurrency_sweep("embedded", repeat=1, levels=[1, 16], out_dir=tmp_path)
    one, many = out["results"]
    assert [r.step for r in out["results"]] == ["serve-rate-inf-conc-1", "serve-rate-inf-conc-16"]
    assert one.config["max_concurrency"] == 1 and len(one.requests) == len(many.requests) == 64
    # one in flight: each request is sent only when the previous one has finished
    reqs = sorted(one.requests, key=lambda q: q.start)
    assert all(b.start >= a.finished - 1e-3 for a, b in zip(reqs, reqs[1:]))
    assert many.summary["output_tok_s"] > 2 * one.summary["output_tok_s"]  # the fake has 8 slots
    assert (tmp_path / "server.log").read_text().count("fake api_server") == 1  # started once
    with pytest.raises(ValueError, match="levels"):
        concurrency_sweep("embedded", levels=[0])


def test_cross_check_alternates_the_clients_on_one_server(fake_vllm_cli, tmp_path):
    from lablib.experiments.serving.runs import cross_check

    out = cross_check("embedded", repeat=1, times=2, out_dir=tmp_path)
    assert [r.step for r in out["results"]] == ["check0-rate-inf", "check1-rate-inf"]
    assert [r["lab_first"] for r in out["rounds"]] == [True, False]
    # each round's ratio is its two clients' own figures (whether they agree is the GPU referee's question: single
    # rounds on the fake, on 2 shared cores, read anywhere from 0.5x to 3.3x with another process busy)
    assert out["output_tok_s_ratios"] == [pytest.approx(r["figures"]["output_tok_s"]["lab"] /
                                                        r["figures"]["output_tok_s"]["vllm_bench"]) for r in out["rounds"]]
    assert out["agreement"]["ratio"] == pytest.approx(sum(r["figures"]["output_tok_s"]["lab"] for r in out["rounds"]) /
                                                      sum(r["figures"]["output_tok_s"]["vllm_bench"] for r in out["rounds"]))
    assert all((tmp_path / f"round{i}" / "bench-serve-journey-rate-inf.json").exists() for i in range(2))
    assert (tmp_path / "server.log").read_text().count("fake api_server") == 1
    with pytest.raises(ValueError, match="times"):
        cross_check("embedded", times=0)


def test_a_request_longer_than_the_context_is_refused_before_the_server_starts(monkeypatch, tmp_path):
    """vLLM would answer each such request with an HTTP 400 after a minute of start-up; the lab says so first."""
    from lablib.experiments.serving import runs as serving

    def no_server(*a, **k):
        raise AssertionError("the server was started")

    monkeypatch.setattr(serving, "VLLMServer", no_server)
    longest = max(r.max_new_tokens for r in load_workload("journey").requests)
    for call in (lambda: serving.rate_sweep("embedded", out_dir=tmp_path, max_model_len=longest),
                 lambda: serving.cross_check("embedded", out_dir=tmp_path, max_model_len=longest)):
        with pytest.raises(ValueError, match=r"ServerConfig.max_model_len=\d+: allowed a context of at least \d+ "
                                             r"tokens for request .* of workload 'journey'.*Fix: max_model_len="):
            call()
    spec = serving.resolve_model("embedded")
    assert serving.check_context(load_workload("journey"), spec, serving.server_config(spec)) == \
        spec.architecture()["context"]
