"""Lab 07's experiment (lablib.experiments.prefix): the simulator's prediction on the token ids an engine is sent,
the seeds' variants, and the prediction checked against the (fake) vLLM engine's own counters, run one at a time."""
import dataclasses
import itertools

import pytest

from lablib.config import HFConfig, VLLMConfig
from lablib.engines.hf import HFEngine
from lablib.experiments.prefix import checks, record as prefix_record, runs as prefix_runs, serving, simulated, workloads
from lablib.workloads import load_workload


@pytest.fixture(scope="module")
def hf():
    return HFEngine("embedded", HFConfig("naive"))  # only its tokenizer is used: prepare() tokenizes


def _shared_tokens(prepared):
    first = prepared[0]
    return min(next((i for i, (a, b) in enumerate(zip(first, p)) if a != b), min(len(first), len(p)))
               for p in prepared[1:])


def test_shared_first_hits_every_full_block_of_the_shared_prompt(hf):
    wl = load_workload("shared-prefix-128").head(6)
    ids = [list(p.prompt_ids) for p in prefix_runs.prepare(wl, hf, prefix_runs.BenchConfig(warmup_requests=0))]
    shared = _shared_tokens(ids)
    assert shared >= 128  # the set's promise: a 128-token shared prompt
    got = prefix_runs.predict(wl, hf)
    assert list(got.cached_tokens) == [0] + [shared // 16 * 16] * 5 and got.queries == sum(map(len, ids))
    assert got.hits == 5 * (shared // 16 * 16) and got.evictions == 0


def test_a_per_request_line_first_shares_nothing(hf):
    wl = workloads.variant("shared-after", load_workload("shared-prefix-512").head(4), hf.tokenizer)
    assert next(r.id for r in wl.requests).endswith("-after") and wl.requests[0].prompt.startswith("# asked by user-000")
    assert prefix_runs.predict(wl, hf).hits == 0  # every block's chained hash differs from the first token on


def test_a_multi_turn_chat_hits_more_each_turn(hf):
    wl = workloads.variant("multi-turn", "shared-prefix-128", hf.tokenizer, turns=4)
    assert [r.id.split("-")[-1] for r in wl.requests] == ["turn1", "turn2", "turn3", "turn4"]
    for before, after in zip(wl.requests, wl.requests[1:]):
        assert after.prompt.startswith(before.prompt) and after.prompt_tokens > before.prompt_tokens
    cached = prefix_runs.predict(wl, hf).cached_tokens
    assert cached[0] == 0 and all(a < b for a, b in itertools.pairwise(cached)) and cached[1] >= 128


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match=r"variant.kind='shared-last': allowed .*shared-first"):
        workloads.variant("shared-last")


def test_prediction_equals_the_engines_counters_one_request_at_a_time(start):
    engine = start(VLLMConfig(max_num_seqs=1, enable_prefix_caching=True))
    for wl in (load_workload("shared-prefix-128").head(5),
               workloads.variant("multi-turn", "shared-prefix-128", engine.tokenizer, turns=4)):
        out = prefix_runs.measure(engine, wl, max_new_tokens=2)
        assert out["exact"] is True, out["verdict"]
        assert out["vllm_hits"] == out["predicted_hits"] > 0 and "exactly equal" in out["verdict"]
        assert [r.cached_tokens for r in out["result"].requests] == list(out["predicted"].cached_tokens)


def test_a_prediction_that_misses_says_which_requests(start, monkeypatch):
    engine = start(VLLMConfig(max_num_seqs=1, enable_prefix_caching=True))
    wl = load_workload("shared-prefix-128").head(3)
    real = prefix_runs.simulate

    def off_by_a_block(*a, **k):  # a simulator that forgot the last-token rule would predict one block more
        res = real(*a, **k)
        cached = list(res.cached_tokens)
        cached[1] += 16
        return dataclasses.replace(res, cached_tokens=tuple(cached))

    monkeypatch.setattr(prefix_runs, "simulate", off_by_a_block)
    out = prefix_runs.measure(engine, wl, max_new_tokens=2)
    assert out["exact"] is False and [d["request_id"] for d in out["differ"]] == [wl.requests[1].id]
    assert "1 of 3 requests differ" in out["verdict"]


def test_the_recording_step_runs_every_set_and_variant(start, tmp_path):
    """scripts/record_reference.py --steps prefix, on the fake vLLM: one recorded Result and one verdict per workload."""
    import importlib.util
    from pathlib import Path

    from lablib.results import ResultStore

    path = Path(__file__).resolve().parents[2] / "scripts" / "record_reference.py"
    spec = importlib.util.spec_from_file_location("record_reference", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    store, facts = ResultStore(tmp_path / "r.jsonl"), {}
    script.step_prefix(tmp_path, store, facts)
    rows = facts["prefix_seqs_1"]
    assert [r["workload"] for r in rows] == [*workloads.SHARED_SETS, "shared-prefix-512-shared-after",
                                              "shared-prefix-512-multi-turn"]
    assert all(r["exact"] for r in rows), [r["verdict"] for r in rows]
    assert [r["vllm_hits"] == 0 for r in rows] == [False, False, False, True, False]
    assert all(r.provenance == "recorded" for r in store.load())


# Lab 07's notebook: the simulator on the embedded tokenizer's ids, and the vLLM runs the recordings above lack.

def test_a_200_token_shared_prefix_caches_its_12_full_blocks(hf):
    wl = workloads.shared_prefix_set(workloads.ODD_LENGTH, hf.tokenizer)
    ids = [list(p.prompt_ids) for p in prefix_runs.prepare(wl, hf, prefix_runs.BenchConfig(warmup_requests=0))]
    assert workloads.shared_tokens(ids) == 200 and wl.name == "shared-prefix-200" and len(wl) == 32
    assert [r.prompt_tokens for r in wl.requests] == [len(i) for i in ids]
    base = load_workload("shared-prefix-1024")
    assert [len(i) - 200 for i in ids] == [r.prompt_tokens - 1024 for r in base.requests]  # the same own snippets
    assert list(prefix_runs.predict(wl, hf).cached_tokens) == [0] + [192] * 31  # 12.5 blocks shared: 12 hit
    system = {r.messages[0]["content"] for r in wl.requests}  # the chat form: the cut header is the system message
    assert len(system) == 1 and len(system.pop()) < len(base.requests[0].messages[0]["content"])
    assert [r.messages[1:] for r in wl.requests] == [r.messages[1:] for r in base.requests]


@pytest.mark.parametrize("bad", [2, 1025, 200.0])
def test_a_shared_prefix_outside_the_shipped_text_is_refused(bad):
    with pytest.raises(ValueError, match=r"shared_prefix_set\.tokens=.*allowed integers 3\.\.1024"):
        workloads.shared_prefix_set(bad)


def test_the_last_prompt_token_is_recomputed_on_real_ids(hf):
    rows = {r["prompt_tokens"]: r for r in simulated.repeat_rows(hf)}
    assert rows[64]["cached_second_time"] == 48 and rows[64]["recomputed"] == 16  # vLLM's floor, on the real tokenizer
    assert [rows[n]["cached_second_time"] for n in (65, 16, 17)] == [64, 0, 16]
    with pytest.raises(ValueError, match=r"repeat_rows\.lengths"):
        simulated.repeat_rows(hf, (0,))


def test_chained_hashes_agree_over_the_shared_prompt_only(hf):
    rows = simulated.chain_rows(hf, blocks=10)
    assert [r["shared"] for r in rows] == [True] * 8 + [False] * 2  # 128 shared tokens: 8 blocks
    assert not any(r["shared, line first"] for r in rows)  # a per-request line first: not even block 0
    assert rows[9]["request 0"] is None and len(rows[0]["request 0"]) == 8


def test_hit_rate_grows_with_the_shared_prefix(hf):
    rows = simulated.prefix_length_rows(hf)
    assert [r["shared_tokens"] for r in rows] == list(workloads.LENGTHS)
    assert [r["cached_per_later_request"] for r in rows] == [128, 192, 512, 1024]
    rates = [r["hit_rate"] for r in rows]
    assert all(a < b for a, b in itertools.pairwise(rates))
    for r in rows:  # whole blocks: the simulator reaches the best rate exactly when the prefix is whole blocks
        assert (r["hit_rate"] == pytest.approx(r["best_hit_rate"])) == (r["shared_tokens"] % 16 == 0)


def test_the_seeds_advice_on_one_set(hf):
    got = prefix_runs.advice(hf)
    assert list(got) == ["shared part first", "per-request line first", "multi-turn"]
    assert got["per-request line first"].hits == 0 < got["shared part first"].hits
    turns = got["multi-turn"].cached_tokens
    assert turns[0] == 0 and all(a < b for a, b in itertools.pairwise(turns))


def test_distinct_prefixes_arrive_in_the_order_asked():
    grouped = workloads.distinct_prefix_prompts(3, 2, 32, "grouped")
    robin = workloads.distinct_prefix_prompts(3, 2, 32, "round-robin")
    popular = workloads.distinct_prefix_prompts(3, 2, 32, "popular")

    def head(ps):
        return [p[:32] for p in ps]

    assert head(grouped)[0] == head(grouped)[1] != head(grouped)[2]
    assert head(robin)[0] == head(robin)[3] and len({tuple(h) for h in head(robin)[:3]}) == 3
    assert head(popular)[0] == head(popular)[2] == head(popular)[4] and head(popular)[1] != head(popular)[3]
    with pytest.raises(ValueError, match=r"distinct_prefix_prompts\.order='random'"):
        workloads.distinct_prefix_prompts(order="random")


def test_scarce_memory_evicts_prefixes_before_they_come_back():
    rows = simulated.scarce_memory_rows()
    by = {(r["order"], r["num_blocks"]): r for r in rows}
    best = by[("grouped", 160)]["hit_rate"]
    assert best > 0.5
    assert all(by[(o, 160)]["hit_rate"] == best and by[(o, 160)]["evictions"] == 0 for o in workloads.ORDERS)
    assert all(by[("round-robin", n)]["hits"] == 0 for n in (16, 32, 48, 64))  # below the 64 prefix blocks: nothing
    assert all(by[("grouped", n)]["hit_rate"] == best for n in (16, 64))  # reused at once: a tiny cache is enough
    for order in workloads.ORDERS:
        mine = [by[(order, n)] for n in range(16, 161, 16)]
        assert all(a["evictions"] >= b["evictions"] for a, b in itertools.pairwise(mine))
        assert all(a["hit_rate"] <= b["hit_rate"] for a, b in itertools.pairwise(mine))


def test_the_eviction_picture_shares_a_popular_prefix_and_rare_ones_lose_blocks():
    demo = simulated.eviction_demo()
    assert demo.cached_tokens == (0, 48, 0, 0, 48, 0, 32, 48, 16, 48)  # prefix 1 is back with 2 blocks, prefix 2 with 1
    assert demo.evictions == 17 and any(max(s.ref_counts) == 2 for s in demo.snapshots)


@pytest.mark.parametrize("cores", [2, 16])
def test_on_and_off_on_the_fake_vllm(start, monkeypatch, cores):
    """On this CPU's 2 cores the two engines start one after the other; on the H200 host's 16, together: the same
    rows either way, each engine measured alone."""
    from lablib.engines import together

    monkeypatch.setattr(together.os, "cpu_count", lambda: cores)
    monkeypatch.delenv(together.ENV, raising=False)
    value, results = prefix_runs.on_off_runs(("embedded",))
    assert {(r.engine_facts.get("together") or {}).get("engines", 1) for r in results} == {1 if cores == 2 else 2}
    if cores == 16:  # each KV cache holds the 32 longest requests of the sets, not max_num_seqs=256 of the longest
        from lablib.bench.offline import request_lengths
        from lablib.config import BenchConfig
        from lablib.models import prompt_tokenizer, resolve_model

        spec = resolve_model("embedded")
        tok = prompt_tokenizer(spec)
        sets = [workloads.shared_set(n, tok) for n in workloads.LENGTHS]
        sets.append(workloads.variant("shared-after", "shared-prefix-512", tok))
        runs = [request_lengths(w, spec, BenchConfig()) for w in sets]
        longest = max(max(run) for run in runs)
        config = prefix_runs.VLLMConfig(max_num_seqs=256, max_model_len=together.run_length(
            spec, prefix_runs.VLLMConfig(), longest))
        kv = {r.config["kv_cache_memory_bytes"] for r in results}
        assert kv == {together.kv_bytes_for(spec, config, longest, 32, runs)}
        assert kv.pop() < together.kv_bytes_for(spec, prefix_runs.VLLMConfig(max_num_seqs=256), longest, 32)
    runs = value["runs"]
    names = [f"shared-prefix-{n}" for n in workloads.LENGTHS] + ["shared-prefix-512-shared-after"]
    assert [(r["caching"], r["workload"]) for r in runs] == [("off", n) for n in names] + [("on", n) for n in names]
    on = {r["workload"]: r for r in runs if r["caching"] == "on"}
    assert on["shared-prefix-200"]["vllm_hits"] == 31 * 192 and on["shared-prefix-512-shared-after"]["vllm_hits"] == 0
    assert on["shared-prefix-1024"]["shared_tokens"] == 1024 and on["shared-prefix-1024"]["hit_rate"] > 0.9
    assert all(r["hit_rate"] is None and not r["vllm_hits"] for r in runs if r["caching"] == "off")
    assert [(a["identical"], a["of"]) for a in value["agreement"]] == [(32, 32)] * 5  # the fake ignores its cache
    assert [a["off_twice"] for a in value["agreement"]] == ["32 of 32"] * 5  # caching off, each set run twice
    text = checks.agreement_lines(type(prefix_runs.on_off(force=False))(value, True, "live here"))
    assert text.startswith("embedded: 128 of 128 requests identical") and "the same run twice: 32 of 32" in text
    assert len(results) == 10 and all(r.requests[0].output_tokens == 32 for r in results)
    pairs = prefix_runs.on_off_pairs(runs)
    assert [p["workload"] for p in pairs] == [r["workload"] for r in runs[5:]] and all(p["ttft_p50_on_over_off"] > 0
                                                                                       for p in pairs)


def test_the_ttft_claim_reads_the_synthetic_models_pairs():
    def row(model, wl, caching, ttft):
        return {"model": model, "workload": wl, "caching": caching, "shared_tokens": 128, "hit_rate": 0.5,
                "ttft_p50_s": ttft, "total_tok_s": 1.0}

    big = "synthetic:llama-3.1-8b"
    after = "shared-prefix-512-shared-after"
    runs = [row(big, "shared-prefix-128", "off", 0.5), row(big, "shared-prefix-128", "on", 0.2),
            row(big, after, "off", 0.5), row(big, after, "on", 0.6),
            row("embedded", "shared-prefix-128", "off", 0.01), row("embedded", "shared-prefix-128", "on", 0.02)]
    assert checks.caching_cuts_ttft(runs)  # the 0%-hit variant and the embedded model are not part of the claim
    assert not checks.caching_cuts_ttft(runs, model="embedded") and not checks.caching_cuts_ttft([])
    assert prefix_runs.on_off_pairs(runs)[0]["ttft_p50_on_over_off"] == pytest.approx(0.4)


def test_record_writes_one_facts_key_and_recorded_results(start, tmp_path):
    from lablib.results import ResultStore

    store, facts = ResultStore(tmp_path / "r.jsonl"), {}
    prefix_record.record_on_off(tmp_path, store, facts, models=("embedded",))
    assert list(facts) == [prefix_runs.ON_OFF_KEY] and set(facts[prefix_runs.ON_OFF_KEY]) == {"runs", "agreement"}
    saved = store.load()
    assert len(saved) == 10 and all(r.provenance == "recorded" and r.lab == "reference" for r in saved)


def test_the_lab_counts_vllms_hits_live_and_says_what_is_not_recorded(start, unrecorded):
    shown = prefix_runs.counters(1, force=True)
    assert shown.live and [r["workload"] for r in shown.value] == [w.name for w in workloads.lab_workloads()]
    assert all(r["exact"] for r in shown.value), [r["verdict"] for r in shown.value]
    unrecorded("prefix_seqs_1", "prefix_seqs_32", prefix_runs.ON_OFF_KEY)
    for got, step in ((prefix_runs.counters(1, force=False), "prefix"), (prefix_runs.counters(32, force=False), "prefix-batch"),
                      (prefix_runs.on_off(force=False), "prefix-on-off")):
        assert got.value is None and f"--steps {step}`" in got.label
    assert checks.part(prefix_runs.on_off(force=False), "runs").value is None
    with pytest.raises(ValueError, match=r"counters\.max_num_seqs=8"):
        prefix_runs.counters(8)


def test_the_scarce_memory_claim_notices_a_rate_that_rises_as_room_shrinks():
    rows = simulated.scarce_memory_rows(capacities=(64, 96, 160))
    assert checks.falls_with_capacity(rows)
    bad = [dict(r, hit_rate=1.0) if r["num_blocks"] == 64 else r for r in rows]
    assert not checks.falls_with_capacity(bad)
    onoff = prefix_runs.on_off(force=False)
    fake = type(onoff)({"runs": [1, 2]}, False, "recorded on NVIDIA H200, 2026-12-01")
    assert checks.part(fake, "runs", len).value == 2 and checks.part(fake, "runs").label == fake.label


EMPTY_ROW = {"per_request": [], "predicted_hits": 0, "predicted_queries": 0, "vllm_hits": 0, "vllm_queries": 0}


def test_a_recorded_on_off_or_counters_shows_what_the_cell_asked_or_says_what_stands_in(monkeypatch, capsys):
    """Issue 11.8: the recording's models are read from its runs; the lab's own call on a recording of both models
    says nothing, one model picks its runs out, a model it lacks shows every run and names the stand-in (the parts
    keep it). Not recorded: no value, no error, whatever was asked."""
    from lablib.results import reference

    big = "synthetic:llama-3.1-8b"
    facts = {prefix_runs.ON_OFF_KEY: {"runs": [{"model": m, "workload": w} for m in ("embedded", big) for w in "ab"],
                                 "agreement": [{"model": m, "identical": 1, "of": 1} for m in ("embedded", big)]},
             "prefix_seqs_1": [{"workload": "a", "max_num_seqs": 1, **EMPTY_ROW}]}

    def recorded(key, step):
        if key not in facts:
            raise reference.NotRecorded(key, step)
        return facts[key]

    monkeypatch.setattr(prefix_runs, "recorded_facts", recorded)  # the name on_off and counters call
    lab = prefix_runs.on_off(force=False)
    assert lab.stand_ins == {} and lab.value == facts[prefix_runs.ON_OFF_KEY] and capsys.readouterr().out == ""
    one = prefix_runs.on_off(("embedded",), force=False)  # the recording is shown whole, and says what else it shows
    assert one.stand_ins == {"models": {"asked": ["embedded"], "shown": ["embedded", big]}}
    assert one.value == facts[prefix_runs.ON_OFF_KEY] and "models: asked ['embedded']" in capsys.readouterr().out
    other = prefix_runs.on_off(("embedded", "llama-3.1-70b"), force=False)
    assert other.stand_ins == {"models": {"asked": ["embedded", "llama-3.1-70b"], "shown": ["embedded", big]}}
    assert other.value == facts[prefix_runs.ON_OFF_KEY] and "models: asked ['embedded', 'llama-3.1-70b']" in (
        capsys.readouterr().out)
    assert checks.part(other, "runs").stand_ins == other.stand_ins and checks.part(other, "runs", len).value == 4
    seq = prefix_runs.counters(1, force=False)
    assert seq.stand_ins == {} and seq.value == [prefix_runs.judged(r) for r in facts["prefix_seqs_1"]]
    assert seq.value[0]["exact"] and seq.value[0]["verdict"].endswith("exactly equal, request by request")
    facts["prefix_seqs_1"] = [{"workload": "a", "max_num_seqs": 32, **EMPTY_ROW}]  # a recording filed under the wrong key says so
    assert prefix_runs.counters(1, force=False).stand_ins == {"max_num_seqs": {"asked": 1, "shown": 32}}
    batch = prefix_runs.counters(32, force=False)
    assert batch.value is None and batch.stand_ins == {} and "--steps prefix-batch`" in batch.label
    del facts[prefix_runs.ON_OFF_KEY]
    assert prefix_runs.on_off(("llama-3.1-70b",), force=False).value is None


# Prefix reuse on the CPU, in transformers (issue 14.6): the saving measured on this machine.

def test_reusable_tokens_follow_vllms_rules():
    from lablib.experiments.prefix.reuse import reusable_tokens

    assert reusable_tokens(541, 512) == 512  # 32 whole blocks of the shared part
    assert reusable_tokens(541, 200) == 192  # 12 whole blocks: the partial 13th is recomputed
    assert reusable_tokens(512, 512) == 496  # the whole prompt shared: its last token is always recomputed
    assert reusable_tokens(10, 10) == 0 and reusable_tokens(40, 40, block_size=8) == 32


def test_reuse_study_gives_the_same_next_token_sooner(hf):
    from lablib.experiments.prefix.reuse import reuse_lines, reuse_study

    study = reuse_study(hf, "shared-prefix-512", requests=3, rounds=3)
    assert study["shared_tokens"] == 512 and [r["reused_tokens"] for r in study["rows"]] == [512] * 3
    assert all(r["same_first_token"] and r["max_logit_diff"] < 1e-3 for r in study["rows"])
    # ~93% of the prompt skipped: measured 6-7x faster here; a 2x margin below that is no noise on 2 shared cores
    assert study["warm_ttft_p50_ms"] * 2 < study["cold_ttft_p50_ms"]
    assert study["speedup_bound"] == pytest.approx(sum(r["prompt_tokens"] for r in study["rows"]) /
                                                   sum(r["prompt_tokens"] - 512 for r in study["rows"]))
    assert "Median TTFT" in reuse_lines(study, "live on this CPU")
    with pytest.raises(ValueError, match="reuse_study.requests"):
        reuse_study(hf, requests=0)


# The server under Poisson load (issue 14.5): the prefix-cache counters on /metrics, next to the simulator and TTFT.

def _threaded_fake_server(**kw):
    """tests/fake_vllm's api_server in a thread (loaded from its file: stdlib only, the fake `vllm` package stays out)."""
    import importlib.util
    import threading
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fake_vllm" / "vllm" / "entrypoints" / "openai" / "api_server.py"
    spec = importlib.util.spec_from_file_location("fake_api_server_prefix", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    srv = mod.make_server("127.0.0.1", 0, "k", **kw)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def fake_server():
    """The fake server with its development routes, 2 slots, 2 ms a token (32 tokens: 64 ms a request)."""
    srv = _threaded_fake_server(max_num_seqs=2, delay=0.002, dev_mode=True)
    yield srv
    srv.shutdown()
    srv.server_close()


def test_the_servers_counter_deltas_are_the_fake_engines_own_counts(hf, fake_server):
    """Each load test's /metrics deltas are the engine's own counts over that test (read at each reset: the reset
    empties the cache and leaves the counters, as vLLM's does), and equal the simulator's prediction for the ids.

    At 5 req/s (a mean gap of 200 ms, a request taking 64 ms) requests mostly run alone; at 1000 req/s all 6 arrive
    within a few ms and queue for the 2 slots. The hits are the same: a prompt's blocks are registered when it is
    admitted (vLLM 0.26's allocate_slots), and in shared-prefix-512 every pair of prompts shares exactly the 32
    blocks of the system prompt, so the order of admission changes nothing."""
    from lablib.experiments.prefix import serving as prefix_serving

    srv = fake_server
    wl = load_workload("shared-prefix-512").head(6)
    ids = workloads.token_ids(wl, hf)
    seen = []
    reset = srv.cache.reset
    srv.cache.reset = lambda: (seen.append((srv.cache.queries, srv.cache.hits)), reset())[1]
    rows, results = prefix_serving.load_tests(srv.url, "k", "embedded", wl, ids, [5.0, 1000.0],
                                              prefix_runs.predict(wl, hf), caching=True)
    ends = [*seen[1:], (srv.cache.queries, srv.cache.hits)]
    assert [(r["queries"], r["hits"]) for r in rows] == [(b[0] - a[0], b[1] - a[1]) for a, b in zip(seen, ends)]
    assert len(seen) == 2 and seen[0] == (sum(map(len, ids)), 5 * 512)  # the warm-up: the set once, from empty
    for r in rows:
        assert (r["queries"], r["hits"]) == (r["predicted_queries"], r["predicted_hits"]) == (sum(map(len, ids)),
                                                                                           5 * 512)
        assert r["hit_rate"] == pytest.approx(r["predicted_hit_rate"]) and r["errors"] == 0 and r["requests"] == 6
        assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"] and r["output_tok_s"] > 0
    burst = sorted(results[1].requests, key=lambda q: q.start)
    assert any(b.start < a.finished for a, b in itertools.pairwise(burst))  # they did overlap
    assert [r.step for r in results] == ["prefix-serve-on-shared-prefix-512-rate-5",
                                         "prefix-serve-on-shared-prefix-512-rate-1000"]


def test_a_server_that_cannot_reset_its_cache_says_why(fake_server):
    from lablib.experiments.prefix import serving as prefix_serving

    srv = _threaded_fake_server(dev_mode=False)
    try:
        with pytest.raises(RuntimeError, match="VLLM_SERVER_DEV_MODE=1"):
            prefix_serving.reset_prefix_cache(srv.url, "k")
    finally:
        srv.shutdown()
        srv.server_close()
    fake_server.running = 1  # a request holds blocks: vLLM answers {"success": false}
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache"):
        prefix_serving.reset_prefix_cache(fake_server.url, "k", timeout_s=0.5)
    fake_server.running = 0
    prefix_serving.reset_prefix_cache(fake_server.url, "k")


def test_serve_runs_caching_off_then_on_on_the_fake_server(with_fake_vllm, tmp_path):
    """The whole step on `python -m vllm.entrypoints.openai.api_server` (the fake): caching off, the counters do not
    move; on, every rate's hits are the simulator's; the shared-after variant hits nothing."""
    from lablib.experiments.prefix import serving as prefix_serving

    rows, results = prefix_serving.serve_runs("embedded", rates=[20.0, 300.0], limit=6, out_dir=tmp_path)
    assert [(r["caching"], r["rate"]) for r in rows] == [("off", 20.0), ("off", 300.0), ("on", 20.0), ("on", 300.0)]
    for r in rows[:2]:
        assert (r["queries"], r["hits"], r["hit_rate"], r["predicted_hits"]) == (0, 0, None, None)
    for r in rows[2:]:
        assert r["hits"] == r["predicted_hits"] == 5 * 512 and r["queries"] == r["predicted_queries"] > 6 * 512
        assert r["model"] == "embedded" and r["limit"] == 6 and r["errors"] == 0
    assert checks.serve_hits_predicted(rows) and len(results) == 4
    assert results[2].config["enable_prefix_caching"] is True and results[0].config["enable_prefix_caching"] is False
    assert "fake api_server" in (tmp_path / "server-caching-on.log").read_text()
    after, _ = prefix_serving.serve_runs("embedded", "shared-prefix-512-shared-after", [300.0], caching=(True,),
                                         limit=4, out_dir=tmp_path)
    assert [(r["hits"], r["predicted_hits"]) for r in after] == [(0, 0)] and after[0]["queries"] > 0


@pytest.mark.parametrize("kw, message", [
    ({"rates": [0]}, r"prefix_serving\.rates=\[0\]: allowed a non-empty list of numbers > 0 \(0 is not\); Fix: "),
    ({"rates": [4.0, -1.0]}, r"prefix_serving\.rates=\[4\.0, -1\.0\]: allowed .*\(-1\.0 is not\); Fix: "),
    ({"rates": [float("inf")]}, r"prefix_serving\.rates=\[inf\]: allowed .*; Fix: requests per second"),
    ({"rates": []}, r"prefix_serving\.rates=\[\]: allowed a non-empty list"),
    ({"workload": "shared-prefix-999"}, (r"prefix_serving\.workload='shared-prefix-999': allowed 'shared-prefix-128', "
                                        r".*'shared-prefix-512-shared-after'; Fix: ")),
    ({"limit": 0}, r"prefix_serving\.limit=0: allowed integers >= 1; Fix: "),
])
def test_bad_input_is_refused_before_any_server_starts(monkeypatch, kw, message):
    from lablib.engines import server
    from lablib.experiments.prefix import serving as prefix_serving

    def no_server(*a, **k):
        raise AssertionError("a server was started")

    for module in (server, prefix_serving):  # the server's module, and the name serve_runs calls
        monkeypatch.setattr(module, "VLLMServer", no_server)
    for call in (lambda: prefix_serving.serve_runs("embedded", **kw), lambda: prefix_serving.serve(**kw, force=True),
                 lambda: prefix_serving.serve(**kw, force=False)):
        with pytest.raises(ValueError, match=message):
            call()


def test_the_lab_serves_live_and_says_what_is_not_recorded(with_fake_vllm, tmp_path, unrecorded):
    from lablib.experiments.prefix import serving as prefix_serving
    from lablib.plots import prefix as figures
    from lablib.results import ResultStore

    store = ResultStore(tmp_path / "r.jsonl")
    assert serving.serve is prefix_serving.serve and serving.serve_lines is prefix_serving.serve_lines  # the lab calls
    live = serving.serve("embedded", rates=[200.0], limit=4, store=store, force=True)
    assert live.live and [r["caching"] for r in live.value] == ["off", "on"] and len(store.load()) == 2
    text = prefix_serving.serve_lines(live)
    assert text.startswith("200 req/s: hit rate ") and f"({live.value[1]['hits']} of " in text
    assert text.endswith(f"[{live.label}]") and "TTFT p50 off" in text
    fig = figures.serve_figure(live)
    assert [t.name for t in fig.data][:2] == [figures.COUNTED, figures.PREDICTED]
    assert list(fig.data[0].y) == pytest.approx([100 * live.value[1]["hit_rate"]])
    assert fig.layout.xaxis.type == "log" and live.label in fig.layout.title.text
    unrecorded(prefix_serving.KEY)
    none = prefix_serving.serve(force=False)
    assert none.value is None and "not recorded yet" in none.label and "--steps prefix-serve`" in none.label
    assert prefix_serving.serve_lines(none) == f"[{none.label}]"
    empty = figures.serve_figure(none)
    assert not [t for t in empty.data if t.y] and "--steps prefix-serve" in empty.layout.title.text


def test_a_recorded_serve_shows_the_recording_and_says_what_stands_in(monkeypatch, capsys):
    from lablib.experiments.prefix import serving as prefix_serving

    rows = [{"model": "synthetic:llama-3.1-8b", "workload": "shared-prefix-512", "caching": c, "rate": rate,
             "limit": None} for rate in prefix_serving.RATES for c in ("off", "on")]
    monkeypatch.setattr(prefix_serving, "recorded_facts", lambda key, step: rows if key == prefix_serving.KEY else None)
    shown = prefix_serving.serve(force=False)
    assert shown.value == rows and shown.stand_ins == {} and capsys.readouterr().out == ""
    two = prefix_serving.serve(rates=[32.0, 2.0], force=False)  # the recording whole, the other rates named
    assert two.value == rows and two.stand_ins == {"rates": {"asked": [32.0, 2.0], "shown": sorted(prefix_serving.RATES)}}
    assert "rates: asked [32.0, 2.0]" in capsys.readouterr().out
    other = prefix_serving.serve("embedded", rates=[5.0], force=False)
    assert other.value == rows and set(other.stand_ins) == {"model", "rates"}
    assert "model: asked embedded, shown synthetic:llama-3.1-8b" in capsys.readouterr().out


def test_the_serving_claims_can_fail():
    def r(caching, rate, ttft, hits=512, predicted=512, errors=0):
        return {"model": "synthetic:llama-3.1-8b", "workload": "shared-prefix-512", "caching": caching, "rate": rate,
                "ttft_p50_s": ttft, "hits": hits, "queries": 600, "predicted_hits": predicted,
                "predicted_queries": 600, "errors": errors}

    good = [r("off", 2.0, 0.03), r("on", 2.0, 0.02), r("off", 128.0, 0.3), r("on", 128.0, 0.05)]
    assert checks.serve_hits_predicted(good) and checks.serve_cuts_ttft(good)
    assert not checks.serve_hits_predicted([*good[:3], r("on", 128.0, 0.05, hits=496)])  # one block short
    assert not checks.serve_hits_predicted([*good[:3], r("on", 128.0, 0.05, errors=1)])
    assert not checks.serve_hits_predicted(good[::2])  # caching off only: nothing to compare
    assert not checks.serve_cuts_ttft([*good[:3], r("on", 128.0, 0.4)])  # slower at the top rate
    assert checks.serve_cuts_ttft([*good[:1], r("on", 2.0, 0.04), *good[2:]])  # only the highest rate is claimed
    assert not checks.serve_cuts_ttft(good[:1] + good[2:3])  # no caching-on run to compare


def test_the_recording_step_records_every_rate_on_and_off(with_fake_vllm, tmp_path, load_script):
    from lablib.experiments.prefix import serving as prefix_serving
    from lablib.results import ResultStore

    store, facts = ResultStore(tmp_path / "r.jsonl"), {}
    prefix_record.record_serve(tmp_path, store, facts, model="embedded", rates=[100.0, 400.0], limit=3)
    assert list(facts) == [prefix_serving.KEY] and len(facts[prefix_serving.KEY]) == 4
    saved = store.load()
    assert len(saved) == 4 and all(r.provenance == "recorded" and r.lab == "reference" for r in saved)
    assert checks.serve_hits_predicted(facts[prefix_serving.KEY])
    script = load_script("record_reference")
    called = []
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(prefix_record, "record_serve", lambda *a: called.append(a))
    try:
        script.STEPS["prefix-serve"](tmp_path, store, facts)
    finally:
        monkeypatch.undo()
    assert called == [(tmp_path, store, facts)]


def test_the_h200_recordings_of_lab_07_hold_what_the_lab_says_of_them():
    """The shipped recordings (2026-12-01): every request's num_cached_tokens equals the simulator's one request at a
    time, while vLLM 0.26's offline counters kept only the first request's stats there (the zero-output-step bug,
    vLLM #48668); 32 at once the counters are exact; the server's /metrics counters equal the simulator's at every
    rate; caching cuts the synthetic 8B's TTFT on every shared-first set."""
    from lablib.experiments.prefix import checks as prefix_checks, serving as prefix_serving

    seq, batch = prefix_runs.counters(1, force=False), prefix_runs.counters(32, force=False)
    assert seq.label.startswith("recorded on NVIDIA H200") and len(seq.value) == len(batch.value) == 5
    for row in seq.value:
        assert not row["differ"] and prefix_runs.counters_keep_only_the_first(row), row["verdict"]
        assert "PR #48668" in prefix_runs.judged(row)["verdict"]
    assert all(prefix_runs.judged(r)["exact"] for r in batch.value), [r["verdict"] for r in batch.value]
    serve = prefix_serving.serve(force=False)
    assert prefix_checks.serve_hits_predicted(serve.value) and prefix_checks.serve_cuts_ttft(serve.value)
    onoff = prefix_runs.on_off(force=False)
    assert prefix_checks.caching_cuts_ttft(onoff.value["runs"])


def test_scarce_memory_on_the_fake_vllm_is_compared_request_by_request(start, tmp_path):
    """vLLM with a pool of the simulator's capacity (+ its null block), one request at a time. The fake engine never
    evicts: where the simulator evicts nothing that comes back (grouped) the two agree request by request; where it
    evicts every prefix before its return (round-robin in 48 blocks) the fake still hits, and the row says which
    requests differ."""
    from lablib.experiments.prefix import scarce as prefix_scarce
    from lablib.results import ResultStore

    store = ResultStore(tmp_path / "r.jsonl")
    rows = prefix_scarce.scarce_vllm_rows((48,), ("grouped", "round-robin"), store=store)
    grouped, rr = rows
    assert prefix_scarce.pool_as_asked(rows) and grouped["kv_blocks"] == 49
    assert grouped["per_request_exact"] and "equal, request by request" in grouped["verdict"]
    assert grouped["predicted_hits"] == grouped["vllm_cached"] > 0 and grouped["requests"] == 32
    assert rr["predicted_hits"] == 0 and rr["predicted_evictions"] > 0 and rr["vllm_cached"] > 0
    assert not rr["per_request_exact"] and f"{len(rr['differ'])} of 32 requests differ" in rr["verdict"]
    assert [r.step for r in store.load()] == ["prefix-scarce-grouped-48", "prefix-scarce-round-robin-48"]
    assert all(r.config["enforce_eager"] for r in store.load())  # hits are read, not decode's speed: no graphs
    assert all(r.requests[0].prompt_tokens == p["prompt_tokens"] for r, p in zip(store.load(), (
        grouped["per_request"][0], rr["per_request"][0])))


def test_scarce_memory_refuses_a_pool_too_small_before_any_engine(monkeypatch, unrecorded):
    import lablib.engines.vllm as engine
    from lablib.experiments.prefix import scarce as prefix_scarce

    for module in (engine, prefix_scarce):  # the engine's module, and the name scarce_vllm_rows calls
        monkeypatch.setattr(module, "VLLMEngine", lambda *a, **k: pytest.fail("an engine was made before the refusal"))
    with pytest.raises(ValueError, match=r"scarce_vllm_rows\.capacities"):
        prefix_scarce.scarce_vllm_rows((16,))  # 512 tokens need 32 blocks
    with pytest.raises(ValueError, match=r"scarce_vllm_rows\.orders"):
        prefix_scarce.scarce_vllm_rows((48,), ("sorted",))
    with pytest.raises(ValueError, match=r"num_gpu_blocks_override.*at least 33"):
        VLLMConfig(num_gpu_blocks_override=32, max_model_len=512)  # vLLM would start, but its null block leaves 31
    with pytest.raises(ValueError, match=r"num_gpu_blocks_override.*set max_model_len"):
        VLLMConfig(num_gpu_blocks_override=64)
    assert VLLMConfig(num_gpu_blocks_override=49, max_model_len=512).llm_kwargs()["num_gpu_blocks_override"] == 49
    unrecorded(prefix_scarce.KEY)
    shown = prefix_scarce.scarce_vllm(force=False)
    assert shown.value is None and "--steps prefix-scarce`" in shown.label
    assert prefix_scarce.scarce_lines(shown) == f"[{shown.label}]"


def test_the_scarce_recording_step_keeps_rows_and_recorded_results(start, tmp_path, monkeypatch):
    from lablib.experiments.prefix import scarce as prefix_scarce
    from lablib.results import ResultStore

    real = prefix_scarce.scarce_vllm_rows
    monkeypatch.setattr(prefix_scarce, "scarce_vllm_rows", lambda **k: real((48,), ("grouped",), **k))
    store, facts = ResultStore(tmp_path / "r.jsonl"), {}
    prefix_record.record_scarce(tmp_path, store, facts)
    got = facts[prefix_scarce.KEY]
    assert [(r["order"], r["num_blocks"]) for r in got] == [("grouped", 48)]
    assert got[0]["provenance"].startswith("recorded on NVIDIA H200, ")
    saved = store.load()
    assert [r.step for r in saved] == ["prefix-scarce-grouped-48"] and saved[0].provenance == "recorded"
    assert saved[0].lab == "reference"


def test_the_agreement_line_names_the_explanation_the_numbers_leave():
    """Three cases the H200 recorded: reuse alone moves tokens (control and run-twice quiet); the control moves while
    one engine run twice does not (the second engine's doing, 2026-12-02's embedded model); one engine run twice
    already moves (random weights, the synthetic 8B): then on against off cannot single out the cache."""
    from lablib.session import Shown

    def rows(model, reused, control, twice):
        sets = [f"shared-prefix-{n}" for n in (128, 512)] + ["shared-prefix-512-shared-after"]
        return [{"model": model, "workload": w, "identical": same, "of": 32, "off_twice": t,
                 "diverged": [{"first_divergence": 5}] * (32 - same)}
                for w, same, t in zip(sets, [*reused, control], twice)]

    def line(*args):
        return checks.agreement_lines(Shown({"agreement": rows(*args)}, False, "recorded"))

    reuse = line("embedded", (30, 28), 32, ["32 of 32"] * 3)
    assert "so the differences come with reused blocks" in reuse and "58 of 64 requests identical" in reuse
    engine = line("embedded", (30, 28), 24, ["32 of 32"] * 3)
    assert "they come with the second engine, the one with caching on" in engine and "the control, which reuses " \
        "nothing: 24 of 32" in engine
    noise = line("synthetic:llama-3.1-8b", (30, 5), 32, ["30 of 32", "7 of 32", "32 of 32"])
    assert "cannot single out the cache here: random weights" in noise and "reused blocks" not in noise
    old = line("embedded", (30, 28), 24, [None] * 3)  # a recording made before the run twice: no claim about it
    assert "two engines of the same configuration already part" in old and "run twice" not in old
