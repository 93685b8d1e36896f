"""Every tracked notebook is committed clean, opening one in JupyterLab does not mark it modified, and git keeps it so.

Clean: no outputs, no execution counts, no metadata beyond `kernelspec` and `language_info` (cells: `tags`),
read as git would commit it (through the nbstripout filter where this clone has it active, else the file
as it is: CI's fresh clone). Unmodified on open: JupyterLab writes the kernel's own `kernelspec` and
`language_info` into a notebook when its kernel starts, and a difference marks it modified; the labs store
exactly what this Python's kernel reports (checked against a real kernel). The filter: a throwaway repository
with the tracked `.gitattributes` and `.nbstripout.gitconfig`, activated as scripts/setup.sh does, where a lab
saved with outputs (as JupyterLab's autosave writes it) shows no diff, and `git add` stages nothing.
"""
import json
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from lablib.instructor import notebooks

ROOT = Path(__file__).resolve().parents[1]
GIT = shutil.which("git")


def _git(*args: str, cwd: Path = ROOT, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False, **kw)


def tracked_notebooks() -> list[Path]:
    if GIT and _git("rev-parse", "--is-inside-work-tree").returncode == 0:
        listed = _git("ls-files", "--", "*.ipynb").stdout.split()
        return [ROOT / p for p in listed if (ROOT / p).exists()]
    return sorted(ROOT.glob("labs/*.ipynb"))  # not a git checkout (an unpacked archive): the labs


def committed_form(path: Path) -> dict:
    """The notebook as git would commit it: through the clean filter where one is active in this clone."""
    clean = None
    if GIT and "filter: nbstripout" in _git("check-attr", "filter", "--", str(path)).stdout:
        clean = _git("config", "filter.nbstripout.clean").stdout.strip() or None
    if clean is None:
        return nbformat.read(path, as_version=4)
    p = subprocess.run(clean, shell=True, cwd=ROOT, stdin=path.open("rb"), capture_output=True, timeout=60,
                       check=False)
    assert p.returncode == 0, f"the clean filter ({clean}) failed on {path}: {p.stderr.decode()[-1000:]}"
    return nbformat.reads(p.stdout.decode(), as_version=4)


@pytest.mark.parametrize("path", tracked_notebooks(), ids=lambda p: p.name)
def test_every_tracked_notebook_is_committed_clean(path):
    problems = notebooks.problems(committed_form(path), str(path.relative_to(ROOT)))
    assert not problems, ("\n".join(problems) + "\nFix: clear the outputs (Edit → Clear Outputs of All Cells) and save, "
                          "or activate the filter: see scripts/setup.sh (nbstripout)")


@pytest.fixture(scope="module")
def kernel_reports() -> dict:
    """What a started python3 kernel tells JupyterLab: its kernelspec and its language_info."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        info = kc.kernel_info(reply=True, timeout=60)["content"]["language_info"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    spec = km.kernel_spec
    return {"kernelspec": {"display_name": spec.display_name, "language": spec.language, "name": "python3"},
            "language_info": info}


def test_opening_a_lab_in_jupyterlab_rewrites_no_metadata(kernel_reports):
    versions = set()
    for path in notebooks.lab_notebooks():
        meta = nbformat.read(path, as_version=4).metadata
        assert meta.kernelspec == kernel_reports["kernelspec"], path.name
        stored = {k: v for k, v in meta.language_info.items() if k != "version"}
        assert stored == {k: v for k, v in kernel_reports["language_info"].items() if k != "version"}, path.name
        versions.add(meta.language_info.get("version"))
    assert len(versions) == 1, f"the labs record different Python versions: {versions}"
    here = kernel_reports["language_info"]["version"]
    if versions != {here}:
        pytest.skip(f"the labs record Python {versions.pop()}, this kernel is {here}: JupyterLab rewrites "
                    "language_info.version on open here (python -m lablib.instructor.notebooks rewrites it)")


def test_gitattributes_route_every_notebook_through_nbstripout():
    lines = (ROOT / ".gitattributes").read_text().splitlines()
    assert "*.ipynb filter=nbstripout" in lines and "*.ipynb diff=ipynb" in lines
    config = (ROOT / ".nbstripout.gitconfig").read_text()
    assert '[filter "nbstripout"]' in config and "required = true" in config and "--keep-id" in config


def _saved_with_outputs(path: Path) -> None:
    """What JupyterLab's autosave writes after a run: outputs, counts, the volatile metadata of a few tools."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = i + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 1000)]
        cell.metadata.update({"execution": {"iopub.status.idle": "2026-12-01T08:00:00Z"}, "scrolled": True,
                              "papermill": {"duration": 1.0}})
    nb.metadata.update({"widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}},
                        "papermill": {"duration": 9.0}, "vscode": {"interpreter": {}}})
    nbformat.write(nb, path)


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_a_lab_saved_with_outputs_shows_no_diff_and_commits_nothing_with_the_filter(tmp_path):
    repo = tmp_path / "clone"
    (repo / "labs").mkdir(parents=True)
    for f in (".gitattributes", ".nbstripout.gitconfig", "labs/01_batching.ipynb"):
        shutil.copy(ROOT / f, repo / f)
    (repo / ".venv").symlink_to(ROOT / ".venv", target_is_directory=True)  # the filter runs .venv/bin/python
    (repo / ".gitignore").write_text("/.venv\n")
    for args in (("init", "-q"), ("config", "user.email", "t@example.com"), ("config", "user.name", "t"),
                 # scripts/setup.sh's line:
                 ("config", "--local", "--replace-all", "include.path", str(repo / ".nbstripout.gitconfig"), "nbstripout"),
                 ("add", "."), ("commit", "-q", "-m", "labs")):
        assert _git(*args, cwd=repo).returncode == 0, args
    lab = repo / "labs" / "01_batching.ipynb"
    before = _git("show", "HEAD:labs/01_batching.ipynb", cwd=repo).stdout
    assert before == lab.read_text()  # committing the clean lab changed nothing in it (ids kept: --keep-id)
    _saved_with_outputs(lab)
    assert "x" * 1000 in lab.read_text()
    assert _git("diff", "--exit-code", cwd=repo).returncode == 0  # the filtered lab is the committed one
    # git status may list it until an add re-hashes it (a clean filter changed its size); the add stages nothing
    assert _git("add", "-A", cwd=repo).returncode == 0
    assert _git("status", "--porcelain", cwd=repo).stdout == ""
    assert _git("commit", "-q", "-m", "after a run", cwd=repo).returncode != 0  # nothing to commit
    assert _git("rev-list", "--count", "HEAD", cwd=repo).stdout.strip() == "1"
    committed = nbformat.reads(_git("show", "HEAD:labs/01_batching.ipynb", cwd=repo).stdout, as_version=4)
    assert notebooks.problems(committed, "01_batching") == []
    assert json.loads(before)["cells"][1]["id"] == committed.cells[1]["id"]
