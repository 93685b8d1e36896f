"""Colab: every lab carries its badge, and its first cell works from Colab's working directory.

Colab opens a notebook from GitHub with the working directory `/content`; a clone made there lives in
`/content/<repo>`. The tests lay out such a clone under tmp_path (`content/REPO/` with pyproject.toml,
lablib/, data/ and labs/) and run, from `content/`, first labs/bootstrap.py in a plain Python process, then
a lab's real first cell in a kernel. On this machine lablib is also installed (editable, from the
working copy): the checks are that the clone's own lablib is the one imported, and that nothing is
installed (pip runs only where the clone's package is not installed at all, a fresh Colab runtime).
Cloning from GitHub needs the network and Colab: not tested here.
"""
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest

from lablib.instructor import notebooks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """`content/` holding a clone `REPO/` laid out as Colab's `git clone` leaves it (data/ linked, not copied)."""
    content = tmp_path_factory.mktemp("colab") / "content"
    clone = content / "REPO"
    shutil.copytree(ROOT / "lablib", clone / "lablib", ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "labs").mkdir()
    for f in ("labs/bootstrap.py", "labs/00_setup.ipynb", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, clone / f)
    (clone / "data").symlink_to(ROOT / "data", target_is_directory=True)
    (content / "sample_data").mkdir()  # what a fresh Colab runtime has beside the clone
    return content


def test_bootstrap_puts_the_clones_lablib_first_from_colabs_working_directory(colab):
    code = ("import json, runpy, sys; runpy.run_path(sys.argv[1]); import lablib; "
            "print(json.dumps({'lablib': lablib.__file__, 'path0': sys.path[0]}))")
    p = subprocess.run([sys.executable, "-c", code, "REPO/labs/bootstrap.py"], cwd=colab, capture_output=True,
                       text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.strip().splitlines()
    got = json.loads(lines[-1])
    assert Path(got["lablib"]).resolve() == (colab / "REPO" / "lablib" / "__init__.py").resolve()
    assert Path(got["path0"]).resolve() == (colab / "REPO").resolve()
    assert lines[-2].startswith(("RECORDED:", "LIVE:")), lines  # the mode banner
    assert "installing" not in p.stdout  # lablib is installed here: bootstrap must not pip install the tmp clone


def test_bootstrap_imports_an_uninstalled_clone_whose_dependencies_are_all_there(colab):
    """The GPU machine: the clone on PYTHONPATH, never pip-installed, every dependency present, no registry to
    reach. Bootstrap must import the clone as it is (pip install -e would fail there, offline), and must still
    install where a dependency is missing (a fresh Colab runtime)."""
    code = ("import importlib.metadata as m, runpy, sys; real = m.distribution\n"
            "def fake(name):\n"
            "    if name in ('lablib', *sys.argv[2:]): raise m.PackageNotFoundError(name)\n"
            "    return real(name)\n"
            "m.distribution = fake\n"
            "import subprocess; run = subprocess.run  # pip intercepted, any other process runs\n"
            "import os; rc = int(os.environ.get('PIP_RC', '0'))  # what the fake pip answers\n"
            "subprocess.run = lambda *a, **k: (print('PIP', a[0][2:6]), subprocess.CompletedProcess(a[0], rc, '', "
            "'ERROR: No matching distribution found for plotly'))[1] if 'pip' in a[0] else run(*a, **k)\n"
            "runpy.run_path(sys.argv[1]); import lablib; print(lablib.__file__)")
    as_is = subprocess.run([sys.executable, "-c", code, "REPO/labs/bootstrap.py"], cwd=colab, capture_output=True,
                           text=True, timeout=120, check=False)
    assert as_is.returncode == 0, as_is.stderr[-2000:]
    assert "installing" not in as_is.stdout and "PIP" not in as_is.stdout, as_is.stdout
    assert Path(as_is.stdout.split()[-1]).resolve() == (colab / "REPO" / "lablib" / "__init__.py").resolve()
    fresh = subprocess.run([sys.executable, "-c", code, "REPO/labs/bootstrap.py", "plotly"], cwd=colab,
                           capture_output=True, text=True, timeout=120, check=False)
    assert "installing" in fresh.stdout and "for plotly" in fresh.stdout, fresh.stdout
    assert "PIP ['pip', 'install', '-q', '-e']" in fresh.stdout, fresh.stdout
    old = code.replace("m.distribution = fake\n", "m.distribution = fake\nv = m.version\n"
                       "m.version = lambda name: '4.57.0' if name == 'transformers' else v(name)\n")
    stale = subprocess.run([sys.executable, "-c", old, "REPO/labs/bootstrap.py"], cwd=colab, capture_output=True,
                           text=True, timeout=120, check=False)  # a runtime with transformers 4: too old
    pin = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
               if d.startswith("transformers"))[len("transformers"):]  # as pyproject states it, lower bound first
    assert f"for transformers 4.57.0 (needs {pin})" in stale.stdout and "PIP" in stale.stdout, stale.stdout
    offline = subprocess.run([sys.executable, "-c", code, "REPO/labs/bootstrap.py", "plotly"], cwd=colab,
                             capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "PIP_RC": "1"})
    assert offline.returncode != 0 and "RuntimeError: lablib needs plotly" in offline.stderr, offline.stderr[-2000:]
    assert "No matching distribution found for plotly" in offline.stderr and "-m pip install 'plotly'" in offline.stderr
    stale_offline = subprocess.run([sys.executable, "-c", old, "REPO/labs/bootstrap.py"], cwd=colab, capture_output=True,
                                   text=True, timeout=120, check=False, env={**os.environ, "PIP_RC": "1"})
    assert f"-m pip install 'transformers{pin}'" in stale_offline.stderr, stale_offline.stderr[-2000:]


