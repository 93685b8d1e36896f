"""SamplingParams with vLLM's keyword names; an unknown keyword is a TypeError, as in vLLM."""
from __future__ import annotations

import enum


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # every output carries all tokens so far
    DELTA = 1  # every output carries only the new tokens
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingParams:
    def __init__(self, *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 max_tokens: int | None = 16, ignore_eos: bool = False, detokenize: bool = True,
                 output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE, prompt_logprobs: int | None = None):
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}.")
        if temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {temperature}.")
        if not isinstance(output_kind, RequestOutputKind):
            raise TypeError(f"output_kind must be a RequestOutputKind, got {output_kind!r}")
        self.n, self.temperature, self.top_p, self.seed = n, temperature, top_p, seed
        self.max_tokens, self.ignore_eos = max_tokens, ignore_eos
        if prompt_logprobs is not None and prompt_logprobs < -1:
            raise ValueError(f"prompt_logprobs must be non-negative or -1, got {prompt_logprobs}.")
        self.detokenize, self.output_kind, self.prompt_logprobs = detokenize, output_kind, prompt_logprobs
