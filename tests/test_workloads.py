"""The workload sets: they load, match their manifest and tokenizer, and have the shapes the labs rely on."""

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from lablib.workloads import (
    Request,
    Workload,
    check_tokenizer,
    data_root,
    length_stats,
    list_workloads,
    load_manifest,
    load_workload,
)

ROOT = Path(__file__).resolve().parent.parent
SETS = ["journey", "shared-prefix-128", "shared-prefix-512", "shared-prefix-1024", "calibration", "evaluation"]


@pytest.fixture(scope="module")
def tok():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(ROOT / "data" / "models" / "target")


@pytest.fixture(scope="module")
def sets() -> dict[str, Workload]:
    return {name: load_workload(name) for name in list_workloads()}


@pytest.fixture
def data_copy(tmp_path: Path) -> Path:
    shutil.copytree(data_root() / "workloads", tmp_path / "workloads")
    return tmp_path


def common_prefix(seqs: list[list[int]]) -> int:
    n = 0
    while all(len(s) > n for s in seqs) and len({s[n] for s in seqs}) == 1:
        n += 1
    return n


# --- the manifest -------------------------------------------------------------------------------


def test_every_set_is_listed_and_loads(sets):
    assert list(sets) == SETS
    for name, w in sets.items():
        entry = w.manifest
        assert w.name == name and w.version == entry["version"] >= 1
        assert len(w) == entry["num_requests"] and w.label == f"{name}@v{w.version}"
        assert len({r.id for r in w}) == len(w)


def test_counts_and_stats_match_the_manifest(sets):
    for w in sets.values():
        assert w.stats() == w.manifest["stats"]
        assert w.total_prompt_tokens == w.manifest["stats"]["prompt_tokens"]["total"]
        assert w.total_output_tokens == w.manifest["stats"]["output_tokens"]["total"]
        assert all(p + o <= 2048 for p, o in w.lengths)


def test_provenance_names_the_real_corpus():
    corpus = ROOT / "data" / "corpus" / "test.jsonl.gz"
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()
    for entry in load_manifest()["workloads"].values():
        assert entry["provenance"]["corpus_sha256"] == digest
        assert entry["provenance"]["script"] == "scripts/build_workloads.py"


def test_readme_is_generated_from_the_manifest():
    readme = (data_root() / "workloads" / "README.md").read_text()
    for name, entry in load_manifest()["workloads"].items():
        stats = entry["stats"]["prompt_tokens"]
        assert f"| {name} | {entry['version']} | {entry['num_requests']} | {stats['min']} |" in readme
        assert entry["sha256"] in readme


# --- the shapes the labs rely on ----------------------------------------------------------------


def test_journey_mixes_short_and_long_prompts_with_a_heavy_output_tail(sets):
    w = sets["journey"]
    assert len(w) == 64
    short = [n for n in w.prompt_lengths if 16 <= n <= 96]
    long = [n for n in w.prompt_lengths if 256 <= n <= 1024]
    assert len(short) == 48 and len(long) == 16
    stats = w.stats()["output_tokens"]
    assert 8 <= stats["min"] and stats["max"] <= 512
    assert stats["p90"] / stats["p50"] > 2
    assert len({r.prompt for r in w}) == 64


def test_shared_prefix_sets_share_exactly_their_first_n_tokens(sets, tok):
    for n in (128, 512, 1024):
        w = sets[f"shared-prefix-{n}"]
        assert len(w) == 32 and set(w.output_lengths) == {32}
        assert w.manifest["shared_prefix_tokens"] == n
        assert {r.meta["shared_prefix_tokens"] for r in w} == {n}
        ids = w.prompt_ids(tok)
        assert common_prefix(ids) == n
        assert len({tuple(x[n:]) for x in ids}) == 32  # distinct suffixes


def test_shared_prefix_is_shared_in_chat_form_too(sets, tok):
    for n in (128, 512, 1024):
        w = sets[f"shared-prefix-{n}"]
        assert len({r.messages[0]["content"] for r in w}) == 1  # one system message
        texts = w.chat_prompts(tok)
        ids = w.chat_prompt_ids(tok)
        assert common_prefix(ids) == w.manifest["shared_prefix_chat_tokens"] > n
        assert all(t.startswith(texts[0][:len(w.requests[0].messages[0]["content"])]) for t in texts)


