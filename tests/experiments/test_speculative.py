"""The greedy speculative loop on the embedded pair, on the CPU: the target's own greedy tokens, token for
token; vLLM's counters, consistent; the formula's report; a perfect draft; refusals before any forward.

The pair is loaded once for the module; 3 journey prompts x 29 new tokens (29 is no multiple of k+1 for
k = 1, 3, 5, so the last step is usually cut). Everything here is deterministic (greedy, no timing asserts).

Lab 08's other steps below: the formula's tables (exact), the study's tables, the batch model, and the vLLM
part on the fake vLLM (tests/fake_vllm, which has no speculative decoding): configs, the pinned runner and
async settings, rows, refusals before any engine, the recording step.
"""
import copy
import json
import math
import os
import re
import time
from fractions import Fraction
from types import SimpleNamespace

import pytest

from lablib.config import VLLMConfig
from lablib.engines import vllm as vllm_engine
from lablib.engines.vllm import VLLMEngine
from lablib.experiments.speculative import acceptance, loops, maths, study as speculative_study, vllm_runs
from lablib.experiments.speculative import record as spec_record, vllm_runs as spec_vllm
from lablib.mechanisms.speculative import SpecCounters, expected_tokens_per_step, reversal_batch, simulate_acceptance
from lablib.mechanisms.speculative import speedup as formula_speedup
from lablib.models import drafters, embedded_path
from lablib.results import ResultStore

torch = pytest.importorskip("torch")
pytest.importorskip("transformers").utils.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (conftest.py)

NEW = 29  # new tokens per prompt; the pair and its 3 journey prompts are tests/experiments/conftest.py's
SHAPE = r"^{owner}\.{field}=.*: allowed .+; Fix: .+"


