"""Lab 08's 8B speed study with a set acceptance: vLLM's config for the synthetic sampler, refused where it cannot
be, and the runs on the fake vLLM (which has no speculative decoding: only the plumbing is tested here; the GPU
session records the speeds). The synthetic 8B and 1B checkpoints are stood in for by the embedded pair: making a
random 8B on this CPU would write 16 GB."""
import json
import threading
from types import SimpleNamespace
import time

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


# ---------------------------------------------------------------------------------------------------------------
# The EAGLE head at 8B scale (issue 31): stood in for by the embedded target and its shipped head
# ---------------------------------------------------------------------------------------------------------------

from lablib.experiments.speculative import eagle_8b  # noqa: E402
from lablib.models.drafters import synthetic_eagle_config  # noqa: E402
from lablib.models.eagle import eagle_path  # noqa: E402

RATES = {1: {"rates": [0.6], "length": 1.6}, 4: {"rates": [0.6, 0.4, 0.25, 0.15], "length": 2.4}}


def test_the_eagle_config_sets_vllms_synthetic_rates_and_refuses_rates_vllm_would():
    c = synthetic_eagle_config(4, RATES[4]["rates"], eagle_path(), TARGET.path)
    assert c["method"] == "eagle" and c["num_speculative_tokens"] == 4 and c["model"] == str(eagle_path())
    assert c["rejection_sample_method"] == "synthetic" and c["synthetic_acceptance_rates"] == [0.6, 0.4, 0.25, 0.15]
    assert "synthetic_acceptance_length" not in c  # vLLM 0.26 takes exactly one of the two
    for bad in ([0.6, 0.4, 0.25], [0.6, 0.7, 0.2, 0.1], [1.2, 0.4, 0.2, 0.1]):  # short, rising, out of [0, 1]
        with pytest.raises(ValueError, match=r"eagle_config\.rates=.*: allowed 4 rates .* non-increasing; Fix:"):
            synthetic_eagle_config(4, bad, eagle_path(), TARGET.path)


def test_each_part_starts_with_the_pinned_bf16_baseline_and_names_every_engine_apart():
    c, d = (eagle_8b.part_settings(p, RATES, eagle_path(), TARGET.path) for p in ("c", "d"))
    assert [s.name for s in c] == ["baseline, pinned (V1, no async) [8b-eagle-c]",
                                   "baseline, vLLM defaults [8b-eagle-c]", "EAGLE head k=4, vLLM defaults [8b-eagle-c]"]
    assert [s.name for s in d] == ["baseline, pinned (V1, no async) [8b-eagle-d]",
                                   "baseline, pinned (V1, no async), FP8 weights [8b-eagle-d]",
                                   "EAGLE head k=4, FP8 weights [8b-eagle-d]"]
    a = c + d  # every part's steps apart, its pinned baseline too: packing keeps one Result per step
    assert len(set(s.step(1) for s in a)) == len(a) and a[-1].step(8) == "spec-8b-eagle-d-eagle-k4-fp8-b8"
    assert len(eagle_8b.part_settings("a", {**RATES, 2: {"rates": [0.6, 0.4]}, 3: {"rates": [0.6, 0.4, 0.2]}},
                                      eagle_path(), TARGET.path)) == 4  # the baseline and k = 1, 2, 3
    assert a[-1].config(8, 0.9).quantization == "fp8" and a[1].config(8, 0.9).quantization is None
    with pytest.raises(ValueError, match=r"part_settings\.rates=\[1, 4\]: allowed rates for k in \(4, 5, 6\)"):
        eagle_8b.part_settings("b", RATES, eagle_path(), TARGET.path)
    with pytest.raises(ValueError, match=r"part_settings\.part='e'"):
        eagle_8b.part_settings("e", RATES, eagle_path(), TARGET.path)


def test_the_head_rates_are_the_loops_unconditional_rates_per_position():
    got = eagle_8b.head_rates(ks=(1, 2), n_prompts=2, max_new_tokens=8)
    for k, r in got.items():
        assert len(r["rates"]) == k and all(a >= b for a, b in zip(r["rates"], r["rates"][1:]))
        assert r["length"] == pytest.approx(1 + sum(r["rates"]))  # E[accepted] is the sum of the chain's rates


