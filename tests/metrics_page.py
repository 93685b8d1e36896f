"""One vLLM /metrics page for the tests that read one (tests/bench/test_prom.py, tests/engines/test_server.py).

Written the way vLLM 0.26's API server writes it (prometheus_client's text exposition): HELP/TYPE lines,
counters with `_total` and `_created` (prompt tokens: `_created` inside the counter's family, as
prometheus_client writes it; generation tokens: `_created` typed as a gauge of its own), gauges per engine
(two engines: their values sum), histograms with buckets, a summary with quantiles, escaped label values,
a time stamp, a NaN.
"""
import textwrap

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
    # HELP vllm:prompt_tokens_total Number of prefill tokens processed.
    # TYPE vllm:prompt_tokens_total counter
    vllm:prompt_tokens_total{engine="0",model_name="qwen"} 51234.0
    vllm:prompt_tokens_created{engine="0",model_name="qwen"} 1.7e+09
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
