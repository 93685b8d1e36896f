"""Hugging Face `generate`, the naive baseline every optimisation is measured against.

Naive: one request at a time. Each decode step reads every weight from memory to produce
one token for one sequence, so the GPU (or CPU) spends its time waiting on memory: decode
is bandwidth-bound, and batch 1 leaves almost all of the arithmetic unused.

Static batching: B requests are left-padded to one length and decoded together, so one
read of the weights serves B tokens. The price: a batch runs until its longest member is
done, finished members keep occupying their slot (padding), short requests wait for long
ones, and nothing new can join until the whole batch ends. Continuous batching (vLLM, lab
03) removes exactly that.

Timing: a streamer receives every step's tokens as they leave the model (`.cpu()` inside
`generate` synchronises the device), so each output token gets its own time stamp.
Output lengths are exact (`ignore_eos`): EOS is not a stop token here, as in vLLM's
`ignore_eos=True`, so the greedy tokens stay comparable between engines.
"""
from __future__ import annotations

import copy
import time
from typing import Any

from ..config import HFConfig
from ..models import ModelSpec, load_hf_model, prompt_tokenizer, resolve_model
from ..results.record import RequestRecord
from .base import OnRecord, PreparedRequest


class _StepClock:
    """A generate() streamer that time-stamps each decode step (the first put is the prompt)."""

    def __init__(self, t0: float):
        self.t0, self.times, self._prompt_seen = t0, [], False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter() - self.t0)

    def end(self) -> None:
        pass


def _progress_bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="req", leave=False)


class HFEngine:
    """Hugging Face transformers `generate`, naive or statically batched, in this process."""

    def __init__(self, model: str | ModelSpec = "embedded", config: HFConfig = HFConfig()):
        import torch

        self.config = config
        self.spec = model if isinstance(model, ModelSpec) else resolve_model(model)
        self.device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("HFConfig.device='cuda' but no CUDA GPU is visible. Fix: device='auto' or 'cpu'.")
        t0 = time.perf_counter()
        self.tokenizer = prompt_tokenizer(self.spec)
        self.model = load_hf_model(self.spec, self.device, config.dtype)
        self._gen_config = copy.deepcopy(self.model.generation_config)
        self._gen_config.eos_token_id = None  # ignore_eos: generate exactly max_new_tokens
        self._gen_config.do_sample = False
        self._gen_config.pad_token_id = self.tokenizer.pad_token_id
        params = {id(p): p for p in self.model.parameters()}.values()
        dtype = next(iter(params)).dtype
        self.name = config.engine
        self.facts = {
            "load_s": time.perf_counter() - t0, "device": self.device, "dtype": str(dtype).replace("torch.", ""),
            "parameters": sum(p.numel() for p in params),
            "weight_bytes": sum(p.numel() * p.element_size() for p in params),
            "kv_bytes_per_token": self.spec.kv_bytes_per_token(dtype.itemsize),
            "context": self.spec.architecture()["context"], "batch_size": config.batch_size,
            "ignore_eos": True,  # EOS is not a stop token here (generation_config.eos_token_id = None)
        }

    def start(self) -> "HFEngine":
        """The model is loaded when the engine is made (in this process, seconds): nothing more to start."""
        return self

    def worker_pids(self) -> list[int]:
        return []

    def generate(self, requests: list[PreparedRequest], on_record: OnRecord | None = None,
                 progress: bool = True) -> list[RequestRecord]:
        import torch

        b = self.config.batch_size
        t0 = time.perf_counter()
        bar = _progress_bar(len(requests), progress, self.name)
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
        return records

    def _run_batch(self, batch: list[PreparedRequest], t0: float, torch: Any) -> list[RequestRecord]:
        width = max(len(r.prompt_ids) for r in batch)
        pad = self.tokenizer.pad_token_id
        ids = [[pad] * (width - len(r.prompt_ids)) + list(r.prompt_ids) for r in batch]
        mask = [[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch]
        n_max = max(r.max_new_tokens for r in batch)
        clock = _StepClock(t0)
        start = time.perf_counter() - t0
        gen = copy.copy(self._gen_config)
        gen.max_new_tokens = n_max
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=torch.tensor(ids, device=self.device), attention_mask=torch.tensor(mask, device=self.device),
                generation_config=gen, streamer=clock)
        done = time.perf_counter() - t0
        new = out[:, width:].tolist()
        recs = []
        for row, r in zip(new, batch):
            times = clock.times[:r.max_new_tokens]
            recs.append(RequestRecord(
                request_id=r.request_id, prompt_tokens=len(r.prompt_ids), output_tokens=r.max_new_tokens,
                arrival=0.0, start=start, first_token=times[0], last_token=times[-1],
                finished=done, token_times=times, output_ids=row[:r.max_new_tokens]))
        return recs

    def close(self) -> None:
        import gc

        del self.model
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
