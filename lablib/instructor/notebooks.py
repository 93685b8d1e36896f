"""The committed form of a lab notebook: the Colab badge, the first cell, metadata JupyterLab will not rewrite, no outputs.

Three things every lab shares are written here, from one place, by `python -m lablib.instructor.notebooks`
(`--check` says what is out of date and exits 1, which tests/test_colab.py and tests/test_notebooks_clean.py run):

- The "Open in Colab" link, the second paragraph of the first markdown cell, and the README's list of them,
  pointing at the project's GitHub repository: `[project.urls] Repository` in pyproject.toml, which whoever
  publishes the labs writes once with `python -m lablib.instructor.notebooks --repo origin` (the clone's own
  `git remote get-url origin`) or `--repo owner/name`. Until then there is no link at all (a link to a
  placeholder is a broken link), and the README says the one command that adds them. The link is text, not
  Colab's badge image: an image from colab.research.google.com is a broken image offline.
- The first code cell. `%run bootstrap.py` alone works only where the working directory is `labs/`
  (JupyterLab, nbval, papermill). Colab opens a notebook straight from GitHub with the working directory
  `/content`: the cell looks for `labs/bootstrap.py` below the working directory (`/content/<repo>`, a
  clone made earlier) and, in Colab with no clone there yet and a repository known, clones it beside it first.
- The terms every lab uses (`lablib.instructor.terms`): the README's section between its markers is that table,
  word for word (lab 00 displays it from the same module).
- The notebook metadata. On opening a notebook JupyterLab writes the kernel's own `kernelspec` and
  `language_info` into it, and any difference marks the notebook modified before a cell has run (seen in
  JupyterLab 4.6 under headless Chromium: the labs' `display_name` "Python 3" against ipykernel's
  "Python 3 (ipykernel)", and a `language_info` of only its name). The labs store exactly what the kernel
  reports, for the Python that runs this command (the project's `.venv`); on another Python version
  JupyterLab still rewrites `language_info.version`, which no file can match for every version.

Outputs, execution counts and volatile metadata are kept out of git by the nbstripout filter
(`.gitattributes`, `.nbstripout.gitconfig`); `CLEAN_NOTEBOOK_KEYS` and `CLEAN_CELL_KEYS` are what a
committed lab may hold, and `problems` names anything else.
"""
from __future__ import annotations

import argparse
import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from .terms import markdown

ROOT = Path(__file__).resolve().parents[2]
LABS_DIR = ROOT / "labs"
README = ROOT / "README.md"
PYPROJECT = ROOT / "pyproject.toml"
COLAB_BRANCH = "main"  # the branch the links open
BADGE_LINE = re.compile(r"^\[!?\[?Open [Ii]n Colab.*\]\(https://colab\.research\.google\.com/.*\)$", re.MULTILINE)
GITHUB = re.compile(r"^(?:https://github\.com/|git@github\.com:|ssh://git@github\.com/)([\w.-]+/[\w.-]+?)(?:\.git)?/?$")
PUBLISH = "python -m lablib.instructor.notebooks --repo origin"  # the one line that adds the Colab links
README_BEGIN, README_END = "<!-- colab-badges: written by python -m lablib.instructor.notebooks -->", "<!-- /colab-badges -->"
TERMS_BEGIN, TERMS_END = "<!-- terms: written by python -m lablib.instructor.notebooks from lablib/instructor/terms.py -->", "<!-- /terms -->"

CLEAN_NOTEBOOK_KEYS = {"kernelspec", "language_info"}  # notebook metadata a committed lab may hold
CLEAN_CELL_KEYS = {"tags"}  # cell metadata a committed lab may hold (papermill's "parameters" tag, nbval's)

FIND = """\
import pathlib, subprocess, sys  # labs/bootstrap.py: beside this notebook, or in a clone below the working directory (Colab: /content/<repo>)
found = [p for p in (pathlib.Path('bootstrap.py'), pathlib.Path('labs/bootstrap.py'), *sorted(pathlib.Path().glob('*/labs/bootstrap.py'))) if p.is_file()]
"""
CLONE = """\
if not found and 'google.colab' in sys.modules:  # opened from GitHub in Colab: clone the repository beside it, once
    subprocess.run(['git', 'clone', '-q', 'https://github.com/{repo}'], check=True)
    found = [pathlib.Path('{name}/labs/bootstrap.py')]
"""
RUN = """\
assert found, 'labs/bootstrap.py not found: open this notebook from a clone of the repository (README.md, "Opening the labs")'
%run "{found[0]}\""""


