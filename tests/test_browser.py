"""The panels in a real browser: JupyterLab started here, driven by headless Chromium (Debian's chromium-driver).

What the widget tests (tests/widgets/) cannot see is whether the page draws what the kernel sends: the panels'
plotly FigureWidgets rendered and responded, yet after a browser refresh showed nothing (or, with anywidget 0.11,
the figure as first drawn, not as the kernel held it). So this test runs the two panels' cells as the labs write
them, in JupyterLab, and reads what the page shows:

1. JupyterLab (a free port, a token, no browser of its own, this venv's kernel) serves a temp folder holding a
   three-cell notebook: labs/bootstrap.py (what every lab's first cell runs, here by its path), lab 01's
   BatchingPanel cell with the smallest run (2 requests, 4 new tokens; the rest of the call as the lab has it) and
   lab 03's KV calculator cell, verbatim. The labs are not run whole in the browser: their other cells take minutes.
2. Chromium opens the notebook, runs all three cells from the Run menu, and checks no cell wrote an error.
3. BatchingPanel: its figure shows no points (no runs in the temp store); press Run; the figure gains a point
   (the throughput of the run, read from the plotly div's data) and the store on disk holds one Result.
4. KVCalculator: pick another model in the dropdown; the bytes per token and the GPU table change to lablib's
   numbers for that model.
5. Save (as autosave would), refresh the page: the panel's figure is drawn again with the same points; Run
   again adds a point; the calculator shows the model picked before the refresh and still answers a change.
6. A mistyped model typed into the panel ("embeded"): Run writes why on the panel (the house's "allowed ...;
   Fix: ..." message), not only into `panel.last_error`, and stores nothing.
7. Kernel > Interrupt during a run started from a new cell: the cell ends in one line saying what was kept
   (nothing: no request had finished) and that the engine was closed, no traceback; the panel says the same;
   its figure keeps the runs it had, none at 0 tok/s, and the store has no new line.
8. The browser console has no SEVERE entry, except those listed in `browser_support.ALLOWED_SEVERE` with why.

Missing chromium or chromedriver skips with what to install (`scripts/browser-deps.sh`); with
LABLIB_BROWSER_REQUIRED=1 (CI) a missing tool fails instead. Timeouts are generous but bounded: a 2-core machine
shared with other jobs. After a failure, pytest's temp folder holds the server's log (browser-home*/jupyterlab.log),
chromedriver's (chromium*/chromedriver.log) and the page as it was last (chromium*/last-page.png).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

from tests import browser_support as bs

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "panels.ipynb"
PANEL_CELL, CALC_CELL = 1, 2
SMALL_RUN = "requests=2, max_new_tokens=4"  # the smallest run that still draws two requests live


def _lab_cell(notebook: str, call: str) -> str:
    nb = nbformat.read(REPO / "labs" / notebook, as_version=4)
    found = [c.source for c in nb.cells if c.cell_type == "code" and call in c.source]
    assert len(found) == 1, f"labs/{notebook}: expected one code cell calling {call}, found {len(found)}"
    return found[0]


def _test_notebook(folder: Path) -> Path:
    """The labs' own cells: bootstrap (by path), the BatchingPanel with a tiny run, the KV calculator verbatim."""
    panel = _lab_cell("01_batching.ipynb", "lablib.widgets.BatchingPanel(")
    calc = _lab_cell("03_kv_cache.ipynb", "lablib.widgets.KVCalculator(")
    first = (f"%run {str(REPO / 'labs' / 'bootstrap.py')!r}\n"
             "import sys\n"
             "import lablib\n"
             "import torch\n"
             "torch.set_num_threads(1)  # a 4.7M-parameter model on a shared 2-core machine: one thread is faster\n"
             "print('kernel:', sys.executable)")
    nb = nbformat.v4.new_notebook()
    nb.metadata = nbformat.read(REPO / "labs" / "01_batching.ipynb", as_version=4).metadata
    nb.cells = [nbformat.v4.new_code_cell(first),
                nbformat.v4.new_code_cell(panel.replace("BatchingPanel(", f"BatchingPanel({SMALL_RUN}, ", 1)),
                nbformat.v4.new_code_cell(calc)]
    path = folder / NOTEBOOK
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def tools():
    missing = bs.missing_tools()
    if missing:
        message = "browser test needs " + "; ".join(missing)
        if os.environ.get("LABLIB_BROWSER_REQUIRED") == "1":
            pytest.fail(message + " (LABLIB_BROWSER_REQUIRED=1)")
        pytest.skip(message)


