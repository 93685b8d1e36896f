"""The timing protocol (lablib.bench.offline) on the CPU with the embedded model: prepare checks every request
against the context before any work, run starts the engine only then and returns (and stores) one complete Result
(the engine's config, the bench's seed as bench_seed, ignore_eos as the engine reports it), and an interrupted run
closes the engine, stores what finished marked partial (nothing when nothing finished) and says so in one line."""

import pytest

from lablib.bench import offline as bench
from lablib.bench.offline import prepare
from lablib.config import BenchConfig
from lablib.engines import HFEngine, PreparedRequest
from lablib.results import RequestRecord, ResultStore
from lablib.workloads import Workload, load_workload

torch = pytest.importorskip("torch")
pytest.importorskip("transformers").utils.logging.set_verbosity_error()

QUICK = BenchConfig(max_new_tokens=8, progress=False)
pytestmark = [pytest.mark.usefixtures("one_thread")]  # torch on one thread (conftest.py)


@pytest.fixture(scope="module")
def engine(hf_naive_cpu) -> HFEngine:
    return hf_naive_cpu


@pytest.fixture(scope="module")
def journey() -> Workload:
    return load_workload("journey")


@pytest.fixture(scope="module")
def run_result(engine, journey, tmp_path_factory):
    store = ResultStore(tmp_path_factory.mktemp("results") / "bench.jsonl")
    seen: list[RequestRecord] = []
    result = bench.run(engine, journey.head(4), QUICK, lab="test", step="naive-4", store=store, on_record=seen.append)
    return result, store, seen


# --- prepare ------------------------------------------------------------------------------------


def test_prepare_tokenizes_and_sets_lengths(engine, journey):
    w = journey.head(6)
    own = prepare(w, engine, BenchConfig(progress=False))
    assert [p.request_id for p in own] == [r.id for r in w]
    assert [len(p.prompt_ids) for p in own] == w.prompt_lengths  # the stored counts are the embedded tokenizer's
    assert [p.max_new_tokens for p in own] == w.output_lengths  # no override: the workload's own lengths
    assert all(p.prompt_ids[0] == engine.tokenizer.bos_token_id for p in own)
    assert {p.max_new_tokens for p in prepare(w, engine, QUICK)} == {8}


def test_prepare_refuses_a_request_longer_than_the_context(engine, journey):
    long = [r for r in journey if r.prompt_tokens > 500]
    w = Workload("journey", journey.version, journey.description, tuple(long), journey.manifest)
    assert prepare(w, engine, QUICK)  # they fit with a short output
    with pytest.raises(ValueError) as e:
        prepare(w, engine, BenchConfig(max_new_tokens=2040, progress=False))
    msg = str(e.value)
    first = long[0]
    assert f"request {first.id}" in msg and f"prompt {first.prompt_tokens} + max_new_tokens 2040" in msg
    assert "context of 2048" in msg and "Fix" in msg


# --- run ----------------------------------------------------------------------------------------


def test_run_returns_a_complete_result(run_result, journey):
    r, _, seen = run_result
    ids = [q.id for q in journey.head(4)]
    assert [q.request_id for q in r.requests] == ids  # the warm-up request is not among them
    assert seen == r.requests
    assert (r.lab, r.step, r.engine, r.provenance) == ("test", "naive-4", "hf-naive", "live")
    s = r.summary
    assert s["requests"] == 4 and s["output_tokens"] == 32
    assert s["prompt_tokens"] == sum(journey.head(4).prompt_lengths)
    assert s["output_tok_s"] == pytest.approx(32 / r.wall_s)
    assert 0 < s["ttft_s"]["p50"] <= s["e2e_s"]["p99"] <= r.wall_s
    assert r.config["mode"] == "naive" and r.config["ignore_eos"] is True and r.config["warmup_requests"] == 1
    assert r.engine_facts["ignore_eos"] is True and r.config["bench_seed"] == QUICK.seed  # from the engine; the bench's seed
    assert r.model["name"] == "embedded" and r.model["parameters"] == 4_737_792
    assert r.workload == {"name": "journey", "version": journey.version, "requests": 4}
    assert r.versions["torch"] and r.versions["transformers"]