def test_bootstrap_without_a_clone_around_uses_the_installed_lablib(tmp_path):
    shutil.copy(ROOT / "labs" / "bootstrap.py", tmp_path / "bootstrap.py")  # notebooks copied out of the clone
    code = "import runpy, sys; runpy.run_path(sys.argv[1]); import lablib; print(lablib.__file__)"
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "bootstrap.py")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert Path(p.stdout.split()[-1]).resolve() == (ROOT / "lablib" / "__init__.py").resolve()


def _run_cells(cells: list[str], cwd: Path) -> list[list[dict]]:
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, kernel_name="python3", timeout=180, allow_errors=True,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return [c.outputs for c in nb.cells]


def _text(outputs: list[dict]) -> str:
    return "".join(o.get("text", "") + "".join(o.get("data", {}).get("text/plain", "")) for o in outputs)


def test_the_first_cell_runs_from_content_and_says_what_to_do_without_a_clone(colab, tmp_path):
    first = nbformat.read(colab / "REPO" / "labs" / "00_setup.ipynb", as_version=4).cells[1].source
    assert first == notebooks.first_cell(notebooks.colab_repo())
    outs = _run_cells([f"%cd {tmp_path}", first,  # a folder with no clone below it, outside Colab
                       f"%cd {colab}", first,
                       "import lablib, plotly.io; print(lablib.__file__); print(plotly.io.renderers.default)"], colab)
    missing = [o for o in outs[1] if o.get("output_type") == "error"]
    assert missing and missing[0]["ename"] == "AssertionError" and "labs/bootstrap.py not found" in missing[0]["evalue"]
    assert not [o for o in outs[3] if o.get("output_type") == "error"], outs[3]
    assert "RECORDED:" in _text(outs[3]) or "LIVE:" in _text(outs[3])
    where, renderer = _text(outs[4]).split()
    assert Path(where).resolve() == (colab / "REPO" / "lablib" / "__init__.py").resolve()
    assert renderer == "plotly_mimetype+notebook"  # what bootstrap sets in a plain Jupyter kernel


def test_every_lab_carries_the_colab_link_and_first_cell_of_the_recorded_repository():
    """The links open pyproject.toml's repository; with none recorded there are none at all (no link to a placeholder,
    no remote badge image to break offline) and the README says the one command that adds them."""
    assert notebooks.sync(check=True) == [], "run: python -m lablib.instructor.notebooks"
    repo = notebooks.colab_repo()
    readme = (ROOT / "README.md").read_text()
    assert notebooks.readme_badges(notebooks.lab_notebooks(), repo) in readme
    for path in [*notebooks.lab_notebooks(), ROOT / "README.md"]:
        text = path.read_text()
        assert "OWNER/REPO" not in text and "colab-badge.svg" not in text, path.name
        if repo is None:
            assert "colab.research.google.com" not in text, path.name
    for path in notebooks.lab_notebooks():
        nb = nbformat.read(path, as_version=4)
        md = next(c for c in nb.cells if c.cell_type == "markdown").source
        assert next(c for c in nb.cells if c.cell_type == "code").source == notebooks.first_cell(repo)
        if repo is not None:
            assert md.splitlines()[2] == notebooks.badge(path.name, repo), md[:300]  # the paragraph after the title
    if repo is None:
        assert notebooks.PUBLISH in readme