def github_repo(url: str) -> str | None:
    """"owner/name" of a GitHub address (https, ssh or scp-like, with or without .git); None for any other."""
    m = GITHUB.match(url.strip())
    return m.group(1) if m else None


def colab_repo(pyproject: Path = PYPROJECT) -> str | None:
    """The GitHub repository the Colab links open ("owner/name"): pyproject.toml's `[project.urls] Repository`,
    or None while the project has none there (no links are written then)."""
    m = re.search(r"^\[project\.urls\]\s*$(.*?)(?=^\[|\Z)", pyproject.read_text(), re.MULTILINE | re.DOTALL)
    url = re.search(r'^Repository\s*=\s*"([^"]*)"', m.group(1), re.MULTILINE) if m else None
    return github_repo(url.group(1)) if url else None


def remote_repo(root: Path = ROOT, remote: str = "origin") -> str:
    """"owner/name" of the clone's own GitHub remote, refused with what to do where there is none."""
    p = subprocess.run(["git", "-C", str(root), "remote", "get-url", remote], capture_output=True, text=True,
                       check=False)
    repo = github_repo(p.stdout) if p.returncode == 0 else None
    if repo is None:
        got = p.stdout.strip() or p.stderr.strip() or "nothing"
        raise ValueError(f"notebooks.repo={remote!r}: git remote {remote!r} gives {got!r}; allowed a remote on "
                         "github.com; Fix: push the clone to GitHub first, or pass --repo owner/name.")
    return repo


