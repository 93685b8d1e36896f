"""Engines started together (lablib.engines.together): the arithmetic, then the real workers on the fake vLLM.

The fake GPU (conftest.fake_gpu) reports 8 GiB used for every live fake EngineCore, device-wide and per process, so
the close checks and the memory monitor's exclusion of the idle engines run for real."""
import pytest

from lablib.bench.offline import run
from lablib.config import BenchConfig, ServerConfig, VLLMConfig
from lablib.engines import together
from lablib.engines import vllm as engines_vllm
from lablib.engines.server import ServerEngine
from lablib.engines.vllm import VLLMEngine
from lablib.hardware.fit import CONTEXT_OVERHEAD, check_fit
from lablib.models import resolve_model
from lablib.models.synthetic import synthetic_spec
from lablib.workloads import load_workload
from tests.fake_vllm_support import CORE_BYTES, GiB, cores, wait_gone


def test_at_once_takes_what_the_memory_and_the_cores_hold():
    gib = [10 * GiB] * 8
    assert together.at_once(gib, 100 * GiB, cpus=16) == 8  # 80 GiB within 85% of 100
    assert together.at_once(gib, 50 * GiB, cpus=16) == 4  # 85% of 50 GiB holds four
    assert together.at_once(gib, 100 * GiB, cpus=6) == 3  # a start keeps two cores busy
    assert together.at_once(gib, 100 * GiB, cpus=16, cap=2) == 2
    assert together.at_once(gib, 5 * GiB, cpus=16) == 1  # none fits beside another: one, alone, as before
    assert together.at_once([10 * GiB, 80 * GiB, 10 * GiB], 100 * GiB, cpus=16) == 1  # in order: stops at the big one


def test_the_cap_comes_from_the_environment_and_bad_values_are_refused(monkeypatch):
    monkeypatch.delenv(together.ENV, raising=False)
    assert together.cap_from_env() is None
    monkeypatch.setenv(together.ENV, "3")
    assert together.cap_from_env() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(together.ENV, bad)
        with pytest.raises(ValueError, match=f"{together.ENV}='{bad}': allowed a whole number >= 1"):
            together.cap_from_env()


def test_the_kv_cache_holds_every_slot_at_the_longest_request_and_one_full_context():
    spec = resolve_model("embedded")
    per_token, context = spec.kv_bytes_per_token(2), spec.architecture()["context"]
    # 64 slots of 1,062 tokens (1,060 + room past the end: the token sampled, async the next) in 67 blocks, vLLM's
    # null block
    assert together.kv_bytes_for(spec, VLLMConfig(max_num_seqs=64), 1060) == (64 * 67 * 16 + 16) * per_token
    # 256 slots, but the run sends 64 requests: no more slots than that
    assert together.kv_bytes_for(spec, VLLMConfig(max_num_seqs=256), 1060, requests=64) == \
        (64 * 67 * 16 + 16) * per_token
    # one slot: a whole max_model_len request must fit (vLLM refuses to start otherwise)
    assert together.kv_bytes_for(spec, VLLMConfig(max_num_seqs=1), 100) == (context + 16) * per_token
    eagle = {"method": "eagle", "model": "head", "num_speculative_tokens": 4}
    assert together.kv_bytes_for(spec, VLLMConfig(max_num_seqs=64, speculative_config=eagle), 1060) == \
        2 * (64 * 67 * 16 + 16) * per_token  # the drafter's layers share the pool; 2k + 2 past the end fit
    ngram = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert together.kv_bytes_for(spec, VLLMConfig(max_num_seqs=64, speculative_config=ngram), 1060) == \
        (64 * 68 * 16 + 16) * per_token  # n-gram has no layers of its own; 1,060 + 18 tokens take 68 blocks
    assert together.kv_bytes_for(spec, VLLMConfig(max_num_seqs=64, kv_cache_dtype="fp8"), 1060) == \
        (64 * 67 * 16 + 16) * spec.kv_bytes_per_token(1)


