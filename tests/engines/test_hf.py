"""The Hugging Face engines on the embedded model: one record per request, exact lengths, honest
time stamps, and static batching gives the same greedy tokens as the naive path.

The model is loaded once per engine for the module; each generate call is ~8 requests x 8 tokens.
"""

import dataclasses

import pytest

from lablib.bench.offline import prepare
from lablib.config import BenchConfig, HFConfig
from lablib.engines import HFEngine, PreparedRequest
from lablib.engines import hf
from lablib.workloads import load_workload

torch = pytest.importorskip("torch")
pytest.importorskip("transformers").utils.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (conftest.py)

N, NEW, B = 8, 8, 4


@pytest.fixture(scope="module")
def naive(hf_naive_cpu) -> HFEngine:
    return hf_naive_cpu


@pytest.fixture(scope="module")
def static(naive) -> HFEngine:
    e = HFEngine(naive.spec, HFConfig("static", B, device="cpu"))
    yield e
    e.close()


@pytest.fixture(scope="module")
def requests(naive) -> list[PreparedRequest]:
    # journey-006 is a long prompt (~540 tokens): batches mix long and short, so left padding is exercised.
    return prepare(load_workload("journey", limit=N), naive, BenchConfig(max_new_tokens=NEW, progress=False))


@pytest.fixture(scope="module")
def naive_records(naive, requests):
    return naive.generate(requests, progress=False)


@pytest.fixture(scope="module")
def static_records(static, requests):
    # uneven lengths inside each batch: the short ones must still get exactly their own count
    uneven = [dataclasses.replace(r, max_new_tokens=NEW - 2 * (i % 3)) for i, r in enumerate(requests)]
    seen = []
    return uneven, static.generate(uneven, on_record=seen.append, progress=False), seen


def check_records(reqs, recs, together: bool = False):
    """`together`: a speculative step's tokens leave the model at once and share its stamp (never go back)."""
    assert [r.request_id for r in recs] == [r.request_id for r in reqs]
    for q, r in zip(reqs, recs):
        assert r.prompt_tokens == len(q.prompt_ids)
        assert r.output_tokens == q.max_new_tokens == len(r.output_ids) == len(r.token_times)
        assert all(a <= b if together else a < b for a, b in zip(r.token_times, r.token_times[1:])), r.token_times
        assert r.arrival == 0.0 <= r.start < r.first_token <= r.last_token <= r.finished
        assert r.first_token == r.token_times[0] and r.last_token == r.token_times[-1]
        assert all(0 <= t < 4096 for t in r.output_ids)


def test_engine_facts(naive, static):
    f = naive.facts
    assert naive.name == "hf-naive" and static.name == "hf-static"
    assert f["device"] == "cpu" and f["dtype"] == "float32" and f["context"] == 2048
    assert f["parameters"] == 4_737_792  # tied embeddings counted once
    assert f["weight_bytes"] == 4 * f["parameters"]
    assert f["kv_bytes_per_token"] == 2 * 5 * 2 * 64 * 4  # K and V, 5 layers, 2 KV heads, head dim 64, fp32
    assert f["ignore_eos"] is True and static.facts["ignore_eos"] is True  # exact lengths (was BenchConfig.ignore_eos)


def test_naive_records(naive_records, requests):
    check_records(requests, naive_records)
    for a, b in zip(naive_records, naive_records[1:]):  # one at a time: each starts after the last finished
        assert b.start >= a.finished


def test_static_records_and_batch_end(static_records):
    reqs, recs, seen = static_records
    check_records(reqs, recs)
    assert seen == recs  # on_record saw every record, in order
    batches = [recs[i:i + B] for i in range(0, len(recs), B)]
    for batch in batches:
        end = max(r.last_token for r in batch)
        assert len({r.start for r in batch}) == 1
        assert all(r.finished == batch[0].finished >= end for r in batch)  # handed back when the batch ends
        short = [r for r in batch if r.output_tokens < NEW]
        assert short and all(r.finished > r.last_token for r in short)  # the short ones waited
    assert batches[1][0].start >= batches[0][0].finished


def test_static_greedy_tokens_equal_naive(naive_records, static_records):
    # Left padding with the attention mask must not change greedy output (fp32 CPU, same model).
    _, recs, _ = static_records
    for n, s in zip(naive_records, recs):
        assert s.output_ids == n.output_ids[:s.output_tokens], n.request_id


