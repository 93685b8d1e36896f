"""The fake `LLM`, its engine loop and its EngineCore child process (see the package docstring)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .entrypoints.openai.api_server import PrefixCache  # the server's too
from .sampling_params import RequestOutputKind, SamplingParams
from .scores import fake_logprob

# The EngineArgs names lablib may pass (an unknown one is a TypeError, as in vLLM).
ENGINE_ARGS = {"gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
               "enable_prefix_caching", "enforce_eager", "dtype", "quantization", "kv_cache_dtype",
               "speculative_config", "tensor_parallel_size", "seed", "block_size", "trust_remote_code",
               "attention_backend", "pipeline_parallel_size", "distributed_executor_backend",
               "disable_custom_all_reduce", "async_scheduling", "num_gpu_blocks_override",
               "load_format", "nnodes", "node_rank", "master_addr", "master_port",
               "compilation_config", "kv_cache_memory_bytes"}  # all in vLLM 0.26's
# vllm/engine/arg_utils.py EngineArgs

# vLLM's EngineCore: prints what vLLM logs at start (to the inherited stderr), says ready, then waits.
# Like vLLM's it exits when its parent dies, unless FAKE_VLLM_ORPHAN_WATCH=0; it never outlives 120 s.
ENGINE_CORE = r"""
import os, sys, time
print("INFO [cuda.py:300] Using FLASH_ATTN attention backend out of potential backends: "
      "['FLASH_ATTN', 'FLEX_ATTENTION']", file=sys.stderr, flush=True)
print("ready", flush=True)
parent, watch, deadline = os.getppid(), sys.argv[2] == "1", time.monotonic() + 120
while time.monotonic() < deadline and not (watch and os.getppid() != parent):
    time.sleep(0.05)
