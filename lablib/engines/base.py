"""The one call shape every engine answers.

nano-vllm's bench swaps its engine for real vLLM by changing one import; here every engine
(Hugging Face naive, Hugging Face static batching, vLLM in a worker process) takes the same
list of `PreparedRequest`s and returns one `RequestRecord` per request, with time stamps in
seconds since the call began. The benchmark never cares which engine ran.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..results.record import RequestRecord

OnRecord = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class PreparedRequest:
    """A request as an engine sees it: token ids in, an exact number of tokens out."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int


class Engine(Protocol):
    name: str  # "hf-naive", "hf-static", "vllm"
    facts: dict[str, Any]  # load/start-up time, weight bytes, KV capacity, backend...
    config: Any  # the frozen config it was built from

    def generate(self, requests: list[PreparedRequest], on_record: OnRecord | None = None,
                 progress: bool = True) -> list[RequestRecord]:
        """Run every request; call on_record as each finishes; return records in request order."""
        ...

    def close(self) -> None:
        """Free the model (and the GPU)."""
        ...
