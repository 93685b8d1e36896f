"""The journey's ladder: each rung belongs to a lab and may run its own workload beside its own baseline;
`through` keeps a lab's own rungs; `side_roads` reads each rung against its baseline, next to the road's gain."""
import dataclasses

import pytest

from lablib.bench import offline
from lablib.experiments import journey as jx
from lablib.results import RequestRecord, Result

CPU = {"gpu": None, "cpu": "Test CPU 9000", "cpu_cores_logical": 2}


def run_of(step: str, engine: str, wall_s: float, ttft: float = 0.1, workload: str = "journey",
           provenance: str = "live", model: str = "embedded", facts: dict | None = None) -> Result:
    reqs = [RequestRecord(f"r{i}", prompt_tokens=10, output_tokens=8, start=0.0, first_token=ttft,
                          last_token=ttft + 7 * 0.01) for i in range(4)]
    return Result(lab="test", step=step, engine=engine, config={}, model={"name": model},
                  workload={"name": workload, "requests": 4}, requests=reqs, wall_s=wall_s, hardware=CPU,
                  provenance=provenance, engine_facts=facts or {})


def test_every_rung_names_its_lab_in_the_ladders_order_and_baselines_come_first():
    steps = jx.ladder([1, 4, 16])
    labs = [s.lab for s in steps]
    assert labs == sorted(labs) and set(labs) <= set(jx.LABS)
    names = [s.name for s in steps]
    assert len(set(names)) == len(names)
    for i, s in enumerate(steps):
        if s.baseline:  # the rung it is measured against runs before it, on the same requests
            base = steps[names.index(s.baseline)]
            assert names.index(s.baseline) < i and base.workload == s.workload, s.name
    assert {s.name: s.lab for s in steps if s.lab in ("02", "07", "08")} == {
        "hf-static-b16-sdpa": "02", "vllm-prefix-off": "07", "vllm-prefix-on": "07", "hf-naive-ngram-k4": "08",
        "hf-naive-draft-k4": "08", "vllm-b1": "08", "vllm-eagle-k4-b1": "08", "vllm-eagle-k4": "08",
        f"vllm-eagle-synthetic-k{jx.EAGLE_REAL_K}-b1": "08"}
    assert {s.workload for s in steps if s.lab == "07"} == {jx.PREFIX_WORKLOAD}


def test_a_rung_for_other_models_is_skipped_with_the_reason():
    draft = next(s for s in jx.ladder([1]) if s.name == "hf-naive-draft-k4")
    assert jx.available(draft, "embedded") == (True, "")
    ok, why = jx.available(draft, "qwen2.5-0.5b")
    assert not ok and "embedded" in why and "qwen2.5-0.5b" in why


def test_through_keeps_a_labs_own_rungs(monkeypatch):
    """run_journey(through='01') runs lab 01's rungs only; the engines here are stand-ins that record the order."""
    made = []

    class Stub:
        def __init__(self, name):
            self.name = name

        def close(self):
            pass

    monkeypatch.setattr(offline, "run", lambda engine, wl, bench, **kw: made.append((kw["step"], wl.name)) or
                        run_of(kw["step"], "hf-naive", 1.0, workload=wl.name))
    monkeypatch.setattr(jx, "ladder", lambda sizes: [
        jx.Step("a", Stub), jx.Step("b", Stub, lab="02"), jx.Step("c", Stub, lab="07", workload=jx.PREFIX_WORKLOAD)])
    _, skipped = jx.run_journey(requests=2, batch_sizes=[1], through="01", log=lambda _: None)
    assert made == [("a", "journey")]
    assert [(s["step"], s["why"]) for s in skipped] == [("b", "lab 02's rung (this run goes through lab 01)"),
                                                       ("c", "lab 07's rung (this run goes through lab 01)")]
    made.clear()
    jx.run_journey(requests=2, batch_sizes=[1], log=lambda _: None)
    assert made == [("a", "journey"), ("b", "journey"), ("c", jx.PREFIX_WORKLOAD)]  # a rung's own workload
    with pytest.raises(ValueError, match=r"run_journey\.through='1': allowed '01', .*; Fix:"):
        jx.run_journey(through="1")


