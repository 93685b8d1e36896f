"""Every lab's first cell runs this file: lablib importable from this clone, figures that survive export, the mode banner.

1. The repository. The clone this file belongs to (the folder above `labs/` holding pyproject.toml)
   goes first on sys.path, so a notebook runs the lablib beside it even where another copy is
   installed. In Colab the notebook's working directory is `/content` and the clone is
   `/content/<repo>`: the first cell finds this file there (`*/labs/bootstrap.py` below the working
   directory) and runs it, and `__file__` leads back to the clone. A clone whose package is not
   installed and whose dependencies are missing (a fresh Colab runtime) is installed once with
   `pip install -e`, for them; where they are all there (a GPU machine with the clone on PYTHONPATH and
   no registry to reach) the clone is imported as it is.
   Without a clone around (notebooks copied elsewhere) an installed lablib is used as it is.
2. Figures. plotly's default in Jupyter is `plotly_mimetype` alone: JupyterLab draws it, but
   `jupyter nbconvert --to html` has no renderer for that type and drops every figure. With
   `plotly_mimetype+notebook` each figure carries both the mimetype (JupyterLab's live figure) and a
   `text/html` div that nbconvert keeps. The divs need plotly.js in the page: this cell's output holds it,
   inline (not a CDN), once per notebook. plotly's `notebook` renderer would add it itself at the first
   figure, but also again each time a renderer is named explicitly, as `fig._repr_mimebundle_()` does
   (lablib.widgets' figure areas call it on every redraw): so it is loaded here, and the renderer's own
   loading is turned off. Colab, Kaggle, VS Code or an explicit $PLOTLY_RENDERER keep what plotly chose
   for them (Colab draws each output in its own frame, so its renderer loads plotly.js per figure).
3. Tables: every DataFrame the kernel displays writes its numbers for people (MiB/GiB, seconds to three
   significant digits, ratios to two decimals: `lablib.plots.numbers`); the data underneath stays numeric.
4. The banner: live (an NVIDIA GPU and vLLM: the vLLM cells measure here) or recorded (they show
   runs recorded on an H200, labelled).
"""
import importlib.metadata
import os
import pathlib
import subprocess
import sys

_here = pathlib.Path(globals().get("__file__") or "bootstrap.py").resolve().parent
_cwd = pathlib.Path.cwd()
_root = next((p for p in (*_here.parents, _cwd, *_cwd.parents)
              if (p / "pyproject.toml").is_file() and (p / "lablib" / "__init__.py").is_file()), None)
if _root is not None and str(_root) not in sys.path:
    sys.path.insert(0, str(_root))


def _missing_dependencies(root: pathlib.Path) -> list[str]:
    """The clone's declared dependencies (pyproject.toml) this Python lacks, or has at a version they exclude."""
    import re

    try:
        import tomllib
    except ImportError:  # Python 3.10: no TOML reader in the standard library, so install to be sure
        return ["(unread: Python 3.10 has no tomllib)"]
    try:
        from packaging.requirements import Requirement
    except ImportError:  # without packaging, a name present is taken as enough
        Requirement = None
    missing = []
    for line in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(line) if Requirement else None
        if req is not None and req.marker is not None and not req.marker.evaluate():
            continue  # not for this platform
        name = req.name if req else re.match(r"[A-Za-z0-9_.-]+", line).group(0)
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if req is not None and req.specifier and not req.specifier.contains(have, prereleases=True):
            wanted = ",".join(sorted(map(str, req.specifier), key=lambda s: not s.startswith(">")))  # lower bound first
            missing.append(f"{name} {have} (needs {wanted})")
    return missing


try:
    importlib.metadata.distribution("lablib")
except importlib.metadata.PackageNotFoundError:  # a clone on sys.path that pip never installed
    assert _root is not None, (f"lablib is not installed and no clone of the lab is around {_here} or {_cwd}: "
                               "clone the repository and open the notebook from its labs/ folder (README.md)")
    _missing = _missing_dependencies(_root)
    if _missing:  # a fresh runtime (Colab): install the clone once, for its dependencies; a machine that has them
        # all (the GPU machine, its clone on PYTHONPATH, no registry) imports the clone as it is
        print(f"installing {_root} for {', '.join(_missing)} (pip install -e, once per runtime) ...")
        _pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", str(_root)], capture_output=True,
                              text=True)
        if _pip.returncode:  # no package index (an offline GPU machine), or pip refused: say what is missing
            _last = ((_pip.stderr or _pip.stdout).strip().splitlines() or ["(no message)"])[-1]
            _want = [f"'{m.split()[0]}{m.split('(needs ')[1].rstrip(')')}'" if "(needs " in m else f"'{m}'"
                     for m in _missing if not m.startswith("(")] or [f"-e {_root}"]  # (unread): the clone itself
            raise RuntimeError(
                f"lablib needs {', '.join(_missing)}, and `pip install -e {_root}` failed: {_last}. Fix: install "
                f"them into this Python ({sys.executable} -m pip install {' '.join(_want)}), or, on a machine "
                "without a package index, carry their wheels (scripts/gpu-extra.txt lists the GPU machine's) and put "
                "them on PYTHONPATH; then restart the kernel.")

import plotly.io  # noqa: E402

if plotly.io.renderers.default == "plotly_mimetype" and not os.environ.get("PLOTLY_RENDERER"):
    plotly.io.renderers["notebook"].activate()  # plotly.js into this cell's output, once
    plotly.io.renderers["notebook"].global_init = False  # its later activations load nothing
    plotly.io.renderers.default = "plotly_mimetype+notebook"

import lablib.plots.numbers  # noqa: E402
import lablib.session  # noqa: E402

lablib.plots.numbers.install()

print(lablib.session.mode()["banner"])
