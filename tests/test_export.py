"""Executed labs export to HTML with every figure and plotly.js once, offline; widget panels as snapshots.

The labs are those tests/test_instructor.py runs (conftest.py's `run_labs("00", "03")`: one execution for both).
Lab 03 draws four plotly figures and shows the KV calculator (a widget panel); lab 00 draws no figure.
That the figures also draw in a browser with the network cut was checked by hand in headless Chromium
(4 of 4 figures drawn); here the checks are on the HTML text.
"""
import re

import nbformat
import pytest
from plotly.offline import get_plotlyjs

from lablib.instructor import export

PLOTLY_URL = re.compile(r"""(<script[^>]*\bsrc=["'][^"']*plotly[^"']*["'])|(import\s+["']https?://[^"']*plotly)""",
                        re.IGNORECASE)


@pytest.fixture(scope="module")
def lab03(run_labs):
    rc, out = run_labs("00", "03")
    assert rc == 0
    return nbformat.read(out / "03_kv_cache.ipynb", as_version=4), (out / "03_kv_cache.html").read_text(), out


def _figure_ids(nb) -> list[str]:
    """The div id of each figure the kernel drew, from its text/html (what bootstrap's renderer adds)."""
    ids = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if export.PLOTLY_MIME in out.get("data", {}):
                ids += re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', "".join(out["data"]["text/html"]))
    return ids


def test_every_figure_of_the_executed_lab_is_in_its_html(lab03):
    nb, page, _ = lab03
    ids = _figure_ids(nb)
    assert export.figure_count(nb) == len(ids) >= 4  # each figure carries a div beside its mimetype
    assert all(re.search(f'<div [^>]*id="{i}"', page) for i in ids)  # nbconvert rewrites the tag: any order
    assert page.count('class="plotly-graph-div"') == len(ids)


def test_plotlyjs_is_inline_once_and_loaded_from_no_cdn(lab03):
    _, page, out = lab03
    assert page.count(export.PLOTLYJS_MARK) == 1
    assert not PLOTLY_URL.search(page)
    # plotly.js itself names cdn.plot.ly once (the base URL of its geo maps' topojson, unused here): nothing more
    assert page.count("cdn.plot.ly") == get_plotlyjs().count("cdn.plot.ly")
    assert export.PLOTLYJS_MARK not in (out / "00_setup.html").read_text()  # a lab without figures carries none


def test_widget_panels_are_static_snapshots_not_empty_placeholders(lab03):
    nb, page, _ = lab03
    assert export.WIDGET_STATE in nb.metadata.get("widgets", {})  # papermill saved the widget state ...
    assert "lablib-widget-snapshot" in page and "Llama-3.1-8B" in page and "bytes per token" in page
    assert export.WIDGET_VIEW not in page and export.WIDGET_STATE not in page and "unpkg.com" not in page


def test_plain_nbconvert_keeps_every_figure_too(lab03):
    from nbconvert import HTMLExporter

    nb, _, _ = lab03
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)  # what `jupyter nbconvert --to html` does
    assert all(re.search(f'<div [^>]*id="{i}"', body) for i in _figure_ids(nb))


def _widget_notebook(panel_first: bool):
    """A panel holding a FigureWidget, and a figure drawn by bootstrap's renderer (plotly.js before it)."""
    figure = {"data": [{"type": "bar", "x": [1, 2], "y": [3, 4]}], "layout": {"title": {"text": "t"}}}
    state = {"box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_dd", "IPY_MODEL_fw"]}},
             "dd": {"model_name": "DropdownModel", "state": {"description": "batch", "_options_labels": ["1", "8"],
                                                            "index": 1}},
             "fw": {"model_name": "AnyModel", "state": {"_anywidget_id": "plotly.graph_objs._figurewidget.FigureWidget",
                                                        "_widget_data": figure["data"], "_widget_layout": figure["layout"],
                                                        "_esm": "x" * 1000}}}
    panel = nbformat.v4.new_code_cell("panel", outputs=[nbformat.v4.new_output(
        "display_data", {export.WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0},
                         "text/plain": "VBox(...)"})])
    plot = nbformat.v4.new_code_cell("fig", outputs=[
        nbformat.v4.new_output("display_data", {"text/html": "<script>/**\n" + export.PLOTLYJS_MARK + "4</script>"}),
        nbformat.v4.new_output("display_data", {export.PLOTLY_MIME: figure,
                                                "text/html": '<div id="f1" class="plotly-graph-div"></div>'})])
    nb = nbformat.v4.new_notebook(cells=[panel, plot] if panel_first else [plot, panel])
    nb.metadata["widgets"] = {export.WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


@pytest.mark.parametrize("panel_first", [True, False])
def test_a_panels_figure_gets_plotlyjs_before_it_and_the_page_keeps_one_copy(panel_first):
    nb = _widget_notebook(panel_first)
    assert export.static_widgets(nb) == 1 and "widgets" not in nb.metadata
    export.plotlyjs_once(nb)
    html = ["".join(o["data"].get("text/html", "")) for c in nb.cells for o in c.outputs]
    snap = next(h for h in html if "lablib-widget-snapshot" in h)
    assert "batch: <b>8</b>" in snap and "plotly-graph-div" in snap and '"bar"' in snap and "x" * 1000 not in snap
    page = "".join(html)
    assert page.count(export.PLOTLYJS_MARK) == 1
    assert page.index(export.PLOTLYJS_MARK) < page.index("plotly-graph-div")