def test_a_part_on_the_fake_vllm_labels_its_rows_and_reads_fp8_rows_over_the_fp8_baseline(pinned_on_the_fake,
                                                                                          tmp_path):
    store = ResultStore(tmp_path / "r.jsonl")
    got = eagle_8b.eagle_runs("d", batches=(1, 2), n_prompts=2, max_new_tokens=4, rates=RATES, target=TARGET,
                              head=eagle_path(), gpu_memory_utilization=0.3, store=store)
    rows = got["rows"]
    assert len(rows) == 6 and not got["failed"] and all(r["label"] == eagle_8b.LABEL for r in rows)
    head = next(r for r in rows if r["name"] == "EAGLE head k=4, FP8 weights [8b-eagle-d]" and r["batch"] == 1)
    assert head["set_rates"] == RATES[4]["rates"] and head["set_length"] == 2.4 and head["token_match"] is None
    spec = head["result"].config["speculative_config"]
    assert spec["synthetic_acceptance_rates"] == RATES[4]["rates"]
    fp8 = [r for r in rows if r["quantization"] == "fp8"]
    for r in fp8:
        base = next(b for b in fp8 if b["method"] == "baseline" and b["batch"] == r["batch"])
        assert r["speedup"] == pytest.approx(r["output_tok_s"] / base["output_tok_s"]) and "speedup_over_pinned_bf16" in r
    assert len(store.load()) == 6 and len(pinned_on_the_fake) == 3  # three engines, each serving both batches


def test_measured_rates_are_taken_while_the_checkpoints_are_made_and_checked_before_any_engine(monkeypatch):
    """With no rates given, the loop measures them beside the checkpoints' making (a minute each on the GPU host),
    and what it measured is checked before an engine starts."""
    measuring = threading.Event()

    def rates(ks, workers=1):
        measuring.set()
        time.sleep(0.3)
        return {k: RATES[4] for k in ks}  # 4 rates for k = 1..3: refused once they arrive

    def target():
        assert measuring.wait(10), "the checkpoint was made before the rates were being measured"
        return TARGET

    monkeypatch.setattr(eagle_8b, "head_rates", rates)
    monkeypatch.setattr(eagle_8b, "synthetic_spec", lambda name: target())
    monkeypatch.setattr(eagle_8b, "synthetic_eagle", lambda name: eagle_path())
    monkeypatch.setattr(eagle_8b, "vllm_spec_runs", lambda **k: pytest.fail("an engine started on unchecked rates"))
    with pytest.raises(ValueError, match=r"rates="):
        eagle_8b.eagle_runs("a", batches=(1,), n_prompts=2, max_new_tokens=4)


def test_the_recording_step_keys_its_facts_by_part(pinned_on_the_fake, tmp_path, monkeypatch):
    store, facts = ResultStore(tmp_path / "r.jsonl"), {}
    monkeypatch.setattr(eagle_8b, "PARTS", {**eagle_8b.PARTS, "a": {"ks": (1,)}})
    spec_record.record_eagle_8b(tmp_path, store, facts, part="a", batches=(1,), n_prompts=2, max_new_tokens=4,
                                rates=RATES, target=TARGET, head=eagle_path(), gpu_memory_utilization=0.3)
    got = facts["speculative-eagle-8b-a"]
    assert [r["name"] for r in got["rows"]] == ["baseline, pinned (V1, no async) [8b-eagle-a]",
                                                "EAGLE head k=1 [8b-eagle-a]"]
    assert got["rates"] == {"1": RATES[1]} and len(got["date"]) == 10 and "result" not in got["rows"][0]
    assert all(r.provenance == "recorded" for r in store.load()) and len(store.load()) == 2
    assert json.loads((tmp_path / "speculative-eagle-8b-a.json").read_text())["part"] == "a"


def _grid_row(k, batch, speedup, length, c, *, method="eagle", pinned=True, quantization=None, tok_s=100.0):
    return {"method": method, "k": k, "batch": batch, "speedup": speedup, "mean_acceptance_length": length,
            "implied_c": c, "pinned": pinned, "quantization": quantization, "output_tok_s": tok_s,
            "set_length": length}


