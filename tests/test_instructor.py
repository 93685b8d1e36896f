"""lablib.instructor: the run-all on real labs, and on notebooks made to fail.

The real labs are 00 and 03 (on a 2-core CPU about 20 s and 10 s): 00 runs the embedded model, 03 draws
plotly figures and a widget panel, so tests/test_export.py reads the HTML of this same run (conftest.py's
`run_labs` executes once per set of labs in a pytest process). The failures are tiny notebooks written into
tmp_path, run through the real command line (`python -m lablib.instructor`) for its exit code and its message.
"""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from lablib.instructor import run as instructor

ROOT = Path(__file__).resolve().parents[1]


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(s[2:]) if s.startswith("# ") else nbformat.v4.new_code_cell(s)
                for s in sources]
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_real_labs_run_and_the_index_gives_each_its_status_wall_time_and_html(capfd, run_labs):
    rc, out = run_labs("00", "03")
    assert rc == 0
    assert "without encryption" not in capfd.readouterr().err  # the kernels' start-up chatter stays out of the run
    index = json.loads((out / "index.json").read_text())
    assert index["ok"] and [r["lab"] for r in index["labs"]] == ["00_setup", "03_kv_cache"]
    page = (out / "index.html").read_text()
    for r in index["labs"]:
        assert r["status"] == "ok" and r["wall_s"] > 0 and not r["failure"]
        assert r["mode"].startswith(("RECORDED:", "LIVE:"))  # the lab's own banner, from its first cell
        assert f"href='{r['html']}'" in page and f"{r['wall_s']:.1f} s" in page
        executed = nbformat.read(out / r["notebook"], as_version=4)
        assert all(c.execution_count for c in executed.cells if c.cell_type == "code")  # every cell ran
        assert (out / r["html"]).stat().st_size > 10_000


def test_a_failing_cell_exits_1_naming_the_notebook_and_the_cell_and_the_next_lab_still_runs(tmp_path):
    bad = _notebook(tmp_path / "10_bad.ipynb", "# A lab that fails", "x = 1", "# Step 2",
                    "\ny = x + 1  # the cell that fails\nraise ValueError(f'deliberate: y={y}')", "print('never')")
    good = _notebook(tmp_path / "11_good.ipynb", "print('fine')")
    p = subprocess.run([sys.executable, "-m", "lablib.instructor", "--out", str(tmp_path / "out"),
                        "--labs", str(bad), str(good)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    # papermill puts an error note above the notebook's cells; the cell is named as it is in the lab itself
    want = f"{bad}: cell 3 (code cell 2, first line `y = x + 1  # the cell that fails`) failed: ValueError: deliberate: y=2"
    assert want in p.stderr.splitlines(), p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["ok"] is False and "failed: 10_bad" in summary["summary"]
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert [(r["lab"], r["status"]) for r in index["labs"]] == [("10_bad", "failed"), ("11_good", "ok")]
    assert index["labs"][0]["failure"]["cell"] == 3
    assert "deliberate: y=2" in (tmp_path / "out" / "10_bad.html").read_text()  # the HTML shows the traceback
    assert "deliberate: y=2" in (tmp_path / "out" / "index.html").read_text()


def test_quick_reaches_the_kernels_as_LABLIB_MODE_recorded(tmp_path, monkeypatch):
    monkeypatch.delenv("LABLIB_MODE", raising=False)
    lab = _notebook(tmp_path / "12_env.ipynb", "import os; print(os.environ.get('LABLIB_MODE'))")
    seen = {}
    for flag in ("--quick", "--full"):
        out = tmp_path / flag.strip("-")
        assert instructor.main(["--out", str(out), "--labs", str(lab), flag]) == 0
        seen[flag] = nbformat.read(out / "12_env.ipynb", as_version=4).cells[0].outputs[0]["text"].strip()
        assert json.loads((out / "index.json").read_text())["speed"] == flag.strip("-")
    assert seen == {"--quick": "recorded", "--full": "None"}
    assert "LABLIB_MODE" not in __import__("os").environ  # the instructor's own environment is left as it was


def test_a_model_the_labs_do_not_run_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit) as e:
        instructor.main(["--out", str(tmp_path / "out"), "--model", "qwen2.5-0.5b"])
    assert str(e.value).startswith("Instructor.model='qwen2.5-0.5b': allowed one of ['embedded']")
    assert "Fix: " in str(e.value) and not (tmp_path / "out").exists()


def test_labs_are_chosen_by_number_name_or_path(tmp_path):
    assert [p.stem for p in instructor.select(["00", "03_kv_cache"])] == ["00_setup", "03_kv_cache"]
    assert [p.stem for p in instructor.select(None)] == [p.stem for p in sorted((ROOT / "labs").glob("*.ipynb"))]
    path = _notebook(tmp_path / "x.ipynb", "1")
    assert instructor.select([str(path)]) == [path.resolve()]
    with pytest.raises(ValueError, match=r"^Instructor.labs='99': allowed a notebook path or one of \["):
        instructor.select(["99"])