def test_a_together_config_is_gated_on_its_own_need_and_the_fit_check_reads_its_kv():
    spec = resolve_model("embedded")
    cfg = together.together_config(spec, VLLMConfig(max_num_seqs=64, gpu_memory_utilization=0.3), 1060, 140 * GiB)
    kv = together.kv_bytes_for(spec, VLLMConfig(max_num_seqs=64), 1060)
    assert cfg.kv_cache_memory_bytes == kv and cfg.max_num_seqs == 64
    fit = check_fit(spec, cfg, 140 * GiB, 100 * GiB)
    assert fit.kv_bytes == kv and fit.fits
    need = fit.weight_bytes + fit.overhead_bytes + CONTEXT_OVERHEAD + together.MARGIN + kv
    assert need <= cfg.gpu_memory_utilization * 140 * GiB < need + 0.01 * 140 * GiB
    # a pool too small for one max_model_len request, or more than is free, is refused with the knob to turn
    small = check_fit(spec, VLLMConfig(kv_cache_memory_bytes=1024), 140 * GiB)
    assert not small.fits and "kv_cache_memory_bytes=0.00 GiB holds 0 KV tokens" in small.advice
    big = check_fit(spec, VLLMConfig(kv_cache_memory_bytes=200 * GiB, gpu_memory_utilization=0.05), 140 * GiB,
                    100 * GiB)
    assert not big.fits and "only 100.0 GiB is free" in big.advice


def test_the_pool_holds_the_longest_requests_in_flight_and_max_model_len_the_runs_longest(tmp_path):
    spec = resolve_model("embedded")
    per_token = spec.kv_bytes_per_token(2)
    lengths = [100] * 60 + [1060] * 4  # 8 slots: the 4 long ones (67 blocks) and 4 short (100 + 2 in 7 blocks)
    # (another run of two long requests needs less: the busiest run decides)
    assert together.kv_bytes_for(spec, VLLMConfig(max_num_seqs=8), 1060, runs=[lengths, [1060] * 2]) == \
        ((4 * 67 + 4 * 7) * 16 + 16) * per_token
    assert together.kv_bytes_for(spec, VLLMConfig(max_num_seqs=8), 1060) == (8 * 67 * 16 + 16) * per_token
    # max_model_len left to the model: the run's longest request, in 256-token steps; the caller's own is kept
    assert together.together_config(spec, VLLMConfig(), 1060, 140 * GiB).max_model_len == 1280
    assert together.together_config(spec, VLLMConfig(max_model_len=2048), 1060, 140 * GiB).max_model_len == 2048
    assert together.run_length(spec, VLLMConfig(), 5000) is None  # past the model's 2,048: the model's own
    eagle = {"method": "eagle", "model": "head", "num_speculative_tokens": 4}
    assert together.run_length(spec, VLLMConfig(speculative_config=eagle), 1271) == 1536  # 1,271 + 10 past 1,280
    # the 8B's 131,072-token context no longer asks 16 GiB of KV of every engine for a 1,600-token run
    big = synthetic_spec("llama-3.1-8b", root=tmp_path, weights=False)
    cfg = together.together_config(big, VLLMConfig(max_num_seqs=64), 1600, 140 * GiB, requests=64,
                                   runs=[[400] * 60 + [1600] * 4])
    assert cfg.max_model_len == 1792 and cfg.kv_cache_memory_bytes == \
        ((4 * 101 + 60 * 26) * 16 + 16) * big.kv_bytes_per_token(2)
    # 3.8 GiB of KV, 0.17 of the H200 in all: where its 131,072 tokens would have asked 16 GiB and 0.26
    assert cfg.kv_cache_memory_bytes < 4 * GiB and cfg.gpu_memory_utilization <= 0.17
    whole = together.kv_bytes_for(big, VLLMConfig(max_num_seqs=64), 1600, requests=64)
    assert whole == (131072 + 16) * big.kv_bytes_per_token(2)


@pytest.fixture
def fleet(start, monkeypatch):
    """one_by_one on the fake vLLM, on a host of 16 cores (this one has 2: one engine at a time otherwise)."""
    monkeypatch.setattr(together.os, "cpu_count", lambda: 16)
    monkeypatch.delenv(together.ENV, raising=False)
    return start.marker


def _configs(n):
    return [VLLMConfig(max_num_seqs=4, seed=i) for i in range(n)]