@pytest.fixture(scope="module")
def reference(pair, prompts) -> list[list[int]]:
    """The target's own greedy tokens, from transformers' generate (EOS ignored, as in the loop)."""
    target = pair[0]
    gen = copy.deepcopy(target.generation_config)
    gen.update(do_sample=False, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    out = []
    with torch.inference_mode():
        for p in prompts:
            x = torch.tensor([p])
            ids = target.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)
            out.append(ids[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module")
def runs(pair, prompts) -> dict[int, list[loops.SpeculativeRun]]:
    target, draft, _ = pair
    return {k: [loops.greedy_speculative(target, draft, p, NEW, k) for p in prompts] for k in (1, 3, 5)}


def test_the_naive_loop_is_hf_greedy(pair, prompts, reference):
    assert [loops.greedy(pair[0], p, NEW) for p in prompts] == reference


@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_tokens_are_the_targets_greedy_tokens(runs, reference, k):
    for run, want in zip(runs[k], reference):
        assert run.k == k and len(run.tokens) == NEW
        assert run.tokens == want
        assert [t for s in run.steps for t in s.emitted] == run.tokens


@pytest.mark.parametrize("k", [1, 3, 5])
def test_counters_are_consistent(runs, k):
    for run in runs[k]:
        for s in run.steps[:-1]:
            assert len(s.emitted) == s.accepted + 1 and s.emitted[:s.accepted] == s.drafted[:s.accepted]
        assert 1 <= len(run.steps[-1].emitted) <= run.steps[-1].accepted + 1  # the last step is cut at NEW
        for s in run.steps:
            assert len(s.drafted) == k and s.accepted_mask == tuple(i < s.accepted for i in range(k))
    c = acceptance.spec_counters(runs[k])
    assert c.num_drafts == sum(len(r.steps) for r in runs[k])
    assert c.num_draft_tokens == k * c.num_drafts  # every step drafts k, the cut last one included
    assert c.num_accepted_tokens <= c.num_draft_tokens
    assert c.num_accepted_tokens == sum(c.accepted_per_pos)
    assert all(a >= b for a, b in zip(c.accepted_per_pos, c.accepted_per_pos[1:]))  # position i needs i-1
    assert c.accepted_per_pos[0] <= c.num_drafts


def test_the_report_sets_measured_beside_the_formula(runs):
    rep = acceptance.acceptance_report(runs[5])
    assert isinstance(rep.counters, SpecCounters) and rep.k == 5
    assert 0 < rep.alpha < 1
    assert rep.predicted_per_position == pytest.approx([rep.alpha**i for i in range(1, 6)], rel=1e-12)
    assert rep.predicted_length == pytest.approx(sum(rep.alpha**i for i in range(6)), rel=1e-12)
    c, n = rep.counters, rep.counters.num_drafts
    assert rep.measured_length == pytest.approx(1 + c.num_accepted_tokens / n)
    assert rep.measured_per_position == pytest.approx([a / n for a in c.accepted_per_pos])
    assert rep.gap_per_position == pytest.approx([m - p for m, p in zip(rep.measured_per_position,
                                                                         rep.predicted_per_position)])
    assert rep.length_gap == pytest.approx(rep.measured_length - rep.predicted_length)
    assert rep.stderr_per_position == pytest.approx([math.sqrt(p * (1 - p) / n) for p in rep.measured_per_position])
    assert rep.conditional_per_position[0] == pytest.approx(rep.measured_per_position[0])
    row = rep.row()
    assert {"k", "alpha", "measured_length", "length_stderr", "predicted_length", "gap_per_position",
            "num_drafts"} <= set(row)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_the_mean_acceptance_length_matches_the_formula_within_three_standard_errors(runs, k):
    # Deterministic (greedy, fixed prompts); the bound is the sampling error over these ~40-60 steps, 3 sigma.
    # Per-position rates are not asserted: acceptance clusters, the i.i.d. formula misfits the deep positions.
    rep = acceptance.acceptance_report(runs[k])
    assert rep.length_stderr > 0
    assert abs(rep.length_gap) <= 3 * rep.length_stderr, rep.row()


def test_a_draft_equal_to_the_target_accepts_everything(pair, prompts):
    target = pair[0]
    k = 3
    for p in prompts[:2]:
        run = loops.greedy_speculative(target, target, p, NEW, k)
        assert all(s.accepted == k for s in run.steps)
        assert all(len(s.emitted) == k + 1 for s in run.steps[:-1])
        assert len(run.steps[-1].emitted) == NEW - (k + 1) * (len(run.steps) - 1)  # the cut end
    rep = acceptance.acceptance_report([run])
    assert rep.measured_length == k + 1 and rep.alpha == 1.0 and rep.predicted_per_position == (1.0,) * k


def test_hf_assisted_generation_with_constant_k_gives_the_same_tokens(pair, prompts, reference):
    target, draft, _ = pair
    saved = draft.generation_config.to_dict()
    assert loops.hf_assisted(target, draft, prompts[0], NEW, 3) == reference[0]
    assert draft.generation_config.to_dict() == saved  # the draft's config is restored


def test_forward_costs_and_a_tiny_study_have_their_fields(pair):
    costs = speculative_study.forward_costs(pair[0], pair[1], [1, 5, 6, 7], ks=(1, 2), repeats=3)
    assert costs["c"] > 0 and set(costs["verify_cost"]) == {1, 2} and "CPU" in costs["provenance"]
    study = speculative_study.cpu_study(n_prompts=1, max_new_tokens=8, ks=(2,), rounds=1, pair=pair)
    row = study["rows"][0]
    assert row["identical_to_greedy"] and row["k"] == 2
    for key in ("tok_s", "baseline_tok_s", "measured_speedup", "predicted_speedup", "c_in_loop",
                "verify_cost_in_loop", "predicted_speedup_in_loop"):
        assert row[key] > 0, key
    assert "measured on this machine's CPU" in study["provenance"]


@pytest.mark.parametrize("kwargs, field", [
    ({"k": 0}, "k"), ({"k": -2}, "k"), ({"k": 1.5}, "k"), ({"k": True}, "k"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": 10**6}, "max_new_tokens"),
    ({"input_ids": []}, "input_ids"), ({"input_ids": [1, 4096]}, "input_ids"),
])
def test_bad_arguments_are_refused(pair, kwargs, field):
    target, draft, _ = pair
    args = {"input_ids": [1, 5, 6], "max_new_tokens": 4, "k": 2, **kwargs}
    with pytest.raises(ValueError, match=SHAPE.format(owner="greedy_speculative", field=field)):
        loops.greedy_speculative(target, draft, **args)


def test_a_draft_with_another_vocabulary_is_refused_before_any_forward(pair):
    other = SimpleNamespace(config=SimpleNamespace(vocab_size=32000))  # would fail on any forward call
    with pytest.raises(ValueError, match=SHAPE.format(owner="greedy_speculative", field=r"draft\.vocab_size")) as e:
        loops.greedy_speculative(pair[0], other, [1, 5, 6], 4, 2)
    assert "4096" in str(e.value)
    with pytest.raises(ValueError, match="draft.vocab_size"):
        loops.hf_assisted(pair[0], other, [1, 5, 6], 4, 2)


def test_counters_of_mixed_k_are_refused(runs):
    with pytest.raises(ValueError, match=re.escape("spec_counters.runs=")):
        acceptance.spec_counters(runs[1] + runs[3])


# ---------------------------------------------------------------- lab 08's other steps: maths, tables, batch model
# Exact where the maths is (the formula's tables, the roofline's c), deterministic elsewhere (greedy loops);
# the vLLM part runs on the fake vLLM, which has no speculative decoding: its plumbing only (configs, the
# pinned runner and async settings, rows, refusals before any engine, the recording step).


@pytest.fixture(scope="module")
def tiny_study(pair):
    return speculative_study.cpu_study(n_prompts=2, max_new_tokens=12, ks=(2, 4), rounds=1, pair=pair)


def test_the_maths_tables_hold_the_formulas_exact_values():
    m = maths.maths_tables(alphas=(0.5,), ks=(4,), costs=(0.0, 0.25, 1.0))
    [row] = m["tokens"]
    assert row["tokens_per_step"] == 31 / 16 and row["speedup_c=0"] == 31 / 16  # n-gram: E / 1
    assert row["speedup_c=0.25"] == 31 / 16 / 2 and row["speedup_c=1"] == 31 / 16 / 5
    assert row["vllm_acceptance_rate"] == 15 / 64
    even = {r["c"]: r["break_even_alpha"] for r in m["break_even"]}
    assert even[0.0] == 0.0 and even[1.0] == 1.0  # 4 x 1 + 1 = 5 = k + 1: only a perfect draft breaks even
    assert formula_speedup(even[0.25], 4, 0.25) == pytest.approx(1, abs=1e-12)  # E = 2 at the break-even alpha
    best = {r["c"]: r["best_k"] for r in m["optimal_k"]}
    assert best[0.0] == 16 and best[1.0] == 1  # free drafts: as many as allowed; dear ones: as few as possible


def test_counters_consistency_names_what_breaks():
    good = SpecCounters(10, 40, 17, (8, 5, 3, 1))
    assert acceptance.counters_consistent(good, 4) == (True, "consistent")
    ok, why = acceptance.counters_consistent(good, 3)
    assert not ok and "k x num_drafts = 30" in why and "4 per-position counts for k=3" in why
    ngram = SpecCounters(10, 33, 17)  # n-gram drafts may be shorter than k
    assert acceptance.counters_consistent(ngram, 4, every_draft_k=False)[0]
    assert not acceptance.counters_consistent(ngram, 4)[0]
    rising = SpecCounters(10, 40, 17, (5, 8, 3, 1))
    assert "increase" in acceptance.counters_consistent(rising, 4)[1]


def test_the_study_tables_and_lines_read_the_loop(tiny_study):
    acc, cost = speculative_study.acceptance_table(tiny_study), speculative_study.cost_table(tiny_study)
    assert [r["k"] for r in acc] == [r["k"] for r in cost] == [2, 4]
    for a, r in zip(acc, tiny_study["rows"]):
        assert a["counters_consistent"] and a["identical_to_greedy"]
        assert a["acceptance_rate"] == r["num_accepted_tokens"] / r["num_draft_tokens"]
        assert a["gap_in_stderrs"] == pytest.approx((r["measured_length"] - r["predicted_length"]) / r["length_stderr"])
    assert speculative_study.study_row(tiny_study, 4)["k"] == 4
    with pytest.raises(ValueError, match=SHAPE.format(owner="study_row", field="k")):
        speculative_study.study_row(tiny_study, 3)
    lines = speculative_study.loop_lines(tiny_study).splitlines()
    assert len(lines) == 3 and "tokens identical to greedy: True" in lines[1] and "standard errors" in lines[2]
    assert "noisy" in speculative_study.cost_lines(tiny_study) and "measured on this machine's CPU" in speculative_study.cost_lines(tiny_study)


def test_assisted_generation_matches_greedy_on_journey_prompts(pair):
    got = loops.assisted_matches(pair, n_prompts=1, max_new_tokens=10, k=3)
    assert got == {"prompts": 1, "max_new_tokens": 10, "k": 3, "identical": 1, "all_identical": True}


def test_the_batch_model_reads_the_spec_sheet_and_reverses():
    t, d = maths.roofline_of("llama-3.1-8b"), maths.roofline_of("llama-3.2-1b")
    assert t.bandwidth == 4.8e12 and t.peak_flops == 989.5e12 and t.weight_bytes == 2 * 8030261248
    m = maths.batch_model(0.8, 4, batches=(1, 64, 256))
    e = expected_tokens_per_step(0.8, 4)
    c = 1235814400 / 8030261248  # the draft's parameters over the target's: both bf16, memory-bound at batch 1
    first = m["curves"]["draft model"][0]
    assert first.draft_cost == pytest.approx(c, rel=1e-12) and first.speedup == pytest.approx(e / (4 * c + 1))
    assert m["curves"]["n-gram"][0].speedup == pytest.approx(e)
    for name, draft in (("draft model", d), ("n-gram", None)):
        b = m["reversal"][name]
        assert b == reversal_batch(0.8, 4, t, draft)
        below, at = maths.speedup_vs_batch(0.8, 4, [b - 1, b], t, draft)
        assert below.speedup >= 1 > at.speedup
    assert m["reversal"]["draft model"] < m["reversal"]["n-gram"]  # the draft's own forwards make it reverse sooner
    assert "simulated" in m["where"] and "H200" in m["where"]
    with pytest.raises(ValueError, match=SHAPE.format(owner="roofline_of", field="arch")):
        maths.roofline_of("llama-9")


# ---------------------------------------------------------------- vLLM: configs, the pinned settings, refusals


def test_the_pinned_config_passes_async_scheduling_and_keeps_the_runner_out_of_llm_kwargs():
    pinned = VLLMConfig(max_num_seqs=4, async_scheduling=False, model_runner_v2=False)
    kw = pinned.llm_kwargs()
    assert kw["async_scheduling"] is False and "model_runner_v2" not in kw and kw["max_num_seqs"] == 4
    assert pinned.to_dict()["model_runner_v2"] is False  # recorded in every Result's config
    assert "async_scheduling" not in VLLMConfig().llm_kwargs()  # None: vLLM decides
    assert isinstance(pinned, VLLMConfig)
    with pytest.raises(ValueError, match=SHAPE.format(owner="VLLMConfig", field="async_scheduling")):
        VLLMConfig(async_scheduling="off")


def test_the_runner_variable_is_set_while_spawning_and_restored(monkeypatch):
    monkeypatch.setenv(vllm_engine.RUNNER_ENV, "1")
    with vllm_engine.runner_env(False):
        assert os.environ[vllm_engine.RUNNER_ENV] == "0"
    with vllm_engine.runner_env(None):
        assert vllm_engine.RUNNER_ENV not in os.environ  # vLLM's own choice
    assert os.environ[vllm_engine.RUNNER_ENV] == "1"
    monkeypatch.delenv(vllm_engine.RUNNER_ENV)
    with vllm_engine.runner_env(True):
        assert os.environ[vllm_engine.RUNNER_ENV] == "1"
    assert vllm_engine.RUNNER_ENV not in os.environ


def test_speculative_configs_for_both_methods():
    assert drafters.speculative_config("draft_model", 4) == {
        "method": "draft_model", "num_speculative_tokens": 4, "model": str(embedded_path("draft"))}
    assert drafters.speculative_config("ngram", 3, prompt_lookup_min=2, prompt_lookup_max=5) == {
        "method": "ngram", "num_speculative_tokens": 3, "model": None, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    got = drafters.speculative_config("ngram", 2, prompt_lookup_max=3)
    assert (got["prompt_lookup_min"], got["prompt_lookup_max"]) == (3, 3)  # vLLM's rule: one sets the other
    got = drafters.speculative_config("ngram", 2)
    assert (got["prompt_lookup_min"], got["prompt_lookup_max"]) == (5, 5)  # vLLM's defaults
    assert drafters.speculative_config("draft_model", 2, sampling={"temperature": 0})["method"] == "draft_model"
    assert drafters.speculative_config("eagle", 4) == {  # the head trained for the embedded target (data/models/eagle)
        "method": "eagle", "model": str(embedded_path("eagle")), "num_speculative_tokens": 4}


def test_an_eagle_head_is_checked_before_vllm(tmp_path):
    with pytest.raises(ValueError, match=SHAPE.format(owner="EagleHead", field="path")):
        drafters.speculative_config("eagle", 4, draft=tmp_path)  # no config.json
    (tmp_path / "config.json").write_text((embedded_path("eagle") / "config.json").read_text().replace(
        '"hidden_size": 256', '"hidden_size": 128'))
    with pytest.raises(ValueError, match=SHAPE.format(owner="EagleHead", field="hidden_size")) as e:
        drafters.speculative_config("eagle", 4, draft=tmp_path)
    assert "256" in str(e.value) and "train_eagle.py" in str(e.value)
    with pytest.raises(ValueError, match=SHAPE.format(owner="EagleHead", field="architectures")):
        drafters.speculative_config("eagle", 4, draft=embedded_path("draft"))  # a draft model is no EAGLE head
    with pytest.raises(ValueError, match=SHAPE.format(owner="speculative_config", field="prompt_lookup_min")):
        drafters.speculative_config("eagle", 4, prompt_lookup_min=2)


@pytest.mark.parametrize("args, kwargs, field, words", [
    (("draft_model", 0), {}, "k", "integers >= 1"), (("ngram", -1), {}, "k", "integers >= 1"),
    (("draft_model", 1.5), {}, "k", "integers"), (("draft_model", True), {}, "k", "integers"),
    (("lookahead", 4), {}, "method", "a method vLLM 0.26 has"),
    (("eagle3", 4), {}, "method", "out of this lab's scope"),
    (("medusa", 4), {}, "method", "draft_model or ngram or eagle"),
    (("ngram", 4), {"prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min", "<= prompt_lookup_max=2"),
    (("ngram", 4), {"prompt_lookup_min": 0}, "prompt_lookup_min", "integers >= 1"),
    (("draft_model", 4), {"prompt_lookup_max": 3}, "prompt_lookup_max", "None with draft_model"),
    (("ngram", 4), {"draft": "data/models/draft"}, "draft", "None with ngram"),
    (("draft_model", 4), {"sampling": {"min_p": 0.1}}, "sampling", "no min_p or logit_bias"),
    (("ngram", 4), {"sampling": {"logit_bias": {5: 1.0}}}, "sampling", "no min_p or logit_bias"),
    (("ngram", 4), {"sampling": {"temperature": 0.8}}, "sampling", "greedy decoding"),
])
def test_bad_speculative_knobs_are_refused(args, kwargs, field, words):
    with pytest.raises(ValueError, match=SHAPE.format(owner="speculative_config", field=field)) as e:
        drafters.speculative_config(*args, **kwargs)
    assert words in str(e.value)


def test_a_draft_with_another_vocabulary_is_refused_before_vllm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    with pytest.raises(ValueError, match=SHAPE.format(owner="speculative_config", field="draft")) as e:
        drafters.speculative_config("draft_model", 4, draft=tmp_path)
    assert "4096" in str(e.value) and "32000" in str(e.value)


def test_the_settings_of_one_batch():
    runs = vllm_runs.settings(("draft_model", "ngram"), (2, 4), (2, 5))
    assert [s.name for s in runs] == ["baseline, pinned (V1, no async)", "baseline, vLLM defaults", "draft model k=2",
                                      "draft model k=4", "n-gram k=2 (lookup 2-5)", "n-gram k=4 (lookup 2-5)"]
    assert [s.step(16) for s in runs[:3]] == ["spec-baseline-b16", "spec-baseline-defaults-b16",
                                              "spec-draft_model-k2-b16"]
    assert runs[-1].step(1) == "spec-ngram-k4-l2-5-b1"
    pinned, default = runs[2].config(8, 0.3), runs[1].config(8, 0.3)
    assert (pinned.async_scheduling, pinned.model_runner_v2, pinned.max_num_seqs) == (False, False, 8)
    assert pinned.speculative_config["num_speculative_tokens"] == 2
    assert (default.async_scheduling, default.model_runner_v2, default.speculative_config) == (None, None, None)
    assert [s.name for s in vllm_runs.settings(("ngram",), (4,), (3, 3), defaults_baseline=False)] == [
        "baseline, pinned (V1, no async)", "n-gram k=4 (lookup 3-3)"]
    eagle = vllm_runs.settings(("eagle",), (4,), defaults_baseline=False)[1]
    assert (eagle.name, eagle.step(1), eagle.spec["method"]) == ("EAGLE head k=4", "spec-eagle-k4-b1", "eagle")
    assert eagle.config(1, 0.3).model_runner_v2 is False  # pinned like every run, so the comparison is one engine


def test_counters_from_a_runs_metrics_delta():
    delta = {"vllm:spec_decode_num_drafts": 751.0, "vllm:spec_decode_num_draft_tokens": 3004.0,
             "vllm:spec_decode_num_accepted_tokens": 1399.0, "vllm:prompt_tokens": 100.0}
    c = vllm_runs.counters_from_delta(delta)
    assert c == SpecCounters(751, 3004, 1399) and round(c.mean_acceptance_length, 2) == 2.86  # the H200 run (facts)
    assert vllm_runs.counters_from_delta({**delta, "vllm:spec_decode_num_drafts": 0.0}) is None  # drafted nothing
    assert vllm_runs.counters_from_delta({"vllm:prompt_tokens": 100.0}) is None  # a baseline: no such counters
    per_pos = {**delta, "vllm:spec_decode_num_accepted_tokens_per_pos": [600, 400, 250, 149]}
    assert vllm_runs.counters_from_delta(per_pos).accepted_per_pos == (600, 400, 250, 149)


def _vllm_row(k: int, counters: SpecCounters, batch: int = 1) -> dict:
    return {"method": "draft_model", "name": f"draft model k={k}", "k": k, "batch": batch,
            "mean_acceptance_length": counters.mean_acceptance_length, "acceptance_rate": counters.acceptance_rate,
            "num_drafts": counters.num_drafts, "provenance": "live on NVIDIA H200"}


def test_the_cross_check_accepts_the_formulas_own_counters_and_flags_others():
    alpha, k, steps = Fraction(7, 10), 4, 4000
    loop = [{"k": k, "alpha": 0.7, "predicted_length": float(expected_tokens_per_step(alpha, k)),
             "measured_length": 2.77, "length_stderr": 0.02, "num_drafts": 400}]
    same = simulate_acceptance(0.7, k, steps, seed=1)  # what the i.i.d. model counts at the loop's alpha
    other = simulate_acceptance(0.5, k, steps, seed=1)
    [ok], [bad] = vllm_runs.cross_check([_vllm_row(k, same)], loop), vllm_runs.cross_check([_vllm_row(k, other)], loop)
    assert ok["within_3_stderrs"] and not bad["within_3_stderrs"]
    se = math.sqrt(0.02**2 + (0.02 * math.sqrt(400)) ** 2 / steps)
    assert ok["stderr"] == pytest.approx(se) and ok["formula_length"] == pytest.approx(2.7731)
    baseline = {"method": "baseline", "k": None, "mean_acceptance_length": None}
    assert vllm_runs.cross_check([baseline, {**_vllm_row(2, same), "k": 2}], loop) == []  # no loop row for k=2
    eagle_row = {**_vllm_row(k, same), "method": "eagle", "name": "EAGLE head k=4"}
    assert vllm_runs.cross_check([eagle_row], loop) == []  # the loop rows are the draft model's: no EAGLE reference
    [got] = vllm_runs.cross_check([eagle_row], [{**loop[0], "drafter": "eagle"}])
    assert got["drafter"] == "eagle" and got["within_3_stderrs"]


def test_bad_knobs_are_refused_before_any_engine(monkeypatch):
    def no_engine(*a, **k):
        raise AssertionError("an engine was made before the knobs were checked")

    monkeypatch.setattr(VLLMEngine, "__init__", no_engine)
    for kwargs, field in (({"ks": (0,)}, "ks"), ({"batches": (0,)}, "batches"), ({"methods": ("eagle3",)}, "method"),
                          ({"prompt_lookup": (6, 2)}, "prompt_lookup_min"), ({"n_prompts": 65}, "n_prompts")):
        with pytest.raises(ValueError, match=rf"\.{field}="):
            vllm_runs.vllm_spec_runs(**kwargs)
    with pytest.raises(ValueError, match=r"settings\.ks="):
        vllm_runs.gpu_study(ks=(0,), force=False)  # refused on a CPU too, before the mode decides


def test_the_runs_on_the_fake_vllm_carry_every_setting(pinned_on_the_fake, tmp_path):
    store = ResultStore(tmp_path / "r.jsonl")
    rows = vllm_runs.vllm_spec_runs(("draft_model", "ngram"), (2,), (1, 2), n_prompts=3, max_new_tokens=4, store=store)
    assert [(r["name"], r["batch"]) for r in rows] == [(n, b) for b in (1, 2) for n in (
        "baseline, pinned (V1, no async)", "baseline, vLLM defaults", "draft model k=2", "n-gram k=2 (lookup 2-5)")]
    # one engine per setting serves both batch sizes (waves of b requests): 4 starts, not 8
    assert [s["env"] for s in pinned_on_the_fake] == ["0", None, "0", "0"]  # the runner, as each worker spawned
    assert [s["async_scheduling"] for s in pinned_on_the_fake] == [False, None, False, False]
    assert vllm_engine.RUNNER_ENV not in os.environ  # restored
    results = [r["result"] for r in rows]
    assert [r.step for r in store.load()] == [vllm_runs.settings(("draft_model", "ngram"), (2,))[i].step(b)
                                             for i in range(4) for b in (1, 2)]  # in the order they ran
    assert sorted(r.step for r in store.load()) == sorted(r.step for r in results)
    for row, res in zip(rows, results):
        assert res.config["max_num_seqs"] == 2 and res.config["max_concurrency"] == row["batch"] and res.lab == vllm_runs.LAB
        q, b = res.requests, row["batch"]  # waves of b requests: each starts after the waves before it finished
        assert all(q[i].start >= max(x.finished for x in q[:i - i % b]) for i in range(b, len(q)))
        assert all(x.arrival == 0 for x in q)
        assert res.config["async_scheduling"] is (False if row["pinned"] else None)
        assert res.summary["output_tokens"] == 3 * 4 and row["back_to_baseline"] is True
        assert row["token_match"] == 1.0 and row["first_divergence"] is None  # the fake decodes alike every time
        assert row["model_runner"] == ("V1" if row["pinned"] else "unknown")  # the fake logs no runner line
        assert row["num_drafts"] is None and row["alpha"] is None  # the fake has no speculative decoding
    sc = {r["name"]: r["result"].config["speculative_config"] for r in rows[:4]}
    assert sc["draft model k=2"]["method"] == "draft_model" and sc["n-gram k=2 (lookup 2-5)"]["prompt_lookup_max"] == 5
    assert sc["baseline, pinned (V1, no async)"] is None
    assert rows[0]["speedup"] == 1.0 and rows[4]["speedup"] == 1.0  # each batch's pinned baseline is its own reference
    assert "no drafts" in rows[2]["counters_note"]
    assert all(r["startup_wall_s"] >= r["startup_s"] > 0 and r["close_s"] >= 0 for r in rows)  # where the minutes go
    line = vllm_runs.engine_time_line(rows)
    assert line.startswith("4 engines, a median of ") and "s closing" in line
    assert vllm_runs.engine_time_line([{k: v for k, v in r.items() if k != "startup_s"} for r in rows]) == ""


def test_started_together_the_runs_keep_each_settings_runner_and_say_how_they_started(pinned_on_the_fake, monkeypatch,
                                                                                     tmp_path):
    """On a host of 16 cores (the H200's) the four engines start at once: each worker still launched with its own
    runner environment, each measured alone, its KV cache given in bytes, VRAM checked back per engine."""
    from lablib.engines import together

    monkeypatch.setattr(together.os, "cpu_count", lambda: 16)
    monkeypatch.delenv(together.ENV, raising=False)
    store = ResultStore(tmp_path / "r.jsonl")
    rows = vllm_runs.vllm_spec_runs(("draft_model", "ngram"), (2,), (1, 2), n_prompts=3, max_new_tokens=4, store=store)
    assert [s["env"] for s in pinned_on_the_fake] == ["0", None, "0", "0"] and vllm_engine.RUNNER_ENV not in os.environ
    assert [(r["name"], r["batch"]) for r in rows] == [(n, b) for b in (1, 2) for n in (
        "baseline, pinned (V1, no async)", "baseline, vLLM defaults", "draft model k=2", "n-gram k=2 (lookup 2-5)")]
    assert all(r["started_together"] == 4 and r["group_start_s"] > 0 and r["back_to_baseline"] is True for r in rows)
    for row in rows:
        cfg = row["result"].config
        assert cfg["kv_cache_memory_bytes"] > 0 and cfg["max_num_seqs"] == 2 and row["result"].summary[
            "output_tokens"] == 12
    assert "They started up to 4 at once, side by side" in vllm_runs.engine_time_line(rows)


def test_the_loop_runs_while_the_first_engine_starts_and_ends_before_its_first_timed_wave(pinned_on_the_fake,
                                                                                         monkeypatch):
    """measure_grid starts the CPU loop before the engines and the first timed wave waits for it: its minutes
    overlap an engine's start, never a measurement."""
    events: list[str] = []
    real_loop, real_start, real_run = vllm_runs.loop_acceptance, VLLMEngine.start, vllm_runs.run

    def loop(*a, **k):
        events.append("loop starts")
        time.sleep(1.0)  # longer than the fake engine's start: the wave must wait for it
        out = real_loop(*a, **k)
        events.append("loop ends")
        return out

    monkeypatch.setattr(vllm_runs, "loop_acceptance", loop)
    monkeypatch.setattr(VLLMEngine, "start", lambda self: (events.append("engine starts"), real_start(self))[1])
    monkeypatch.setattr(vllm_runs, "run", lambda *a, **k: (events.append("timed wave"), real_run(*a, **k))[1])
    got = vllm_runs.measure_grid((1,), (2,), ("ngram",), (2, 5), 2, 4, None)
    assert events.index("loop ends") < events.index("timed wave")
    assert events[:2] == ["loop starts", "engine starts"] or events[:2] == ["engine starts", "loop starts"]
    assert got["loop"][0]["k"] == 2 and got["loop"][0]["prompts"] == 2  # the loop's rows came through


def test_the_recording_step_writes_its_facts_and_recorded_results(pinned_on_the_fake, tmp_path):
    store, facts = ResultStore(tmp_path / "r.jsonl"), {}
    spec_record.record(tmp_path, store, facts, batches=(1,), ks=(2,), methods=("ngram",), n_prompts=2, max_new_tokens=4)
    got = facts["speculative"]
    assert [r["name"] for r in got["rows"]] == ["baseline, pinned (V1, no async)", "baseline, vLLM defaults",
                                                "n-gram k=2 (lookup 2-5)"]
    assert got["loop"][0]["k"] == 2 and got["loop"][0]["prompts"] == 2 and got["cross_check"] == []
    assert got["gpu"] == store.load()[0].hardware.get("gpu") and len(got["date"]) == 10 and "results" not in got
    assert all(r.provenance == "recorded" for r in store.load()) and len(store.load()) == 3
    assert json.loads((tmp_path / "speculative.json").read_text())["rows"][2]["k"] == 2


def test_the_lab_run_live_is_its_own_recording(pinned_on_the_fake, tmp_path, load_script):
    """gpu_study live with a store writes what `record` writes (facts-speculative.json), and pack_reference --labs
    takes that file as facts["speculative"]: lab 08 on the GPU is not run twice."""
    store = ResultStore(tmp_path / "results" / "08_speculative_decoding.jsonl")
    knobs = dict(batches=(1,), ks=(2,), methods=("ngram",), n_prompts=2, max_new_tokens=4, store=store, force=True)
    vllm_runs.gpu_study(**knobs)
    assert not store.facts_path("speculative").exists()  # not record's grid: this user's run, not the recording
    import pytest as _pytest

    mp = _pytest.MonkeyPatch()
    mp.setattr(spec_vllm, "RECORD_GRID", {"batches": (1,), "ks": (2,), "methods": ("ngram",), "prompt_lookup": (2, 5),
                                          "n_prompts": 2, "max_new_tokens": 4})
    try:
        shown = vllm_runs.gpu_study(**knobs)
    finally:
        mp.undo()
    kept = json.loads(store.facts_path("speculative").read_text())
    assert all(r["recorded_at"] for r in kept["rows"]) and kept["date"] == kept["rows"][0]["recorded_at"][:10]
    assert shown.live and [r["name"] for r in kept["rows"]] == [r["name"] for r in shown.value["rows"]] == [
        "baseline, pinned (V1, no async)", "baseline, vLLM defaults", "n-gram k=2 (lookup 2-5)"]
    assert "results" not in kept and kept["gpu"] == store.load()[0].hardware.get("gpu") and len(kept["date"]) == 10
    assert kept["settings"]["batches"] == [1] and kept["loop"][0]["k"] == 2
    import dataclasses as dc

    stale = dc.replace(store.load()[0], recorded_at="2099-01-01T00:00:00+0000")  # a later run of a kept step
    store.append(stale)
    facts, dates, results = load_script("pack_reference").lab_facts([tmp_path])
    assert facts == {"speculative": kept} and dates == {"speculative": kept["date"]}
    # the journey reads them: exactly the Results the rows were made from, not the first run's of the same steps
    assert sorted((r["step"], r["recorded_at"]) for r in results) == sorted((r["step"], r["recorded_at"])
                                                                           for r in kept["rows"])
    assert {r["provenance"] for r in results} == {"recorded"} and all(q["output_ids"] is None for r in results
                                                                      for q in r["requests"])
    newer = load_script("pack_reference").newer_than_packed
    assert newer(facts, dates, results, {"speculative": "2000-01-01"}) == (facts, dates, results)
    assert newer(facts, dates, results, {"speculative": "2999-01-01"}) == ({}, {}, [])  # never rolls one back
    with pytest.raises(ValueError, match=r"facts_path\.key='\.\./x'"):
        store.keep_facts("../x", {})


def test_the_cross_check_measures_vllm_against_the_loops_length_not_the_formula():
    counters = SpecCounters(1000, 4000, 1600)  # mean length 2.6
    loop = [{"k": 4, "alpha": 0.7, "predicted_length": 2.77, "measured_length": 2.6, "length_stderr": 0.01,
             "num_drafts": 400}]  # the formula 17 standard errors off the loop's own measurement, on these prompts
    [got] = vllm_runs.cross_check([_vllm_row(4, counters)], loop)
    assert got["gap"] == pytest.approx(2.6 - 2.6) and got["within_3_stderrs"]
    assert got["formula_gap"] == pytest.approx(2.6 - 2.77) and got["formula_length"] == 2.77


def test_a_failing_setting_keeps_the_others_and_a_failing_baseline_raises(pinned_on_the_fake, monkeypatch, tmp_path):
    from lablib.engines.vllm import VLLMEngine

    real = VLLMEngine.start

    def start(self):
        if (self.config.speculative_config or {}).get("method") == "ngram":
            raise RuntimeError("engine core died")
        return real(self)

    monkeypatch.setattr(VLLMEngine, "start", start)
    failed = []
    rows = vllm_runs.vllm_spec_runs(("draft_model", "ngram"), (2,), (1,), n_prompts=2, max_new_tokens=4,
                               defaults_baseline=False, failures=failed)
    assert [r["name"] for r in rows] == ["baseline, pinned (V1, no async)", "draft model k=2"]
    assert [(f["name"], f["error"], f["batches_done"]) for f in failed] == [
        ("n-gram k=2 (lookup 2-5)", "RuntimeError: engine core died", [])]
    with pytest.raises(RuntimeError, match="engine core died"):  # without a list the old behaviour: it raises
        vllm_runs.vllm_spec_runs(("ngram",), (2,), (1,), n_prompts=2, max_new_tokens=4, defaults_baseline=False)
    monkeypatch.setattr(VLLMEngine, "start", lambda self: (_ for _ in ()).throw(RuntimeError("no GPU")))
    with pytest.raises(RuntimeError, match="no GPU"):  # the pinned baseline failing: nothing to compare with
        vllm_runs.vllm_spec_runs(("ngram",), (2,), (1,), n_prompts=2, max_new_tokens=4, failures=[])


def test_ngram_rows_get_no_alpha_and_model_drafters_do():
    class R:
        step, wall_s, recorded_at = "s", 1.0, "2026-12-02T00:00:00+0000"
        summary = {"output_tok_s": 100.0}
        engine_facts = {"last_run": {"metrics_delta": {
            "vllm:spec_decode_num_drafts": 100.0, "vllm:spec_decode_num_draft_tokens": 400.0,
            "vllm:spec_decode_num_accepted_tokens": 160.0,
            "vllm:spec_decode_num_accepted_tokens_per_pos": [70, 45, 30, 15]}}}

    logged = {"model_runner": "V1", "async_scheduling": False}
    ngram = vllm_runs.settings(("ngram",), (4,), defaults_baseline=False)[1]
    draft = vllm_runs.settings(("draft_model",), (4,), defaults_baseline=False)[1]
    n, d = spec_vllm._row(ngram, 1, R(), {}, logged), spec_vllm._row(draft, 1, R(), {}, logged)
    assert n["alpha"] is None and n["formula_length"] is None and "n-gram drafts vary in length" in n["counters_note"]
    assert n["mean_acceptance_length"] == pytest.approx(2.6) and d["alpha"] is not None and d["formula_length"]


def test_the_gpu_step_without_a_recording_says_which_step_records_it(monkeypatch):
    from lablib.results.reference import NotRecorded

    def none(key, step):
        raise NotRecorded(key, step)

    monkeypatch.setattr(spec_vllm, "recorded_facts", none)  # a clone whose data/reference predates the step
    shown = vllm_runs.gpu_study(force=False)
    assert shown.value is None and "--steps speculative" in shown.label
    assert list(vllm_runs.gpu_table(shown)["provenance"]) == [shown.label]
    recorded = {"rows": [{"name": "baseline, pinned (V1, no async)", "batch": 1, "speedup": 1.0}], "loop": [],
                "cross_check": [], "gpu": "NVIDIA H200", "date": "2026-12-02"}
    monkeypatch.setattr(spec_vllm, "recorded_facts", lambda key, step: recorded if (key, step) == ("speculative",
                                                                                             "speculative") else None)
    shown = vllm_runs.gpu_study(force=False)
    assert shown.value["rows"][0]["provenance"] == "recorded on NVIDIA H200, 2026-12-02"
    assert list(vllm_runs.gpu_table(shown, "rows", ["batch", "speedup"]).columns) == ["batch", "speedup", "provenance"]


def test_a_recorded_grid_is_shown_whole_and_says_what_stands_in(monkeypatch, capsys):
    """Issue 11.8 for lab 08, as issue 28 left it: the recording holds batches 1-64, k 2 and 4, three methods; a cell
    asking (1, 64), k 4 is shown the whole recording and told which values are shown instead."""
    rows = [{"name": "baseline", "method": "baseline", "k": None, "batch": b} for b in (1, 4, 16, 64)] + [
        {"name": f"{m} k={k}", "method": m, "k": k, "batch": b} for m in vllm_runs.METHODS for k in (2, 4) for b in (1, 4, 16, 64)]
    recorded = {"rows": rows, "loop": [{"k": 2}, {"k": 4}], "cross_check": [{"method": "ngram", "k": 4}],
                "workload": {"name": "journey", "requests": 64, "max_new_tokens": 64},
                "settings": {"batches": [1, 4, 16, 64], "ks": [2, 4], "methods": list(vllm_runs.METHODS), "prompt_lookup": [2, 5]},
                "gpu": "NVIDIA H200", "date": "2026-12-02"}
    monkeypatch.setattr(spec_vllm, "recorded_facts", lambda key, step: recorded)
    assert vllm_runs.gpu_study(force=False).stand_ins == {} and capsys.readouterr().out == ""  # the lab's own grid
    shown = vllm_runs.gpu_study(batches=(1, 64), ks=(4,), force=False)
    assert shown.stand_ins == {"batches": {"asked": [1, 64], "shown": [1, 4, 16, 64]},
                               "ks": {"asked": [4], "shown": [2, 4]}}
    assert shown.value["rows"] == [{**r, "provenance": "recorded on NVIDIA H200, 2026-12-02"} for r in rows]
    assert [r["k"] for r in shown.value["loop"]] == [2, 4] and "batches: asked [1, 64]" in capsys.readouterr().out
    wide = vllm_runs.gpu_study(batches=(1, 128), ks=(4,), n_prompts=16, force=False)  # 128 and 16 prompts: never recorded
    assert len(wide.value["rows"]) == len(rows)
    assert wide.stand_ins["batches"] == {"asked": [1, 128], "shown": [1, 4, 16, 64]}
    assert wide.stand_ins["n_prompts"] == {"asked": 16, "shown": 64}
    assert "Shown instead of what this cell asked" in capsys.readouterr().out


def test_the_harness_runs_the_pair_as_engines_and_keeps_the_tokens():
    """Lab 08's harness step: naive generate, the draft and prompt lookup through bench.run on the same prompts."""
    runs = speculative_study.harness_runs(n_prompts=2, max_new_tokens=8, k=3)
    rows = runs["rows"]
    assert [r["speculative"] for r in rows] == ["off", "draft", "ngram"] and rows[0]["speedup"] == 1.0
    assert all(r["identical_to_naive"] for r in rows)
    assert rows[0]["tokens_per_target_forward"] is None and all(1 <= r["tokens_per_target_forward"] <= 4 for r in rows[1:])
    assert [r.step for r in runs["results"]] == ["hf-naive-sdpa", "hf-naive-draft-k3", "hf-naive-ngram-k3"]
    assert all(r.summary["output_tokens"] == 16 for r in runs["results"])
    text = speculative_study.harness_lines(runs)
    assert "draft model:" in text and "n-gram (prompt lookup):" in text and "identical to naive's" in text


def test_the_harness_stays_on_the_cpu_in_float32_on_a_gpu_machine(monkeypatch):
    """On a GPU machine HFEngine's device="auto" picks CUDA and bfloat16, where the verify pass rounds differently
    from one-token steps; the harness pins the CPU, so its "identical to naive" and its label stay true."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # what device="auto" sees on a GPU machine
    runs = speculative_study.harness_runs(n_prompts=1, max_new_tokens=4, k=2)
    assert [(r.engine_facts["device"], r.model["dtype"]) for r in runs["results"]] == [("cpu", "float32")] * 3
    assert runs["provenance"].startswith("measured on this machine's CPU")


def test_the_harness_refuses_a_bad_k_before_any_model_loads():
    with pytest.raises(ValueError, match=r"harness_runs\.k=0: allowed integers 1\.\.16; Fix:"):
        speculative_study.harness_runs(k=0)


def test_a_batch_larger_than_the_prompts_is_refused():
    with pytest.raises(ValueError, match=r"vllm_spec_runs\.batches=\[1, 64\]: allowed batch sizes <= n_prompts=16"):
        vllm_runs.vllm_spec_runs(("ngram",), (2,), (1, 64), n_prompts=16)


def test_the_engine_line_reads_the_switch_and_the_speedups_from_the_runs():
    from lablib.session import Shown

    def row(name, method, pinned, batch, tok_s, speedup):
        return {"name": name, "method": method, "pinned": pinned, "batch": batch, "output_tok_s": tok_s,
                "speedup": speedup}

    rows = [row("base", "baseline", True, 1, 400.0, 1.0), row("defaults", "baseline", False, 1, 300.0, 0.75),
            row("ngram k=4", "ngram", True, 1, 600.0, 1.5), row("base", "baseline", True, 64, 8000.0, 1.0),
            row("ngram k=4", "ngram", True, 64, 4000.0, 0.5)]
    text = vllm_runs.engine_lines(Shown({"rows": rows}, False, "recorded on X"))
    assert "batch 1: 300 vs 400 tok/s (-25%)" in text and "batch 64" not in text.split(". ")[0]  # no defaults at 64
    assert "ngram k=4 1.50x (batch 1)" in text and "1 of 1 settings beat plain decoding at some batch" in text
    slower = vllm_runs.engine_lines(Shown({"rows": [{**r, "speedup": min(r["speedup"], 0.9)} for r in rows]}, False, "r"))
    assert "No setting beats plain decoding at any batch here" in slower and "ngram k=4 0.90x (batch 1)" in slower
    assert vllm_runs.engine_lines(Shown(None, False, "not recorded yet")) == "[not recorded yet]"


def _drafter_row(method: str, batch: int, speedup: float, c: float | None) -> dict:
    return {"method": method, "batch": batch, "speedup": speedup, "implied_c": c, "name": f"{method}-{batch}"}


def test_the_model_drafters_claim_reads_c_and_speedup_of_the_model_drafters_only():
    """Lab 08's live claim on the embedded pair: a draft step costs about a target step, so no model drafter pays.
    n-gram rows (no forward, no c) do not enter it; a drafter that pays, or a cheap one, makes it fail."""
    base = [_drafter_row("baseline", 1, 1.0, None), _drafter_row("ngram", 1, 1.1, None),  # n-gram may beat it
            _drafter_row("draft_model", 1, 0.51, 0.87), _drafter_row("eagle", 64, 0.70, 0.67)]
    assert vllm_runs.model_drafters_never_pay({"rows": base})
    assert vllm_runs.model_drafter_costs({"rows": base}) == {"lowest_c": 0.67, "best_speedup": 0.7}
    assert not vllm_runs.model_drafters_never_pay({"rows": base + [_drafter_row("eagle", 1, 1.2, 0.3)]})
    assert not vllm_runs.model_drafters_never_pay({"rows": base + [_drafter_row("eagle", 4, 0.9, 0.45)]})
    assert not vllm_runs.model_drafters_never_pay({"rows": base[:2]})  # nothing to read: not passed


def test_the_recorded_h200_grid_holds_the_model_drafters_claim():
    """The recording lab 08 shows without a GPU carries the claim its Checks make live."""
    from lablib.results.reference import recorded_facts

    assert vllm_runs.model_drafters_never_pay(recorded_facts("speculative", "vllm-spec"))