"""


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class RequestOutput:
    request_id: str  # the id given to add_request (not the suffixed one it returned)
    outputs: list[CompletionOutput]
    finished: bool
    metrics: Any = None  # set only with stats logging on (disable_log_stats=False)
    num_cached_tokens: int | None = None  # prompt tokens the prefix cache served
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # with SamplingParams(prompt_logprobs=k)


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival_time: float
    output: list[int] = field(default_factory=list)
    scheduled_ts: float = 0.0
    cached: int = 0


@dataclass
class Metric:
    name: str
    value: float | None = None  # Counter and Gauge; a Histogram has count/sum/buckets instead
    count: int | None = None
    sum: float | None = None
    buckets: list[int] | None = None


class LLMEngine:
    """Continuous batching in miniature: up to max_num_seqs requests run, each gets one token per step."""

    def __init__(self, vllm_config: SimpleNamespace, log_stats: bool, prefix_caching: bool = True):
        self.vllm_config = vllm_config
        self.log_stats = log_stats
        self.prefix_caching = prefix_caching  # on by default, as in vLLM 0.26 for Llama
        self.cache = PrefixCache(vllm_config.cache_config.block_size, prefix_caching)  # no eviction in the fake
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._finished = 0
        self._counters = {"vllm:prompt_tokens": 0, "vllm:generation_tokens": 0, "vllm:request_success": 0}
        self._ttft: list[float] = []
        crash = os.environ.get("FAKE_VLLM_CRASH_AFTER")
        self._crash_after = int(crash) if crash else None
        self._step_sleep = float(os.environ.get("FAKE_VLLM_STEP_SLEEP") or 0)

    def add_request(self, request_id: str, prompt: dict, params: SamplingParams,
                    arrival_time: float | None = None) -> str:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        ids = list(prompt["prompt_token_ids"])
        max_len = self.vllm_config.model_config.max_model_len
        if len(ids) > max_len:
            raise ValueError(f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                             f"of {max_len}.")
        self._waiting.append(_Request(request_id, ids, params, arrival_time or time.monotonic()))
        return f"{request_id}-{uuid.uuid4().hex[:8]}"  # vLLM 0.26 makes the id unique; outputs keep the original

    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting or self._running)

    def step(self) -> list[RequestOutput]:
        if self._crash_after is not None and self._finished >= self._crash_after:
            print(f"FAKE_VLLM: EngineCore hit a fatal error after {self._finished} finished requests",
                  file=sys.stderr, flush=True)
            os._exit(3)
        if self._step_sleep:
            time.sleep(self._step_sleep)
        while self._waiting and len(self._running) < self.vllm_config.scheduler_config.max_num_seqs:
            r = self._waiting.popleft()
            r.scheduled_ts = time.monotonic()
            self._counters["vllm:prompt_tokens"] += len(r.prompt)
            r.cached = self.cache.admit(r.prompt) or 0  # full blocks only, never the last prompt token
            self._running.append(r)
        outs = []
        for r in self._running:
            token = (len(r.prompt) + len(r.output)) % 100
            r.output.append(token)
            self._counters["vllm:generation_tokens"] += 1
            if len(r.output) == 1:
                self._ttft.append(time.monotonic() - r.arrival_time)
            finished = len(r.output) >= r.params.max_tokens
            kind = r.params.output_kind
            if kind == RequestOutputKind.FINAL_ONLY and not finished:
                continue
            ids = [token] if kind == RequestOutputKind.DELTA else list(r.output)
            metrics = (SimpleNamespace(arrival_time=r.arrival_time, scheduled_ts=r.scheduled_ts)
                       if self.log_stats else None)
            scored = None
            if r.params.prompt_logprobs is not None and len(r.output) == 1:  # vLLM: with the first output
                scored = [None] + [{t: Logprob(fake_logprob(a, t), 1)} for a, t in zip(r.prompt, r.prompt[1:])]
            outs.append(RequestOutput(r.request_id, [CompletionOutput(0, ids)], finished, metrics,
                                      r.cached if self.prefix_caching else None, scored))
        done = [r for r in self._running if len(r.output) >= r.params.max_tokens]
        self._running = [r for r in self._running if len(r.output) < r.params.max_tokens]
        self._finished += len(done)
        self._counters["vllm:request_success"] += len(done)
        return outs

    def get_metrics(self) -> list[Metric]:
        assert self.log_stats, "Stat logging disabled"
        return [*(Metric(k, float(v)) for k, v in self._counters.items()),
                Metric("vllm:prefix_cache_queries", float(self.cache.queries)),
                Metric("vllm:prefix_cache_hits", float(self.cache.hits)),
                Metric("vllm:num_requests_running", float(len(self._running))),
                Metric("vllm:time_to_first_token_seconds", count=len(self._ttft), sum=sum(self._ttft), buckets=[])]


def _end_engine_core(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(10)


class LLM:
    def __init__(self, model: str, tokenizer: str | None = None, disable_log_stats: bool = True,
                 skip_tokenizer_init: bool = False, **kwargs: Any):
        message = os.environ.get("FAKE_VLLM_FAIL_START")
        if message:
            raise RuntimeError(message)
        # what vLLM reads when an engine starts (its model runner), in the engine's log: a spare worker must carry it
        print(f"fake-vllm: VLLM_USE_V2_MODEL_RUNNER={os.environ.get('VLLM_USE_V2_MODEL_RUNNER')}", file=sys.stderr,
              flush=True)
        unknown = sorted(set(kwargs) - ENGINE_ARGS)
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument {unknown[0]!r}")
        cfg = json.loads((Path(model) / "config.json").read_text())
        if not skip_tokenizer_init:
            tok = Path(tokenizer or model)
            if not any((tok / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
                raise OSError(f"Can't load tokenizer for '{tok}'. Pass skip_tokenizer_init=True to use token ids only.")
        dtype = kwargs.get("dtype", "auto")
        if dtype == "auto":
            dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
        self._core = subprocess.Popen(
            [sys.executable, "-c", ENGINE_CORE, os.environ.get("FAKE_VLLM_MARKER", "fake-vllm-enginecore"),
             os.environ.get("FAKE_VLLM_ORPHAN_WATCH", "1")], stdout=subprocess.PIPE, text=True)
        self._core.stdout.readline()
        weakref.finalize(self, _end_engine_core, self._core)  # vLLM ends its EngineCore when the LLM is collected
        # vLLM sizes the KV cache as the memory left after the weights over the bytes per block: the fake's budget
        # holds FAKE_VLLM_GPU_BLOCKS blocks of 16-bit K/V, so an fp8 KV cache (one byte an element) holds twice as
        # many; num_gpu_blocks_override fixes the count whatever the dtype, as in vLLM
        kv_dtype = kwargs.get("kv_cache_dtype", "auto")
        budget = int(os.environ.get("FAKE_VLLM_GPU_BLOCKS") or 1234)
        if kwargs.get("kv_cache_memory_bytes"):  # the pool given in bytes: blocks of 16 tokens of this model's K/V
            heads = cfg["num_attention_heads"]
            per_token = (2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads)
                         * (cfg.get("head_dim") or cfg["hidden_size"] // heads) * 2)
            budget = kwargs["kv_cache_memory_bytes"] // (kwargs.get("block_size", 16) * per_token)
        config = SimpleNamespace(
            cache_config=SimpleNamespace(num_gpu_blocks=kwargs.get("num_gpu_blocks_override")
                                         or budget * 2 // (1 if str(kv_dtype).startswith("fp8") else 2),
                                         block_size=kwargs.get("block_size", 16),
                                         cache_dtype=kv_dtype),
            scheduler_config=SimpleNamespace(max_num_seqs=kwargs.get("max_num_seqs", 256),
                                             max_num_batched_tokens=kwargs.get("max_num_batched_tokens", 16384)),
            model_config=SimpleNamespace(max_model_len=kwargs.get("max_model_len") or cfg["max_position_embeddings"],
                                         dtype=f"torch.{dtype}",  # vLLM holds a torch.dtype; str() reads the same
                                         enforce_eager=kwargs.get("enforce_eager", False)))
        self.llm_engine = LLMEngine(config, log_stats=not disable_log_stats,
                                    prefix_caching=kwargs.get("enable_prefix_caching", True) is not False)

    def get_metrics(self) -> list[Metric]:
        return self.llm_engine.get_metrics()

    def generate(self, prompts: list[dict], sampling_params: SamplingParams | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """vLLM's offline call: every prompt to the end, one final output each, in the prompts' order."""
        params = sampling_params or SamplingParams()
        final = {}
        for i, p in enumerate(prompts):
            self.llm_engine.add_request(str(i), p, params)
        while self.llm_engine.has_unfinished_requests():
            for o in self.llm_engine.step():
                kept = final.get(o.request_id)
                if kept is not None and kept.prompt_logprobs is not None:
                    o.prompt_logprobs = kept.prompt_logprobs
                final[o.request_id] = o
        return [final[str(i)] for i in range(len(prompts))]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        if self.llm_engine._running:
            return False  # vLLM refuses while blocks are in use
        self.llm_engine.cache.reset()
        return True