def set_colab_repo(repo: str, pyproject: Path = PYPROJECT) -> None:
    """Write `[project.urls] Repository = "https://github.com/<repo>"` into pyproject.toml (replaced, or added)."""
    if github_repo(f"https://github.com/{repo}") != repo:
        raise ValueError(f"notebooks.repo={repo!r}: allowed a GitHub \"owner/name\" or 'origin'; "
                         "Fix: --repo me/llm-inference-lab.")
    line, text = f'Repository = "https://github.com/{repo}"', pyproject.read_text()
    section = re.search(r"^\[project\.urls\]\s*$(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    if section is None:
        text = text.replace("\n[project.optional-dependencies]", f"\n[project.urls]\n{line}\n\n"
                            "[project.optional-dependencies]", 1)
    else:
        body = section.group(1)
        new = (re.sub(r"^Repository\s*=.*$", line, body, count=1, flags=re.MULTILINE)
               if re.search(r"^Repository\s*=", body, re.MULTILINE) else f"\n{line}{body}")
        text = text[:section.start(1)] + new + text[section.end(1):]
    pyproject.write_text(text)


def colab_url(notebook: str, repo: str, branch: str = COLAB_BRANCH) -> str:
    """Colab's address for `labs/<notebook>` in `repo` on GitHub."""
    return f"https://colab.research.google.com/github/{repo}/blob/{branch}/labs/{notebook}"


def badge(notebook: str, repo: str) -> str:
    """The markdown line of the "Open in Colab" link for `labs/<notebook>` (text: no image to break offline)."""
    return f"[Open in Colab ↗]({colab_url(notebook, repo)})"


def first_cell(repo: str | None = None) -> str:
    """The source of every lab's first code cell: with a repository, Colab clones it when no clone is around."""
    clone = CLONE.format(repo=repo, name=repo.split("/")[-1]) if repo else ""
    return FIND + clone + RUN


def kernel_metadata() -> dict[str, Any]:
    """The `kernelspec` and `language_info` JupyterLab writes on opening a lab with this Python's ipykernel."""
    from ipykernel.ipkernel import IPythonKernel  # deferred: ipykernel
    from jupyter_client.kernelspec import KernelSpecManager  # deferred: jupyter_client

    spec = KernelSpecManager().get_kernel_spec("python3")
    return {"kernelspec": {"display_name": spec.display_name, "language": spec.language, "name": "python3"},
            "language_info": dict(IPythonKernel.language_info)}


def lab_notebooks(labs_dir: Path = LABS_DIR) -> list[Path]:
    """The labs, in order."""
    return sorted(labs_dir.glob("[0-9][0-9]_*.ipynb"))


def with_badge(markdown: str, notebook: str, repo: str | None) -> str:
    """`markdown` with its Colab link replaced, or inserted as the paragraph after the title; without a
    repository, with the link (and the blank line after it) taken out."""
    if repo is None:
        return re.sub(BADGE_LINE.pattern + r"\n*", "", markdown, count=1, flags=re.MULTILINE)
    line = badge(notebook, repo)
    if BADGE_LINE.search(markdown):
        return BADGE_LINE.sub(lambda _: line, markdown, count=1)
    title, _, rest = markdown.partition("\n")
    return f"{title}\n\n{line}\n\n{rest.lstrip(chr(10))}" if rest else f"{title}\n\n{line}"


def synced(nb: Any, notebook: str, repo: str | None, metadata: dict[str, Any] | None = None) -> Any:
    """A copy of `nb` with its badge, first code cell, kernel metadata as they should be;
    nothing else changes."""
    nb = copy.deepcopy(nb)
    first_md = next(c for c in nb.cells if c.cell_type == "markdown")
    first_md.source = with_badge(first_md.source, notebook, repo)
    next(c for c in nb.cells if c.cell_type == "code").source = first_cell(repo)
    nb.metadata.update(metadata or kernel_metadata())
    return nb


def problems(nb: Any, name: str) -> list[str]:
    """What keeps `nb` from being a clean committed lab: outputs, counts, metadata outside the allowed keys."""
    found = [f"{name}: notebook metadata {k!r} (allowed: {sorted(CLEAN_NOTEBOOK_KEYS)})"
             for k in nb.metadata if k not in CLEAN_NOTEBOOK_KEYS]
    for i, cell in enumerate(nb.cells):
        where = f"{name} cell {i} ({cell.source.splitlines()[0][:50] if cell.source else 'empty'!r})"
        if cell.get("outputs"):
            found.append(f"{where}: {len(cell.outputs)} outputs")
        if cell.get("execution_count") is not None:
            found.append(f"{where}: execution_count {cell.execution_count}")
        found += [f"{where}: cell metadata {k!r} (allowed: {sorted(CLEAN_CELL_KEYS)})"
                  for k in cell.get("metadata", {}) if k not in CLEAN_CELL_KEYS]
    return found


def readme_badges(labs: list[Path], repo: str | None) -> str:
    """The README's block of Colab links, one line per lab, between its markers; without a repository, the one
    line that adds them."""
    if repo is None:
        lines = ["No Colab links yet: they open the project's GitHub repository, which whoever publishes the labs "
                 f"names once with `{PUBLISH}` (the clone's GitHub remote; or `--repo owner/name`)."]
    else:
        lines = [f"- `{p.stem}` {badge(p.name, repo)}" for p in labs]
    return "\n".join([README_BEGIN, *lines, README_END])


def sync(labs_dir: Path = LABS_DIR, readme: Path | None = README, check: bool = False,
         repo: str | None = None) -> list[str]:
    """Write (or with `check`, only compare) every lab's Colab link, first cell and metadata, and the README's links,
    for `repo` (default: `colab_repo()`, pyproject.toml's).

    Returns what was (or would be) changed, one line per file.
    """
    import nbformat  # deferred: nbformat

    repo = repo if repo is not None else colab_repo()
    changed, labs, meta = [], lab_notebooks(labs_dir), kernel_metadata()
    for path in labs:
        nb = nbformat.read(path, as_version=4)
        new = synced(nb, path.name, repo, metadata=meta)
        if new != nb:
            changed.append(f"{path}: badge, first cell or kernel metadata out of date")
            if not check:
                nbformat.write(new, path)
    if readme is not None and readme.exists():
        text = new_text = readme.read_text()
        for (begin, end), block, what in (((README_BEGIN, README_END), readme_badges(labs, repo), "Colab links"),
                                          ((TERMS_BEGIN, TERMS_END), readme_terms(markdown()), "terms")):
            pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
            if pattern.search(new_text):
                updated = pattern.sub(lambda _, b=block: b, new_text)
                if updated != new_text:
                    changed.append(f"{readme}: {what} out of date")
                new_text = updated
        if new_text != text and not check:
            readme.write_text(new_text)
    return changed


def readme_terms(table: str) -> str:
    """The README's terms section, between its markers."""
    return "\n".join([TERMS_BEGIN, table, TERMS_END])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lablib.instructor.notebooks", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only report what is out of date; exit 1 if anything is")
    ap.add_argument("--labs-dir", type=Path, default=LABS_DIR)
    ap.add_argument("--repo", help="publish: 'origin' (this clone's GitHub remote) or owner/name; written to "
                                   "pyproject.toml's [project.urls] Repository, then every Colab link from it")
    args = ap.parse_args(argv)
    if args.repo and not args.check:
        set_colab_repo(remote_repo() if args.repo == "origin" else args.repo)
    changed = sync(args.labs_dir, README if args.labs_dir == LABS_DIR else None, check=args.check)
    print("\n".join(changed) or "every lab's Colab link, first cell and kernel metadata, and the terms, are up to date")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
