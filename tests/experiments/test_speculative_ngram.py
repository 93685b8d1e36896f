"""N-gram speculation replayed (lablib.experiments.speculative.ngram): vLLM's proposer step for step, the replay's
counters, the code-edit requests, and the journey replay against vLLM's recorded n-gram runs on the same text."""
from __future__ import annotations

import random

import numpy as np
import pytest

from lablib.experiments.speculative import ngram, vllm_runs

pytestmark = pytest.mark.usefixtures("one_thread")


def vllm_0_26_propose(origin_tokens: np.ndarray, min_ngram: int, max_ngram: int, max_model_len: int,
                      k: int) -> np.ndarray:
    """vLLM 0.26.0's `_find_longest_matched_ngram_and_propose_tokens` (vllm/v1/spec_decode/ngram_proposer.py),
    transcribed line for line (KMP over the reversed tokens), the reference `ngram.propose` must equal."""
    total_token = origin_tokens.shape[0]
    if total_token < min_ngram:
        return np.empty((0,), dtype=origin_tokens.dtype)
    k = min(k, max_model_len - total_token)
    if k <= 0:
        return np.empty((0,), dtype=origin_tokens.dtype)
    tokens = origin_tokens[::-1]
    lps = np.zeros(max_ngram, dtype=np.int32)
    longest_ngram = 0
    position = 0
    prev_lps = 0
    i = 1
    while i < total_token:
        if tokens[prev_lps] == tokens[i]:
            prev_lps += 1
            if prev_lps >= longest_ngram:
                longest_ngram = prev_lps
                position = i
            if i < max_ngram:
                lps[i] = prev_lps
            if prev_lps == max_ngram:
                prev_lps = lps[max_ngram - 1]
            i += 1
        elif prev_lps != 0:
            prev_lps = lps[prev_lps - 1]
        else:
            i += 1
    if longest_ngram < min_ngram:
        return np.empty((0,), dtype=origin_tokens.dtype)
    start_position = total_token - 1 - position + longest_ngram
    k = min(k, total_token - start_position)
    return origin_tokens[start_position: start_position + k]


def test_the_proposal_is_vllms_on_every_sequence_tried():
    rng = random.Random(0)
    tried = drafted = 0
    for _ in range(3000):
        vocab, n = rng.choice((2, 3, 5, 12)), rng.randint(1, 40)
        seq = [rng.randrange(vocab) for _ in range(n)]
        lo = rng.randint(1, 4)
        hi, k = rng.randint(lo, 6), rng.randint(1, 6)
        want = vllm_0_26_propose(np.array(seq, dtype=np.int32), lo, hi, 10_000, k).tolist()
        assert ngram.propose(seq, k, (lo, hi)) == want, (seq, lo, hi, k)
        tried, drafted = tried + 1, drafted + bool(want)
    assert drafted > tried / 4  # the test drew sequences that do draft, not only empty proposals


def test_the_replay_copies_what_repeats_and_counts_as_vllm_counts():
    prompt = [7, 1, 2, 3, 4, 5, 6, 8, 9]
    written = [1, 2, 3, 4, 5, 6, 8, 9, 1, 2, 3, 4, 5, 6, 8, 9, 0, 0, 0, 0]  # the prompt again, after its first token
    run = ngram.replay(prompt, written, 12, 3)
    assert run.tokens == written[:12]  # greedy: the target's text, whatever was drafted
    assert all(0 < len(s.drafted) <= 3 for s in run.steps)  # a step that drafted nothing is not a draft
    assert all(s.accepted == sum(s.accepted_mask) and s.emitted[:s.accepted] == s.drafted[:s.accepted][:len(s.emitted)]
               for s in run.steps)  # (the last step's tokens are cut at max_new_tokens; its count is not)
    assert sum(s.accepted for s in run.steps) > sum(len(s.drafted) for s in run.steps) / 2  # a repeat is copied
    assert sum(len(s.emitted) for s in run.steps) <= 11  # the prefill's token came before any proposal
    with pytest.raises(ValueError, match=r"replay\.written=.*allowed at least max_new_tokens \+ k = 15"):
        ngram.replay(prompt, written[:14], 12, 3)


