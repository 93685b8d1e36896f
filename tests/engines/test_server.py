"""Online serving without a GPU: the load generator, the metrics scraper and the server wrapper
against the fake OpenAI-compatible server of tests/fake_vllm (run here in a thread) that checks
the key, streams one SSE chunk per token with a delay, ends with a usage chunk and [DONE], and
serves a /metrics page whose gauges follow the requests in flight."""
import asyncio
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lablib.bench import client
from lablib.bench.client import client_check
from lablib.bench.loadgen import arrival_times, load_test, run_online, run_sync
from lablib.bench.prom import (
    DEFAULT_GAUGES,
    MetricsScraper,
    parse_prometheus,
    window_means,
)
from lablib.config import ServerConfig
from lablib.engines import openai
from lablib.engines.server import HOST, VLLMServer, server_command
from lablib.workloads import Request, Workload
from tests.metrics_page import PAGE

KEY = "test-key"
TOKEN_DELAY = 0.01


def _fake_api_server():
    """tests/fake_vllm's api_server module, loaded from its file (stdlib only: the fake `vllm` package stays out)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fake_vllm", "vllm",
                        "entrypoints", "openai", "api_server.py")
    spec = importlib.util.spec_from_file_location("fake_api_server", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fake():
    """The fake OpenAI server in a thread: room for 2 sequences, TOKEN_DELAY per token, key KEY."""
    srv = _fake_api_server().make_server(HOST, 0, KEY, max_num_seqs=2, delay=TOKEN_DELAY)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _workload(n=6):
    reqs = [Request(f"r{i}", f"def f{i}(x): return", ({"role": "user", "content": "hi"},), 3 + i % 3, 5)
            for i in range(n)]
    return Workload("fake", 1, "a fake set", tuple(reqs))


def test_poisson_arrivals_seeded_and_mean_gap():
    a, b = arrival_times(20_000, 5.0, seed=7), arrival_times(20_000, 5.0, seed=7)
    assert a == b and a != arrival_times(20_000, 5.0, seed=8)
    assert a[0] == 0.0 and all(y >= x for x, y in zip(a, a[1:]))
    assert a[-1] / (len(a) - 1) == pytest.approx(1 / 5.0, rel=0.03)
    assert arrival_times(4, math.inf, seed=0) == [0.0] * 4
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="rate"):
            arrival_times(3, bad, seed=0)


def test_load_test_records_every_token(fake):
    prompts = ["a b c", [1, 2, 3, 4], "x", "y z", [5], "q"]
    max_tokens = [3, 5, 4, 6, 2, 3]
    t0 = []
    records, errors = asyncio.run(load_test(fake.url, KEY, "fake", prompts, max_tokens, rate=40.0, seed=3,
                                            on_start=t0.append))
    assert errors == [] and [r.request_id for r in records] == [f"req-{i:04d}" for i in range(6)]
    schedule = arrival_times(6, 40.0, seed=3)
    for r, n, a, p in zip(records, max_tokens, schedule, prompts):
        assert len(r.token_times) == n == r.output_tokens
        assert r.arrival == a and r.ttft > 0 and r.arrival <= r.start <= r.first_token <= r.last_token <= r.finished
        assert r.tpot >= TOKEN_DELAY * 0.5 if n > 1 else True
        assert r.prompt_tokens == (len(p) if isinstance(p, list) else len(p.split()))
    # the server saw each request at its scheduled time: never early, late by at most connection
    # set-up and a 2-core machine's thread scheduling
    seen = sorted(t - t0[0] for t in fake.received)
    assert all(a - 0.002 <= s < a + 0.12 for s, a in zip(seen, schedule)), (seen, schedule)


def test_wrong_key_and_dead_server_are_errors_not_exceptions(fake):
    records, errors = asyncio.run(load_test(fake.url, "wrong", "fake", ["a"] * 3, [2] * 3, rate=math.inf, seed=0))
    assert records == [] and len(errors) == 3 and all("HTTP 401" in e for e in errors)
    records, errors = asyncio.run(load_test(f"http://{HOST}:1", KEY, "fake", ["a"], [2], rate=math.inf, seed=0))
    assert records == [] and len(errors) == 1 and "req-0000" in errors[0]
    with pytest.raises(ValueError, match="max_tokens"):
        asyncio.run(load_test(fake.url, KEY, "fake", ["a"], [1, 2], rate=1.0, seed=0))


def test_scraper_timeline_follows_the_gauges(fake):
    with MetricsScraper(fake.url, interval_s=0.02, api_key=KEY) as scraper:
        time.sleep(0.05)
        asyncio.run(load_test(fake.url, KEY, "fake", ["a"] * 6, [15] * 6, rate=math.inf, seed=0))
        time.sleep(0.05)
    ts, running = scraper.series("vllm:num_requests_running")
    _, waiting = scraper.series("vllm:num_requests_waiting")
    assert len(ts) >= 5 and ts == sorted(ts) and scraper.errors == []
    assert running[0] == 0 and max(running) == 2 and running[-1] == 0 and max(waiting) > 0
    assert set(scraper.timeline()["samples"][0]) == {"t", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                                                     "vllm:num_requests_waiting"}


def test_run_online_one_result_per_rate(fake):
    results = run_online(fake.url, KEY, "fake", _workload(), [math.inf, 30.0], seed=1, metrics_interval_s=0.02,
                         server={"max_num_seqs": 2})
    assert [r.step for r in results] == ["serve-rate-inf", "serve-rate-30"]
    for r, rate in zip(results, [math.inf, 30.0]):
        assert r.engine == "vllm-server" and r.config["rate"] == rate and r.config["max_num_seqs"] == 2
        assert r.summary["requests"] == 6 and r.summary["output_tokens"] == sum(3 + i % 3 for i in range(6))
        assert r.summary["ttft_s"]["p50"] > 0 and r.notes == []
        assert r.engine_facts["server_metrics"]["samples"]
        json.loads(r.to_json())
    assert len(fake.received) == 1 + 12  # the warm-up request, then 6 per rate

    async def in_a_notebook():  # Jupyter's loop is already running: run_sync moves to a thread
        return run_sync(load_test(fake.url, KEY, "fake", ["a"], [2], rate=math.inf, seed=0))

    records, errors = asyncio.run(in_a_notebook())
    assert len(records) == 1 and errors == []


def test_client_check_sees_the_server_own_latencies(fake):
    """A client that keeps up reads every request's last token as the server sends it: its mean matches the histogram's."""
    (r,) = run_online(fake.url, KEY, "fake", _workload(), [math.inf], seed=1, metrics_interval_s=0.05, max_tokens=20)
    server = r.engine_facts["server_latency"]
    assert server["itl_s_count"] == 6 * 19  # tokens after the first, of this test's requests only
    assert server["ttft_s_count"] == 6 and server["e2e_s_count"] == 6 and server["itl_s"] == pytest.approx(TOKEN_DELAY, rel=0.5)
    assert server["http_s_count"] == 6 and server["http_s"] >= server["e2e_s"]  # the API server's time holds the engine's
    client = r.engine_facts["client"]
    assert client["library"].startswith("aiohttp") and client["events"] == 6 * (20 + 1)  # tokens and a usage chunk
    assert 0 < client["busy"] < 0.5  # 6 slow streams: the client mostly waits
    check = client_check(r)
    assert check["kept_up"] is True and 1.0 <= check["lag"] < 1.06, check  # 2 requests at a time, 0.2 s each
    assert check["verdict"].startswith("the client kept up") and check["clumped"] < 0.2
    assert check["tokens_per_event"] == 1.0  # the fake sends one token per event
    r.engine_facts["server_latency"] = None  # a run without the server's view cannot be judged
    assert client_check(r)["kept_up"] is None and client_check(r)["verdict"].startswith("no server-side")


def test_without_a_timeline_the_server_is_still_read_before_and_after(fake):
    """timeline=False (the referee's lab runs): no scrape during the test, yet client_check has the server's view."""
    before = fake.scrapes
    (r,) = run_online(fake.url, KEY, "fake", _workload(), [math.inf], seed=1, metrics_interval_s=0.01, timeline=False,
                      max_tokens=20, warmup_requests=0)
    assert r.engine_facts["server_metrics"] is None and r.config["metrics_during_test"] is False
    assert r.engine_facts["server_latency"]["e2e_s_count"] == 6 and client_check(r)["kept_up"] is True
    assert fake.scrapes - before == 2  # once before the test, once after
    (t,) = run_online(fake.url, KEY, "fake", _workload(), [math.inf], seed=1, metrics_interval_s=0.01, max_tokens=20,
                      warmup_requests=0)
    assert t.config["metrics_during_test"] is True and len(t.engine_facts["server_metrics"]["samples"]) >= 3


def test_client_check_weighs_clumps_against_a_reference_client_on_the_same_server(fake):
    """A server that writes events in bursts makes every client read clumps: only the excess over vLLM's client counts."""
    (r,) = run_online(fake.url, KEY, "fake", _workload(), [math.inf], seed=1, max_tokens=20, warmup_requests=0)
    for rec in r.requests:  # every other gap read in a clump, as a saturated API server's bursts give
        rec.token_times = [t - (i % 2) * (t - rec.token_times[i - 1]) if i else t for i, t in enumerate(rec.token_times)]
    alone = client_check(r)
    assert alone["clumped"] > 0.4 and alone["kept_up"] is False and alone["excess_clumped"] == alone["clumped"]
    same = client_check(r, reference_clumped=alone["clumped"] - 0.01)  # vLLM's client read nearly as many
    assert same["kept_up"] is True and same["excess_clumped"] == pytest.approx(0.01)
    assert "the reference client" in same["verdict"] and "the client kept up" in same["verdict"]
    worse = client_check(r, reference_clumped=alone["clumped"] - 0.2)  # 20 points more than the reference: the client
    assert worse["kept_up"] is False and "FELL BEHIND" in worse["verdict"]


def test_client_check_weighs_the_client_against_the_api_server_not_the_engine():
    """Time the API server spends before the engine (tokenizing, in vLLM) is in every client's latency: not lag.

    The fake's front end takes 0.3 s a request, so the client's own cost (10-16 ms a request on a loaded 2-core
    machine, measured: with 0.1 s the ratio read 1.105 in CI) stays a small part of what is compared."""
    srv = _fake_api_server().make_server(HOST, 0, KEY, max_num_seqs=8, delay=TOKEN_DELAY, frontend_delay=0.3)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        (r,) = run_online(srv.url, KEY, "fake", _workload(), [math.inf], seed=1, warmup_requests=0, max_tokens=5)
    finally:
        srv.shutdown()
        srv.server_close()
    check = client_check(r)
    assert check["kept_up"] is True and 1.0 <= check["lag"] < 1.1, check  # against the API server's ~0.35 s
    assert check["server_e2e_ms"] < 100 and check["api_share"] > 0.5  # 0.3 s of each ~0.35 s was the API server's
    assert "the API server's own" in check["verdict"]
    del r.engine_facts["server_latency"]["http_s"]  # a server without the HTTP histogram: the engine's time only
    engine_only = client_check(r)
    assert engine_only["lag"] > 2 and engine_only["kept_up"] is False and "no HTTP histogram in this run" in engine_only["verdict"]


def test_client_check_catches_a_client_that_falls_behind(fake, monkeypatch):
    """A client whose loop stalls 3 token delays per event reads the last tokens late: its request latency gives it away."""
    real = json.loads

    def slow(data):
        time.sleep(3 * TOKEN_DELAY)  # blocks the event loop, as a CPU-bound client does
        return real(data)

    monkeypatch.setattr(openai.json, "loads", slow)  # the stream reader's json
    (r,) = run_online(fake.url, KEY, "fake", _workload(), [math.inf], seed=1, metrics=DEFAULT_GAUGES,
                      warmup_requests=0)
    check = client_check(r)
    assert check["kept_up"] is False and check["lag"] > 1.5, check
    assert "FELL BEHIND" in check["verdict"] and check["client_e2e_ms"] > check["server_e2e_ms"]
    assert check["clumped"] > 0.3  # events waited in the socket and came in together


def test_clumped_share_counts_events_read_together():
    assert client.clumped_share([0.01, 0.0, 0.00005, 0.02]) == 0.5
    assert client.clumped_share([]) is None


def test_window_means_of_histograms():
    before = parse_prometheus(PAGE)  # TTFT: sum 3.0 s over 50 requests
    after = dict(before, **{"vllm:time_to_first_token_seconds_sum": 5.0, "vllm:time_to_first_token_seconds_count": 60.0})
    means = window_means(before, after)
    assert means["ttft_s"] == pytest.approx(2.0 / 10) and means["ttft_s_count"] == 10
    assert means["itl_s"] is None and means["itl_s_count"] is None  # not on this page
    assert window_means(before, before)["ttft_s"] is None  # nothing observed in the window


def test_parse_prometheus_on_a_vllm_page():
    m = parse_prometheus(PAGE)
    assert m["vllm:num_requests_running"] == 15.0 and m["vllm:num_requests_waiting"] == 4.0
    assert m["vllm:kv_cache_usage_perc"] == 0.8125 and m["vllm:prompt_tokens_total"] == 51234.0
    assert m["vllm:time_to_first_token_seconds_sum"] / m["vllm:time_to_first_token_seconds_count"] == 3.0 / 50
    assert m["vllm:request_success_total"] == 38.0 and m["http_requests_total"] == 50.0
    assert math.isnan(m["odd_labels"])
    assert not any(k.endswith(("_bucket", "_created")) for k in m)
    assert parse_prometheus(PAGE, {"engine": "1"})["vllm:num_requests_running"] == 3.0
    assert parse_prometheus(PAGE, {"finished_reason": "stop"}) == {"vllm:request_success_total": 8.0}


def test_server_config_and_command():
    cfg = ServerConfig("/models/qwen", port=8123, api_key="k", max_num_seqs=64, gpu_memory_utilization=0.85,
                       max_model_len=4096, enable_prefix_caching=False, served_model_name="qwen", dtype="bfloat16",
                       extra_args=["--seed", "0"])
    assert server_command(cfg, python="py") == [
        "py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/qwen", "--host", "127.0.0.1",
        "--port", "8123", "--api-key=k", "--served-model-name", "qwen", "--max-num-seqs", "64",
        "--max-model-len", "4096", "--gpu-memory-utilization", "0.85", "--dtype", "bfloat16",
        "--no-enable-prefix-caching", "--seed", "0"]
    short = server_command(ServerConfig("m", api_key="k", tokenizer="tok", enable_prefix_caching=True), python="py")
    assert short[-5:] == ["--served-model-name", "m", "--tokenizer", "tok", "--enable-prefix-caching"]
    assert "--api-key=-x_1" in server_command(ServerConfig("m", api_key="-x_1"), python="py")  # urlsafe keys can start with -
    a, b = ServerConfig("m"), ServerConfig("m")
    assert len(a.api_key) >= 16 and a.api_key != b.api_key and "api_key" not in a.to_dict()
    for kwargs, field in [({"port": 70000}, "port"), ({"max_num_seqs": 0}, "max_num_seqs"),
                          ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
                          ({"api_key": "has space"}, "api_key"), ({"max_model_len": 1.5}, "max_model_len")]:
        with pytest.raises(ValueError, match=field):
            ServerConfig("m", **kwargs)


def test_server_that_exits_at_start_up_says_why(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('ValueError: bad option --frobnicate'); sys.exit(3)"]
    srv = VLLMServer(ServerConfig("m", port=0), command=cmd, log_path=tmp_path / "s.log")
    with pytest.raises(RuntimeError, match=r"(?s)code 3.*bad option --frobnicate"):
        srv.__enter__()
    assert srv.proc is None


def test_server_that_never_gets_healthy_times_out(tmp_path):
    cmd = [sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(60)"]
    with pytest.raises(RuntimeError, match=r"(?s)/health within 1s.*loading weights"):
        VLLMServer(ServerConfig("m", port=0), command=cmd, log_path=tmp_path / "s.log", startup_timeout_s=1).start()


def _ends(pid: int, within_s: float) -> bool:
    """True once process `pid` is gone or a zombie (dead, awaiting its reaper), polling for up to within_s."""
    for _ in range(int(within_s / 0.05)):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1][0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_server_context_ends_its_whole_process_group(tmp_path, fake):
    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent(f'''\
        import subprocess, sys, http.server
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(tmp_path / "child.pid")!r}, "w").write(str(child.pid))
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
        '''))
    cfg = ServerConfig("m", port=0)
    srv = VLLMServer(cfg, log_path=tmp_path / "s.log")
    srv.command = [sys.executable, str(script), str(srv.port)]
    with srv as s:
        assert s.healthy() and s.startup_s is not None and s.base_url.endswith(str(s.port))
        child = int((tmp_path / "child.pid").read_text())
    assert srv.proc is None
    if not _ends(child, 2.5):  # the orphaned child is gone (or at most a zombie awaiting its reaper)
        pytest.fail(f"child {child} of the server outlived the server's process group")
    busy = VLLMServer(ServerConfig("m", port=fake.server_address[1]), command=["true"])
    with pytest.raises(RuntimeError, match="already in use"):
        busy.start()


def test_server_dies_with_the_process_that_started_it(tmp_path):
    """A kernel killed with SIGKILL runs no atexit handler: the server must not outlive it holding the GPU."""

    server = tmp_path / "server.py"
    server.write_text(textwrap.dedent('''\
        import http.server, sys
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
        '''))
    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent(f'''\
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from lablib.config import ServerConfig
        from lablib.engines.server import VLLMServer
        srv = VLLMServer(ServerConfig("m", port=0), log_path={str(tmp_path / "s.log")!r})
        srv.command = [sys.executable, {str(server)!r}, str(srv.port)]
        srv.start()
        print(srv.proc.pid, flush=True)
        time.sleep(60)
        '''))
    p = subprocess.Popen([sys.executable, str(parent)], stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline())
    os.kill(p.pid, signal.SIGKILL)  # no atexit, no stop(): only the parent-death signal can end the server
    p.wait()
    if not _ends(pid, 5.0):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the server outlived the process that started it")


def test_client_ceiling_reads_every_event_of_the_stub():
    """The lab's client against lablib.bench.sse_stub: every event read, what each cost, and the events/s that allows."""
    c = client.client_ceiling(16, 50)
    assert c["events"] == 16 * (50 + 1) and c["library"].startswith("aiohttp")  # tokens and a usage chunk per stream
    assert c["cpu_us_per_event"] > 0 and c["ceiling_events_s"] == pytest.approx(1e6 / c["cpu_us_per_event"])
    with pytest.raises(ValueError, match="streams"):
        client.client_ceiling(0)


def test_client_overhead_script_compares_the_two_clients(load_script, capsys):
    load_script("client_overhead").main(4, 10)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("lablib.bench.loadgen (aiohttp") and "44 events" in out[0], out  # 4 x (10 + usage)
    assert out[1].startswith("httpx reader:")
