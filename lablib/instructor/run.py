"""Run every lab top to bottom with papermill: the executed notebooks, one HTML per lab, an index, and the cell that failed.

    lablab-instructor --out handout/                 # every lab, as this machine runs them
    lablab-instructor --out handout/ --quick --labs 00 03

The labs have no parameters cell: every lab decides for itself what this machine can run (session.mode),
and their cells name the embedded model. So nothing is injected into the notebooks; the two switches
reach the kernels the way the labs already read them:
- `--full` (the default) runs each lab as the machine can: live vLLM cells on a GPU with vLLM, the H200
  recordings elsewhere. `--quick` sets `LABLIB_MODE=recorded`, so on a GPU machine the vLLM cells show the
  recordings instead of measuring (minutes instead of the ~12 of a live run); on a CPU the two are the same.
- `--model` accepts `embedded`, the model the labs' cells run; another model needs a lab parameter first.

A failed lab does not stop the others. The command exits 1 and its last stderr lines name, for each
failure, the notebook, the cell (its index in the notebook, counting markdown cells, and its first
line) and the error; the executed notebook and its HTML are written anyway, with papermill's note at the
top linking to the cell. The last stdout line is one JSON document (ok, the summary, the index's path);
`index.json` holds every lab's record.
"""
from __future__ import annotations

import argparse
import contextlib
import html
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..engines.process import environ
from ..validate import refuse
from .export import to_html
from .notebooks import LABS_DIR, lab_notebooks

MODELS = ("embedded",)  # the models the labs' cells run


@dataclass
class LabRun:
    """One lab's run: where it came from, how it went, and what it wrote."""

    lab: str  # the notebook's stem (lab_id("01"))
    source: str  # the notebook that was run
    status: str = "not run"  # "ok" or "failed"
    wall_s: float = 0.0  # seconds from kernel start to the last cell
    mode: str = ""  # the lab's own banner (its first cell's last line)
    notebook: str = ""  # the executed notebook, relative to the output folder
    html: str = ""  # its HTML, relative to the output folder
    failure: dict[str, Any] = field(default_factory=dict)  # cell index, first line, error: empty when ok

    def failure_line(self) -> str:
        f = self.failure
        return (f"{self.source}: cell {f['cell']} (code cell {f['code_cell']}, first line `{f['first_line']}`) "
                f"failed: {f['error']}")


# ipykernel 7 logs "Kernel is running over TCP without encryption" at start-up on the kernel's stderr (this
# command's own): the kernel listens on localhost only, and the line read like an error in the run-all's output.
# Only the kernel application's own log is quieted; a cell's warnings and errors still land in its notebook.
KERNEL_QUIET = ["--IPKernelApp.log_level=ERROR"]

def select(labs: list[str] | None, labs_dir: Path = LABS_DIR) -> list[Path]:
    """The notebooks to run: each of `labs` is a notebook path or a lab's number or name ("01", lab_id("01"))."""
    every = lab_notebooks(labs_dir)
    if not labs:
        if not every:
            raise refuse("Instructor", "labs_dir", str(labs_dir), "a folder holding the labs' notebooks",
                         "run from a clone of the repository (the labs are not installed with the package)")
        return every
    chosen = []
    for item in labs:
        path = Path(item)
        if path.suffix == ".ipynb" and path.is_file():
            chosen.append(path.resolve())
            continue
        match = [p for p in every if p.stem == item or p.stem.split("_")[0] == item]
        if len(match) != 1:
            raise refuse("Instructor", "labs", item, f"a notebook path or one of {[p.stem for p in every]} "
                         "(or their numbers)", "pass e.g. --labs 00 03_kv_cache")
        chosen.append(match[0])
    return chosen


def first_failure(executed: Any, source: Any) -> dict[str, Any]:
    """The first cell of `executed` that raised (or that papermill marked), located in `source` by cell id."""
    ids = {c.get("id"): i for i, c in enumerate(source.cells)}
    code_ids = [c.get("id") for c in source.cells if c.cell_type == "code"]
    for cell in executed.cells:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        marked = cell.get("metadata", {}).get("papermill", {}).get("exception")
        if cell.cell_type != "code" or not (errors or marked):
            continue
        index = ids.get(cell.get("id"), -1)
        lines = [ln for ln in cell.source.splitlines() if ln.strip()]
        error = (f"{errors[0].get('ename')}: {errors[0].get('evalue')}" if errors else
                 "the cell did not finish (timeout or the kernel died)")
        return {"cell": index, "code_cell": code_ids.index(cell.get("id")) + 1 if cell.get("id") in code_ids else -1,
                "first_line": lines[0][:100] if lines else "", "error": error.splitlines()[0][:300] if error else ""}
    return {"cell": -1, "code_cell": -1, "first_line": "", "error": "papermill reported an error outside any cell"}


def _banner(nb: Any) -> str:
    for cell in nb.cells:
        if cell.cell_type == "code":
            text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            return text.strip().splitlines()[-1] if text.strip() else ""
    return ""


def _execute(path: Path, out: Path, run: LabRun, cell_timeout_s: float | None) -> None:
    """papermill on one notebook (working directory: its folder); a failure is noted on `run`, never raised."""
    import papermill  # deferred: papermill

    try:
        papermill.execute_notebook(str(path), str(out / run.notebook), cwd=str(path.parent), progress_bar=False,
                                   log_output=False, execution_timeout=cell_timeout_s, kernel_name="python3",
                                   extra_arguments=KERNEL_QUIET)
        run.status = "ok"
    except Exception as e:  # noqa: BLE001 -- papermill's execution error, a timeout, a dead kernel: the notebook says which cell
        run.status = "failed"
        if not (out / run.notebook).exists():
            run.failure = {"cell": -1, "code_cell": -1, "first_line": "", "error": f"{type(e).__name__}: {e}"[:300]}


