"""The terms every lab uses, defined once: lab 00 displays this table (`show()`), the README carries it (written
there by `python -m lablib.instructor.notebooks`, checked by tests/test_colab.py), and later labs use the words
without defining them again."""
from __future__ import annotations

TERMS: dict[str, str] = {
    "prefill": "the forward pass over a request's whole prompt, all its tokens at once; it writes the prompt's KV "
               "cache and yields the first output token. Many tokens per weight read: compute-bound on a GPU.",
    "decode": "every later step: one new token per running request, reading every weight and the whole KV cache "
              "once. One token per weight read: bound by memory bandwidth, which is why batching pays.",
    "KV cache": "the keys and values of every past token, kept so a decode step attends to them without "
                "recomputing: 2 x layers x KV heads x head dim x bytes per value, per token.",
    "TTFT": "time to first token: from a request's arrival to its first output token (queueing + prefill).",
    "TPOT": "time per output token: (last token time - first token time) / (output tokens - 1), one request's "
            "mean decode pace after its first token.",
    "ITL": "inter-token latency: each gap between two consecutive output tokens of one request, every gap "
           "counted (TPOT is their mean per request; ITL's P99 shows the stalls).",
    "E2E": "end-to-end latency: from arrival to the last token handed back.",
    "P50 / P99": "percentiles over requests (or over gaps, for ITL): half of them are at most P50, 99% at most "
                 "P99. P99 is what the slowest user in a hundred sees.",
    "throughput": "output tokens per second over the run's wall time (output tok/s), all requests together.",
    "roofline": "the ceiling a step cannot beat: decode moves at least the weights and KV bytes each step, so "
                "tokens per second <= batch x peak bandwidth / bytes per step. Drawn only for GPUs whose peak "
                "is in lablib's table; \"unknown\" otherwise.",
    "MBU": "model bandwidth utilisation: bytes a decode step must move, divided by its measured time, as a "
           "share of the GPU's peak memory bandwidth (how close decode runs to the roofline).",
    "synthetic / recorded / live": "synthetic: a random-weight checkpoint of a real architecture (speed and "
                                   "memory are real, the text is noise); recorded: measured on the H200 by "
                                   "the project's scripts and shipped in data/reference; live: measured now, "
                                   "on this machine.",
}

HEADING = "## The terms every lab uses"


def table() -> str:
    """The terms as one markdown table."""
    rows = "\n".join(f"| **{term}** | {text} |" for term, text in TERMS.items())
    return f"| term | meaning |\n| --- | --- |\n{rows}"


def markdown() -> str:
    """The table under its heading: the README's section."""
    return f"{HEADING}\n\n{table()}"


def show() -> object:
    """The table as a notebook displays it (lab 00)."""
    from IPython.display import Markdown  # deferred: IPython, only in a notebook

    return Markdown(table())
