"""Numbers for people: how every table a lab shows writes its numbers, while the data underneath stays numeric.

A DataFrame printed raw says `peak_mem_bytes 515653632`, `ttft_p50_s 0.031503` and `max_concurrency 2790.851562`:
the reader counts digits instead of reading. Here a column's name says its unit, and the unit says the format:
bytes as KiB/MiB/GiB, seconds and milliseconds to three significant digits, ratios (a rate, a share, an `_over_`,
a speedup) to two decimals, other floats to three significant digits with thousands separators, integers with
them. `install()` (run by `labs/bootstrap.py`) registers `frame_html`/`frame_text` as IPython's formatters for every
DataFrame, so a lab's tables (`Shown.table`, the study objects' tables, a cell's own `pd.DataFrame(...)`) display this
way; only the display changes, so checks and plots read the same numbers as before. Text cells keep their full width
(no "..." inside a verdict); a list cell (per-request detail) is cut to `LIST_CHARS`.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

LIST_CHARS = 60  # a list or dict cell (per-request detail) is cut to this many characters, with "…"
RATIO = re.compile(r"(_over_|ratio|rate$|hit_rate|fraction|share|speedup|efficiency|_x$|^x_)")
COUNT = re.compile(r"(tokens|requests|hits|queries|blocks|count|^n_|_n$)")


def gib(n: float) -> str:
    """Bytes in the binary unit that keeps 1-3 digits before the point: 515653632 -> '492 MiB'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{significant(n / size)} {unit}"
    return f"{n:,.0f} B"


def significant(x: float, digits: int = 3) -> str:
    """`x` to `digits` significant digits without an exponent for everyday sizes: 0.004888 -> '0.00489',
    1347.7 -> '1,348', 2790.85 -> '2,791'."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    magnitude = math.floor(math.log10(abs(x)))
    if magnitude >= digits - 1:
        return f"{x:,.0f}"
    if magnitude < -6:
        return f"{x:.{digits - 1}e}"
    return f"{x:,.{digits - 1 - magnitude}f}"


def _missing(v: Any) -> bool:
    try:
        return v is None or (isinstance(v, float) and math.isnan(v))
    except TypeError:
        return False


def formatter(name: Any, values: Any) -> Callable[[Any], str] | None:
    """The format for one column, from its name and values; None leaves pandas' own (text, booleans)."""
    import pandas as pd  # deferred: pandas only where a table is shown

    label = str(name[-1] if isinstance(name, tuple) else name).lower()
    kind = values.dtype.kind
    if kind == "O" and any(isinstance(v, (list, tuple, dict)) for v in values):
        def cut(v: Any) -> str:
            s = str(v)
            return s if len(s) <= LIST_CHARS else s[:LIST_CHARS - 1] + "…"
        return cut
    if kind not in "iuf" or pd.api.types.is_bool_dtype(values):
        return None

    def guard(f: Callable[[float], str]) -> Callable[[Any], str]:
        return lambda v: "–" if _missing(v) else f(float(v))

    if "bytes" in label:
        return guard(gib)
    if label.endswith(("_s", "_ms", "_us", "seconds")) or label in ("s", "ms", "wall_s"):
        return guard(significant)
    if RATIO.search(label) and not COUNT.search(label):
        return guard(lambda v: f"{v:,.2f}")
    finite = values[pd.notna(values)]
    if kind in "iu" or (len(finite) and all(float(v).is_integer() for v in finite)):
        return guard(lambda v: f"{v:,.0f}")  # counts (a count column holding NaN arrives as floats)
    return guard(significant)


def formatters(frame: Any) -> dict[Any, Callable[[Any], str]]:
    """One formatter per column that needs one."""
    out = {}
    for i, name in enumerate(frame.columns):
        f = formatter(name, frame.iloc[:, i])
        if f is not None:
            out[name] = f
    return out


def frame_html(frame: Any) -> str:
    """The DataFrame as JupyterLab shows it (pandas' own HTML table), its numbers written for people."""
    import pandas as pd  # deferred: pandas

    fmts = formatters(frame) if frame.columns.is_unique else {}
    with pd.option_context("display.max_colwidth", None):
        return frame.to_html(formatters=fmts, notebook=True, max_rows=pd.get_option("display.max_rows"),
                             max_cols=pd.get_option("display.max_columns"), show_dimensions=len(frame) > 60)


def frame_text(frame: Any) -> str:
    """The DataFrame as plain text (nbval, the HTML export's fallback, a terminal), numbers written for people."""
    import pandas as pd  # deferred: pandas

    fmts = formatters(frame) if frame.columns.is_unique else {}
    return frame.to_string(formatters=fmts, max_rows=pd.get_option("display.max_rows"), max_colwidth=None,
                           line_width=120)


def install() -> bool:
    """Make every DataFrame this IPython kernel displays use `frame_html` and `frame_text`; False outside IPython."""
    try:
        from IPython import get_ipython  # deferred: IPython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False
    import pandas as pd  # deferred: pandas

    formatters_ = ip.display_formatter.formatters
    formatters_["text/html"].for_type(pd.DataFrame, frame_html)
    formatters_["text/plain"].for_type(pd.DataFrame, lambda frame, p, cycle: p.text(frame_text(frame)))
    return True