def test_the_grid_reads_best_k_the_batch_c_and_where_it_stops_paying():
    rows = [_grid_row(None, 1, 1.0, None, None, method="baseline"),
            _grid_row(2, 1, 1.6, 2.0, 0.125), _grid_row(4, 1, 1.8, 2.6, 0.111),
            _grid_row(2, 8, 1.2, 2.0, 0.33), _grid_row(4, 8, 1.1, 2.6, 0.34),
            _grid_row(2, 64, 0.9, 2.0, 0.61), _grid_row(4, 64, 0.8, 2.6, 0.56),
            _grid_row(4, 64, 1.5, 2.6, 0.2, pinned=False),  # vLLM's defaults: not in the pinned surface
            {**_grid_row(4, 1, 1.3, 2.6, 0.25, quantization="fp8"), "speedup_over_pinned_bf16": 1.7}]
    study = eagle_8b.joined({"a": {"rows": rows, "rates": {"2": {}, "4": {}}, "gpu": "H200", "date": "2026-12-05"}})
    assert study["missing"] == ["b", "c", "d"] and all(r["part"] == "a" for r in study["rows"])
    assert [(r["batch"], r["best_k"], r["pays"]) for r in eagle_8b.best_k(study)] == [(1, 4, True), (8, 2, True),
                                                                                      (64, 2, False)]
    assert eagle_8b.stops_paying(study) == 64
    surf = {(r["batch"], r["k"]): r for r in eagle_8b.surface(study)}
    assert surf[(8, 2)]["batch_c"] == pytest.approx((0.33 + 0.34) / 2)  # the median of the batch's two ks
    assert surf[(1, 4)]["formula_speedup"] == pytest.approx(2.6 / (4 * surf[(1, 4)]["batch_c"] + 1))
    assert len(surf) == 6  # pinned bf16 only
    from lablib.session import Shown

    text = eagle_8b.eagle_lines(Shown(study, False, "recorded on H200, 2026-12-05"))
    assert "batch 1: k=4 1.80x" in text and "From batch 64 no k pays" in text and "FP8 weights" in text
    assert "--steps speculative-eagle-8b-b,speculative-eagle-8b-c,speculative-eagle-8b-d" in text
    assert "(pinned, bf16; k 2, 4 recorded)" in text and "recorded on H200, 2026-12-05]" in text
    assert "ceiling" not in text and "draft model" not in text  # no Result to read a ceiling from, no draft study given


def test_a_larger_k_within_one_percent_of_the_best_is_a_tie_and_the_smaller_k_is_named():
    rows = [_grid_row(2, 1, 1.6, 2.0, 0.12), _grid_row(3, 1, 1.605, 2.2, 0.15), _grid_row(1, 1, 1.4, 1.6, 0.1),
            _grid_row(2, 8, 1.2, 2.0, 0.3), _grid_row(3, 8, 1.3, 2.2, 0.25)]
    best = eagle_8b.best_k(eagle_8b.joined({"a": {"rows": rows}}))
    assert [(r["batch"], r["best_k"], r["tied_ks"]) for r in best] == [(1, 2, [2, 3]), (8, 3, [3])]
    from lablib.session import Shown

    assert "batch 1: k=2 1.60x (k 2, 3 within 1%)" in eagle_8b.eagle_lines(Shown(eagle_8b.joined({"a": {"rows": rows}}),
                                                                                 False, "recorded"))


