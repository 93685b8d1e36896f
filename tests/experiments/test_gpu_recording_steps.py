"""The GPU recording steps of goodput, the SLO capacity and the advisor check (scripts/record_reference.py steps
`capacity`, `goodput-referee`, `advisor-check`), rehearsed on the fake server: what they keep, marked recorded."""
from __future__ import annotations

import json

from lablib.bench.goodput import SLO
from lablib.experiments.advisor import record as advisor_record
from lablib.experiments.advisor.plan import Goal
from lablib.experiments.serving import record as serving_record
from lablib.results.store import ResultStore


def test_the_capacity_step_keeps_its_probes_as_recordings(fake_vllm_cli, tmp_path):
    store, facts = ResultStore(tmp_path / "ref.jsonl"), {}
    serving_record.record_capacity(tmp_path, store, facts, slo=SLO(ttft_ms=300, percentile=90))  # the fake's ideal
    # burst of 128 requests on 8 slots takes ~1 s: a 300 ms target fails it on any machine
    got = facts["capacity"]
    lo, hi = got["interval_rps"]
    assert lo < hi and len(got["rows"]) >= 3 and got["burst"]["holds"] is False
    kept = store.load()
    assert {r.provenance for r in kept} == {"recorded"} and kept[0].step == "capacity-rate-inf"
    assert json.loads((tmp_path / "capacity.json").read_text())["verdict"] == got["verdict"]


def test_the_goodput_referee_step_compares_the_rule_and_the_attainments(fake_vllm_cli, tmp_path):
    store, facts = ResultStore(tmp_path / "ref.jsonl"), {}
    serving_record.record_goodput(tmp_path, store, facts, times=2, repeat=1)
    got = facts["goodput_referee"]
    assert got["same_rule"] is True, got["rounds"]  # vLLM's (the fake's) request_goodput = the lab's rule on its records
    assert [r["lab_first"] for r in got["rounds"]] == [True, False] and "equals" in got["verdict"]
    assert [r.step for r in store.load()] == ["goodput0-rate-inf", "goodput1-rate-inf"]
    same = serving_record.two_proportions(45, 50, 45, 50)
    assert same["agree"] and same["z"] == 0 and not serving_record.two_proportions(50, 50, 10, 50)["agree"]


def test_the_advisor_check_step_runs_every_goal_and_keeps_a_failure_apart(fake_vllm_cli, tmp_path):
    store, facts = ResultStore(tmp_path / "ref.jsonl"), {}
    goals = {"small": Goal(concurrency=4, prompt_tokens=64, output_tokens=8, tpot_slo_ms=50.0),
             "impossible": Goal(concurrency=16, tpot_slo_ms=0.5)}  # refused by the advisor before any server
    advisor_record.record(tmp_path, store, facts, goals=goals, served="embedded")
    got = facts["advisor_check"]["goals"]
    assert got["impossible"]["error"].startswith("ValueError: Goal.tpot_slo_ms=0.5")
    assert len(got["small"]["rows"]) == 9 and "result" not in got["small"]["predicted"]
    assert [r.provenance for r in store.load()] == ["recorded"]
    assert set(advisor_record.GOALS) == {"chat-shared-prefix", "long-context", "assistant-batch-1"}
    from lablib.experiments.advisor.plan import plan
    assert all(plan(g)["t"] == 1 for g in advisor_record.GOALS.values())  # one H200 runs each advised engine


def test_the_pareto_front_keeps_what_nothing_beats_and_the_sweep_runs_one_server_per_setting(fake_vllm_cli, tmp_path):
    from lablib.experiments.serving import pareto

    pts = [{"tok_s_per_gpu": g, "tok_s_per_user": u} for g, u in ((100, 50), (200, 40), (150, 30), (200, 40),
                                                                  (300, 10), (90, None))]
    assert [(p["tok_s_per_gpu"], p["tok_s_per_user"]) for p in pareto.front(pts)] == [(100, 50), (200, 40), (200, 40),
                                                                                     (300, 10)]
    store, facts = ResultStore(tmp_path / "ref.jsonl"), {}
    serving_record.record_pareto(tmp_path, store, facts, model="embedded", max_num_seqs=(4, 8),
                                 max_num_batched_tokens=(2048,), schemes=("bf16",), levels=(1, 8), repeat=1)
    got = facts["pareto"]
    assert len(got["settings"]) == 2 and len(got["points"]) == 4 and got["front"]
    assert len({p["step"] for p in got["points"]}) == 4  # one name per setting and level: none lost when packed
    assert all(p["tok_s_per_gpu"] > 0 and p["tok_s_per_user"] > 0 for p in got["points"])
    assert {r.provenance for r in store.load()} == {"recorded"} and len(store.load()) == 4
    import pytest
    with pytest.raises(ValueError, match=r"pareto\.sweep\.schemes='int3': allowed"):
        pareto.sweep("embedded", schemes=("int3",))