def test_copy_edit_requests_rename_one_identifier_the_same_way_every_time():
    a, b = ngram.copy_edit_requests(8), ngram.copy_edit_requests(8)
    assert a == b and len({r["id"] for r in a}) == 8
    for r in a:
        old, new = r["renamed"], f"new_{r['renamed']}"
        assert f"`{old}` renamed to `{new}`" in r["prompt"] and new in r["answer"]
        assert r["answer"].replace(new, old) == r["prompt"].split("\n\n# The same code")[0] + "\n"
    with pytest.raises(ValueError, match=r"copy_edit_requests\.n=0"):
        ngram.copy_edit_requests(0)


def test_the_rename_changes_uses_of_the_name_only():
    code = "def f(url, x):\n    self.url = url  # the url\n    return {'url': url}, x.url"
    assert ngram._renamed(code, "url", "new_url") == (
        "def f(new_url, x):\n    self.url = new_url  # the url\n    return {'url': new_url}, x.url")
    assert ngram._renamed('s = """cut mid-string', "s", "t") is None  # a block that does not tokenize is skipped
    assert ngram._renamed("y = 1", "x", "new_x") is None  # nothing to rename


def test_code_edits_draft_more_and_make_more_tokens_per_step_than_the_journey():
    rows = ngram.ngram_acceptance(ks=(2, 4), n_prompts=16, max_new_tokens=32)
    assert [(r["text"], r["k"]) for r in rows] == [("journey", 2), ("journey", 4), ("copy-edit", 2), ("copy-edit", 4)]
    assert all(r["counters_consistent"] for r in rows) and ngram.copy_pays_more(rows)
    for r in rows:  # tokens per step: drafted steps at their mean length, the others one token each
        share, length = r["drafted_share"], r["measured_length"]
        assert r["tokens_per_step"] == pytest.approx(share * length + (1 - share), rel=0.1)  # less: the cut at the end
    assert "copy-edit" in ngram.ngram_lines(rows) and ngram.COPY_LABEL in ngram.ngram_lines(rows)
    assert all(r["alpha"] is None and r["predicted_length"] is None for r in rows)  # the i.i.d. formula: not n-gram's
    for bad, field in (({"texts": ("chat",)}, "texts"), ({"lookup": (3, 2)}, "lookup"), ({"ks": (0,)}, "ks")):
        with pytest.raises(ValueError, match=rf"ngram_acceptance\.{field}="):
            ngram.ngram_acceptance(**bad)


def test_the_journey_replay_counts_what_vllm_counted_on_the_h200():
    """vLLM's n-gram runs of the embedded pair (lab 08's recorded grid: 64 journey prompts x 64 tokens, k 2 and 4,
    batches 1-64) against the replay on the CPU's greedy text: within 3 standard errors, all eight."""
    grid = vllm_runs.gpu_study(force=False).value
    if grid is None:
        pytest.fail("lab 08's vLLM grid is not in data/reference: the cross-check has nothing to read")
    rows = ngram.ngram_acceptance(texts=("journey",), ks=(2, 4), n_prompts=64, max_new_tokens=64)
    checked = ngram.against_grid(rows, grid)
    assert len(checked) == 8 and all(c["within_3_stderrs"] for c in checked), [
        round(c["gap_in_stderrs"], 2) for c in checked]
    assert ngram.against_grid(rows, {**grid, "workload": {"requests": 32, "max_new_tokens": 64}}) == []
    other = {**grid, "rows": [{**r, "prompt_lookup": [3, 5]} for r in grid["rows"]]}
    assert ngram.against_grid(rows, other) == []  # another lookup window is another drafter