def test_side_roads_read_each_rung_against_its_baseline_beside_the_roads_gain():
    spec = {"last_run": {"speculative": {"tokens_per_forward": 2.5}}}
    results = [run_of("hf-naive", "hf-naive", 2.0), run_of("hf-static-b4", "hf-static", 0.5),
               run_of("hf-naive-ngram-k4", "hf-naive", 1.0, facts=spec),
               run_of("vllm-prefix-off", "vllm", 1.0, ttft=0.4, workload=jx.PREFIX_WORKLOAD, model="x"),
               run_of("vllm-prefix-on", "vllm", 0.8, ttft=0.1, workload=jx.PREFIX_WORKLOAD, model="x")]
    rows = {r["rung"]: r for r in jx.side_roads(results, [1, 4])}
    assert set(rows) == {"hf-naive-ngram-k4", "vllm-prefix-on"}  # the draft rung and the rest did not run here
    ngram = rows["hf-naive-ngram-k4"]
    assert (ngram["baseline"], ngram["lab"], ngram["tok_s_ratio"]) == ("hf-naive", "08", pytest.approx(2.0))
    assert ngram["tokens_per_forward"] == 2.5
    assert ngram["journey_gain"] == pytest.approx(4.0)  # hf-static-b4 over hf-naive: the best other journey rung
    fast = [*results[:2], run_of("hf-naive-ngram-k4", "hf-naive", 0.1)]  # the rung itself fastest: not its own gain
    assert jx.side_roads(fast, [1, 4])[0]["journey_gain"] == pytest.approx(4.0)
    prefix = rows["vllm-prefix-on"]
    assert prefix["ttft_speedup"] == pytest.approx(4.0) and prefix["tok_s_ratio"] == pytest.approx(1.25)
    assert prefix["journey_gain"] is None  # model x ran no journey rung: no gain is claimed for it


def test_the_report_says_what_each_side_road_bought(tmp_path):
    from lablib.report import write_report

    results = [run_of("hf-naive", "hf-naive", 2.0), run_of("hf-naive-draft-k4", "hf-naive", 4.0, ttft=0.2)]
    page = write_report(results, tmp_path / "r.html").read_text()
    assert "(2.00&times; later)" in page  # its first token came later than naive's
    assert "<b>hf-naive-draft-k4</b> against <b>hf-naive</b>" in page and "(0.50&times;)" in page
    assert "In throughput it did not pay here: lab 08 measures why." in page


def test_the_rungs_recorded_names_are_the_ones_labs_07_and_08_record():
    """The journey does not record its prefix and speculative rungs itself: lab 07's on/off runs and lab 08's
    sweep do, and these names must be the ones their own naming produces (a rename there would leave the road
    showing 'not recorded yet' forever)."""
    from lablib.experiments.prefix import workloads as pw
    from lablib.experiments.speculative import vllm_runs as sv

    assert jx.PREFIX_RECORDED == {c: f"prefix-{'on' if c else 'off'}-{jx.PREFIX_WORKLOAD}-{pw.BIG}" for c in (0, 1)}
    base, eagle = sv.settings(("eagle",), (jx.SPEC_K,), defaults_baseline=False)
    assert jx.SPEC_RECORDED == {b: (base.step(b), eagle.step(b)) for b in (1, 64)}


def test_the_sdpa_rung_is_measured_against_the_largest_batch_whatever_the_order():
    steps = {s.name: s for s in jx.hf_steps([16, 4, 1])}
    assert steps["hf-static-b16-sdpa"].baseline == "hf-static-b16" and "hf-static-b4-sdpa" not in steps
    assert jx.hf_steps([1])[-1].name == "hf-naive-sdpa" and jx.hf_steps([1])[-1].baseline == "hf-naive"


def test_side_roads_read_the_batch_sizes_the_results_ran_with():
    """`lablab --batch-sizes 1,32`: the report pairs hf-static-b32-sdpa with hf-static-b32 without being told."""
    results = [run_of("hf-naive", "hf-naive", 2.0), run_of("hf-static-b32", "hf-static", 1.0),
               run_of("hf-static-b32-sdpa", "hf-static", 0.5)]
    results[1].config["batch_size"] = results[2].config["batch_size"] = 32
    assert jx.batch_sizes_of(results) == [1, 32]
    (row,) = jx.side_roads(results)
    assert (row["rung"], row["baseline"], row["tok_s_ratio"]) == ("hf-static-b32-sdpa", "hf-static-b32", 2.0)


def test_a_rung_for_one_model_knows_it_by_any_name():
    from lablib.models import resolve_model

    draft = next(s for s in jx.ladder([1]) if s.name == "hf-naive-draft-k4")
    assert jx.available(draft, "embedded-target")[0] and jx.available(draft, resolve_model("embedded"))[0]
    assert not jx.available(draft, resolve_model("embedded-draft"))[0]


