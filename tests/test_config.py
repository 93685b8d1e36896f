"""Run configurations refuse every value that cannot work, naming the field and the value,
before any model loads. Pure Python: milliseconds."""

import dataclasses

import pytest

from lablib.config import BenchConfig, HFConfig, VLLMConfig

BAD = [
    # (config class, keyword arguments, field the message must name, value as it must appear)
    (HFConfig, {"mode": "static", "batch_size": 0}, "batch_size", "0"),
    (HFConfig, {"mode": "static", "batch_size": -1}, "batch_size", "-1"),
    (HFConfig, {"mode": "static", "batch_size": True}, "batch_size", "True"),
    (HFConfig, {"mode": "static", "batch_size": 1.5}, "batch_size", "1.5"),
    (HFConfig, {"mode": "static", "batch_size": "4"}, "batch_size", "'4'"),
    (HFConfig, {"mode": "fast"}, "mode", "'fast'"),
    (HFConfig, {"mode": "naive", "batch_size": 4}, "batch_size", "4"),
    (HFConfig, {"dtype": "int3"}, "dtype", "'int3'"),
    (HFConfig, {"device": "tpu"}, "device", "'tpu'"),
    (BenchConfig, {"max_new_tokens": 0}, "max_new_tokens", "0"),
    (BenchConfig, {"max_new_tokens": -5}, "max_new_tokens", "-5"),
    (BenchConfig, {"max_new_tokens": 8.0}, "max_new_tokens", "8.0"),
    (BenchConfig, {"warmup_requests": -1}, "warmup_requests", "-1"),
    (BenchConfig, {"warmup_requests": False}, "warmup_requests", "False"),
    (BenchConfig, {"monitor_interval_s": 0}, "monitor_interval_s", "0"),
    (BenchConfig, {"monitor_interval_s": 60}, "monitor_interval_s", "60"),
    (BenchConfig, {"monitor_interval_s": float("nan")}, "monitor_interval_s", "nan"),
    (BenchConfig, {"seed": -1}, "seed", "-1"),
    (VLLMConfig, {"gpu_memory_utilization": 0}, "gpu_memory_utilization", "0"),
    (VLLMConfig, {"gpu_memory_utilization": 1.2}, "gpu_memory_utilization", "1.2"),
    (VLLMConfig, {"gpu_memory_utilization": -0.1}, "gpu_memory_utilization", "-0.1"),
    (VLLMConfig, {"gpu_memory_utilization": True}, "gpu_memory_utilization", "True"),
    (VLLMConfig, {"max_num_seqs": 0}, "max_num_seqs", "0"),
    (VLLMConfig, {"max_num_batched_tokens": 128, "max_num_seqs": 256}, "max_num_batched_tokens", "128"),
    (VLLMConfig, {"max_num_batched_tokens": 0}, "max_num_batched_tokens", "0"),
    (VLLMConfig, {"max_model_len": -1}, "max_model_len", "-1"),
    (VLLMConfig, {"tensor_parallel_size": 0}, "tensor_parallel_size", "0"),
    (VLLMConfig, {"kv_cache_dtype": "int4"}, "kv_cache_dtype", "'int4'"),
    (VLLMConfig, {"quantization": "magic"}, "quantization", "'magic'"),
    (VLLMConfig, {"dtype": "fp64"}, "dtype", "'fp64'"),
]


@pytest.mark.parametrize("cls,kwargs,field,shown", BAD, ids=[f"{c.__name__}-{f}-{s}" for c, _, f, s in BAD])
def test_bad_value_names_field_and_value(cls, kwargs, field, shown):
    with pytest.raises(ValueError) as e:
        cls(**kwargs)
    msg = str(e.value)
    assert f"{cls.__name__}.{field}={shown}" in msg, msg


def test_out_of_range_messages_say_what_is_allowed():
    with pytest.raises(ValueError, match=r"HFConfig\.batch_size=0: allowed integers >= 1; Fix:"):
        HFConfig("static", 0)
    with pytest.raises(ValueError, match=r"HFConfig\.mode='fast': allowed 'naive', 'static', 'continuous'; Fix:"):
        HFConfig("fast")
    with pytest.raises(ValueError, match=r"VLLMConfig\.gpu_memory_utilization=1\.2: allowed a number in \(0, 1\]; Fix:"):
        VLLMConfig(gpu_memory_utilization=1.2)
    with pytest.raises(ValueError, match=r"VLLMConfig\.max_num_batched_tokens=128: allowed >= max_num_seqs=256"):
        VLLMConfig(max_num_batched_tokens=128)
    with pytest.raises(ValueError, match="'fp8'"):
        VLLMConfig(kv_cache_dtype="int4")


@pytest.mark.parametrize("kwargs", [{}, {"mode": "naive", "batch_size": 1}, {"mode": "static", "batch_size": 1},
                                    {"mode": "static", "batch_size": 64, "dtype": "bfloat16", "device": "cpu"},
                                    {"mode": "static", "batch_size": 16, "compile": True}])