def _made(configs):
    """Engines made as a lab makes them (their checks run), or the error that refused one."""
    out = []
    for c in configs:
        try:
            out.append(VLLMEngine("embedded", c))
        except ValueError as e:
            out.append(e)
    return out


def test_engines_start_together_and_are_handed_out_one_at_a_time(fleet):
    wl = load_workload("journey", limit=4)
    seen, results = [], []
    for i, engine in enumerate(together.one_by_one(_made(_configs(3)), longest_tokens=1100)):
        assert isinstance(engine, VLLMEngine) and engine.facts["started"]
        assert len(cores(fleet)) == 3  # all three up before the first was handed out, none closed while one runs
        assert engine.facts["together"]["engines"] == 3 and engine.facts["together"]["group_start_s"] > 0
        assert engine.config.kv_cache_memory_bytes == engine.facts["together"]["kv_cache_memory_bytes"] > 0
        assert engine.config.seed == i  # in the order given
        results.append(run(engine, wl, BenchConfig(max_new_tokens=4, progress=False), step=f"e{i}"))
        seen.append(engine)
    assert wait_gone(cores(fleet)) == []
    facts = [e.facts for e in seen]
    for f in facts:  # closed beside the others: its own processes had to let go of their memory
        assert f["vram_back_to_baseline"] is True and f["vram_held_before_close_bytes"] == CORE_BYTES
        assert f["vram_check"].startswith("its own processes")
    assert len({f["vram_baseline_bytes"] for f in facts}) == 1  # the baseline they share
    assert all(f["vram_group_back_to_baseline"] is True for f in facts)  # and the whole GPU back to it after all
    # closed at once: the group's close took less than its engines' closes one after another would
    group_close = {f["together"]["group_close_s"] for f in facts}
    assert len(group_close) == 1 and group_close.pop() < sum(f["close_s"] for f in facts)
    # while each ran, the two idle engines' memory was on the GPU, not counted as the run's own
    for r in results:
        assert r.memory["others_bytes"] == 2 * CORE_BYTES and r.memory["peak_process_bytes"] == CORE_BYTES
        assert any("2 other engine(s) started with this one sat idle" in n for n in r.notes)


def test_with_a_cap_of_one_they_start_one_after_another(fleet, monkeypatch):
    monkeypatch.setenv(together.ENV, "1")
    for engine in together.one_by_one(_made(_configs(2)), longest_tokens=1100):
        assert len(cores(fleet)) == 1 and "together" not in engine.facts
        assert engine.config.kv_cache_memory_bytes is None  # its own configuration, vLLM's profiling


@pytest.mark.parametrize("share, own", [(0.3, True), (0.9, False)])
def test_one_that_fails_beside_the_others_starts_again_alone(fleet, monkeypatch, share, own):
    """Alone, with its own configuration where the memory the others hold leaves room for it (0.3 of the fake H200),
    else with the one it had beside them (0.9 asks for more than is free while two fake engines hold 16 GiB)."""
    real = VLLMEngine.wait_ready
    failed = []

    def flaky(self):
        if self.config.seed == 1 and not failed:
            failed.append(self)
            self.close(force=True)  # what a failed start leaves: the worker ended
            raise RuntimeError("vLLM worker failed: address already in use (fake)")
        return real(self)

    monkeypatch.setattr(VLLMEngine, "wait_ready", flaky)
    configs = [VLLMConfig(max_num_seqs=4, seed=i, gpu_memory_utilization=share) for i in range(3)]
    got = list(e for e in together.one_by_one(_made(configs), longest_tokens=1100))
    assert all(isinstance(e, VLLMEngine) for e in got) and [e.config.seed for e in got] == [0, 1, 2]
    retried = got[1]
    assert retried is not failed[0] and "address already in use" in retried.facts["together"]["alone_after"]
    assert (retried.config == configs[1]) is own and (retried.config.kv_cache_memory_bytes is None) is own
    assert "alone_after" not in got[0].facts["together"] and "alone_after" not in got[2].facts["together"]
    assert wait_gone(cores(fleet)) == []


