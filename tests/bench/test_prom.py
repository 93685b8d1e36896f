"""lablib.bench.prom on a /metrics page written the way vLLM 0.26's API server writes it (tests/metrics_page.py:
prometheus_client's text exposition, HELP/TYPE lines, counters with `_total` and `_created`, gauges per engine,
histograms with buckets, a summary with quantiles, escaped label values, a time stamp), read by prometheus_client's
own parser."""

import math

import pytest

from lablib.bench.prom import (
    parse_labels,
    parse_prometheus,
    parse_samples,
    select,
    window_means,
)
from tests.metrics_page import PAGE


def test_a_vllm_page_parsed_exactly():
    m = parse_prometheus(PAGE)
    assert m == {
        "python_gc_objects_collected_total": 12400.0,
        "vllm:num_requests_running": 15.0,  # summed over the two engines
        "vllm:num_requests_waiting": 4.0,
        "vllm:kv_cache_usage_perc": 0.8125,
        "vllm:prompt_tokens_total": 51234.0,  # its _created dropped
        "vllm:generation_tokens_total": 1234.0,
        "vllm:request_success_total": 38.0,
        "vllm:time_to_first_token_seconds_count": 50.0,  # _sum and _count kept, buckets dropped
        "vllm:time_to_first_token_seconds_sum": 3.0,
        "http_request_duration_seconds_count": 50.0,
        "http_request_duration_seconds_sum": 4.0,
        "rpc_latency_seconds_sum": 7.5,  # the summary's quantiles dropped
        "rpc_latency_seconds_count": 30.0,
        "http_requests_total": 50.0,  # the time stamp is not the value
        "odd_labels": m["odd_labels"],
    }
    assert math.isnan(m["odd_labels"])  # 1.5 + NaN


def test_label_filter_and_escaped_values():
    assert parse_prometheus(PAGE, {"engine": "1"}) == {
        "vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 0.0, "vllm:generation_tokens_total": 234.0,
        "vllm:time_to_first_token_seconds_count": 10.0, "vllm:time_to_first_token_seconds_sum": 0.5}
    assert parse_prometheus(PAGE, {"finished_reason": "stop"}) == {"vllm:request_success_total": 8.0}
    assert parse_prometheus(PAGE, {"path": 'a"b,c}'}) == {"odd_labels": 1.5}  # escapes undone, a } inside a value
    assert parse_prometheus(PAGE, {"note": "line\nbreak", "dir": "C:\\tmp"}) == {"odd_labels": 1.5}
    assert parse_prometheus(PAGE, {"handler": "/metrics"}) == {"http_requests_total": 5.0}
    assert parse_labels(r'a="1",b="x\"y",c="back\\slash",d="n\nl"') == {"a": "1", "b": 'x"y', "c": "back\\slash",
                                                                         "d": "n\nl"}
    assert parse_labels("") == {}


def test_samples_keep_every_line_and_a_malformed_line_is_skipped():
    samples = parse_samples(PAGE)
    assert ("vllm:time_to_first_token_seconds_bucket", {"engine": "0", "le": "0.5", "model_name": "qwen"}, 30.0) in samples
    assert ("rpc_latency_seconds", {"quantile": "0.99", "service": "a"}, 0.9) in samples
    assert len(samples) == sum(1 for line in PAGE.splitlines() if line and not line.startswith("#"))
    broken = PAGE + "this line is not prometheus\n"
    assert parse_prometheus(broken).keys() == parse_prometheus(PAGE).keys()
    assert parse_prometheus(broken)["vllm:time_to_first_token_seconds_sum"] == 3.0  # the TYPE lines still apply
    assert "rpc_latency_seconds" not in parse_prometheus(broken)  # the summary's quantiles still dropped


def test_the_fake_servers_untyped_page_and_window_means():
    before = parse_prometheus("vllm:time_to_first_token_seconds_sum 1.0\nvllm:time_to_first_token_seconds_count 4.0\n"
                              'http_request_duration_seconds_sum{handler="/v1/completions",method="POST"} 2.0\n'
                              'http_request_duration_seconds_count{handler="/v1/completions",method="POST"} 4.0\n')
    after = parse_prometheus(PAGE)
    means = window_means(before, after)
    assert means["ttft_s"] == pytest.approx((3.0 - 1.0) / (50 - 4)) and means["ttft_s_count"] == 46
    assert means["http_s"] == pytest.approx((4.0 - 2.0) / (50 - 4))
    assert means["itl_s"] is None and means["e2e_s_count"] is None


def test_select_keeps_only_the_named_metrics_for_the_scrape_during_a_test():
    """The scraper parses only its gauges' lines: the same values as the whole page, a fraction of the parsing."""
    names = ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "odd_labels")
    page = PAGE + "vllm:num_requests_running_extra 9.0\n"  # a longer name that starts with a wanted one
    cut = select(page, names)
    whole = parse_prometheus(page)
    got = parse_prometheus(cut)
    assert {k: v for k, v in got.items() if k != "odd_labels"} == {n: whole[n] for n in names[:2]}
    assert math.isnan(got["odd_labels"]) and math.isnan(whole["odd_labels"])  # 1.5 + NaN, summed alike
    assert "_extra" not in cut and "bucket" not in cut and "# TYPE odd_labels gauge" in cut
    assert len(cut.splitlines()) < len(page.splitlines()) / 3
    assert select(page, ()) == "\n"
