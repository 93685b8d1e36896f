"""lablib.bench.prom on a /metrics page written the way vLLM 0.26's API server writes it (prometheus_client's
text exposition: HELP/TYPE lines, counters with `_total` and `_created`, gauges per engine, histograms with
buckets, a summary with quantiles, escaped label values, a time stamp), read by prometheus_client's own parser."""

import math
import textwrap

import pytest

from lablib.bench.prom import parse_labels, parse_prometheus, parse_samples, select, window_means

PAGE = textwrap.dedent(r'''
    # HELP python_gc_objects_collected_total Objects collected during gc
    # TYPE python_gc_objects_collected_total counter
    python_gc_objects_collected_total{generation="0"} 12345.0
    python_gc_objects_collected_total{generation="1"} 55.0
    # HELP vllm:num_requests_running Number of requests in model execution batches.
    # TYPE vllm:num_requests_running gauge
    vllm:num_requests_running{engine="0",model_name="qwen"} 12.0
    vllm:num_requests_running{engine="1",model_name="qwen"} 3.0
    # HELP vllm:num_requests_waiting Number of requests waiting to be processed.
    # TYPE vllm:num_requests_waiting gauge
    vllm:num_requests_waiting{engine="0",model_name="qwen"} 4.0
    vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
    # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
    # TYPE vllm:kv_cache_usage_perc gauge
    vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.8125
    # HELP vllm:generation_tokens_total Number of generation tokens processed.
    # TYPE vllm:generation_tokens_total counter
    vllm:generation_tokens_total{engine="0",model_name="qwen"} 1000.0
    vllm:generation_tokens_total{engine="1",model_name="qwen"} 234.0
    # HELP vllm:generation_tokens_created Number of generation tokens processed.
    # TYPE vllm:generation_tokens_created gauge
    vllm:generation_tokens_created{engine="0",model_name="qwen"} 1.7e+09
    # HELP vllm:request_success_total Count of successfully processed requests.
    # TYPE vllm:request_success_total counter
    vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen"} 30.0
    vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen"} 8.0
    # HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
    # TYPE vllm:time_to_first_token_seconds histogram
    vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="qwen"} 0.0
    vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="qwen"} 30.0
    vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="qwen"} 40.0
    vllm:time_to_first_token_seconds_count{engine="0",model_name="qwen"} 40.0
    vllm:time_to_first_token_seconds_sum{engine="0",model_name="qwen"} 2.5
    vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="qwen"} 10.0
    vllm:time_to_first_token_seconds_count{engine="1",model_name="qwen"} 10.0
    vllm:time_to_first_token_seconds_sum{engine="1",model_name="qwen"} 0.5
    # HELP http_request_duration_seconds Latency with only few buckets by handler.
    # TYPE http_request_duration_seconds histogram
    http_request_duration_seconds_bucket{handler="/v1/completions",le="0.1",method="POST"} 3.0
    http_request_duration_seconds_bucket{handler="/v1/completions",le="+Inf",method="POST"} 50.0
    http_request_duration_seconds_count{handler="/v1/completions",method="POST"} 50.0
    http_request_duration_seconds_sum{handler="/v1/completions",method="POST"} 4.0
    http_request_duration_seconds_created{handler="/v1/completions",method="POST"} 1.7e+09
    # HELP rpc_latency_seconds A summary with quantiles.
    # TYPE rpc_latency_seconds summary
    rpc_latency_seconds{quantile="0.5",service="a"} 0.2
    rpc_latency_seconds{quantile="0.99",service="a"} 0.9
    rpc_latency_seconds_sum{service="a"} 7.5
    rpc_latency_seconds_count{service="a"} 30.0
    rpc_latency_seconds_created{service="a"} 1.7e+09
    # HELP http_requests_total Total number of requests by method, status and handler.
    # TYPE http_requests_total counter
    http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 45.0 1700000000000
    http_requests_total{handler="/metrics",method="GET",status="2xx"} 5.0
    # TYPE odd_labels gauge
    odd_labels{path="a\"b,c}",note="line\nbreak",dir="C:\\tmp"} 1.5
    odd_labels{path="plain",note="",dir=""} NaN
    ''').lstrip()


def test_a_vllm_page_parsed_exactly():
    m = parse_prometheus(PAGE)
    assert m == {
        "python_gc_objects_collected_total": 12400.0,
        "vllm:num_requests_running": 15.0,  # summed over the two engines
        "vllm:num_requests_waiting": 4.0,
        "vllm:kv_cache_usage_perc": 0.8125,
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