def test_a_refused_setting_is_handed_over_as_its_error_and_the_others_run(fleet):
    configs = [VLLMConfig(max_num_seqs=4), VLLMConfig(max_num_seqs=4, tensor_parallel_size=2),
               VLLMConfig(max_num_seqs=4, seed=2)]
    got = []
    for e in together.one_by_one(_made(configs), longest_tokens=1100):
        got.append(e)
        if isinstance(e, VLLMEngine):
            assert e.facts["started"]
    assert isinstance(got[1], ValueError) and "needs 2 GPUs" in str(got[1])
    assert isinstance(got[0], VLLMEngine) and isinstance(got[2], VLLMEngine)


def test_breaking_off_closes_every_engine_it_started(fleet):
    engines = together.one_by_one(_made(_configs(3)), longest_tokens=1100)
    first = next(engines)
    assert len(cores(fleet)) == 3
    engines.close()  # what a loop that breaks or raises does (contextlib.closing in the labs)
    assert wait_gone(cores(fleet)) == [] and first.facts["closed"]


def test_a_close_that_fails_stops_neither_the_others_nor_the_verdict(fleet, monkeypatch):
    real = VLLMEngine.close

    def failing(self, force=False, beside=None):
        real(self, force, beside)
        if self.config.seed == 0:
            raise OSError("the worker's pipe broke while closing (fake)")

    monkeypatch.setattr(VLLMEngine, "close", failing)
    got = []
    with pytest.raises(OSError, match="pipe broke"):
        for e in together.one_by_one(_made(_configs(3)), longest_tokens=1100):
            got.append(e)
    assert len(got) == 3 and wait_gone(cores(fleet)) == []
    assert all(e.facts["closed"] and e.facts["together"]["group_close_s"] > 0 for e in got)
    assert all(e.facts["vram_group_back_to_baseline"] is True for e in got)


