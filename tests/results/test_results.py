"""The Result record: per-request arithmetic, percentiles, summaries, JSON round trips and the
append-only store that survives a torn last line. Pure Python and numpy: milliseconds."""

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from lablib.results import (
    RequestRecord,
    Result,
    ResultStore,
    load_results,
    summarise,
)
from lablib.stats import PERCENTILES, distribution, percentile, percentile_of


def rec(i: int = 0, **kw) -> RequestRecord:
    base = dict(request_id=f"r{i}", prompt_tokens=10 + i, output_tokens=4, arrival=0.0, start=0.5,
                first_token=1.0, last_token=1.6, finished=2.0, token_times=[1.0, 1.1, 1.3, 1.6],
                output_ids=[5, 6, 7, 8])
    return RequestRecord(**{**base, **kw})


def result(step: str = "hf-naive", n: int = 3, wall_s: float = 4.0, **kw) -> Result:
    return Result(lab="test", step=step, engine="hf-naive", config={"batch_size": 1}, model={"name": "embedded"},
                  workload={"name": "journey", "version": 1, "requests": n},
                  requests=[rec(i) for i in range(n)], wall_s=wall_s, **kw)


# --- one request --------------------------------------------------------------------------------


def test_request_record_latencies():
    r = rec(arrival=0.25)
    assert r.ttft == pytest.approx(0.75)
    assert r.tpot == pytest.approx(0.6 / 3)
    assert r.e2e == pytest.approx(1.75)  # to finished, not to last_token: static batching hands back late
    assert r.itls == pytest.approx([0.1, 0.2, 0.3])
    assert r.prefill_s == pytest.approx(0.5)  # from start, not arrival: queueing is not prefill
    assert r.decode_s == pytest.approx(0.6)


def test_request_record_edge_cases():
    r = rec(start=None, finished=None)
    assert r.prefill_s == pytest.approx(1.0)  # no start: measured from arrival
    assert r.e2e == pytest.approx(1.6)  # no finished: last token is the end
    one = rec(output_tokens=1, last_token=1.0, token_times=[1.0])
    assert one.tpot is None and one.itls == [] and one.decode_s == 0.0
    pending = RequestRecord("p", 5, 3)
    assert (pending.ttft, pending.tpot, pending.e2e, pending.prefill_s, pending.decode_s) == (None,) * 5
    assert pending.itls == []


# --- aggregates ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
def test_percentile_matches_numpy(n):
    rng = random.Random(n)
    xs = [rng.lognormvariate(0, 1) for _ in range(n)]
    for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)


