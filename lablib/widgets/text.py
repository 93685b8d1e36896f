"""Text a model wrote, shown as code: monospaced, in a code block, under a caption that says what it is.

A tiny model's continuation printed as plain output reads like a traceback (indented lines, stray quotes); in a
fenced block it reads as what it is, a sample of Python-looking text. It is shown, never run."""
from __future__ import annotations

import re
from typing import Any


def code_sample(text: str, caption: str, language: str = "python") -> Any:
    """An IPython Markdown object: `caption` in italics, then `text` in a fenced `language` block.

    A fence longer than any run of backticks in `text` keeps the model's own backticks from ending the block."""
    from IPython.display import Markdown  # deferred: IPython

    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return Markdown(f"*{caption}*\n\n{fence}{language}\n{text}\n{fence}")
