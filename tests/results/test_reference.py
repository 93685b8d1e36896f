"""The runs recorded on the H200 (data/reference/): they load as recorded Results, the headline
facts agree with the Results they were computed from, and the README is what the pack script
renders from both. Pure file checks: well under a second."""

import gzip
import json
import shutil

import pytest

from lablib.results import Result, reference
from lablib.results.reference import REFERENCE_DIR, load_reference, recorded_rows, reference_facts, reference_steps
from lablib.session import mode

REPACK = "re-pack: python scripts/pack_reference.py RUN_DIR..."


@pytest.fixture(scope="module")
def runs() -> dict[str, Result]:
    return {r.step: r for r in load_reference()}


@pytest.fixture(scope="module")
def facts() -> dict:
    return reference_facts()


@pytest.fixture(scope="module")
def pack(load_script):
    return load_script("pack_reference")


def test_recorded_runs_load_with_their_provenance(runs):
    assert len(runs) == len(reference_steps()) >= 4
    for r in runs.values():
        assert r.provenance == "recorded"
        assert r.hardware["gpu"] == "NVIDIA H200" and r.versions["vllm"] == "0.26.0"
        assert r.label.startswith(f"{r.step} (recorded on NVIDIA H200, ")
        assert r.requests and r.summary["requests"] == len(r.requests) == r.workload["requests"]


def test_load_reference_by_step_and_prefix(runs):
    assert [r.step for r in load_reference("vllm-8b-single", "vllm-8b-journey")] == ["vllm-8b-single", "vllm-8b-journey"]
    sweep = load_reference(prefix="vllm-gmu-")
    assert len(sweep) == 10 and all(r.step.startswith("vllm-gmu-") for r in sweep)


def test_unknown_step_lists_the_recorded_ones(runs):
    with pytest.raises(ValueError, match=r"no recorded run named \['nope'\]") as e:
        load_reference("nope")
    for step in runs:
        assert step in str(e.value)


def test_headline_agrees_with_the_results(runs, facts):
    h = facts["headline"]
    assert h["gpu"] == "NVIDIA H200" and h["versions"]["vllm"] == "0.26.0"
    assert h["date"] == runs["vllm-8b-journey"].recorded_at[:10]
    s = {k: r.summary for k, r in runs.items()}
    ratio = s["vllm-8b-journey"]["output_tok_s"] / s["hf-static-b64-8b-journey"]["output_tok_s"]
    assert h["journey_ratio"] == pytest.approx(ratio, abs=1e-6)
    assert h["single_stream_tok_s"] == pytest.approx(s["vllm-8b-single"]["output_tok_s"], abs=1e-6)
    assert h["single_stream_mbu"] == pytest.approx(runs["vllm-8b-single"].roofline["mbu"], abs=1e-6)
    bench = facts["vllm_bench_throughput"]
    big = s["vllm-8b-256x128x128"]
    assert h["lab_over_vllm_bench_total_tok_s"] == pytest.approx(big["total_tok_s"] / bench["tokens_per_second"], abs=1e-6)
    assert h["lab_over_vllm_bench_requests_s"] == pytest.approx(big["requests_s"] / bench["requests_per_second"], abs=1e-6)


def test_sweep_kv_grows_with_the_budget_and_vram_comes_back(runs, facts):
    sweep = facts["sweep"]
    assert len(sweep) == 10
    gmu = [p["gpu_memory_utilization"] for p in sweep]
    kv = [p["kv_tokens"] for p in sweep]
    assert gmu == sorted(gmu) and len(set(gmu)) == 10
    assert all(a < b for a, b in zip(kv, kv[1:]))
    assert all(p["back_to_baseline"] is True for p in sweep)
    assert all(p["vram_after_close_bytes"] == p["vram_before_bytes"] for p in sweep)
    for p in sweep:  # each sweep point is a stored run
        assert runs[f"vllm-gmu-{p['gpu_memory_utilization']}"].summary["output_tok_s"] == \
            pytest.approx(p["output_tok_s"], abs=1e-6)


def test_readme_is_rendered_from_facts_and_results(pack, facts, monkeypatch, tmp_path):
    with gzip.open(REFERENCE_DIR / "h200.jsonl.gz", "rt", encoding="utf-8") as f:
        by_step = {r["step"]: r for r in map(json.loads, f.read().splitlines())}
    monkeypatch.setattr(pack, "OUT", tmp_path)
    shutil.copy(REFERENCE_DIR / "README.md", tmp_path / "README.md")  # the hand-written part below the marker is kept
    pack.write_readme(by_step, facts)
    assert (tmp_path / "README.md").read_text() == (REFERENCE_DIR / "README.md").read_text(), REPACK
    text = (tmp_path / "README.md").read_text()  # a notebook renumbered since its run is named as such; others not
    assert "- `02_kv_cache`: 13 of 13 cells passed on 2026-11-29 (a name from the labs' earlier numbering)" in text
    assert "- `07_prefix_caching`: 21 of 21 cells passed on 2026-12-01\n" in text


