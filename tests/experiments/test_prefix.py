"""Lab 07's experiment (lablib.experiments.prefix): the simulator's prediction on the token ids an engine is sent,
the seeds' variants, and the prediction checked against the (fake) vLLM engine's own counters, run one at a time."""
import dataclasses

import pytest

from lablib.config import HFConfig, VLLMConfig
from lablib.engines.hf import HFEngine
from lablib.experiments import prefix
from lablib.workloads import load_workload
from tests.engines.test_vllm import fake_gpu, start, with_fake_vllm  # noqa: F401 - the fake vLLM's fixtures


@pytest.fixture(scope="module")
def hf():
    return HFEngine("embedded", HFConfig("naive"))  # only its tokenizer is used: prepare() tokenizes


def _shared_tokens(prepared):
    first = prepared[0]
    return min(next((i for i, (a, b) in enumerate(zip(first, p)) if a != b), min(len(first), len(p)))
               for p in prepared[1:])


def test_shared_first_hits_every_full_block_of_the_shared_prompt(hf):
    wl = load_workload("shared-prefix-128").head(6)
    ids = [list(p.prompt_ids) for p in prefix.prepare(wl, hf, prefix.BenchConfig(warmup_requests=0))]
    shared = _shared_tokens(ids)
    assert shared >= 128  # the set's promise: a 128-token shared prompt
    got = prefix.predict(wl, hf)
    assert list(got.cached_tokens) == [0] + [shared // 16 * 16] * 5 and got.queries == sum(map(len, ids))
    assert got.hits == 5 * (shared // 16 * 16) and got.evictions == 0


def test_a_per_request_line_first_shares_nothing(hf):
    wl = prefix.variant("shared-after", load_workload("shared-prefix-512").head(4), hf.tokenizer)
    assert [r.id for r in wl.requests][0].endswith("-after") and wl.requests[0].prompt.startswith("# asked by user-000")
    assert prefix.predict(wl, hf).hits == 0  # every block's chained hash differs from the first token on


def test_a_multi_turn_chat_hits_more_each_turn(hf):
    wl = prefix.variant("multi-turn", "shared-prefix-128", hf.tokenizer, turns=4)
    assert [r.id.split("-")[-1] for r in wl.requests] == ["turn1", "turn2", "turn3", "turn4"]
    for before, after in zip(wl.requests, wl.requests[1:]):
        assert after.prompt.startswith(before.prompt) and after.prompt_tokens > before.prompt_tokens
    cached = prefix.predict(wl, hf).cached_tokens
    assert cached[0] == 0 and all(a < b for a, b in zip(cached[1:], cached[2:])) and cached[1] >= 128


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match=r"variant.kind='shared-last': allowed .*shared-first"):
        prefix.variant("shared-last")


def test_prediction_equals_the_engines_counters_one_request_at_a_time(start):  # noqa: F811
    engine = start(VLLMConfig(max_num_seqs=1, enable_prefix_caching=True))
    for wl in (load_workload("shared-prefix-128").head(5),
               prefix.variant("multi-turn", "shared-prefix-128", engine.tokenizer, turns=4)):
        out = prefix.measure(engine, wl, max_new_tokens=2)
        assert out["exact"] is True, out["verdict"]
        assert out["vllm_hits"] == out["predicted_hits"] > 0 and "exactly equal" in out["verdict"]
        assert [r.cached_tokens for r in out["result"].requests] == list(out["predicted"].cached_tokens)


def test_a_prediction_that_misses_says_which_requests(start, monkeypatch):  # noqa: F811
    engine = start(VLLMConfig(max_num_seqs=1, enable_prefix_caching=True))
    wl = load_workload("shared-prefix-128").head(3)
    real = prefix.simulate

    def off_by_a_block(*a, **k):  # a simulator that forgot the last-token rule would predict one block more
        res = real(*a, **k)
        cached = list(res.cached_tokens)
        cached[1] += 16
        return dataclasses.replace(res, cached_tokens=tuple(cached))

    monkeypatch.setattr(prefix, "simulate", off_by_a_block)
    out = prefix.measure(engine, wl, max_new_tokens=2)
    assert out["exact"] is False and [d["request_id"] for d in out["differ"]] == [wl.requests[1].id]
    assert "1 of 3 requests differ" in out["verdict"]


def test_the_recording_step_runs_every_set_and_variant(start, tmp_path):  # noqa: F811
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
    assert [r["workload"] for r in rows] == [*prefix.SHARED_SETS, "shared-prefix-512-shared-after",
                                              "shared-prefix-512-multi-turn"]
    assert all(r["exact"] for r in rows), [r["verdict"] for r in rows]
    assert [r["vllm_hits"] == 0 for r in rows] == [False, False, False, True, False]
    assert all(r.provenance == "recorded" for r in store.load())