def test_labs_on_road_counts_a_lab_by_its_rung_run_or_recorded():
    from lablib.experiments.journey import labs_on_road, road

    recorded = road([], [1, 8])  # the shipped recordings alone, as a CPU shows the vLLM rungs
    assert labs_on_road(recorded, [1, 8]) == {"02", "03", "05", "06", "07", "08"}  # 02: the H200's HF sdpa run
    assert labs_on_road(recorded[:1], [1, 8]) == {"02"} and labs_on_road([], [1, 8]) == set()


def test_vllm_gain_is_live_only_where_vllms_rung_ran_here():
    from lablib.experiments.journey import vllm_gain

    ran = [run_of("hf-naive", "hf-naive", 0.4), run_of("hf-static-b8", "hf-static", 0.2), run_of("vllm", "vllm", 0.01)]
    got = vllm_gain(ran)
    assert got.live and got.value == pytest.approx(20.0, rel=0.01)  # the faster HF rung: 0.2 s against 0.01 s
    missing = vllm_gain(ran[:2] + [run_of("vllm-8b-journey", "vllm", 0.01, provenance="recorded")])
    assert not missing.live and missing.value is None and "did not run here" in missing.label


def test_the_default_model_is_the_gpus_real_size_shape_and_embedded_without_one(monkeypatch):
    monkeypatch.setattr(jx, "live_model", lambda default: default)  # no GPU
    assert jx.default_model() == "embedded" and jx.default_batch_sizes("embedded") == list(jx.CPU_BATCHES)
    monkeypatch.setattr(jx, "live_model", lambda default: "synthetic:llama-3.1-8b")  # an H200
    assert jx.default_model() == "synthetic:llama-3.1-8b"
    assert jx.default_batch_sizes("synthetic:llama-3.1-8b") == list(jx.REAL_SIZE_BATCHES) == [1, 64]
    assert jx.is_real_size("synthetic:llama-3.1-8b") and not jx.is_real_size("embedded")


@pytest.mark.usefixtures("one_thread")
def test_at_real_size_naive_generate_runs_a_stated_subset_and_every_other_rung_all(tmp_path):
    """A model folder that is not the embedded pair counts as real size (a copy of the embedded target here, so it
    runs on this CPU): naive generate takes the first NAIVE_REAL_SIZE requests and says so; static batching all."""
    import shutil

    from lablib.config import BenchConfig
    from lablib.models import embedded_path

    folder = tmp_path / "model"
    shutil.copytree(embedded_path("target"), folder)
    assert jx.is_real_size(str(folder)) and jx.default_batch_sizes(str(folder)) == [1, 64]
    n = jx.NAIVE_REAL_SIZE + 2
    results, _ = jx.run_journey(str(folder), requests=n, batch_sizes=[1, 2], through="01", log=lambda _: None,
                                bench=BenchConfig(max_new_tokens=2, progress=False))
    naive, static = results
    assert (naive.step, naive.workload["requests"]) == ("hf-naive", jx.NAIVE_REAL_SIZE)
    assert naive.config["subset"].startswith(f"the first {jx.NAIVE_REAL_SIZE} of {n} requests")
    assert (static.step, static.workload["requests"]) == ("hf-static-b2", n) and "subset" not in static.config