def test_without_nvmls_process_list_the_whole_gpu_after_the_group_speaks_for_every_engine(fleet, monkeypatch):
    import pynvml

    def unsupported(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", unsupported)
    got = list(together.one_by_one(_made(_configs(3)), longest_tokens=1100))
    assert [e.facts["vram_back_to_baseline"] for e in got] == [True, True, True]
    assert [e.facts.get("vram_check") for e in got] == ["the whole GPU, once every engine started with it had "
                                                        "closed"] * 3


def test_interrupted_while_the_group_starts_every_engine_launched_is_closed(fleet, monkeypatch):
    real = VLLMEngine.wait_ready

    def interrupted(self):
        if self.config.seed == 1:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(VLLMEngine, "wait_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        next(together.one_by_one(_made(_configs(3)), longest_tokens=1100))
    assert wait_gone(cores(fleet)) == []


def test_a_retried_engine_shares_the_groups_baseline_and_a_refused_one_does_not_split_the_group(fleet, monkeypatch):
    real = VLLMEngine.wait_ready
    failed = []

    def flaky(self):
        if self.config.seed == 2 and not failed:
            failed.append(self)
            raise RuntimeError("vLLM worker failed (fake)")
        return real(self)

    monkeypatch.setattr(VLLMEngine, "wait_ready", flaky)
    configs = [VLLMConfig(max_num_seqs=4, seed=0), VLLMConfig(max_num_seqs=4, tensor_parallel_size=2),
               VLLMConfig(max_num_seqs=4, seed=2, gpu_memory_utilization=0.3)]
    got = []
    for e in together.one_by_one(_made(configs), longest_tokens=1100):
        if isinstance(e, VLLMEngine) and e.config.seed == 0:
            assert len(cores(fleet)) == 2  # the refused one took no place: the other two started together
        got.append(e)
    assert isinstance(got[1], ValueError) and got[0].facts["together"]["engines"] == 2
    assert got[2].facts["vram_baseline_bytes"] == got[0].facts["vram_baseline_bytes"]
    assert got[2].facts["vram_back_to_baseline"] is True


def test_a_group_makes_no_spare_worker_even_where_asked_for(fleet, monkeypatch):
    from lablib.engines import vllm as engines_vllm

    monkeypatch.setenv(engines_vllm.SPARE_ENV, "1")  # a spare per start would be spawned, then ended by the next
    got = []
    for e in together.one_by_one(_made(_configs(2)), longest_tokens=1100):
        assert engines_vllm.Spare.current is None and e.facts["worker"] == "spawned"
        got.append(e)
    assert len(got) == 2 and engines_vllm.os.environ[engines_vllm.SPARE_ENV] == "1"  # the caller's setting is back


def test_vllms_server_starts_in_the_group_sized_as_an_offline_engine_is(fleet, monkeypatch):
    """The journey's server rung (tests/fake_vllm's api_server, a process of its own) starts beside two offline
    engines: all three up before the first is handed out, the server's KV cache, max_model_len and memory gate those
    of an offline engine of the same settings, each run's memory not counting the idle others, and once the group
    has closed the server is gone and the whole GPU back to its baseline."""
    monkeypatch.setenv("FAKE_VLLM_TOKEN_DELAY", "0.001")
    wl = load_workload("journey", limit=4)
    made = [VLLMEngine("embedded", VLLMConfig(max_num_seqs=4)), ServerEngine("embedded"),
            VLLMEngine("embedded", VLLMConfig(max_num_seqs=4, seed=1))]
    seen, results = [], []
    for engine in together.one_by_one(made, longest_tokens=1100, requests=4):
        assert all(e.alive() for e in [engine, *engine.others()]) and len(engine.others()) == 2
        assert engine.facts["together"]["engines"] == 3
        results.append(run(engine, wl, BenchConfig(max_new_tokens=4, progress=False), step=engine.name))
        seen.append(engine)
    server = seen[1]
    assert isinstance(server, ServerEngine) and server is not made[1]  # a new one, sized for the run
    sized = server.vllm_config()
    offline = together.together_config(made[0].spec, VLLMConfig(), 1100, _gpu_total(), requests=4)
    assert sized.kv_cache_memory_bytes == offline.kv_cache_memory_bytes == server.facts["together"][
        "kv_cache_memory_bytes"]
    assert (sized.max_model_len, sized.gpu_memory_utilization) == (offline.max_model_len,
                                                                  offline.gpu_memory_utilization)
    cmd = server.server.command
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(sized.kv_cache_memory_bytes)
    assert results[1].engine == "vllm-server" and results[1].summary["output_tokens"] == 4 * len(wl)
    for r in results:  # the two idle engines' memory is not the run's own
        assert any("2 other engine(s) started with this one sat idle" in n for n in r.notes)
    assert wait_gone(cores(fleet)) == [] and not server.alive() and server.worker_pids() == []
    assert all(e.facts["closed"] and e.facts["vram_group_back_to_baseline"] is True for e in seen)
    # NVML lists no process of the fake server: its own verdict is the whole GPU's once the group had closed
    assert server.facts["vram_back_to_baseline"] is True and server.facts["vram_check"].startswith("the whole GPU")


def _gpu_total():
    return engines_vllm.nvml_used()[2]


def test_a_server_is_sized_as_it_will_run_and_an_attached_one_is_refused():
    """The server's settings read as vLLM's server runs them (max_num_seqs its default where unset; flags in either
    form, the last one given); resized pins max_num_seqs and replaces a KV flag rather than adding a second; a server
    this process did not start is neither sized nor restarted."""
    engine = ServerEngine("embedded", ServerConfig(model="m", extra_args=(
        "--quantization=fp8", "--kv-cache-memory-bytes", "1000", "--kv-cache-memory-bytes=2000")))
    c = engine.vllm_config()
    assert (c.max_num_seqs, c.quantization, c.kv_cache_memory_bytes) == (1024, "fp8", 2000)
    sized = engine.resized(VLLMConfig(max_num_seqs=64, max_model_len=768, gpu_memory_utilization=0.2,
                                      kv_cache_memory_bytes=5000))
    assert sized.config.extra_args == ("--quantization=fp8", "--kv-cache-memory-bytes", "5000")
    assert (sized.config.max_num_seqs, sized.config.max_model_len, sized.config.gpu_memory_utilization) == (64, 768, 0.2)
    assert sized.vllm_config().kv_cache_memory_bytes == 5000 and sized.config.api_key == engine.config.api_key
    attached = ServerEngine("embedded", base_url="http://127.0.0.1:1", api_key="k")
    for call in (attached.vllm_config, lambda: attached.resized(VLLMConfig())):
        with pytest.raises(ValueError, match=r"ServerEngine\.\w+: this engine is attached .* Fix"):
            call()