def test_run_on_the_cpu_measures_rss_and_knows_no_peak(run_result):
    r, _, _ = run_result
    if r.hardware.get("gpu"):
        pytest.skip("a GPU is visible: memory and roofline come from NVML and the peak table there")
    assert r.memory["source"] == "rss" and r.memory["peak_bytes"] >= r.memory["baseline_bytes"] > 0
    assert any("resident set size" in n for n in r.notes)
    assert r.roofline["mbu"] == "unknown" and r.roofline["peak_bw"] == "unknown"
    assert r.roofline["achieved_bw"] > 0  # what was achieved is still measured, only the peak is unknown


def test_run_appends_to_the_store(run_result):
    r, store, _ = run_result
    assert store.load() == [r]


def test_warmup_is_run_but_not_recorded(engine, journey):
    calls = []
    real = engine.generate

    def spy(requests, on_record=None, progress=True):
        calls.append([q.request_id for q in requests])
        return real(requests, on_record=on_record, progress=progress)

    engine.generate = spy
    try:
        r = bench.run(engine, journey.head(2), BenchConfig(max_new_tokens=2, warmup_requests=1, progress=False))
    finally:
        del engine.generate
    assert calls == [["warmup-journey-000"], ["journey-000", "journey-001"]]
    assert [q.request_id for q in r.requests] == ["journey-000", "journey-001"]


# --- an interrupted run -------------------------------------------------------------------------


class InterruptedEngine:
    """Follows the engine call shape; the timed run emits `finish` records, then the user hits Interrupt (in the
    warm-up instead with `in_warmup`)."""

    name = "fake"

    def __init__(self, real: HFEngine, finish: int = 2, in_warmup: bool = False):
        self.spec, self.tokenizer, self.facts, self.config = real.spec, real.tokenizer, dict(real.facts), real.config
        self.finish, self.in_warmup, self.closed = finish, in_warmup, 0

    def start(self) -> "InterruptedEngine":
        return self

    def worker_pids(self) -> list[int]:
        return []

    def close(self) -> None:
        self.closed += 1

    def generate(self, requests: list[PreparedRequest], on_record=None, progress: bool = True):
        recs = [RequestRecord(q.request_id, len(q.prompt_ids), q.max_new_tokens, start=0.0, first_token=0.01 * (i + 1),
                              last_token=0.02 * (i + 1), token_times=None) for i, q in enumerate(requests)]
        if on_record is None and not self.in_warmup:  # the warm-up
            return recs
        for rec in recs[:self.finish]:
            on_record(rec)
        raise KeyboardInterrupt


def test_interrupted_run_stores_what_finished_marked_partial_then_stops_with_one_line(engine, journey, tmp_path):
    store = ResultStore(tmp_path / "runs.jsonl")
    cut = InterruptedEngine(engine)
    with pytest.raises(KeyboardInterrupt) as e:  # a RunInterrupted: still an interrupt, so a cell stops
        bench.run(cut, journey.head(5), QUICK, step="cut", store=store)
    (saved,) = store.load()
    assert saved.step == "cut" and saved.engine == "fake" and saved.partial
    assert [q.request_id for q in saved.requests] == ["journey-000", "journey-001"]
    assert saved.summary["requests"] == 2 and saved.summary["output_tokens"] == 16
    assert any(n.startswith("partial run: interrupted after 2 of 5 requests: KeyboardInterrupt") for n in saved.notes)
    assert isinstance(e.value, bench.RunInterrupted) and e.value.kept.requests == saved.requests
    assert str(e.value) == ("Interrupted cut after 2 of 5 requests: kept a Result of those 2, marked partial in its "
                            f"notes, in {store.path}; the engine was closed.")
    assert cut.closed == 1
    assert e.value.__cause__ is None and e.value.__suppress_context__  # not chained to the engine's traceback


@pytest.mark.parametrize("finish, in_warmup, said", [
    (0, False, "Interrupted cut after 0 of 5 requests: nothing was stored (no request had finished); the engine was "
               "closed."),
    (0, True, "Interrupted cut while the engine started or warmed up, before any request was timed: nothing was "
              "stored; the engine was closed."),
])
def test_an_interrupt_before_any_request_finished_stores_nothing(engine, journey, tmp_path, finish, in_warmup, said):
    store = ResultStore(tmp_path / "runs.jsonl")
    cut = InterruptedEngine(engine, finish=finish, in_warmup=in_warmup)
    with pytest.raises(bench.RunInterrupted) as e:
        bench.run(cut, journey.head(5), QUICK, step="cut", store=store)
    assert str(e.value) == said and e.value.kept is None
    assert not store.path.exists() and cut.closed == 1


