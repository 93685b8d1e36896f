"""A fake vLLM for tests on machines without a GPU (test support only; never installed).

It has exactly the slice of vLLM 0.26's API that `lablib/engines/vllm_worker.py` uses:
`LLM(...)` with `.llm_engine` (`vllm_config`, `add_request`, `step`,
`has_unfinished_requests`), `.get_metrics()` and `.generate()` (for `prompt_logprobs`); `SamplingParams`;
`inputs.TokensPrompt`; `sampling_params.RequestOutputKind`; `__version__`. Like vLLM it
starts an "EngineCore" child process, which prints the attention-backend line the worker
reads from its log, and which the LLM ends when it is garbage-collected.

Its engine decodes one token per step for every running request, token i of a request
being `(prompt length + i) % 100`, and stops at `max_tokens`. Environment variables,
read in the worker process, steer it:

  FAKE_VLLM_FAIL_START=msg      LLM(...) raises RuntimeError(msg)
  FAKE_VLLM_CRASH_AFTER=N       the process dies (os._exit(3), no message) at the first step after N finished requests
  FAKE_VLLM_STEP_SLEEP=s        each step takes at least s seconds
  FAKE_VLLM_GPU_BLOCKS=n        KV blocks the engine reports at 16-bit KV (default 1234, block size 16); twice as
                                many with kv_cache_dtype='fp8' (half the bytes per token)
  FAKE_VLLM_ORPHAN_WATCH=0      the EngineCore no longer exits by itself when its parent dies
  FAKE_VLLM_MARKER=text         put on the EngineCore's command line, so a test can find it
"""
from .llm import LLM
from .sampling_params import SamplingParams

__version__ = "0.26.0+fake"

__all__ = ["LLM", "SamplingParams", "__version__"]
