"""ServerEngine: an OpenAI server answering the engine call, through lablib.bench.offline.run, without a GPU.

Two ways in, both against tests/fake_vllm's api_server (one SSE chunk per token, exact `max_tokens` with
`ignore_eos`): the engine owns a VLLMServer (the fake started as `python -m vllm.entrypoints.openai.api_server`
with the fake package on PYTHONPATH) and ends it on close; or it attaches to a server already running (the fake in
a thread here) and leaves it running on close. Either way: one record per request, exact output lengths, a
token time per token."""
import importlib.util
import os
import threading
import urllib.request

import pytest

from lablib.bench.offline import run
from lablib.config import BenchConfig, ServerConfig
from lablib.engines.server import HOST, ServerEngine
from lablib.models import embedded_path
from lablib.workloads import load_workload


FAKE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fake_vllm")
KEY = "engine-key"


def _healthy(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.fixture
def fake_thread():
    """tests/fake_vllm's api_server in a thread (loaded from its file: stdlib only), 8 slots, 1 ms per token."""
    path = os.path.join(FAKE, "vllm", "entrypoints", "openai", "api_server.py")
    spec = importlib.util.spec_from_file_location("fake_api_server_engine", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    srv = mod.make_server(HOST, 0, KEY, max_num_seqs=8, delay=0.001)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_an_owned_server_runs_a_workload_through_offline_run(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FAKE, *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("FAKE_VLLM_TOKEN_DELAY", "0.001")
    cfg = ServerConfig(model=str(embedded_path()), port=0, served_model_name="embedded", max_model_len=2048)
    engine = ServerEngine("embedded", cfg, log_path=tmp_path / "server.log")
    assert engine.facts["context"] == 2048 and engine.worker_pids() == []  # nothing started by the constructor
    wl = load_workload("journey").head(6)
    try:
        r = run(engine, wl, BenchConfig(progress=False), step="server")
        assert engine.facts["owns_server"] is True and len(engine.worker_pids()) == 1
        base_url = engine.base_url
        assert _healthy(base_url)
    finally:
        engine.close()
    assert [q.request_id for q in r.requests] == [q.id for q in wl]  # one record per request, in order
    assert [q.output_tokens for q in r.requests] == wl.output_lengths  # exact lengths (ignore_eos)
    assert all(len(q.token_times) == q.output_tokens and q.first_token <= q.last_token for q in r.requests)
    assert [q.prompt_tokens for q in r.requests] == wl.prompt_lengths  # token ids went in, as the tokenizer cut them
    assert r.engine == "vllm-server" and r.config["ignore_eos"] is True and r.summary["output_tokens"] == sum(
        wl.output_lengths)
    assert engine.worker_pids() == [] and not _healthy(base_url)  # close() ended the server it owned
    assert "fake api_server" in (tmp_path / "server.log").read_text()


def test_an_attached_engine_measures_and_leaves_the_server_running(fake_thread):
    engine = ServerEngine("embedded", base_url=fake_thread.url, api_key=KEY, served_model_name="fake")
    assert engine.facts["owns_server"] is False and engine.worker_pids() == []
    wl = load_workload("journey").head(5)
    r = run(engine, wl, BenchConfig(max_new_tokens=7, warmup_requests=1, progress=False))
    engine.close()
    assert [q.request_id for q in r.requests] == [q.id for q in wl]
    assert [q.output_tokens for q in r.requests] == [7] * 5 and all(len(q.token_times) == 7 for q in r.requests)
    assert len(fake_thread.received) == 1 + 5  # the warm-up request, then the workload
    assert _healthy(fake_thread.url)  # still running after close
    again = ServerEngine("embedded", base_url=fake_thread.url, api_key=KEY, served_model_name="fake")
    assert [q.output_tokens for q in run(again, wl.head(2), BenchConfig(max_new_tokens=2, warmup_requests=0,
                                                                        progress=False)).requests] == [2, 2]


def test_config_and_base_url_together_are_refused():
    with pytest.raises(ValueError, match="ServerEngine: config and base_url given.*Fix"):
        ServerEngine("embedded", ServerConfig(model="m"), base_url="http://127.0.0.1:1")