def test_batch_one_is_read_against_its_weights_ceiling_and_the_head_c_beside_the_draft_models():
    def roof(ceiling):
        return SimpleNamespace(roofline={"ceiling_tok_s": ceiling})

    rows = [{**_grid_row(None, 1, 1.0, None, None, method="baseline", tok_s=150.0), "result": roof(319.0)},
            {**_grid_row(2, 1, 1.55, 2.0, 0.14, tok_s=232.0), "result": roof(319.0)},
            {**_grid_row(2, 16, 1.3, 2.0, 0.25), "result": roof(2000.0)},
            {**_grid_row(None, 1, 1.0, None, None, method="baseline", quantization="fp8", tok_s=270.0),
             "result": roof(598.0)},
            {**_grid_row(4, 1, 1.6, 2.6, 0.2, quantization="fp8", tok_s=650.0), "result": roof(598.0),
             "speedup_over_pinned_bf16": 4.33}]
    second = {**rows[0], "output_tok_s": 155.0}  # part b's own pinned baseline: one bar per weights and runner
    study = eagle_8b.joined({"a": {"rows": rows, "rates": {}, "gpu": "H200", "date": "2026-12-05"},
                             "b": {"rows": [second], "rates": {}}})
    assert [r["output_tok_s"] for r in study["batch1"] if r["k"] is None] == [150.0, 270.0]  # part a's, then FP8
    got = {(r["weights"], r["k"]): r for r in eagle_8b.batch1_roofline(study)}
    assert set(got) == {("bf16", None), ("bf16", 2), ("fp8", None), ("fp8", 4)}  # batch 1 only
    assert got["bf16", 2]["ceiling_tok_s"] == 319.0 and got["bf16", 2]["share_of_ceiling"] == pytest.approx(232 / 319)
    assert got["fp8", 4]["ceiling_tok_s"] == 598.0 and got["fp8", 4]["share_of_ceiling"] > 1  # past its ceiling
    draft = {"rows": [{"method": "draft_model", "batch": 1, "implied_c": 0.33}, {"method": "draft_model", "batch": 4,
                                                                                  "implied_c": 0.44}]}
    assert eagle_8b.head_against_draft(study, draft) == [{"batch": 1, "head_c": 0.14, "draft_model_c": 0.33}]
    from lablib.session import Shown

    text = eagle_8b.eagle_lines(Shown(study, False, "recorded"), draft)
    assert "bf16 bandwidth ceiling is 319 tok/s: plain decoding reached 150 (47%), the head at k=2 232 (73%)" in text
    assert "A head step costs c = 0.14 of a target step at batch 1; the 1B draft model's, 0.33 (two recordings" in text
    assert "4.33x over bf16; 109% of the FP8 ceiling, 598)" in text


def test_without_a_recording_the_eagle_step_names_its_steps(monkeypatch):
    def none(key, step):
        raise NotRecordedErr(key, step)

    from lablib.results.reference import NotRecorded as NotRecordedErr

    monkeypatch.setattr(eagle_8b, "recorded_facts", none)
    shown = eagle_8b.eagle_study(force=False)
    assert shown.value is None and "speculative-eagle-8b-a, speculative-eagle-8b-b" in shown.label
    assert eagle_8b.eagle_lines(shown) == f"[{shown.label}]"


def test_fp8_and_default_rows_are_read_over_their_own_baseline_and_none_where_it_failed():
    rows = [{**_grid_row(None, 1, 1.0, None, None, method="baseline", tok_s=100.0)},
            {**_grid_row(None, 1, 0.9, None, None, method="baseline", pinned=False, tok_s=90.0)},
            {**_grid_row(4, 1, 1.8, 2.6, 0.2, pinned=False, tok_s=180.0)},
            {**_grid_row(4, 1, 2.5, 2.6, 0.1, quantization="fp8", tok_s=250.0)}]  # its FP8 baseline failed
    eagle_8b.over_own_baseline(rows)
    defaults, fp8 = rows[2], rows[3]
    assert defaults["speedup"] == pytest.approx(2.0) and defaults["speedup_over_pinned_bf16"] == 1.8
    assert defaults["implied_c"] == pytest.approx((2.6 / 2.0 - 1) / 4)
    assert fp8["speedup"] is None and fp8["implied_c"] is None and fp8["speedup_over_pinned_bf16"] == 2.5
    assert rows[0]["speedup"] == 1.0 and "speedup_over_pinned_bf16" not in rows[0]


def test_recorded_rates_with_string_keys_are_taken_and_bad_ones_refused_before_any_checkpoint(monkeypatch):
    def never(*a, **k):
        raise AssertionError("a checkpoint was made before the rates were checked")

    monkeypatch.setattr(eagle_8b, "synthetic_spec", never)
    assert eagle_8b.check_rates((4,), {"4": {"rates": [0.6, 0.4, 0.25, 0.15]}})[4]["rates"] == [0.6, 0.4, 0.25, 0.15]
    with pytest.raises(ValueError, match=r"eagle_config\.rates=\[0\.6, 0\.7\]"):
        eagle_8b.eagle_runs("a", rates={1: {"rates": [0.6]}, 2: {"rates": [0.6, 0.7]}, 3: {"rates": [0.5, 0.4, 0.3]}})