def test_an_interrupted_run_without_a_store_hands_its_partial_result_over(engine, journey):
    with pytest.raises(bench.RunInterrupted, match="a Result of those 2, marked partial, is on this exception's "
                                                   r"\.kept \(no store was given\)") as e:
        bench.run(InterruptedEngine(engine), journey.head(5), QUICK, step="cut")
    assert e.value.kept.partial and len(e.value.kept.requests) == 2


def test_ipython_shows_an_interrupted_run_as_its_one_line():
    """What a notebook cell shows: the message alone (RunInterrupted._render_traceback_), no frames through the
    engine's generate; the cell still ends in error, so Run All stops there."""
    import subprocess
    import sys

    cell = ("from lablib.bench.offline import RunInterrupted\n"
            "def generate():\n    raise RunInterrupted('Interrupted x after 1 of 2 requests: kept')\n"
            "generate()")
    script = ("from IPython.core.interactiveshell import InteractiveShell\n"  # a shell of its own: none in pytest's
              f"ran = InteractiveShell.instance().run_cell({cell!r})\n"
              "print('stopped:', type(ran.error_in_exec).__name__)")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    one_line = "\x1b[0;31mKeyboardInterrupt\x1b[0m: Interrupted x after 1 of 2 requests: kept"
    assert shown.stdout.strip().splitlines() == [one_line, "stopped: RunInterrupted"], shown


def test_waves_keep_every_request_on_the_runs_clock_and_sum_the_engines_counters():
    """BenchConfig(max_concurrency=b): the workload in waves of b, one engine call each. Every record's times move
    onto the run's clock (a later wave starts after the earlier ones finish; arrival stays 0), and the engine's
    last_run counters are the waves' sum (gauges: the last wave's), a speculative engine's length recomputed."""
    import dataclasses as dc
    import time

    from lablib.bench.offline import merge_last_run, run
    from lablib.config import BenchConfig
    from lablib.results import RequestRecord
    from lablib.workloads import load_workload

    class Waves:
        name, config, worker_pids = "stub", BenchConfig(), staticmethod(lambda: [])

        def __init__(self):
            from lablib.models import resolve_model, prompt_tokenizer

            self.spec = resolve_model("embedded")
            self.tokenizer = prompt_tokenizer(self.spec)
            self.facts, self.calls = {"context": 2048}, []

        def start(self):
            return self

        def generate(self, reqs, on_record=None, progress=True):
            self.calls.append([r.request_id for r in reqs])
            out = []
            for j, r in enumerate(reqs):
                t = [0.01 * (j + 1) + 0.001 * n for n in range(r.max_new_tokens)]
                rec = RequestRecord(r.request_id, len(r.prompt_ids), r.max_new_tokens, arrival=0.0, start=0.0,
                                    first_token=t[0], last_token=t[-1], finished=t[-1], token_times=t,
                                    output_ids=[1] * r.max_new_tokens)
                out.append(rec)
                if on_record:
                    on_record(rec)
            time.sleep(max(q.finished for q in out))  # the call takes the time its records say it took
            self.facts["last_run"] = {"wall_s": 0.1, "metrics": {"gauge": len(self.calls)},
                                      "metrics_delta": {"vllm:x": len(reqs), "per_pos": [1, 2]}}
            return out

    eng = Waves()
    r = run(eng, load_workload("journey", limit=5), BenchConfig(max_new_tokens=3, max_concurrency=2, progress=False,
                                                               warmup_requests=0))
    assert [len(c) for c in eng.calls] == [2, 2, 1] and r.config["max_concurrency"] == 2
    assert [q.request_id for q in r.requests] == [c for call in eng.calls for c in call]
    starts = [q.start for q in r.requests]
    assert starts[0] < starts[2] < starts[4] and starts[0] == starts[1] and all(q.arrival == 0 for q in r.requests)
    assert all(q.token_times[0] == q.first_token and q.token_times[-1] == q.last_token for q in r.requests)
    assert r.requests[2].first_token > r.requests[1].last_token  # wave 2 after wave 1, on one clock
    last = r.engine_facts["last_run"]
    assert last["metrics_delta"] == {"vllm:x": 5, "per_pos": [3, 6]} and last["metrics"] == {"gauge": 3}
    assert last["calls"] == 3 and last["wall_s"] == pytest.approx(0.3)
    spec = merge_last_run([{"speculative": {"method": "draft", "k": 4, "tokens": 10, "target_forwards": 5,
                                            "tokens_per_forward": 2.0}},
                           {"speculative": {"method": "draft", "k": 4, "tokens": 2, "target_forwards": 2,
                                            "tokens_per_forward": 1.0}}])["speculative"]
    assert spec == {"method": "draft", "k": 4, "tokens": 12, "target_forwards": 7, "tokens_per_forward": 12 / 7}
    with pytest.raises(ValueError, match=r"BenchConfig\.max_concurrency=0: allowed .*; Fix:"):
        BenchConfig(max_concurrency=0)
    assert dc.replace(BenchConfig(), max_concurrency=None).max_concurrency is None