def test_readme_states_the_headline_numbers(facts):
    readme = (REFERENCE_DIR / "README.md").read_text()
    h = facts["headline"]
    for text in (f"{h['journey_ratio']:.1f}x", f"{h['single_stream_tok_s']:.0f} tok/s, MBU {h['single_stream_mbu']:.2f}",
                 f"{h['lab_over_vllm_bench_total_tok_s']:.3f}", f"{h['lab_over_vllm_bench_requests_s']:.3f}",
                 f"recorded on {h['gpu']}, {h['date']}"):
        assert text in readme, text


def test_mode_on_a_machine_without_gpu_and_vllm():
    m = mode()
    if m["live"]:
        pytest.skip("this machine has a GPU and vLLM: it measures live")
    assert m["live"] is False and m["banner"].startswith("RECORDED: ") and "NVIDIA H200" in m["banner"]
    assert m["why"] in m["banner"]


def test_missing_reference_file_says_how_to_restore(monkeypatch, tmp_path):
    monkeypatch.setattr(reference, "REFERENCE_DIR", tmp_path)
    reference._all.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="git checkout data/reference"):
            reference_steps()
    finally:
        reference._all.cache_clear()


def test_serving_sweep_recorded_with_the_cross_check(facts):
    served = load_reference(prefix="serve-rate-")
    serve = facts["serve"]
    fractions = serve.get("fractions", (0.25, 0.5, 0.75, 1.0, 1.25))  # the first recording predates the field
    assert len(served) == 1 + len(fractions) and all(r.provenance == "recorded" and "H200" in r.label for r in served)
    assert all(len(r.requests) == 256 and not r.notes and r.engine_facts["server_metrics"]["samples"] for r in served)
    burst = next(r for r in served if r.config["rate"] == float("inf"))
    assert serve["capacity_rps"] == pytest.approx(burst.summary["requests_s"], rel=1e-5)
    rates = sorted(r.config["rate"] for r in served if r.config["rate"] != float("inf"))
    assert rates == pytest.approx([f * serve["capacity_rps"] for f in fractions], abs=0.01)
    fig = serve["compare"]["figures"]["output_tok_s"]
    assert fig["lab"] == pytest.approx(burst.summary["output_tok_s"], rel=1e-5)
    assert fig["ratio"] == pytest.approx(fig["lab"] / fig["vllm_bench"], rel=1e-5)
    assert serve["bench_serve"]["completed"] == 256 and "ttfts" not in serve["bench_serve"]
    assert facts["headline"]["lab_over_vllm_bench_serve_output_tok_s"] == pytest.approx(fig["ratio"], rel=1e-5)


@pytest.mark.parametrize("key,prefix", [("serve_check", ""), ("serve_check_embedded", "embedded-")])
def test_serve_check_rounds_recorded(facts, runs, key, prefix):
    from lablib.bench.referee import agreement

    check = facts[key]
    rounds = check["rounds"]
    assert len(rounds) == 3 and [r["lab_first"] for r in rounds] == [True, False, True]  # the first client alternates
    for i, r in enumerate(rounds):  # each round's lab burst is a recorded Result, and its ratio divides the two
        fig = r["figures"]["output_tok_s"]
        assert fig["lab"] == pytest.approx(runs[f"{prefix}check{i}-rate-inf"].summary["output_tok_s"], rel=1e-5)
        assert fig["ratio"] == pytest.approx(fig["lab"] / fig["vllm_bench"], rel=1e-5)
        assert r["completed"] == {"lab": 256, "vllm_bench": 256}
        # re-derived from the raw results at packing: neither client (both aiohttp) read a backlog, and the lab's
        # request latency was the server's plus a hop
        assert r["clumped"]["lab"] < 0.01 and r["clumped"]["vllm_bench"] < 0.01 and r["client"]["kept_up"] is True
    assert check["output_tok_s_ratios"] == [r["figures"]["output_tok_s"]["ratio"] for r in rounds]
    assert check["agreement"]["agree"] is True
    assert check["agreement"]["ratio"] == pytest.approx(agreement(rounds)["ratio"], rel=1e-5)
    if key == "serve_check":  # the synthetic 8B's 5 s bursts: within 5% every round
        assert all(0.95 < x < 1.05 for x in check["output_tok_s_ratios"])
    else:  # the embedded model's 2 s bursts scatter: vLLM's own client moved over 10% between rounds
        assert check["agreement"]["vllm_spread"] > 0.1 and abs(check["agreement"]["ratio"] - 1) < 0.1


