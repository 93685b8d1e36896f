"""Lab 08's 8B speed study with a set acceptance: vLLM's config for the synthetic sampler, refused where it cannot
be, and the runs on the fake vLLM (which has no speculative decoding: only the plumbing is tested here; the GPU
session records the speeds). The synthetic 8B and 1B checkpoints are stood in for by the embedded pair: making a
random 8B on this CPU would write 16 GB."""
import json

import pytest

from lablib.experiments.speculative import record as spec_record, synthetic as syn
from lablib.models import resolve_model
from lablib.results.store import ResultStore

TARGET, DRAFT = resolve_model("embedded-target"), resolve_model("embedded-draft")


@pytest.fixture
def small_pair(monkeypatch):
    import lablib.models.synthetic as synthetic

    monkeypatch.setattr(synthetic, "synthetic_spec", lambda name: TARGET if name == syn.TARGET else DRAFT)


def test_the_config_sets_the_synthetic_sampler_at_the_asked_length():
    c = syn.synthetic_config(4, 2.9, TARGET.path, DRAFT.path)
    assert c["method"] == "draft_model" and c["num_speculative_tokens"] == 4 and c["model"] == str(DRAFT.path)
    assert c["rejection_sample_method"] == "synthetic" and c["synthetic_acceptance_length"] == 2.9


@pytest.mark.parametrize("k, length, field", [(4, 5.5, "length"), (4, 0.5, "length"), (0, 2.0, "k")])
def test_an_impossible_length_or_k_is_refused(k, length, field):
    with pytest.raises(ValueError, match=rf"synthetic_config\.{field}=.*: allowed .*; Fix:"):
        syn.synthetic_config(k, length, TARGET.path, DRAFT.path)


def test_the_runs_on_the_fake_vllm_carry_the_setting_and_the_label(small_pair, pinned_on_the_fake, tmp_path):
    store = ResultStore(tmp_path / "r.jsonl")
    rows = syn.synthetic_speed_runs(2.5, k=3, batches=(1, 2), n_prompts=3, max_new_tokens=4, store=store,
                                    gpu_memory_utilization=0.3)
    assert [(r["name"], r["batch"]) for r in rows] == [(n, b) for b in (1, 2) for n in (
        "baseline, pinned (V1, no async) [8b]", "draft model k=3 [8b]")]
    assert [r.step for r in store.load()] == ["spec-8b-baseline-b1", "spec-8b-baseline-b2",
                                              "spec-8b-draft_model-k3-b1", "spec-8b-draft_model-k3-b2"]
    assert all(r["label"] == syn.LABEL and r["set_length"] == 2.5 and r["token_match"] is None for r in rows)
    spec = rows[1]["result"].config["speculative_config"]
    assert spec["rejection_sample_method"] == "synthetic" and spec["synthetic_acceptance_length"] == 2.5
    assert len(pinned_on_the_fake) == 2  # one engine per setting for both batch sizes


def test_the_recording_takes_its_length_from_the_speculative_loop_and_writes_its_facts(small_pair, pinned_on_the_fake,
                                                                                       tmp_path):
    store = ResultStore(tmp_path / "r.jsonl")
    facts = {"speculative": {"loop": [{"k": 2, "drafter": "draft_model", "measured_length": 2.2}]}}
    spec_record.record_8b(tmp_path, store, facts, k=2, batches=(1,), n_prompts=2, max_new_tokens=4)
    got = facts[syn.KEY]
    assert got["set_length"] == 2.2 and got["k"] == 2 and got["label"] == syn.LABEL and len(got["date"]) == 10
    assert all(r.provenance == "recorded" for r in store.load()) and len(store.load()) == 2
    assert json.loads((tmp_path / "speculative-8b.json").read_text())["rows"][1]["set_length"] == 2.2


def test_without_a_recording_the_study_says_which_step_records_it(unrecorded):
    shown = syn.synthetic_study(force=False)  # the H200's recording (2026-12-01): every row pinned, counters consistent
    assert shown.value["label"] == syn.LABEL and [r["batch"] for r in shown.value["rows"]] == [1, 1, 4, 4, 16, 16, 64, 64]
    assert all(r["counters_consistent"] in (None, True) and r["pinned"] for r in shown.value["rows"])
    text = syn.synthetic_lines(shown)  # the recording: a 1B draft at L = 2.21 never paid; c from the runs > break-even
    assert "below 1 at every batch" in text and "c = (L - 1) / k = 0.30" in text and text.endswith(f"{shown.label}]")
    assert all(r["implied_c"] > (shown.value["set_length"] - 1) / 4 for r in shown.value["rows"] if r["implied_c"])
    unrecorded(syn.KEY)
    shown = syn.synthetic_study(force=False)
    assert syn.synthetic_lines(shown) == f"[{shown.label}]"
    assert shown.value is None and "--steps speculative-8b" in shown.label
    with pytest.raises(ValueError, match=r"synthetic_study\.k=0"):
        syn.synthetic_study(k=0)


def test_the_set_length_comes_from_this_sessions_loop_then_the_shipped_one(monkeypatch):
    import lablib.experiments.speculative.synthetic as mod

    here = {"speculative": {"loop": [{"k": 4, "drafter": "draft_model", "measured_length": 2.6}]}}
    assert mod.loop_length(4, here) == 2.6
    shipped = {"loop": [{"k": 4, "drafter": "eagle", "measured_length": 3.1},
                        {"k": 4, "drafter": "draft_model", "measured_length": 2.4}]}
    monkeypatch.setattr(mod, "recorded_facts", lambda key, step: shipped)
    assert mod.loop_length(4, {}) == 2.4  # the draft model's row, not the EAGLE head's
