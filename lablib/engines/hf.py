"""Hugging Face `generate`, the naive baseline every optimisation is measured against.

Naive: one request at a time. Each decode step reads every weight from memory to produce
one token for one sequence, so the GPU (or CPU) spends its time waiting on memory: decode
is bandwidth-bound, and batch 1 leaves almost all of the arithmetic unused.

Static batching: B requests are left-padded to one length and decoded together, so one
read of the weights serves B tokens. The price: a batch runs until its longest member is
done, finished members keep occupying their slot (padding), short requests wait for long
ones, and nothing new can join until the whole batch ends. Continuous batching (vLLM, lab
04) removes exactly that; transformers has its own ("continuous": a paged KV cache, a finished
request's slot refilled at the next step), the Hugging Face path a user would pick instead of vLLM.

Compiled (`HFConfig(compile=True)`, the transformers optimisation guide's recipe): the KV cache is allocated once
at a fixed length (a static cache) so every decode step has the same shapes, and `generate` compiles that step
with torch.compile (mode "reduce-overhead": on a GPU the step is replayed as a CUDA graph, one launch instead of
hundreds). Fixed shapes are the price: the cache is sized for the longest request the run holds (`size_for`), the
attention reads all of it each step, and every batch is padded to `batch_size` rows (the padding's tokens are
computed and dropped). The first call compiles (tens of seconds); `facts["first_call_s"]` keeps it.

Timing: a streamer receives every step's tokens as they leave the model (`.cpu()` inside
`generate` synchronises the device), so each output token gets its own time stamp.
Output lengths are exact (`ignore_eos`): EOS is not a stop token here, as in vLLM's
`ignore_eos=True`, so the greedy tokens stay comparable between engines.
"""
from __future__ import annotations

import copy
import logging
import time
from typing import Any

from .. import validate
from ..config import HFConfig
from ..hardware.oom import free_memory
from ..models import ModelSpec, load_hf_model, prompt_tokenizer, resolve_model
from ..results.record import RequestRecord
from .base import OnRecord, PreparedRequest

CONTINUOUS_BLOCK = 256  # tokens per page of transformers' paged KV cache (its default)
CONTINUOUS_MAX_LEN = 4096  # the longest sequence the continuous cache is sized for (prompt + output)
CONTINUOUS_STEP_TOKENS = 2048  # tokens one step of it may carry (prompts' chunks and decodes); unset, it sizes from memory


class _AssistantCallNotice(logging.Filter):
    """Drops one transformers notice that our call does not cause. Assisted generation's own call to the draft
    (transformers 5's `AssistedCandidateGenerator._prepare_generation_args`) passes `generation_config` beside
    `min_new_tokens` and `max_new_tokens`, and `generate` then calls that mix deprecated, to a user who passed
    a `generation_config` alone. Every other message of that logger passes."""

    NOTICE = "Passing `generation_config` together with generation-related arguments"

    def filter(self, record: logging.LogRecord) -> bool:
        return self.NOTICE not in record.getMessage()


def quiet_assistant_call_notice() -> None:
    """Install `_AssistantCallNotice` on transformers' generation logger, once per process."""
    log = logging.getLogger("transformers.generation.utils")
    if not any(isinstance(f, _AssistantCallNotice) for f in log.filters):
        log.addFilter(_AssistantCallNotice())


class _StepClock:
    """A generate() streamer that time-stamps each decode step (the first put is the prompt).

    A plain step puts one token per sequence (shape [batch]); an assisted (speculative) step puts the tokens
    the target accepted plus its own next one (shape [1, n]): each gets the step's time, and `steps` counts
    the target's forwards, so tokens / steps is tokens per target forward. That is vLLM's mean acceptance
    length only where every step drafted: prompt lookup finds nothing to propose on some steps, which then
    count as plain ones (vLLM counts drafted steps only)."""

    def __init__(self, t0: float):
        self.t0, self.times, self.steps, self._prompt_seen = t0, [], 0, False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        now = time.perf_counter() - self.t0
        self.steps += 1
        self.times += [now] * (int(value.shape[-1]) if getattr(value, "dim", lambda: 1)() == 2 else 1)

    def end(self) -> None:
        pass


def _sizes(model: Any) -> dict[str, int]:
    """A model's parameters and weight bytes, each tensor once (`parameters()` skips tied duplicates)."""
    params = list(model.parameters())
    return {"parameters": sum(p.numel() for p in params),
            "weight_bytes": sum(p.numel() * p.element_size() for p in params)}


def exact_draft_length(assistant_config: Any, k: int) -> Any:
    """Make a draft's generation_config propose exactly k tokens every assisted step (in place; returned).

    transformers 5.17's candidate generator reads the assistant's own config, whose defaults are 20 tokens,
    schedule "constant" and a confidence threshold of 0.4 (the draft stops early when unsure, re-fitted with
    scikit-learn): the k a lab sets would not be the k that ran."""
    assistant_config.update(num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                            assistant_confidence_threshold=0.0)
    return assistant_config