def test_an_interrupted_wave_run_keeps_the_counters_of_the_waves_that_finished():
    from lablib.bench.offline import _in_waves
    from lablib.engines import PreparedRequest
    from lablib.results import RequestRecord

    class Stops:
        facts = {"last_run": {"metrics_delta": {"n": 99}}}  # the warm-up's, which must not pass for the run's
        calls = 0

        def generate(self, reqs, on_record=None, progress=True):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            recs = [RequestRecord(r.request_id, 1, 1, arrival=0.0, start=0.0, first_token=0.01, last_token=0.01,
                                  finished=0.01, token_times=None) for r in reqs]  # an engine without per-token times
            for rec in recs:
                on_record(rec)
            self.facts["last_run"] = {"metrics_delta": {"n": len(reqs)}}
            return recs

    eng, seen = Stops(), []
    reqs = [PreparedRequest(f"r{i}", [1, 2], 1) for i in range(6)]
    with pytest.raises(KeyboardInterrupt):
        _in_waves(eng, reqs, 2, seen.append, 0.0)
    assert len(seen) == 4 and all(r.token_times is None for r in seen)
    assert eng.facts["last_run"]["metrics_delta"] == {"n": 4} and eng.facts["last_run"]["calls"] == 2


def test_the_decode_roofline_leaves_out_an_untied_input_embedding():
    """A decode step looks up only its batch's rows of the input embedding table: with untied embeddings (the 8B's
    128256 x 4096 table) its bytes, at the engine's dtype, are not part of what a step reads; tied, the LM head reads
    the whole table every step, so nothing is left out; without a shape (or arch) nothing is either."""
    from lablib.bench.offline import roofline_for
    from lablib.models.architecture import architectures, shape

    rec = RequestRecord("r0", 128, 129, arrival=0.0, start=0.0, first_token=0.02, last_token=0.02 + 128 * 0.01)
    facts = {"weight_bytes": 16_060_522_496, "kv_bytes_per_token": 131_072}  # the 8B in bf16: its checkpoint's bytes
    kv = 131_072 * (128 + 129 / 2)  # one sequence at a mean context of 192.5 tokens
    untied = shape(architectures()["llama-3.1-8b"])
    assert (untied["vocab"], untied["hidden"], untied["tie_word_embeddings"]) == (128256, 4096, False)
    bf16 = roofline_for([rec], 1.3, facts, "NVIDIA H200", untied)
    assert bf16["batch"] == 1 and bf16["bytes_per_step"] == int(16_060_522_496 - 1_050_673_152 + kv) == 15_035_080_704
    assert bf16["ceiling_tok_s"] == pytest.approx(4.8e12 / 15_035_080_704, rel=1e-12)
    assert bf16["mbu"] == pytest.approx(100 * 15_035_080_704 / 4.8e12, rel=1e-9)  # decode at 1 / 0.01 s tok/s
    fp32 = roofline_for([rec], 1.3, {**facts, "dtype": "float32"}, "NVIDIA H200", untied)  # HF on the CPU: 4 bytes
    assert fp32["bytes_per_step"] == int(16_060_522_496 - 2 * 1_050_673_152 + kv)
    tied = roofline_for([rec], 1.3, facts, "NVIDIA H200", {**untied, "tie_word_embeddings": True})
    assert tied["bytes_per_step"] == int(16_060_522_496 + kv) == roofline_for([rec], 1.3, facts, "NVIDIA H200")[
        "bytes_per_step"] == roofline_for([rec], 1.3, facts, "NVIDIA H200", shape({}))["bytes_per_step"]


def test_a_run_on_the_tied_embedded_model_reads_every_weight(run_result, engine):
    r, _, _ = run_result
    f, roof = engine.facts, r.roofline
    assert r.model["tie_word_embeddings"] is True and f["weight_bytes"] > 0
    assert roof["bytes_per_step"] == int(f["weight_bytes"] + f["kv_bytes_per_token"] * roof["batch"] * roof["context_len"])
