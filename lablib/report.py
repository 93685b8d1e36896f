"""A self-contained HTML report of a set of Results: the figures, the table, the provenance.

One file, plotly.js inlined once, so it opens anywhere offline (a workshop laptop, an
email attachment). Every run's hardware, versions and provenance are listed, so a number
in the report can always be traced to the machine that measured it.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from . import plots
from .results.compare import table
from .results.record import Result


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def write_report(results: list[Result], path: str | Path, title: str = "LLM inference journey",
                 skipped: list[dict[str, str]] | None = None) -> Path:
    """Write the report and return its path."""
    if not results:
        raise ValueError("write_report: no Results to report. Fix: run at least one step first.")
    figs = [plots.journey(results), plots.throughput_vs_batch(results), plots.latency_cdf(results, "ttft"),
            plots.latency_cdf(results, "tpot"), plots.phase_breakdown(results), plots.memory_timeline(results)]
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
    rows = table(results)
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row.values()) + "</tr>" for row in rows)
    skipped_html = "".join(f"<li><b>{html.escape(s['step'])}</b>: {html.escape(s['why'])}</li>" for s in skipped or [])
    prov = {r.step: {"provenance": r.provenance, "recorded_at": r.recorded_at, "hardware": r.hardware,
                     "versions": r.versions, "model": r.model, "workload": r.workload, "config": r.config,
                     "notes": r.notes} for r in results}
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 6px;font-size:13px}}pre{{background:#f6f6f6;padding:1em;overflow:auto}}</style>
</head><body><h1>{html.escape(title)}</h1>
<p>{len(results)} runs. Every number below was measured by lablib; recorded runs are labelled with the GPU and date.</p>
<table><tr>{head}</tr>{body}</table>
{"<h2>Steps not run on this machine</h2><ul>" + skipped_html + "</ul>" if skipped_html else ""}
{"".join(parts)}
<h2>Provenance</h2><pre>{html.escape(json.dumps(prov, indent=1, default=str))}</pre></body></html>"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