def test_cross_check_section_per_model(pack, facts):
    text = pack._check_text(facts["serve_check"], "the embedded model")
    assert "### Repeated cross-check, the embedded model: 3 rounds" in text
    ratios = [f"| {r['figures']['output_tok_s']['ratio']:.3f} |" for r in facts["serve_check"]["rounds"]]
    assert all(x in text for x in ratios) and pack._check_text({"rounds": []}, "x") == ""
    assert facts["serve_check"]["agreement"]["verdict"] in text


def test_lab_runs_on_the_gpu_summarised(pack, facts):
    lab = facts["lab_runs"]
    assert lab["nbval"]["02_kv_cache"] == "13 of 13 cells passed on 2026-11-29"  # each line says when it ran
    assert lab["nbval"]["07_prefix_caching"] == "21 of 21 cells passed on 2026-12-01"
    rows = {r["step"]: r for r in lab["rows"]}
    ratio = rows["vllm-embedded-journey"]["output_tok_s"] / rows["hf-static-b64-embedded-journey"]["output_tok_s"]
    assert lab["embedded_journey_ratio_vllm_over_hf_static_b64"] == pytest.approx(ratio, rel=1e-5)
    assert lab["serve_capacity_rps"] == pytest.approx(lab["serve_compare"]["figures"]["requests_s"]["lab"], rel=1e-5)
    assert lab["nbval"]["03_continuous_batching"] == "25 of 25 cells passed on 2026-11-29"
    compare = lab["serve_compare"]  # lab 03's live cross-check: the lab's client (aiohttp) kept up with the server
    assert compare["client"]["kept_up"] is True and compare["clumped"]["lab"] < 0.05
    assert compare["client"]["server_http_ms"] > compare["client"]["server_e2e_ms"]  # the API server's share on top
    assert 0.95 < compare["figures"]["output_tok_s"]["ratio"] < 1.05
    log = "labs/03_x::ipynb::Cell 0 PASSED  [ 4%]\nlabs/03_x::ipynb::Cell 1 FAILED\nlabs/02_y::ipynb::Cell 0 PASSED\n"
    assert pack.nbval_summary(log) == {"03_x": "1 of 2 cells passed (failed: cell 1)", "02_y": "1 of 1 cells passed"}
    durations = ("===== slowest durations =====\n95.50s call     labs/08_s.ipynb::Cell 18\n"
                 "4.25s call     labs/08_s.ipynb::Cell 2\n0.25s setup    labs/08_s.ipynb::Cell 0\n"
                 "12.00s call     labs/03_x.ipynb::Cell 1\n(3 durations < 0.005s hidden.)\n")
    assert pack.nbval_seconds(durations) == {"08_s": pytest.approx(100.0), "03_x": pytest.approx(12.0)}
    lab08 = "08_speculative_decoding"  # a run cut short reports fewer cells than the notebook has: a floor
    cells = json.loads((pack.ROOT / "labs" / f"{lab08}.ipynb").read_text())["cells"]
    code = sum(c["cell_type"] == "code" for c in cells)
    assert pack.cut_short(lab08, f"{code} of {code} cells passed") == ""
    assert pack.cut_short(lab08, "16 of 16 cells passed") == \
        f" over the 16 of {code} cells that ran (cut short: at least that)"
    assert pack.cut_short("03_x", "1 of 2 cells passed") == ""  # no such notebook here: nothing to compare with