def test_naive_matches_a_hand_written_greedy_loop(naive, requests, naive_records):
    # No cache, no generate(): argmax of the full forward pass, one token at a time, EOS ignored.
    q, r = requests[1], naive_records[1]
    ids = list(q.prompt_ids)
    with torch.inference_mode():
        for _ in range(NEW):
            ids.append(int(naive.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert ids[len(q.prompt_ids):] == r.output_ids


def test_eos_is_not_a_stop_token(naive):
    eos = naive.tokenizer.eos_token_id
    (r,) = naive.generate([PreparedRequest("eos", (naive.tokenizer.bos_token_id, eos, eos), 12)], progress=False)
    assert r.output_tokens == len(r.output_ids) == len(r.token_times) == 12


def test_cuda_without_a_gpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal is for machines without one")
    with pytest.raises(ValueError, match="device='cuda' but no CUDA GPU"):
        HFEngine("embedded", HFConfig(device="cuda"))


# --- later labs' HF rungs: another attention kernel (lab 02), transformers' speculative decoding (lab 08) -------

@pytest.mark.parametrize("how", ["ngram", "draft"])
def test_speculative_decoding_keeps_the_greedy_tokens_and_counts_its_target_forwards(naive, requests, naive_records, how):
    """Assisted generation verifies greedily: the tokens are naive generate's, token for token. Each verify step
    emits 1..k+1 tokens, one time stamp per token (a step's tokens share its stamp), and the counters say so."""
    e = HFEngine(naive.spec, HFConfig(speculative=how, num_speculative_tokens=3, device="cpu"))
    try:
        recs = e.generate(requests, progress=False)
        spec = e.facts["last_run"]["speculative"]
    finally:
        e.close()
    check_records(requests, recs, together=True)
    assert [r.output_ids for r in recs] == [r.output_ids for r in naive_records]
    assert spec["method"] == how and spec["k"] == 3 and spec["tokens"] == N * NEW
    assert N <= spec["target_forwards"] <= N * NEW  # at least one step a request, at most one a token
    assert 1 <= spec["tokens_per_forward"] <= 3 + 1
    assert spec["tokens_per_forward"] == spec["tokens"] / spec["target_forwards"]
    stamps = [len(set(r.token_times)) for r in recs]  # distinct stamps = the request's target forwards
    assert sum(stamps) <= spec["target_forwards"] and all(s <= NEW for s in stamps)
    if how == "draft":
        assert e.facts["draft"]["model"] == "embedded-draft" and 0 < e.facts["draft"]["parameters"]


def test_the_draft_accepts_more_than_chance(naive, requests):
    """The embedded draft was distilled from the target: over 8 x 8 tokens it must average well above one token
    per verify step (a draft the target never agreed with gives exactly 1)."""
    e = HFEngine(naive.spec, HFConfig(speculative="draft", num_speculative_tokens=4, device="cpu"))
    try:
        e.generate(requests, progress=False)
        assert e.facts["last_run"]["speculative"]["tokens_per_forward"] > 1.3
    finally:
        e.close()


def test_eager_and_sdpa_attention_give_the_same_tokens(naive, requests, naive_records):
    e = HFEngine(naive.spec, HFConfig(attn_implementation="eager", device="cpu"))
    try:
        assert e.facts["attn_implementation"] == "eager" and naive.facts["attn_implementation"] == "sdpa"
        assert [r.output_ids for r in e.generate(requests, progress=False)] == [r.output_ids for r in naive_records]
    finally:
        e.close()


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "static", "batch_size": 4, "speculative": "ngram"},
     r"HFConfig\.speculative='ngram': allowed '' with mode='static' .*; Fix: mode='naive'"),
    ({"mode": "continuous", "batch_size": 4, "speculative": "draft"},
     r"HFConfig\.speculative='draft': allowed '' with mode='continuous' .*; Fix: mode='naive'"),
    ({"mode": "paged"}, r"HFConfig\.mode='paged': allowed 'naive', 'static', 'continuous'; Fix:"),
    ({"speculative": "eagle"}, r"HFConfig\.speculative='eagle': allowed '', 'draft', 'ngram'; Fix:"),
    ({"speculative": "draft", "num_speculative_tokens": 0}, r"HFConfig\.num_speculative_tokens=0: allowed .*1\.\.16; Fix:"),
    ({"attn_implementation": "flash"}, r"HFConfig\.attn_implementation='flash': allowed 'eager', 'sdpa', 'flex_attention'"),
    ({"mode": "continuous", "batch_size": 4, "compile": True},
     r"HFConfig\.mode='continuous': allowed mode 'naive' or 'static' with speculative='' when compile=True .*; Fix:"),
    ({"speculative": "ngram", "compile": True}, r"HFConfig\.speculative='ngram': allowed mode 'naive' or 'static'"),
    ({"compile": 1}, r"HFConfig\.compile=1: allowed True or False; Fix:"),
])
def test_bad_hf_knobs_are_refused_before_any_model_loads(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HFConfig(**kwargs)


def test_a_draft_with_another_vocabulary_is_refused(naive, monkeypatch):
    """vLLM and transformers both need the draft's vocabulary to be the target's; the engine says so, naming the
    field and the fix, instead of transformers' shape error mid-generate."""
    import lablib.engines.hf as hf

    real = hf.load_hf_model

    def other_vocab(spec, *a, **kw):
        m = real(spec, *a, **kw)
        if spec.name != naive.spec.name:
            m.config.vocab_size += 1
        return m

    monkeypatch.setattr(hf, "load_hf_model", other_vocab)
    with pytest.raises(ValueError, match=r"HFConfig\.draft_model='embedded-draft': allowed a draft with the target's "
                                         r"vocabulary .*; Fix:"):
        HFEngine(naive.spec, HFConfig(speculative="draft", device="cpu"))


def test_transformers_continuous_batching_keeps_the_greedy_tokens_and_never_runs_more_than_batch_size(
        naive, requests, naive_records):
    """mode='continuous': transformers' own manager (paged KV cache), made once on the first call and kept; every
    request its exact length, stamps that never go back, the greedy tokens of naive generate, and at no moment more
    than batch_size requests between their start and their end."""
    e = HFEngine(naive.spec, HFConfig("continuous", 2, device="cpu"))
    try:
        uneven = [dataclasses.replace(r, max_new_tokens=NEW - 2 * (i % 3)) for i, r in enumerate(requests)]
        e.size_for(uneven)  # as bench.offline.run does: the paged cache sized for the run's longest request
        e.generate(uneven[:1], progress=False)  # the warm-up makes the manager
        longest = max(len(r.prompt_ids) + r.max_new_tokens for r in uneven)
        assert e.facts["continuous_cache_len"] == -(-longest // hf.CONTINUOUS_BLOCK) * hf.CONTINUOUS_BLOCK < \
            e.facts["context"]
        manager = e._manager
        seen = []
        recs = e.generate(uneven, on_record=seen.append, progress=False)
        assert e._manager is manager and len(seen) == len(uneven)
        check_records(uneven, recs, together=True)
        assert [r.output_ids for r in recs] == [n.output_ids[:q.max_new_tokens] for n, q in zip(naive_records, uneven)]
        edges = sorted([(r.start, 1) for r in recs] + [(r.finished, -1) for r in recs])  # an end before a start
        running = [sum(d for _, d in edges[:i + 1]) for i in range(len(edges))]
        assert max(running) <= 2, running
    finally:
        e.close()
    assert e._manager is None


def test_continuous_batching_refuses_a_request_longer_than_its_cache_before_making_it(naive, requests, monkeypatch):
    import lablib.engines.hf as hf

    monkeypatch.setattr(hf, "CONTINUOUS_MAX_LEN", 16)
    e = HFEngine(naive.spec, HFConfig("continuous", 2, device="cpu"))
    try:
        with pytest.raises(ValueError, match=r"HFConfig\.mode='continuous': allowed requests of at most 16 tokens"):
            e.generate(requests[:2], progress=False)
        assert e._manager is None  # refused before the manager and its cache were made
    finally:
        e.close()


def test_the_compiled_static_cache_keeps_the_greedy_tokens_pads_to_its_batch_and_compiles_once_per_length(
        naive, requests, static_records):
    """compile=True: transformers' static cache and auto-compiled decode step (on the CPU when asked). Sized before
    the warm-up (`size_for`, as bench.offline.run calls it) the warm-up and the run share one cache length; a last
    batch short of batch_size is padded with copies (computed, dropped); a later, longer call grows the cache."""
    uneven, static_recs, _ = static_records
    e = HFEngine(naive.spec, HFConfig("static", B, device="cpu", compile=True))
    try:
        assert e.name == "hf-static-compile" and e.facts["compile"]["cache_lengths"] == 0
        run = uneven[:B + 1]  # two batches: the second holds one request and B - 1 copies
        e.size_for(run)
        longest = max(len(r.prompt_ids) for r in run) + NEW
        e.generate(run[:1], progress=False)  # the warm-up
        recs = e.generate(run, progress=False)
        check_records(run, recs)
        assert [r.output_ids for r in recs] == [r.output_ids for r in static_recs[:B + 1]]
        facts = e.facts["compile"]
        assert (facts["cache_lengths"], facts["max_cache_len"]) == (1, longest)
        assert facts["padded_rows"] == B - 1 and facts["first_call_s"] > 0  # this call's: B - 1 copies in its last batch
        i = max(range(len(run)), key=lambda j: len(run[j].prompt_ids))  # the longest prompt, twice the tokens
        more = [dataclasses.replace(run[i], max_new_tokens=2 * NEW)]
        assert e.generate(more, progress=False)[0].output_ids[:run[i].max_new_tokens] == recs[i].output_ids
        assert (e.facts["compile"]["cache_lengths"], e.facts["compile"]["max_cache_len"]) == \
            (2, len(run[i].prompt_ids) + 2 * NEW)
    finally:
        e.close()