def test_calibration_and_evaluation_come_from_disjoint_files(sets):
    cal, ev = sets["calibration"], sets["evaluation"]
    assert len(cal) == 64 and 1 <= len(ev) <= 64
    assert set(cal.prompt_lengths) == set(ev.prompt_lengths) == {512}
    cal_files, ev_files = {r.meta["source"] for r in cal}, {r.meta["source"] for r in ev}
    assert not cal_files & ev_files
    assert not set(cal.manifest["source_files"]) & set(ev.manifest["source_files"])


def test_stored_prompt_tokens_match_the_embedded_tokenizer(sets, tok):
    for w in sets.values():
        check_tokenizer(w, tok)  # recounts every prompt; raises on any difference
    ids = sets["journey"].prompt_ids(tok)
    assert [len(x) for x in ids] == sets["journey"].prompt_lengths and {x[0] for x in ids} == {tok.bos_token_id}


def test_chat_form_renders_through_the_embedded_template(sets, tok):
    w = sets["journey"].head(4)
    for r, text, ids in zip(w, w.chat_prompts(tok), w.chat_prompt_ids(tok)):
        assert text.startswith("<|bos|><|system|>\nYou complete Python code.")
        assert text.endswith("<|assistant|>\n") and r.prompt in text
        assert ids.count(tok.bos_token_id) == 1


# --- helpers and errors -------------------------------------------------------------------------


def test_head_and_limit_keep_the_first_requests(sets):
    w = load_workload("journey", limit=5)
    assert [r.id for r in w] == [r.id for r in sets["journey"].requests[:5]]
    assert w.label == "journey@v1[:5]" and w.head(100).requests == w.requests
    assert w.lengths == list(zip(w.prompt_lengths, w.output_lengths))


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(ValueError, match=r"unknown workload 'jouney'.*'journey'.*list_workloads"):
        load_workload("jouney")


@pytest.mark.parametrize("limit", [0, -3, 2.5, True])
def test_bad_limit_is_refused(limit):
    with pytest.raises(ValueError, match=rf"Workload\.limit={re.escape(repr(limit))}: allowed integers >= 1"):
        load_workload("journey", limit=limit)


def test_modified_file_is_refused_with_the_rebuild_command(data_copy):
    path = data_copy / "workloads" / "journey.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[0])
    row["max_new_tokens"] += 1
    path.write_text(json.dumps(row) + "\n" + "".join(lines[1:]))
    with pytest.raises(ValueError, match=r"corrupt or was modified.*python scripts/build_workloads.py"):
        load_workload("journey", data_dir=data_copy)
    assert len(load_workload("calibration", data_dir=data_copy)) == 64  # the others still load


def test_data_folder_follows_the_environment(data_copy, monkeypatch):
    monkeypatch.setenv("LABLIB_DATA", str(data_copy))
    assert data_root() == data_copy
    (data_copy / "workloads" / "evaluation.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="corrupt or was modified"):
        load_workload("evaluation")
    monkeypatch.setenv("LABLIB_DATA", str(data_copy / "nowhere"))
    with pytest.raises(FileNotFoundError, match="build_workloads.py"):
        list_workloads()


def test_a_different_tokenizer_is_caught(sets):
    class CharTokenizer:
        name_or_path = "chars"

        def __call__(self, texts, add_special_tokens=True):
            return {"input_ids": [[1] * add_special_tokens + [ord(c) for c in t] for t in texts]}

    with pytest.raises(ValueError, match=r"'chars' does not match workload journey@v1.*data/models/target"):
        check_tokenizer(sets["journey"], CharTokenizer())
    with pytest.raises(ValueError, match="no chat template"):
        sets["journey"].chat_prompts(CharTokenizer())


def test_request_and_workload_validate_their_fields():
    msgs = ({"role": "user", "content": "x"},)
    with pytest.raises(ValueError, match=r"Request\(a\)\.max_new_tokens=-1: allowed integers >= 0"):
        Request("a", "x = 1", msgs, -1, 4)
    with pytest.raises(ValueError, match=r"messages\[0\].*'role'"):
        Request("a", "x = 1", ({"content": "x"},), 8, 4)
    r = Request("a", "x = 1", msgs, 8, 4)
    with pytest.raises(ValueError, match=r"ids \['a'\] repeat"):
        Workload("w", 1, "", (r, r))
    with pytest.raises(ValueError, match=r"Workload\(w\)\.version=0: allowed integers >= 1"):
        Workload("w", 0, "", (r,))
    assert Request.from_dict(r.to_dict()) == r


def test_length_stats_interpolate_like_numpy():
    assert length_stats([1, 2, 3, 4]) == {"min": 1, "p50": 2.5, "mean": 2.5, "p90": 3.7, "max": 4, "total": 10}