def test_lab_runs_packed_from_a_gpu_labs_folder(pack, facts, runs, tmp_path):
    import dataclasses

    (tmp_path / "results").mkdir(parents=True)
    import os

    (tmp_path / "nbval.log").write_text("labs/03_z::ipynb::Cell 0 PASSED\nlabs/03_z::ipynb::Cell 1 PASSED\n"
                                        "61.50s call     labs/03_z.ipynb::Cell 1\n0.50s call     labs/03_z.ipynb::Cell 0\n")
    os.utime(tmp_path / "nbval.log", (1764633600, 1764633600))  # the log ended on 2025-12-02 (UTC): the date shown
    live = [dataclasses.replace(runs[s], provenance="live", step=s.replace("8b", "embedded"), lab="03_z")
            for s in ("vllm-8b-journey", "hf-static-b64-8b-journey")]
    recorded = dataclasses.replace(runs["vllm-8b-single"], lab="03_z")  # only live runs are the labs' own
    (tmp_path / "results" / "03_z.jsonl").write_text("".join(r.to_json() + "\n" for r in [*live, recorded]))
    old = facts["lab_runs"]
    lab = pack.lab_runs([tmp_path], old)
    assert lab["nbval"] == {**old["nbval"], "03_z": "2 of 2 cells passed on 2025-12-02"}  # joins the others
    new_rows = [r for r in lab["rows"] if r["notebook"] == "03_z"]
    assert [r["step"] for r in new_rows] == ["vllm-embedded-journey", "hf-static-b64-embedded-journey"]
    assert lab["rows"][:len(old["rows"])] == old["rows"]  # the other notebooks' rows are kept
    assert lab["embedded_journey_ratio_vllm_over_hf_static_b64"] == pytest.approx(
        live[0].summary["output_tok_s"] / live[1].summary["output_tok_s"])
    assert lab["serve_compare"] == old["serve_compare"]  # no load test in this folder: the old comparison stays
    again = pack.lab_runs([tmp_path], lab)  # the same notebook packed again replaces its rows, never duplicates
    assert again["rows"] == lab["rows"] and again["nbval"] == lab["nbval"]
    assert lab["nbval_seconds"] == {**old.get("nbval_seconds", {}), "03_z": pytest.approx(62.0)}  # its live wall time
    (tmp_path / "nbval.log").write_text("labs/03_z::ipynb::Cell 0 PASSED\n")  # run again, with no durations table
    assert "03_z" not in pack.lab_runs([tmp_path], lab)["nbval_seconds"]  # its old time goes with its old line


def test_scheduler_sweep_recorded_one_engine_per_setting(facts, runs):
    from lablib.experiments.scheduling import scheduler_rows

    # the lab asks for two of the recorded settings and is shown the recording, all five (issue 28), the rest named
    shown = scheduler_rows([8, 64], force=False)
    assert not shown.live and shown.label.startswith("recorded on NVIDIA H200")
    assert [r["max_num_seqs"] for r in shown.value] == [8, 64, 256, 256, 256]
    assert shown.stand_ins["(max_num_seqs, max_num_batched_tokens)"]["asked"] == [[8, None], [64, None]]
    rows = recorded_rows("scheduler_sweep", "knobs")
    assert [(r["max_num_seqs"], r["max_num_batched_tokens"]) for r in rows] == [
        (8, None), (64, None), (256, None), (256, 512), (256, 2048)]
    assert all(r["back_to_baseline"] for r in rows)
    assert all(r["provenance"].startswith("recorded on NVIDIA H200") for r in rows)
    for r in rows:  # each row is the summary of its recorded Result
        res = runs[f"vllm-seqs{r['max_num_seqs']}-tok{r['max_num_batched_tokens']}"]
        assert res.summary["output_tok_s"] == pytest.approx(r["output_tok_s"], rel=1e-5)
        assert res.summary["ttft_s"]["p99"] == pytest.approx(r["ttft_p99_s"], rel=1e-5)


def test_packing_a_new_run_merges_onto_the_reference(pack, facts, runs, monkeypatch, tmp_path):
    import shutil

    out = tmp_path / "reference"
    shutil.copytree(REFERENCE_DIR, out)
    monkeypatch.setattr(pack, "OUT", out)
    run = tmp_path / "run"
    run.mkdir()
    budget = {**facts["scheduler_sweep"][-1], "max_num_batched_tokens": 8192, "output_tok_s": 1.0}  # a new setting
    seqs8 = {**facts["scheduler_sweep"][0], "output_tok_s": 2.0}  # the same setting measured again
    (run / "facts-knobs.json").write_text(json.dumps({"scheduler_sweep": [budget, seqs8]}))
    pack.main([run])
    merged = json.loads((out / "facts.json").read_text())
    keys = [(r["max_num_seqs"], r["max_num_batched_tokens"]) for r in merged["scheduler_sweep"]]
    assert keys == [(8, None), (64, None), (256, None), (256, 512), (256, 2048), (256, 8192)]
    assert merged["scheduler_sweep"][0]["output_tok_s"] == 2.0  # the newer measurement replaced the older
    assert merged["serve"] == facts["serve"] and merged["sweep"] == facts["sweep"]  # untouched facts kept
    assert (out / "h200.jsonl.gz").read_bytes() == (REFERENCE_DIR / "h200.jsonl.gz").read_bytes()  # no new Results
    new = dict(runs["serve-rate-inf"].to_dict(), step="serve-rate-99")  # a new rate sweep (of one rate)
    (run / "reference.jsonl").write_text(json.dumps(new) + "\n")
    pack.main([run])
    with gzip.open(out / "h200.jsonl.gz", "rt", encoding="utf-8") as f:
        steps = [json.loads(line)["step"] for line in f]
    assert [s for s in steps if s.startswith("serve-rate-")] == ["serve-rate-99"]  # the old sweep went whole
    assert set(steps) - {"serve-rate-99"} == {s for s in runs if not s.startswith("serve-rate-")}


