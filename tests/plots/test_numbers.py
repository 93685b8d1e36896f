"""Numbers for people (`lablib.plots.numbers`): a table's display writes bytes in MiB/GiB, seconds to three
significant digits, ratios to two decimals and counts with separators, while the DataFrame keeps its numbers."""
from __future__ import annotations

import math

import pandas as pd

from lablib.plots import numbers


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"step": ["hf-naive", "hf-static-b4"], "peak_mem_bytes": [515653632, 3 * 2**30],
                         "ttft_p50_s": [1.347718, 0.004888], "output_tok_s": [182.017552, 2640.5],
                         "max_concurrency": [2790.851562, 12.3], "hit_rate": [0.749528, 0.9],
                         "ttft_p50_on_over_off": [1.026601, 0.146520], "vllm_hits": [3968.0, 15872.0],
                         "verdict": ["vLLM hit 3,968 of 5,294 prompt tokens, the simulator predicted 3,968: " * 2, "ok"]})


def test_the_issues_raw_numbers_read_as_people_write_them():
    text = numbers.frame_text(_frame())
    for raw in ("515653632", "1.347718", "2790.851562", "0.749528", "3968.0"):
        assert raw not in text, raw
    for shown in ("492 MiB", "3.00 GiB", "1.35", "0.00489", "2,791", "0.75", "0.15", "3,968", "2,640"):
        assert shown in text, shown


def test_text_is_never_cut_and_the_data_stays_numeric():
    frame = _frame()
    verdict = frame["verdict"][0].strip()
    assert verdict in numbers.frame_text(frame) and verdict in numbers.frame_html(frame)
    assert frame["peak_mem_bytes"].dtype.kind == "i" and frame["ttft_p50_s"][0] == 1.347718


def test_significant_digits_without_exponents_for_everyday_sizes():
    assert [numbers.significant(v) for v in (0.031503, 1.0266, 12.34, 182.0, 1347.7, 0.0)] == \
        ["0.0315", "1.03", "12.3", "182", "1,348", "0"]
    assert numbers.gib(2**20) == "1.00 MiB" and numbers.gib(512) == "512 B"
    assert numbers.significant(math.inf) == "inf"