def progress_bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm  # deferred: tqdm

    return tqdm(total=total, desc=desc, unit="req", leave=False)


class HFEngine:
    """Hugging Face transformers `generate`, naive or statically batched, in this process."""

    def __init__(self, model: str | ModelSpec = "embedded", config: HFConfig = HFConfig()):
        import torch  # deferred: torch

        self.config = config
        self.spec = model if isinstance(model, ModelSpec) else resolve_model(model)
        self.device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("HFConfig.device='cuda' but no CUDA GPU is visible. Fix: device='auto' or 'cpu'.")
        t0 = time.perf_counter()
        self.tokenizer = prompt_tokenizer(self.spec)
        self.model = load_hf_model(self.spec, self.device, config.dtype, config.attn_implementation)
        self._gen_config = copy.deepcopy(self.model.generation_config)
        self._gen_config.eos_token_id = None  # ignore_eos: generate exactly max_new_tokens
        self._gen_config.do_sample = False
        self._gen_config.pad_token_id = self.tokenizer.pad_token_id
        self.draft = self._load_draft(config) if config.speculative == "draft" else None
        self._manager: Any = None  # mode="continuous": transformers' manager, made by the first generate call
        self._continuous_len: int | None = None  # mode="continuous": the paged cache's length per request (size_for)
        self._cache_len: int | None = None  # compile=True: the static cache's length, grown only (a new length recompiles)
        self._kv: Any = None  # compile=True: the StaticCache every call decodes into (`_kv_cache`), and its length
        self._kv_len: int | None = None
        self._calls = 0  # generate calls on it (request ids are unique per call)
        if config.speculative == "ngram":
            self._gen_config.prompt_lookup_num_tokens = config.num_speculative_tokens
        sizes = _sizes(self.model)
        dtype = next(self.model.parameters()).dtype
        self.name = config.engine
        self.facts = {
            "load_s": time.perf_counter() - t0, "device": self.device, "dtype": str(dtype).replace("torch.", ""),
            **sizes,
            "kv_bytes_per_token": self.spec.kv_bytes_per_token(dtype.itemsize),
            "context": self.spec.architecture()["context"], "batch_size": config.batch_size,
            "ignore_eos": True,  # EOS is not a stop token here (generation_config.eos_token_id = None)
            "attn_implementation": self.model.config._attn_implementation,
        }
        if self.draft is not None:
            self.facts["draft"] = {"model": config.draft_model, **_sizes(self.draft)}
        if config.compile:
            self.facts["compile"] = self._static_cache()

    def _static_cache(self) -> dict[str, Any]:
        """compile=True: generate's auto-compiled decode step (on a CPU too, where transformers compiles only when
        asked: `_compile_all_devices`) over one StaticCache the engine keeps (`_kv_cache`)."""
        from transformers import CompileConfig  # deferred: transformers

        compile_config = CompileConfig()  # fullgraph off, mode "reduce-overhead": transformers' defaults
        if self.device != "cuda":
            compile_config._compile_all_devices = True
        self._gen_config.compile_config = compile_config
        return {"cache": "static", "mode": compile_config.mode, "max_cache_len": None, "cache_lengths": 0,
                "padded_rows": 0, "first_call_s": None}

    def _kv_cache(self) -> Any:
        """The StaticCache every compiled call decodes into: made once per length and emptied between calls, so its
        tensors keep their addresses and a captured CUDA graph stays valid (cache_implementation="static" would make
        a new cache each call)."""
        from transformers import StaticCache  # deferred: transformers

        if self._kv is None or self._kv_len != self._cache_len:
            self._kv = StaticCache(config=self.model.config, max_cache_len=self._cache_len)
            self._kv_len = self._cache_len
        else:
            self._kv.reset()
        return self._kv

    def size_for(self, requests: list[PreparedRequest]) -> None:
        """Before the warm-up: size the static cache (compile=True) for the longest request of the run to come, so
        the warm-up compiles the very shapes the run decodes with; size continuous batching's paged cache for it
        (made by the warm-up, kept for the run); otherwise a no-op."""
        if not requests:
            return
        longest = max(len(r.prompt_ids) + r.max_new_tokens for r in requests)
        if self.config.compile:
            self._grow_cache(max(len(r.prompt_ids) for r in requests) + max(r.max_new_tokens for r in requests))
        if self.config.mode == "continuous" and self._manager is None:
            self._continuous_len = min(self.facts["context"], CONTINUOUS_MAX_LEN,
                                       -(-longest // CONTINUOUS_BLOCK) * CONTINUOUS_BLOCK)

    def _grow_cache(self, length: int) -> None:
        if self._cache_len is None or length > self._cache_len:
            self._cache_len = length
            self.facts["compile"]["max_cache_len"] = length
            self.facts["compile"]["cache_lengths"] += 1  # each new length: a new cache, compiled again

    def _load_draft(self, config: HFConfig) -> Any:
        """The draft for assisted generation, proposing exactly k tokens a step (`exact_draft_length`)."""
        draft_spec = resolve_model(config.draft_model)
        draft = load_hf_model(draft_spec, self.device, config.dtype, config.attn_implementation)
        if draft.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(f"HFConfig.draft_model={config.draft_model!r}: allowed a draft with the target's "
                             f"vocabulary ({self.model.config.vocab_size} tokens; this one has "
                             f"{draft.config.vocab_size}); Fix: pick the target's own draft, or speculative='ngram'.")
        exact_draft_length(draft.generation_config, config.num_speculative_tokens)
        quiet_assistant_call_notice()  # transformers' own call to the draft warns of a mix our call never passes
        return draft

    def start(self) -> "HFEngine":
        """The model is loaded when the engine is made (in this process, seconds): nothing more to start."""
        return self

    def worker_pids(self) -> list[int]:
        return []

    def generate(self, requests: list[PreparedRequest], on_record: OnRecord | None = None,
                 progress: bool = True) -> list[RequestRecord]:
        import torch  # deferred: torch

        if self.config.mode == "continuous":
            return self._continuous(requests, on_record, progress)
        b = self.config.batch_size
        self._steps = 0
        if self.config.compile:
            self.facts["compile"]["padded_rows"] = 0  # this call's own
        if self.config.compile and requests:
            self._grow_cache(max(max(len(r.prompt_ids) for r in requests[i:i + b]) +
                                 max(r.max_new_tokens for r in requests[i:i + b]) for i in range(0, len(requests), b)))
        t0 = time.perf_counter()
        bar = progress_bar(len(requests), progress, self.name)
        records: list[RequestRecord] = []
        try:
            for i in range(0, len(requests), b):
                batch = requests[i:i + b]
                for rec in self._run_batch(batch, t0, torch):
                    records.append(rec)
                    if on_record:
                        on_record(rec)
                if bar:
                    bar.update(len(batch))
        finally:
            if bar:
                bar.close()
        if self.config.compile and self.facts["compile"]["first_call_s"] is None:
            self.facts["compile"]["first_call_s"] = round(time.perf_counter() - t0, 2)  # compiling included
        if self.config.speculative:  # this call's own counts (a warm-up call is not the run)
            tokens = sum(r.output_tokens for r in records)
            self.facts["last_run"] = {"speculative": {
                "method": self.config.speculative, "k": self.config.num_speculative_tokens, "target_forwards": self._steps,
                "tokens": tokens, "tokens_per_forward": tokens / self._steps if self._steps else None}}
        return records

    def _run_batch(self, batch: list[PreparedRequest], t0: float, torch: Any) -> list[RequestRecord]:
        width = max(len(r.prompt_ids) for r in batch)
        pad = self.tokenizer.pad_token_id
        rows = batch
        if self.config.compile and len(batch) < self.config.batch_size:  # the compiled step's shape: batch_size rows
            rows = batch + [batch[0]] * (self.config.batch_size - len(batch))
            self.facts["compile"]["padded_rows"] += self.config.batch_size - len(batch)
        ids = [[pad] * (width - len(r.prompt_ids)) + list(r.prompt_ids) for r in rows]
        mask = [[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in rows]
        n_max = max(r.max_new_tokens for r in batch)
        clock = _StepClock(t0)
        start = time.perf_counter() - t0
        gen = copy.copy(self._gen_config)
        gen.max_new_tokens = n_max
        extra = {"assistant_model": self.draft} if self.draft else {}
        with torch.inference_mode():  # the cache's tensors are inference tensors: emptied in this mode too
            if self.config.compile:
                extra["past_key_values"] = self._kv_cache()
            out = self.model.generate(
                input_ids=torch.tensor(ids, device=self.device), attention_mask=torch.tensor(mask, device=self.device),
                generation_config=gen, streamer=clock, **extra)
        done = time.perf_counter() - t0
        self._steps += clock.steps
        new = out[:, width:].tolist()
        recs = []
        for row, r in zip(new, batch):
            times = clock.times[:r.max_new_tokens]
            recs.append(RequestRecord(
                request_id=r.request_id, prompt_tokens=len(r.prompt_ids), output_tokens=r.max_new_tokens,
                arrival=0.0, start=start, first_token=times[0], last_token=times[-1],
                finished=done, token_times=times, output_ids=row[:r.max_new_tokens]))
        return recs

    def _continuous(self, requests: list[PreparedRequest], on_record: OnRecord | None,
                    progress: bool) -> list[RequestRecord]:
        """transformers' continuous batching: every request queued at t=0, up to batch_size decoding together, each
        finished one's slot refilled at the next step, the KV cache in pages (`continuous_batching_context_manager`).
        The manager and its cache are made once, on the first call (the warm-up), and kept: a run times the decoding,
        not the cache's allocation. The cache holds batch_size sequences of the run's longest request (`size_for`,
        in whole pages), else of the longest length the model takes here (its context, at most CONTINUOUS_MAX_LEN
        tokens); sized from memory instead, it zeroes most of a CPU's RAM."""
        length = self._continuous_len or min(self.facts["context"], CONTINUOUS_MAX_LEN)
        long = [r.request_id for r in requests if len(r.prompt_ids) + r.max_new_tokens > length]
        if long:  # the cache was sized for `length`: a longer one would evict others or never be scheduled
            raise validate.refuse("HFConfig", "mode", "continuous", f"requests of at most {length} tokens (prompt and "
                                  f"output) with transformers' continuous batching here; {long[:3]} are longer",
                                  "shorter requests (max_new_tokens), or mode='static'.")
        if self._manager is None:
            from transformers import ContinuousBatchingConfig  # deferred: transformers

            gen = copy.copy(self._gen_config)
            gen.eos_token_id = -1  # the manager's own way to say: no stop token (ignore_eos)
            cfg = ContinuousBatchingConfig(num_blocks=self.config.batch_size * -(-length // CONTINUOUS_BLOCK),
                                           block_size=CONTINUOUS_BLOCK, max_requests_per_batch=self.config.batch_size,
                                           max_batch_tokens=CONTINUOUS_STEP_TOKENS)
            self._manager = self.model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
            self.facts["continuous_cache_len"] = length  # tokens per request slot of the paged cache
            self._manager.start()
        bar = progress_bar(len(requests), progress, self.name)
        self._calls += 1  # ids unique per call: a result left from an interrupted call is never taken for this one's
        t0 = time.perf_counter()
        ids = {self._manager.add_request(list(r.prompt_ids), request_id=f"{r.request_id}#{self._calls}.{i}",
                                         max_new_tokens=r.max_new_tokens, record_timestamps=True): r
               for i, r in enumerate(requests)}
        records: list[RequestRecord] = []
        ok = False
        try:
            while len(records) < len(ids):
                out = self._manager.get_result(timeout=1)
                if out is None:
                    if not self._manager.is_running():
                        raise RuntimeError("transformers' continuous batching stopped before every request finished "
                                           f"({len(records)} of {len(ids)}). Fix: see the traceback above it; "
                                           "mode='static' runs without it.")
                    continue
                if not out.is_finished():
                    continue
                if out.error:
                    raise RuntimeError(f"transformers' continuous batching failed request {out.request_id}: "
                                       f"{out.error}. Fix: mode='static' runs without it.")
                r = ids.get(out.request_id)
                if r is None:  # not this call's
                    continue
                if len(out.timestamps or ()) < min(len(out.generated_tokens), r.max_new_tokens):
                    raise RuntimeError(f"transformers' continuous batching stamped {len(out.timestamps or ())} of "
                                       f"{len(out.generated_tokens)} tokens of request {r.request_id} (a request "
                                       "restarted after an eviction). Fix: a smaller batch_size, or mode='static'.")
                times = [t - t0 for t in out.timestamps][:r.max_new_tokens]
                rec = RequestRecord(request_id=r.request_id, prompt_tokens=len(r.prompt_ids),
                                    output_tokens=len(times), arrival=0.0, start=max(0.0, out.lifespan[0] - t0),
                                    first_token=times[0], last_token=times[-1], finished=out.lifespan[1] - t0,
                                    token_times=times, output_ids=list(out.generated_tokens)[:r.max_new_tokens])
                records.append(rec)
                if on_record:
                    on_record(rec)
                if bar:
                    bar.update(1)
            ok = True
        finally:
            if bar:
                bar.close()
            if not ok:  # an error or an interrupt: the manager's pending requests would go on computing; end it
                self._stop_manager()
        order = {r.request_id: i for i, r in enumerate(requests)}
        return sorted(records, key=lambda rec: order[rec.request_id])

    def _stop_manager(self) -> None:
        """Stop transformers' continuous-batching thread at once (pending requests failed, not finished), if any."""
        manager, self._manager = getattr(self, "_manager", None), None
        if manager is not None:
            manager.stop(block=True, hard_stop=True)

    def close(self) -> None:
        import torch  # deferred: the engines load no torch at import

        self._stop_manager()

        if not hasattr(self, "model"):  # closed already (an interrupted run closes its engine; its caller again)
            return
        del self.model
        self.draft = None
        free_memory(torch.cuda.is_available())