def run_lab(path: Path, out: Path, *, env: dict[str, str], cell_timeout_s: float | None) -> LabRun:
    """Execute one notebook with papermill (working directory: its folder), then write its HTML."""
    import nbformat  # deferred: nbformat

    run = LabRun(lab=path.stem, source=str(path), notebook=f"{path.stem}.ipynb", html=f"{path.stem}.html")
    source = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as scope:  # the kernel inherits env; this process's own is put back after
        for k, v in env.items():
            scope.enter_context(environ(k, v))
        _execute(path, out, run, cell_timeout_s)
        run.wall_s = round(time.perf_counter() - t0, 2)
    if (out / run.notebook).exists():
        executed = nbformat.read(out / run.notebook, as_version=4)
        if run.status == "failed" and not run.failure:
            run.failure = first_failure(executed, source)
        run.mode = _banner(executed)
        (out / run.html).write_text(to_html(executed))
    return run


ROW = "<tr><td>{lab}</td><td class='{status}'>{status}{why}</td><td>{wall:.1f} s</td><td>{links}</td><td>{mode}</td></tr>"
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Labs, executed</title><style>
body{{font-family:system-ui,sans-serif;margin:2em;max-width:70em}} td,th{{padding:4px 10px;text-align:left;
vertical-align:top;border-bottom:1px solid #ddd}} .ok{{color:#1a7f37}} .failed{{color:#cf222e}} small{{color:#555}}
</style></head><body><h1>Labs, executed</h1><p>{summary}</p><table><tr><th>lab</th><th>status</th><th>wall time</th>
<th>files</th><th>mode (the lab's own banner)</th></tr>{rows}</table><p><small>{facts}</small></p></body></html>"""


def write_index(runs: list[LabRun], out: Path, facts: dict[str, Any]) -> dict[str, Any]:
    """`index.html` (a table of the labs, their status and wall time, linking each HTML) and `index.json`."""
    failed = [r for r in runs if r.status != "ok"]
    rows = []
    for r in runs:
        why = f"<br><small>{html.escape(r.failure_line())}</small>" if r.failure else ""
        links = " · ".join(f"<a href='{html.escape(f)}'>{kind}</a>" for kind, f in (("HTML", r.html), ("notebook", r.notebook))
                           if (out / f).exists())
        rows.append(ROW.format(lab=html.escape(r.lab), status=r.status, why=why, wall=r.wall_s, links=links,
                               mode=html.escape(r.mode)))
    summary = (f"{len(runs) - len(failed)} of {len(runs)} labs ran top to bottom in "
               f"{sum(r.wall_s for r in runs):.0f} s" + (f"; failed: {', '.join(r.lab for r in failed)}" if failed else ""))
    (out / "index.html").write_text(PAGE.format(summary=html.escape(summary), rows="".join(rows),
                                                facts=html.escape(json.dumps(facts))))
    doc = {"ok": not failed, "summary": summary, "labs": [asdict(r) for r in runs], **facts}
    (out / "index.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lablab-instructor", description=(
        "Run every lab with papermill; write the executed notebooks, one HTML per lab and index.html."))
    ap.add_argument("--out", type=Path, required=True, help="folder for the executed notebooks, HTML and index")
    speed = ap.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="vLLM cells show the H200 recordings (LABLIB_MODE=recorded)")
    speed.add_argument("--full", action="store_true", help="each lab as this machine can run it (the default)")
    ap.add_argument("--model", default="embedded", help="the labs' model: embedded (the only one their cells run)")
    ap.add_argument("--labs", nargs="+", metavar="LAB", help="lab numbers, names or notebook paths (default: every lab)")
    ap.add_argument("--cell-timeout", type=float, default=1800.0, metavar="S", help="seconds one cell may run")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.model not in MODELS:
        raise SystemExit(str(refuse("Instructor", "model", args.model, f"one of {list(MODELS)} (the model the "
                                    "labs' cells run; no lab takes a model parameter yet)",
                                    f"leave --model out, or run the journey on it: lablab --model {args.model}")))
    try:
        import nbconvert  # deferred: nbconvert  # noqa: F401
        import papermill  # deferred: papermill  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"lablab-instructor needs papermill and nbconvert ({e}); Fix: pip install -e '.[lab]'") from e
    labs = select(args.labs)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {"LABLIB_MODE": "recorded"} if args.quick else {}
    runs = []
    for path in labs:
        print(f"{path.stem} ...", end=" ", flush=True)
        run = run_lab(path, args.out, env=env, cell_timeout_s=args.cell_timeout)
        print(f"{run.status} in {run.wall_s:.1f} s", flush=True)
        runs.append(run)
    facts = {"speed": "quick" if args.quick else "full", "model": args.model, "python": sys.version.split()[0],
             "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    doc = write_index(runs, args.out, facts)
    for r in runs:
        if r.failure:
            print(r.failure_line(), file=sys.stderr)
    print(json.dumps({k: doc[k] for k in ("ok", "summary")} | {"index": str(args.out / "index.html")}))
    return 0 if doc["ok"] else 1