def test_at_real_size_the_speculative_rung_is_a_synthetic_eagle_head_at_the_recorded_rates(tmp_path, monkeypatch):
    """The 8B ladder's speculative rung: the embedded pair's EAGLE rungs are skipped on a synthetic Llama and the
    real-size one runs there only, its head made for the target's shape, its acceptance the rates recorded in
    EAGLE_RATES_STEP at EAGLE_REAL_K (vLLM's synthetic sampler); checked without making the 16 GB target."""
    import json

    import lablib.models.synthetic as syn
    from lablib.models import ModelSpec
    from lablib.results.reference import recorded_facts

    steps = {s.name: s for s in jx.ladder([1, 64])}
    real = steps[f"vllm-eagle-synthetic-k{jx.EAGLE_REAL_K}-b1"]
    assert real.baseline == "vllm-b1" and "synthetic acceptance" in real.why
    ok, why = jx.available(real, "embedded")
    assert not ok and why.startswith("it runs on synthetic:llama-") and "not 'embedded'" in why
    ok, why = jx.available(steps["vllm-eagle-k4-b1"], "synthetic:llama-3.2-1b")
    assert not ok and "embedded" in why
    assert jx._is_one_of("synthetic:llama-3.2-1b", real.models) and not jx._is_one_of("synthetic:qwen2.5-7b", real.models)
    monkeypatch.setattr(syn, "ROOT", tmp_path)  # the head is made here; the target is its config alone
    target = tmp_path / "llama-3.2-1b"
    target.mkdir()
    cfg = {k: v for k, v in syn.architectures()["llama-3.2-1b"].items() if not k.startswith("_")}
    (target / "config.json").write_text(json.dumps({**cfg, "dtype": "bfloat16"}))
    spec = ModelSpec("synthetic:llama-3.2-1b", str(target), "synthetic", cfg)
    c = jx.real_size_eagle_config(spec)
    want = recorded_facts(jx.EAGLE_RATES_STEP, jx.EAGLE_RATES_STEP)["rates"][str(jx.EAGLE_REAL_K)]["rates"]
    assert (c["method"], c["num_speculative_tokens"]) == ("eagle", jx.EAGLE_REAL_K)
    assert c["rejection_sample_method"] == "synthetic" and c["synthetic_acceptance_rates"] == want
    assert c["model"] == str(tmp_path / "llama-3.2-1b-eagle")
    assert not list(target.glob("*.safetensors"))  # the target was not made


@pytest.mark.parametrize("gpu, batch", [("T4", 16), ("L4", 32), ("A10G", 32), ("A100-40", 32), ("A100-80", 64),
                                        ("H100", 64), ("H200", 64)])
def test_at_real_size_hf_batches_what_the_gpu_holds(gpu, batch):
    """The tier's shape, its weights, KV for that many of the journey's longest requests and eager's scores of its
    longest prompt within 90% of the GPU: 64 on 80 GB and up, fewer below, where a batch of 64 would not fit."""
    from lablib.hardware.tiers import REHEARSAL_GPUS, shape_for

    memory = REHEARSAL_GPUS[gpu]["memory_mib"] * 2**20
    assert jx.real_size_hf_batch(f"synthetic:{shape_for(memory)}", memory_bytes=memory) == batch


def test_a_rung_out_of_memory_is_skipped_with_the_reason_and_the_road_goes_on(monkeypatch):
    torch = pytest.importorskip("torch")
    ran = []

    def run_step(step, model, wl, bench, **kw):
        if step.name == "b":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        ran.append(step.name)
        return run_of(step.name, "hf-naive", 1.0)

    monkeypatch.setattr(jx, "run_step", run_step)
    monkeypatch.setattr(jx, "ladder", lambda sizes: [jx.Step("a", None), jx.Step("b", None), jx.Step("c", None)])
    results, skipped = jx.run_journey("embedded", requests=2, batch_sizes=[1], log=lambda _: None)
    assert ran == ["a", "c"] and [r.step for r in results] == ["a", "c"]
    assert skipped == [{"step": "b", "why": "out of memory on this machine (OutOfMemoryError: CUDA out of memory. "
                                            "Tried to allocate 20.00 GiB): a smaller --batch-sizes, or a smaller --model"}]


def test_a_vllm_rungs_engine_start_is_said_and_an_hf_rung_has_none():
    import dataclasses

    from lablib.experiments.journey import engine_start, start_text
    from lablib.results.reference import load_reference

    r = load_reference("spec-eagle-k2-b1")[0]  # a recorded vLLM run: its facts carry the start
    alone = engine_start(dataclasses.replace(r, engine_facts={"startup_wall_s": 90.64}))
    assert alone == {"start_s": 90.6, "together": 1, "group_start_s": None}
    assert start_text(alone) == "engine start 91 s"
    grouped = engine_start(dataclasses.replace(r, engine_facts={"startup_wall_s": 140.2, "together": {
        "engines": 3, "group_start_s": 151.0}}))
    assert start_text(grouped) == "its engine started with 2 other(s): 151 s for the group"
    assert engine_start(dataclasses.replace(r, engine_facts={})) is None  # HF's engines report no start


