"""The one call shape every engine answers.

nano-vllm's bench swaps its engine for real vLLM by changing one import; here every engine
(Hugging Face naive, Hugging Face static batching, vLLM in a worker process, an
OpenAI-compatible server) takes the same list of `PreparedRequest`s and returns one
`RequestRecord` per request, with time stamps in seconds since the call began. The
benchmark (`lablib.bench.offline.run`) uses exactly what `Engine` below declares, and never
cares which engine ran.

An engine's life has three steps, so that everything that needs no GPU time happens first:
construct it (cheap: the config and model checked, the tokenizer loaded, `facts["context"]`
known), `start()` it (the expensive part: weights loaded, a worker or server launched;
idempotent, and `generate` starts an engine that was not started), then `close()` it (the
GPU back to its baseline). The benchmark checks every request against `facts["context"]`
between the first two steps, so a prompt too long for the model is refused before a vLLM
engine spends a minute starting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..results.record import RequestRecord

OnRecord = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class PreparedRequest:
    """A request as an engine sees it: token ids in, an exact number of tokens out (EOS ignored)."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int


class Engine(Protocol):
    name: str  # "hf-naive", "hf-static", "vllm", "vllm-server"
    spec: Any  # the ModelSpec it runs (lablib.models)
    tokenizer: Any  # turns a workload's text into prompt ids for this model
    config: Any  # the frozen config it was built from (to_dict() goes into every Result)
    facts: dict[str, Any]  # what actually ran: context, start-up time, weight bytes, KV capacity, backend, ignore_eos...

    def start(self) -> "Engine":
        """Load the model / launch the worker; a no-op once started."""
        ...

    def generate(self, requests: list[PreparedRequest], on_record: OnRecord | None = None,
                 progress: bool = True) -> list[RequestRecord]:
        """Run every request; call on_record as each finishes; return records in request order."""
        ...

    # Optional: `size_for(requests)`, called by bench.offline.run before the warm-up with the run's requests, lets an
    # engine of fixed shapes (HFEngine with compile=True: a static cache) compile the shapes the run will use.

    def worker_pids(self) -> list[int]:
        """Processes outside this one that hold the model (the memory monitor watches them); [] for in-process."""
        ...

    def close(self) -> None:
        """Free the model (and the GPU)."""
        ...


class GroupEngine(Engine, Protocol):
    """An engine `lablib.engines.together` starts beside others: vLLM's offline engine (`VLLMEngine`) and its OpenAI
    server (`ServerEngine`). Its settings read as a VLLMConfig, it is made again with another (sized for the run), its
    start is split in two so several run side by side, and its close says whether its own memory came back."""

    baseline: Any  # the GPU's memory (nvml_used) before it, or its group, started

    def vllm_config(self) -> Any:
        """Its settings as a VLLMConfig (lablib.config), as `together` sizes them."""
        ...

    def resized(self, config: Any) -> "GroupEngine":
        """A new engine of the same model and kind with `config`, not started."""
        ...

    def launch(self) -> "GroupEngine":
        """Start its processes without waiting for them."""
        ...

    def wait_ready(self) -> "GroupEngine":
        """Wait until the launched engine answers; its start-up facts into `facts`."""
        ...

    def alive(self) -> bool:
        """Whether its processes are up."""
        ...

    def others(self) -> list["GroupEngine"]:
        """The other engines of this process still up (idle while this one runs)."""
        ...

    def close(self, force: bool = False, beside: bool | None = None) -> None:  # type: ignore[override]
        """End its processes; `beside`: other engines are up, so only its own processes must let go of memory."""
        ...