def test_good_hf_configs(kwargs):
    c = HFConfig(**kwargs)
    assert c.engine == f"hf-{c.mode}" + ("-compile" if c.compile else "")
    assert c.to_dict() == {**{"mode": "naive", "batch_size": 1, "dtype": "auto", "device": "auto",
                              "attn_implementation": "sdpa", "speculative": "", "num_speculative_tokens": 4,
                              "draft_model": "embedded-draft", "compile": False}, **kwargs}


def test_good_bench_configs():
    assert BenchConfig().max_new_tokens is None and BenchConfig().seed == 0
    b = BenchConfig(warmup_requests=0, max_new_tokens=1, monitor_interval_s=0.001, tags={"x": 1})
    assert (b.warmup_requests, b.max_new_tokens, b.tags) == (0, 1, {"x": 1})


@pytest.mark.parametrize("kwargs", [{}, {"gpu_memory_utilization": 1}, {"gpu_memory_utilization": 0.05},
                                    {"max_num_seqs": 1, "max_num_batched_tokens": 1},
                                    {"kv_cache_dtype": "fp8", "quantization": "fp8", "max_model_len": 4096},
                                    {"speculative_config": {"model": "d", "num_speculative_tokens": 4}}])
def test_good_vllm_configs(kwargs):
    assert VLLMConfig(**kwargs).engine == "vllm"


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        HFConfig().batch_size = 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        VLLMConfig().max_num_seqs = 8


def test_llm_kwargs_leave_vllm_defaults_where_none():
    kw = VLLMConfig().llm_kwargs()
    assert None not in kw.values()
    assert not {"max_num_batched_tokens", "max_model_len", "quantization", "speculative_config"} & set(kw)
    assert kw["gpu_memory_utilization"] == 0.9 and kw["max_num_seqs"] == 256 and kw["enable_prefix_caching"] is False
    spec = {"model": "draft", "num_speculative_tokens": 4}
    kw = VLLMConfig(max_model_len=2048, quantization="fp8", speculative_config=spec).llm_kwargs()
    assert kw["max_model_len"] == 2048 and kw["quantization"] == "fp8" and kw["speculative_config"] == spec
    assert set(kw) | {"max_num_batched_tokens", "attention_backend", "distributed_executor_backend",
                      "num_gpu_blocks_override", "kv_cache_memory_bytes", "load_format", "nnodes", "node_rank",
                      "master_addr", "master_port", "compilation_config", "async_scheduling",
                      "model_runner_v2"} == set(VLLMConfig().to_dict())  # the runner: an environment variable
    off = {"pass_config": {"fuse_allreduce_rms": False}}  # passed unchanged: vLLM 0.26's own key
    assert VLLMConfig(compilation_config=off).llm_kwargs()["compilation_config"] == off
    with pytest.raises(ValueError, match=r"VLLMConfig\.compilation_config='O0': allowed a dict"):
        VLLMConfig(compilation_config="O0")


def test_multi_node_settings_pass_to_vllm_unchanged_and_bad_ones_name_the_fix():
    two = VLLMConfig(tensor_parallel_size=8, pipeline_parallel_size=2, distributed_executor_backend="mp", nnodes=2,
                     node_rank=1, master_addr="10.0.0.1", master_port=29501)
    kw = two.llm_kwargs()
    assert {k: kw[k] for k in ("nnodes", "node_rank", "master_addr", "master_port")} == {
        "nnodes": 2, "node_rank": 1, "master_addr": "10.0.0.1", "master_port": 29501}
    assert two.gpus == 16 and two.gpus_per_node == 8
    assert not {"nnodes", "node_rank", "master_addr", "master_port"} & set(VLLMConfig().llm_kwargs())  # vLLM's own
    with pytest.raises(ValueError, match=r"VLLMConfig\.distributed_executor_backend='ray': allowed 'mp' with nnodes=2"):
        VLLMConfig(tensor_parallel_size=2, nnodes=2, node_rank=0, master_addr="a", distributed_executor_backend="ray")
    with pytest.raises(ValueError, match=r"VLLMConfig\.node_rank=2: allowed 0\.\.1 with nnodes=2"):
        VLLMConfig(tensor_parallel_size=2, nnodes=2, node_rank=2, master_addr="a", distributed_executor_backend="mp")
    with pytest.raises(ValueError, match=r"VLLMConfig\.master_addr=None: allowed node 0's address"):
        VLLMConfig(tensor_parallel_size=2, nnodes=2, node_rank=0, distributed_executor_backend="mp")
    with pytest.raises(ValueError, match=r"VLLMConfig\.nnodes=2: allowed a divisor of .*=3"):
        VLLMConfig(pipeline_parallel_size=3, nnodes=2, node_rank=0, master_addr="a", distributed_executor_backend="mp")
    with pytest.raises(ValueError, match=r"VLLMConfig\.node_rank=1: allowed None or 0 on one machine"):
        VLLMConfig(node_rank=1)
    with pytest.raises(ValueError, match=r"VLLMConfig\.nnodes=0: allowed integers >= 1"):
        VLLMConfig(nnodes=0)
    for port in (0, 65536):
        with pytest.raises(ValueError, match=rf"VLLMConfig\.master_port={port}: allowed integers 1\.\.65535"):
            VLLMConfig(master_port=port)
    assert VLLMConfig(master_port=65535).master_port == 65535