def test_at_real_size_every_batch_1_rung_reads_naive_generates_requests(monkeypatch):
    """On a GPU at real size (live here by patch): naive generate, vLLM one request at a time and its EAGLE rung run
    the same first NAIVE_REAL_SIZE requests, each saying so; the batched rungs run all 64, the prefix rungs their own
    set whole; the embedded pair's speculative rungs (HF's draft and n-gram, vLLM's EAGLE k=4) do not run."""
    monkeypatch.setattr(jx, "mode", lambda: {"live": True, "gpu": True, "why": ""})
    todo, skipped = jx.rungs("synthetic:llama-3.1-8b", batch_sizes=[1, 64])
    assert sorted(s["step"] for s in skipped) == sorted(f"{how}-k{jx.SPEC_K}{tail}" for how, tail in (
        ("hf-naive-draft", ""), ("hf-naive-ngram", ""), ("vllm-eagle", ""), ("vllm-eagle", "-b1")))
    by = {step.name: (own, b) for step, own, b in todo}
    batch_1 = ["hf-naive", "vllm-b1", f"vllm-eagle-synthetic-k{jx.EAGLE_REAL_K}-b1"]
    first = [r.id for r in by["hf-naive"][0].requests]
    assert len(first) == jx.NAIVE_REAL_SIZE
    for name in batch_1:
        own, bench = by[name]
        assert [r.id for r in own.requests] == first, name
        assert bench.tags["subset"].startswith(f"the first {jx.NAIVE_REAL_SIZE} of 64 requests"), name
    for name in ("hf-static-b64", "hf-static-b64-sdpa", "hf-static-b64-compile", "vllm", "vllm-fp8", "vllm-server"):
        own, bench = by[name]
        assert len(own.requests) == 64 and "subset" not in bench.tags, name
    assert len(by["vllm-prefix-on"][0].requests) == len(by["vllm-prefix-off"][0].requests) > jx.NAIVE_REAL_SIZE
    on_embedded, _ = jx.rungs("embedded", batch_sizes=[1, 4])  # the embedded model: every rung all of its requests
    assert all("subset" not in b.tags for _, _, b in on_embedded)


def test_the_batch_1_rungs_ride_the_engine_of_the_rung_they_change_and_start_their_own_without_it(monkeypatch):
    """vLLM one request at a time is the vllm rung's engine with one request in flight (and the embedded EAGLE head's
    batch-1 rung its batch rung's engine): one engine start fewer each, measured right after the host; where the
    host does not run (here: skipped), the rider starts its own engine, still one request at a time."""
    monkeypatch.setattr(jx, "mode", lambda: {"live": True, "gpu": True, "why": ""})
    todo, _ = jx.rungs("embedded", batch_sizes=[1, 4])
    together = [t for t in todo if t[0].together]
    hosts, riders = jx.hosts_and_riders(together)
    assert {host: [t[0].name for t in ts] for host, ts in riders.items()} == {
        "vllm": ["vllm-b1"], f"vllm-eagle-k{jx.SPEC_K}": [f"vllm-eagle-k{jx.SPEC_K}-b1"]}
    assert "vllm-b1" not in [t[0].name for t in hosts] and len(hosts) == len(together) - 2
    by = {step.name: b for step, _, b in todo}
    assert by["vllm-b1"].max_concurrency == by[f"vllm-eagle-k{jx.SPEC_K}-b1"].max_concurrency == 1
    assert by["vllm"].max_concurrency is None and by[f"vllm-eagle-k{jx.SPEC_K}"].max_concurrency is None
    assert (by["vllm-b1"].tags["rides"], by[f"vllm-eagle-k{jx.SPEC_K}-b1"].tags["rides"]) == (
        "vllm", f"vllm-eagle-k{jx.SPEC_K}")  # each Result says whose engine it ran on
    assert "rides" not in by["vllm"].tags
    real, _ = jx.rungs("synthetic:llama-3.1-8b", batch_sizes=[1, 64])  # at real size the EAGLE rung starts its
    real_by = {step.name: b for step, _, b in real}  # own engine, its requests sent as its baseline's: one at a time
    eagle = real_by[f"vllm-eagle-synthetic-k{jx.EAGLE_REAL_K}-b1"]
    assert eagle.max_concurrency == real_by["vllm-b1"].max_concurrency == 1 and "rides" not in eagle.tags
    from lablib.results.reference import load_reference
    r = dataclasses.replace(load_reference("spec-eagle-k2-b1")[0], engine_facts={"startup_wall_s": 90.6})
    assert jx.engine_start(r) is not None
    assert jx.engine_start(dataclasses.replace(r, config={**r.config, "rides": "vllm"})) is None  # the host's
    # Result carries the start, not the rider's
    alone, riders = jx.hosts_and_riders([t for t in together if t[0].name != "vllm"])
    assert "vllm-b1" in [t[0].name for t in alone] and "vllm" not in riders