@pytest.fixture(scope="module")
def lab(tools, tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-root")
    _test_notebook(root)
    server = bs.JupyterLab(root, tmp_path_factory.mktemp("browser-home"))
    try:
        yield server.start(timeout=90)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def page(lab, tmp_path_factory):
    home = tmp_path_factory.mktemp("chromium")
    driver = bs.chromium(home / "profile", home / "chromedriver.log")
    try:
        p = bs.Page(driver, lab)
        p.open(NOTEBOOK, timeout=120)
        p.run_all(cells=3, timeout=150)
        p.read_console()
        yield p
    finally:
        bs.stop_chromium(driver, screenshot=home / "last-page.png")


def _points(page: bs.Page) -> tuple[int, dict]:
    """(points in the panel's figure, the figure's summary) once exactly one visible figure is drawn there."""
    figs = bs.wait_for("the panel's figure", lambda: [f for f in page.figures(PANEL_CELL) or [] if f["visible"]], 60)
    assert len(figs) == 1, f"the panel's Output should hold one figure, the page shows {figs}"
    return figs[0]["points"], figs[0]


def _bytes_per_token(page: bs.Page) -> int:
    text = bs.wait_for("the calculator's text", lambda: next(
        (t for t in page.text(CALC_CELL, ".widget-html-content") if "bytes per token" in t), None), 30)
    return int(re.search(r"([\d,]+) bytes per token", text).group(1).replace(",", ""))


def _gpu_table(page: bs.Page) -> str:
    return next(t for t in page.text(CALC_CELL, ".widget-html-content") if "On common GPUs" in t)


def _pick_other_model(page: bs.Page) -> tuple[str, int, int]:
    """Choose a model with other KV bytes per token; (its name, bytes shown before, bytes shown after)."""
    from lablib.mechanisms.kv import kv_bytes_per_token
    from lablib.widgets.kv import ARCHITECTURES

    before = _bytes_per_token(page)
    select = page.dropdown(CALC_CELL, "model")
    name = next(n for n in (o.text for o in select.options) if n in ARCHITECTURES
                and kv_bytes_per_token(*ARCHITECTURES[n], "bfloat16") != before)
    select.select_by_visible_text(name)
    after = bs.wait_for(f"the bytes per token to change after picking {name}",
                        lambda: (b := _bytes_per_token(page)) != before and b, 30)
    assert after == kv_bytes_per_token(*ARCHITECTURES[name], "bfloat16"), (name, after)
    return name, before, after


def _stored(lab: bs.JupyterLab) -> list[str]:
    path = lab.root / "results" / "01_batching.jsonl"  # the panel's default store: $LABLIB_RESULTS, set to the served folder
    return path.read_text().splitlines() if path.exists() else []


def _press_run(page: bs.Page, lab: bs.JupyterLab) -> int:
    """Press the panel's Run; wait for the figure to gain a point and the status to give the run's tok/s."""
    before, _ = _points(page)
    runs = len(_stored(lab))
    seen: list[tuple[str, int]] = []  # what the figure showed while the run went on: live requests, then throughput

    def done() -> int | bool:
        n, fig = _points(page)
        state = (fig["title"].split("<br>")[0], n)
        if not seen or seen[-1] != state:
            seen.append(state)
        status = " ".join(page.text(PANEL_CELL, ".widget-html-content"))
        return n > before and "Throughput vs batch size" in fig["title"] and "output tok/s" in status and n

    page.button(PANEL_CELL, "Run").click()
    after = bs.wait_for("the panel's figure to gain a point", done, 150)
    print(f"BatchingPanel Run: {before} -> {after} points; the figure showed {seen}")
    assert len(_stored(lab)) == runs + 1, "each run appends one Result to the panel's store"
    return after


def _ran(page: bs.Page, lab: bs.JupyterLab) -> int:
    """The panel has run once (in this test or an earlier one): its figure's points after that run."""
    if "points_after_run" not in page.notes:
        before, fig = _points(page)
        assert before == 0 and "press Run" in " ".join(fig["annotations"]), fig  # an empty store: labelled, empty
        page.notes["points_after_run"] = _press_run(page, lab)
    return page.notes["points_after_run"]


def test_cells_ran_without_errors_on_this_venvs_kernel(page):
    assert page.errors_in_outputs() == []
    outputs = " ".join(page.text(0, ".jp-OutputArea-output"))
    assert f"kernel: {sys.executable}" in outputs, outputs


def test_batching_panel_run_adds_a_point(page, lab):
    assert _ran(page, lab) >= 1


def test_kv_calculator_updates_when_the_model_changes(page):
    table = _gpu_table(page)
    name, before, after = _pick_other_model(page)
    print(f"KVCalculator: {before:,} bytes per token (Llama-3.1-8B), {after:,} after picking {name}")
    assert _gpu_table(page) != table
    page.notes["kv_bytes_per_token"] = after


def test_panel_figure_survives_a_refresh(page, lab):
    points = _ran(page, lab)
    page.save(lab.root / NOTEBOOK, timeout=30)
    page.read_console()
    page.driver.refresh()
    page.wait_ready(timeout=120)
    shown = bs.wait_for(f"the panel's figure to be drawn again with its {points} points",
                        lambda: (n := _points(page)[0]) == points and n, 90)
    print(f"after refresh: the panel's figure shows {shown} points")
    assert _press_run(page, lab) > points, "after a refresh the panel still draws a new run"
    name, before, after = _pick_other_model(page)
    print(f"after refresh: KVCalculator {before:,} -> {after:,} bytes per token ({name})")
    if "kv_bytes_per_token" in page.notes:
        assert before == page.notes["kv_bytes_per_token"], "the calculator shows after a refresh what it showed before"


def test_batching_panel_says_why_a_mistyped_model_did_not_run(page, lab):
    _ran(page, lab)
    runs = len(_stored(lab))
    page.type_into(PANEL_CELL, "model", "embeded")
    page.button(PANEL_CELL, "Run").click()
    said = bs.wait_for("the panel to say why it did not run", lambda: next(
        (t for t in page.text(PANEL_CELL, ".widget-html-content") if "not a known model" in t), None), 60)
    print(f"BatchingPanel with model 'embeded' says: {said}")
    assert "model='embeded'" in said and "allowed" in said and "Fix: model='embedded'" in said
    assert "not run" in " ".join(page.text(PANEL_CELL, ".widget-html-content"))
    assert len(_stored(lab)) == runs
    page.type_into(PANEL_CELL, "model", "embedded")


def test_an_interrupted_run_says_what_was_kept_and_plots_no_empty_run(page, lab):
    """A run long enough (1,000 new tokens a request: seconds each) that Kernel > Interrupt, sent as soon as the
    live figure appears, lands before the first request finishes: the run that used to be stored at 0 tok/s."""
    _ran(page, lab)
    before, _ = _points(page)
    runs = len(_stored(lab))
    cell = page.add_cell_and_run("panel.run(model='embedded', requests=4, max_new_tokens=1000)")
    bs.wait_for("the run's live figure", lambda: any(
        "requests finished" in f["title"] for f in page.figures(PANEL_CELL) or []), 60)
    page.command("Kernel", "kernelmenu:interrupt")
    shown = bs.wait_for("the interrupted cell's message", lambda: [
        t for t in page.text(cell, ".jp-OutputArea-output") if "KeyboardInterrupt" in t], 60)
    print(f"the interrupted cell shows: {shown}")
    assert len(shown) == 1 and "Traceback" not in shown[0] and len(shown[0].strip().splitlines()) == 1, shown
    assert shown[0].strip().startswith("KeyboardInterrupt: Interrupted hf-naive")
    assert "nothing was stored" in shown[0] and "the engine was closed" in shown[0]
    panel_says = " ".join(page.text(PANEL_CELL, ".widget-html-content"))
    assert "interrupted" in panel_says and "nothing was stored" in panel_says, panel_says
    points, fig = bs.wait_for("the panel's runs drawn again", lambda: (
        (got := _points(page))[1]["title"].startswith("Throughput vs batch size") and got), 30)
    assert points == before and fig["lowest"] > 0, fig  # the runs it had; no run at 0 tok/s
    assert len(_stored(lab)) == runs
    page.wait_ready(timeout=60)  # the kernel is idle again and answers


def test_browser_console_has_no_severe_errors(page):
    page.read_console()
    bad, allowed = bs.severe_errors(page.console)
    for message, why in allowed:
        print(f"allowed SEVERE: {message[:200]} ({why})")
    print(f"console: {len(page.console)} entries, {sum(e['level'] == 'SEVERE' for e in page.console)} SEVERE")
    for e in page.console:
        print(f"  {e['level']}: {e['message'][:300]}")
    assert bad == [], "SEVERE console entries:\n" + "\n".join(bad)
