"""Every lab's first cell: `%run bootstrap.py` makes lablib importable and says how this machine runs the labs.

Opened from a clone that is not installed yet (e.g. Colab), lablib is not importable: find the
clone's root (the folder with pyproject.toml, above this file or the working directory),
`pip install -e` it and put it on sys.path. Then print the mode banner: live (an NVIDIA GPU
and vLLM: the vLLM cells measure here) or recorded (they show runs recorded on an H200, labelled).
"""
import importlib.util
import pathlib
import subprocess
import sys

if importlib.util.find_spec("lablib") is None:
    _here = pathlib.Path(globals().get("__file__", "bootstrap.py")).resolve().parent
    _root = next((p for p in (_here, *_here.parents, pathlib.Path.cwd(), *pathlib.Path.cwd().parents)
                  if (p / "pyproject.toml").exists()), None)
    assert _root is not None, "lablib is not installed and no clone of the lab is around: see README.md (Colab section)"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", str(_root)], check=True)
    sys.path.insert(0, str(_root))

import lablib.session  # noqa: E402

print(lablib.session.mode()["banner"])