def test_percentile_and_distribution_skip_none():
    assert percentile_of([], 50) is None and percentile_of([None, None], 50) is None
    assert percentile_of([3.0, None, 1.0], 50) == 2.0
    d = distribution([1.0, None, 2.0, 3.0, 4.0])
    assert d["mean"] == 2.5 and d["p50"] == 2.5 and set(d) == {"mean", *(f"p{q}" for q in PERCENTILES)}
    assert distribution([None]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_summarise_throughput_arithmetic():
    reqs = [rec(0, output_tokens=4), rec(1, output_tokens=6, last_token=2.0, token_times=None)]
    s = summarise(reqs, wall_s=2.5)
    assert (s["requests"], s["prompt_tokens"], s["output_tokens"]) == (2, 21, 10)
    assert s["output_tok_s"] == pytest.approx(10 / 2.5)
    assert s["total_tok_s"] == pytest.approx(31 / 2.5)
    assert s["requests_s"] == pytest.approx(2 / 2.5)
    assert s["ttft_s"]["p50"] == pytest.approx(1.0)
    assert s["tpot_s"]["mean"] == pytest.approx((0.6 / 3 + 1.0 / 5) / 2)
    assert s["itl_s"]["mean"] == pytest.approx(0.2)  # only the request that has token times
    assert s["e2e_s"]["p99"] == pytest.approx(2.0)
    assert s["prefill_s"] == pytest.approx(1.0) and s["decode_s"] == pytest.approx(1.6)
    assert math.isfinite(summarise([], 0.0)["output_tok_s"])  # an empty run does not divide by zero


# --- the record ---------------------------------------------------------------------------------


def test_result_summarises_itself_and_round_trips_through_json():
    r = result(notes=["a note"], memory={"source": "rss", "peak_bytes": 123}, roofline={"mbu": "unknown"})
    assert r.summary == summarise(r.requests, r.wall_s)
    back = Result.from_dict(json.loads(r.to_json()))
    assert back == r
    assert isinstance(back.requests[0], RequestRecord) and back.requests[0].itls == r.requests[0].itls


def test_to_json_handles_numpy_scalars_and_paths(tmp_path):
    r = result(engine_facts={"kv": np.int64(7), "where": tmp_path, "dims": (1, 2)})
    facts = json.loads(r.to_json())["engine_facts"]
    assert facts == {"kv": 7, "where": str(tmp_path), "dims": [1, 2]}


def test_bad_provenance_is_refused():
    with pytest.raises(ValueError, match="provenance='bogus'"):
        result(provenance="bogus")


def test_recorded_label_names_the_gpu_and_date():
    r = result("vllm-b8", provenance="recorded", hardware={"gpu": "NVIDIA H200"}, recorded_at="2026-11-29T10:00:00")
    assert r.label == "vllm-b8 (recorded on NVIDIA H200, 2026-11-29)"
    assert result("hf-naive").label == "hf-naive"  # live runs need no qualifier


# --- the store ----------------------------------------------------------------------------------


def test_store_appends_and_loads_in_order(tmp_path):
    store = ResultStore(tmp_path / "sub" / "runs.jsonl")
    assert store.load() == []
    runs = [result(f"step-{i}", n=i + 1) for i in range(3)]
    for r in runs:
        store.append(r)
    assert store.path.read_text().count("\n") == 3
    assert store.load() == runs


def test_torn_last_line_is_skipped_with_a_warning(tmp_path):
    store = ResultStore(tmp_path / "runs.jsonl")
    runs = [result("a"), result("b")]
    for r in runs:
        store.append(r)
    with open(store.path, "a") as f:
        f.write(result("c").to_json()[:200])  # power lost mid-write
    with pytest.warns(UserWarning, match=r"runs.jsonl:3: skipped"):
        loaded = store.load()
    assert loaded == runs
    store.append(result("d"))  # the next run starts a fresh line: only the torn record is lost
    with pytest.warns(UserWarning, match=r"runs.jsonl:3: skipped"):
        assert [r.step for r in store.load()] == ["a", "b", "d"]
    store.append(result("e"))
    with pytest.warns(UserWarning):
        assert [r.step for r in store.load()] == ["a", "b", "d", "e"]


def test_a_run_of_no_requests_is_neither_stored_nor_read_back(tmp_path):
    """A run interrupted before its first request measured nothing: not written, and a line of one that an older
    lablib wrote is skipped on load (a chart would draw it as a run at 0 tok/s); a partial run is kept, marked."""
    store = ResultStore(tmp_path / "runs.jsonl")
    empty = result("interrupted", n=0)
    assert empty.summary["output_tok_s"] == 0 and store.append(empty) is False and not store.path.exists()
    cut = result("cut", n=1, notes=["partial run: interrupted after 1 of 3 requests: KeyboardInterrupt"])
    assert store.append(result("whole")) is True and store.append(cut) is True
    with open(store.path, "a") as f:
        f.write(empty.to_json() + "\n")  # as an older lablib stored it
    assert [(r.step, r.partial) for r in store.load()] == [("whole", False), ("cut", True)]
    assert [r.step for r in load_results(tmp_path)] == ["whole", "cut"]


def test_load_results_over_a_folder_with_gzip(tmp_path):
    ResultStore(tmp_path / "a.jsonl").append(result("plain"))
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(result("zipped-1").to_json() + "\n" + result("zipped-2").to_json() + "\n")
    (tmp_path / "notes.txt").write_text("not results")
    got = load_results(tmp_path)
    assert [r.step for r in got] == ["plain", "zipped-1", "zipped-2"]
    assert [r.step for r in load_results(tmp_path / "b.jsonl.gz", tmp_path / "a.jsonl")] == \
        ["zipped-1", "zipped-2", "plain"]


def test_every_store_lands_in_the_one_results_folder(tmp_path, monkeypatch):
    from lablib.results import store as store_mod

    monkeypatch.delenv("LABLIB_RESULTS", raising=False)
    root = Path(store_mod.__file__).resolve().parents[2]
    assert store_mod.results_dir() == root / "results"  # from a clone: the repository's results/, whatever the cwd
    monkeypatch.chdir(root / "labs")  # where nbval and Jupyter run a lab
    assert ResultStore.for_lab("01_batching").path == root / "results" / "01_batching.jsonl"
    monkeypatch.setenv("LABLIB_RESULTS", str(tmp_path))
    assert ResultStore.for_lab("07_prefix_caching").path == tmp_path / "07_prefix_caching.jsonl"
    for bad in ("", "labs/01", ".hidden"):
        with pytest.raises(ValueError, match="ResultStore.for_lab.lab"):
            ResultStore.for_lab(bad)


def test_no_lab_writes_outside_the_results_folder():
    """Every lab builds its store with ResultStore.for_lab, never a path of its own (issue: one results/ folder)."""
    import json

    root = Path(__file__).resolve().parents[2]
    for nb in sorted((root / "labs").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        assert "ResultStore(" not in code and "'results/" not in code and '"results/' not in code, nb.name


def test_outputs_agree_says_how_many_are_identical_and_where_the_others_part():
    from lablib.results import RequestRecord, Result
    from lablib.results.compare import outputs_agree

    def result(ids):
        reqs = [RequestRecord(f"r{i}", 10, len(o), first_token=0.1, last_token=0.2, output_ids=o)
                for i, o in enumerate(ids)]
        return Result("t", "s", "vllm", {}, {"name": "embedded"}, {"name": "w"}, reqs, 1.0)

    got = outputs_agree(result([[1, 2, 3], [4, 5, 6]]), result([[1, 2, 3], [4, 9, 6]]))
    assert (got["identical"], got["of"]) == (1, 2) and got["diverged"] == [
        {"request_id": "r1", "first_divergence": 1, "output_tokens": 3}]
    short = outputs_agree(result([[1, 2]]), result([[1, 2, 3]]))  # one stopped early: it parts where it stopped
    assert short["diverged"] == [{"request_id": "r0", "first_divergence": 2, "output_tokens": 2}]