def test_publishing_writes_the_repository_once_and_every_link_from_it(tmp_path):
    """`--repo`: the repository goes into pyproject.toml's [project.urls], then the labs' links and first cells,
    and the README's list, follow it; run again with another, every one moves."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    labs = tmp_path / "labs"
    labs.mkdir()
    for p in notebooks.lab_notebooks()[:2]:
        shutil.copy(p, labs / p.name)
    (tmp_path / "README.md").write_text(f"x\n{notebooks.readme_badges([], None)}\ny\n")
    for repo in ("me/lab", "you/fork"):
        notebooks.set_colab_repo(repo, tmp_path / "pyproject.toml")
        assert notebooks.colab_repo(tmp_path / "pyproject.toml") == repo
        notebooks.sync(labs, tmp_path / "README.md", repo=repo)
        assert notebooks.sync(labs, tmp_path / "README.md", check=True, repo=repo) == []
        for p in notebooks.lab_notebooks(labs):
            nb = nbformat.read(p, as_version=4)
            assert nb.cells[0].source.splitlines()[2] == notebooks.badge(p.name, repo)
            assert f"https://github.com/{repo}'" in notebooks.first_cell(repo)
            assert next(c for c in nb.cells if c.cell_type == "code").source == notebooks.first_cell(repo)
        assert f"github/{repo}/blob/main/labs/00_setup.ipynb" in (tmp_path / "README.md").read_text()
    import tomllib

    urls = tomllib.loads((tmp_path / "pyproject.toml").read_text())["project"]["urls"]
    assert urls == {"Repository": "https://github.com/you/fork"}  # replaced, not added twice
    with pytest.raises(ValueError, match="owner/name"):
        notebooks.set_colab_repo("not a repo", tmp_path / "pyproject.toml")


def test_the_remote_is_read_as_github_owner_and_name():
    for url in ("https://github.com/me/lab.git", "git@github.com:me/lab.git", "https://github.com/me/lab",
                "ssh://git@github.com/me/lab.git\n"):
        assert notebooks.github_repo(url) == "me/lab", url
    assert notebooks.github_repo("https://gitlab.com/me/lab.git") is None


def test_the_link_goes_after_the_title_once_and_follows_the_repository():
    md = "# Lab 09 — Something\n\n**Objectives**\n- one"
    once = notebooks.with_badge(md, "09_x.ipynb", "me/lab")
    assert once.splitlines()[:4] == ["# Lab 09 — Something", "", notebooks.badge("09_x.ipynb", "me/lab"), ""]
    moved = notebooks.with_badge(once, "09_x.ipynb", "you/fork")
    assert moved.count("Open in Colab") == 1 and "github/you/fork/blob/main/labs/09_x.ipynb" in moved
    assert notebooks.with_badge(moved, "09_x.ipynb", "you/fork") == moved
    assert notebooks.with_badge(moved, "09_x.ipynb", None) == md  # no repository: the link goes, nothing else
    old = "# T\n\n[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab." \
          "research.google.com/github/OWNER/REPO/blob/main/labs/09_x.ipynb)\n\n**Objectives**\n- one"
    assert notebooks.with_badge(old, "09_x.ipynb", None) == "# T\n\n**Objectives**\n- one"  # the old badge too
    cell = notebooks.first_cell("you/fork")
    assert "https://github.com/you/fork'" in cell and "'fork/labs/bootstrap.py'" in cell and len(cell.splitlines()) <= 10
    assert "git" not in notebooks.first_cell(None).replace("github", "")  # no repository: nothing to clone


def test_the_terms_are_defined_once_shown_in_lab_00_and_the_readme():
    import nbformat

    from lablib.instructor import terms

    table = terms.markdown()
    for term in ("TTFT", "TPOT", "ITL", "P50 / P99", "MBU", "roofline", "prefill", "decode"):
        assert f"| **{term}** |" in table
    assert terms.show().data == terms.table() and table.endswith(terms.table())
    lab00 = nbformat.read(notebooks.LABS_DIR / "00_setup.ipynb", as_version=4)
    assert [c.source for c in lab00.cells if "terms.show()" in c.source and c.cell_type == "code"]
    assert notebooks.readme_terms(table) in (ROOT / "README.md").read_text()
    for path in notebooks.lab_notebooks()[1:]:  # defined once: no other lab carries the table
        assert terms.HEADING not in path.read_text(), path.name