def test_packing_scaling_parts_merges_their_rows(pack, facts, monkeypatch, tmp_path, load_script):
    """Lab 09's tp_scaling is recorded in parts (several commands, 2- and 4-GPU machines): each packed run adds its
    rows by (model, scheme, t, pp, all_reduce, batch), a part recorded again replaces only its own rows, and a lab
    folder's facts-tp_scaling.json (the live cell's) merges the same way."""
    import shutil

    from lablib.experiments.parallel.grid import SCALING_PARTS, scaling_part

    out = tmp_path / "reference"
    shutil.copytree(REFERENCE_DIR, out)
    monkeypatch.setattr(pack, "OUT", out)

    def row(run, batch, tpot):
        return {"model": run.model, "scheme": run.scheme, "t": run.t, "pp": run.pp, "all_reduce": run.all_reduce,
                "run": run.name, "batch": batch, "status": "measured", "tpot_ms": tpot}

    def part(name, tpot, day, gpus=2):
        d = tmp_path / f"{name}-{day}"
        d.mkdir()
        rows = [row(r, b, tpot) for r in scaling_part(**SCALING_PARTS[name]) for b in (1, 64)]
        (d / f"facts-{name}.json").write_text(json.dumps({"tp_scaling": {"rows": rows, "gpu": "NVIDIA H200",
                                                                         "gpu_count": gpus, "date": day}}))
        return d

    pack.main([part("tp-scaling-8b", 5.0, "2026-12-03"), part("tp-scaling-8b-x2", 6.0, "2026-12-03")])
    got = json.loads((out / "facts.json").read_text())["tp_scaling"]
    assert [(r["run"], r["batch"]) for r in got["rows"]] == [
        (n, b) for n in ("tp1", "tp2", "tp4", "tp2-nccl", "tp1-pp2") for b in (1, 64)]
    pack.main([part("tp-scaling-8b", 4.0, "2026-12-04", gpus=4)])  # the 8B's plain TP again, on 4 GPUs
    got = json.loads((out / "facts.json").read_text())["tp_scaling"]
    assert [r["tpot_ms"] for r in got["rows"]] == [4.0] * 6 + [6.0] * 4  # only that part's rows replaced
    assert got["gpu_count"] == 4 and got["dates"] == ["2026-12-03", "2026-12-04"]
    lab = tmp_path / "lab"
    (lab / "results").mkdir(parents=True)
    live = {"rows": [row(scaling_part(**SCALING_PARTS["tp-scaling-8b"])[1], 1, 3.0)], "gpu_count": 2,
            "date": "2026-12-05", "gpu": "NVIDIA H200"}
    (lab / "results" / "facts-tp_scaling.json").write_text(json.dumps(live))
    pack.main([], [lab])
    got = json.loads((out / "facts.json").read_text())["tp_scaling"]
    assert [r["tpot_ms"] for r in got["rows"]] == [4.0, 4.0, 3.0] + [4.0] * 3 + [6.0] * 4  # TP=2 batch 1 only
    steps = load_script("record_reference").STEPS
    assert set(SCALING_PARTS) <= set(steps) and "tp-scaling" in steps


def test_recorded_synthetic_runs_say_so_in_every_figure(runs):
    from lablib import plots
    from lablib.experiments.scheduling import scheduler_rows
    from lablib.models import LABEL
    from lablib.plots import scheduler_figure
    from lablib.plots import serving as plots_serving

    served = load_reference(prefix="serve-rate-")
    for fig in (plots_serving.latency_vs_rate(served), plots_serving.throughput_vs_rate(served),
                plots_serving.server_metrics_figure(served), scheduler_figure(scheduler_rows(force=False).value),
                plots.journey([runs["hf-static-b64-8b-journey"], runs["vllm-8b-journey"]])):
        assert LABEL in fig.layout.title.text and "recorded" in fig.layout.title.text
    embedded = [r for r in runs.values() if r.model.get("name") == "embedded"]
    assert embedded and LABEL not in plots.journey(embedded).layout.title.text
