"""The prompt sets every lab runs: fixed, seeded, versioned, and checked before use.

A serving benchmark is only as honest as its workload. Throughput depends on how long the
prompts are (prefill is compute-bound), how long the outputs are (decode is bandwidth-bound
and runs once per output token), and how much the prompts share (a prefix cache skips
shared prefill). So every lab draws from the same few sets in `data/workloads/`, built
once by `scripts/build_workloads.py` from held-out source files the embedded models never
saw in training:

- `journey`: 64 code-completion requests, 3/4 short prompts and 1/4 long ones, with
  output lengths drawn from a log-normal like real chat traffic (a few very long answers
  dominate the tail, which is what breaks static batching and contiguous KV reservation).
- `shared-prefix-128`, `-512`, `-1024`: 32 requests that all start with the same N-token
  file header (a long system prompt, in chat form), each followed by a distinct snippet.
- `calibration` and `evaluation`: 512-token windows for quantization, taken from two
  disjoint groups of files so a quantizer is never scored on what it was calibrated on.

Each request carries two forms of the same prompt: `prompt`, plain text the embedded
(base, completion) model continues, and `messages`, a chat a real instruct model takes
through its own chat template. `prompt_tokens` counts the plain form with the embedded
tokenizer (bos included); another model's tokenizer gives other counts, so ask the
workload for ids (`prompt_ids`, `chat_prompt_ids`) rather than trusting the stored count.

Every file's sha256 is in `data/workloads/manifest.json`; `load_workload` refuses a file
that does not match, so two results recorded months apart on different machines ran the
same requests. The data folder is `data/` beside the package, or `$LABLIB_DATA`.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import validate
from .config import DATA_DIR
from .stats import percentile

DATA_ENV = "LABLIB_DATA"
REBUILD = "python scripts/build_workloads.py"
EMBEDDED_TOKENIZER = "data/models/target"


def data_root(data_dir: str | Path | None = None) -> Path:
    """The data folder: `data_dir` if given, else $LABLIB_DATA, else `data/` beside the package."""
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    return DATA_DIR


def workloads_dir(data_dir: str | Path | None = None) -> Path:
    return data_root(data_dir) / "workloads"


def length_stats(values: Sequence[int]) -> dict[str, float | int]:
    """min, p50, mean, p90, max and total of token counts, as the manifest records them."""
    if len(values) == 0:
        raise ValueError("values is empty: length statistics need at least one request.")
    return {"min": min(values), "p50": round(percentile(values, 50), 2), "mean": round(sum(values) / len(values), 2),
            "p90": round(percentile(values, 90), 2), "max": max(values), "total": sum(values)}


@dataclass(frozen=True)
class Request:
    """One request, in both completion and chat form."""

    id: str  # unique within its workload, e.g. "journey-007"
    prompt: str  # plain text for a base (completion) model such as the embedded target
    messages: tuple[dict[str, str], ...]  # the same request as a chat: {"role", "content"} dicts
    max_new_tokens: int  # requested output length (engines run with ignore_eos to honour it)
    prompt_tokens: int  # len(tokenizer(prompt).input_ids) with the embedded tokenizer, bos included
    meta: Mapping[str, Any] = field(default_factory=dict)  # source file, lines, shared prefix tokens, ...

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Request.id={self.id!r} is invalid: it must be a non-empty string.")
        if not isinstance(self.prompt, str) or not self.prompt:
            raise ValueError(f"Request {self.id}: prompt={self.prompt!r} is invalid: it must be non-empty text.")
        messages = tuple(self.messages)
        if not messages:
            raise ValueError(f"Request {self.id}: messages is empty: give at least one {{'role', 'content'}} dict.")
        for i, m in enumerate(messages):
            if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ValueError(f"Request {self.id}: messages[{i}]={m!r} is invalid: it must be a dict with "
                                 "string 'role' and 'content', e.g. {'role': 'user', 'content': '...'}.")
        object.__setattr__(self, "messages", tuple({"role": m["role"], "content": m["content"]} for m in messages))
        for name, minimum in (("max_new_tokens", 0), ("prompt_tokens", 1)):
            value = getattr(self, name)
            validate.integer(f"Request({self.id})", name, value, f"rebuild the workloads with `{REBUILD}`.", minimum)
        if not isinstance(self.meta, Mapping):
            raise ValueError(f"Request {self.id}: meta={self.meta!r} is invalid: it must be a dict.")
        object.__setattr__(self, "meta", dict(self.meta))

    def to_dict(self) -> dict[str, Any]:
        """The JSON line this request is stored as."""
        return {"id": self.id, "prompt": self.prompt, "messages": [dict(m) for m in self.messages],
                "max_new_tokens": self.max_new_tokens, "prompt_tokens": self.prompt_tokens, "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Request:
        missing = {"id", "prompt", "messages", "max_new_tokens", "prompt_tokens"} - set(d)
        if missing:
            raise ValueError(f"a request is missing {sorted(missing)}: the file was not written by `{REBUILD}`.")
        return cls(id=d["id"], prompt=d["prompt"], messages=tuple(d["messages"]), max_new_tokens=d["max_new_tokens"],
                   prompt_tokens=d["prompt_tokens"], meta=d.get("meta", {}))


@dataclass(frozen=True)
class Workload:
    """A named, versioned, ordered set of requests; the input of every engine and benchmark."""

    name: str  # the set's name in the manifest, e.g. "journey"
    version: int  # bumped whenever the set's content changes, so results name what they ran
    description: str  # one paragraph: what the set is for
    requests: tuple[Request, ...]  # in the fixed order every lab submits them
    manifest: Mapping[str, Any] = field(default_factory=dict)  # the set's manifest entry (provenance, sha256, stats)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Workload.name={self.name!r} is invalid: it must be a non-empty string.")
        validate.integer(f"Workload({self.name})", "version", self.version, f"rebuild with `{REBUILD}`.")
        requests = tuple(self.requests)
        if not requests or not all(isinstance(r, Request) for r in requests):
            raise ValueError(f"Workload {self.name}: requests must be a non-empty sequence of Request.")
        ids = [r.id for r in requests]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"Workload {self.name}: request ids {dupes} repeat: ids must be unique.")
        object.__setattr__(self, "requests", requests)
        object.__setattr__(self, "manifest", dict(self.manifest))

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    @property
    def label(self) -> str:
        """How results name this workload: 'journey@v1', or 'journey@v1[:8]' for a head."""
        full = self.manifest.get("num_requests", len(self.requests))
        return f"{self.name}@v{self.version}" + ("" if len(self.requests) == full else f"[:{len(self.requests)}]")

    @property
    def prompt_lengths(self) -> list[int]:
        return [r.prompt_tokens for r in self.requests]

    @property
    def output_lengths(self) -> list[int]:
        return [r.max_new_tokens for r in self.requests]

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """(prompt_tokens, max_new_tokens) pairs, the input of `lablib.mechanisms` simulations."""
        return [(r.prompt_tokens, r.max_new_tokens) for r in self.requests]

    @property
    def total_prompt_tokens(self) -> int:
        return sum(self.prompt_lengths)

    @property
    def total_output_tokens(self) -> int:
        return sum(self.output_lengths)

    def stats(self) -> dict[str, dict[str, float | int]]:
        """Length statistics of these requests, in the manifest's shape."""
        return {"prompt_tokens": length_stats(self.prompt_lengths), "output_tokens": length_stats(self.output_lengths)}

    def head(self, n: int) -> Workload:
        """The first n requests (all of them if n is larger), for quick runs on a CPU."""
        _check_count("n", n)
        return Workload(self.name, self.version, self.description, self.requests[:n], self.manifest)

    def repeated(self, times: int) -> Workload:
        """The requests `times` over, in order, ids suffixed "#1", "#2", ...: a longer run of the same mix.

        A load test needs more requests than the journey's 64 to reach a steady state. The
        copies share prompts, so run them with prefix caching off, or the copies' prefill is free.
        """
        _check_count("times", times)
        if times == 1:
            return self
        reqs = tuple(Request(f"{r.id}#{k}", r.prompt, r.messages, r.max_new_tokens, r.prompt_tokens, r.meta)
                     for k in range(1, times + 1) for r in self.requests)
        return Workload(f"{self.name}x{times}", self.version, f"{self.description} (repeated {times}x)", reqs,
                        {**self.manifest, "num_requests": len(reqs)})

    def prompt_ids(self, tokenizer: Any) -> list[list[int]]:
        """Token ids of the plain prompts, with the tokenizer's own special tokens (bos)."""
        return [list(ids) for ids in tokenizer([r.prompt for r in self.requests])["input_ids"]]

    def chat_prompts(self, tokenizer: Any) -> list[str]:
        """The chat form rendered by the tokenizer's chat template, ending with the assistant's turn."""
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template, so "
                             "the chat form cannot be rendered. Fix: use an instruct/chat model's tokenizer, or the "
                             "plain form with prompt_ids().")
        return [tokenizer.apply_chat_template([dict(m) for m in r.messages], tokenize=False,
                                              add_generation_prompt=True) for r in self.requests]

    def chat_prompt_ids(self, tokenizer: Any) -> list[list[int]]:
        """Token ids of the rendered chat form. Chat templates write bos themselves, so the text is
        tokenized without special tokens; tokenizing it with them gives a doubled bos."""
        texts = self.chat_prompts(tokenizer)
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _check_count(name: str, value: object) -> None:
    validate.integer("Workload", name, value, f"pass e.g. {name}=8 (a number of requests), or None for the whole set.")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_manifest(data_dir: str | Path | None = None) -> dict[str, Any]:
    """The manifest: {"schema": ..., "workloads": {name: entry}}."""
    path = workloads_dir(data_dir) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"no workload manifest at {path}. Fix: build the sets with `{REBUILD}`, or point "
                                f"${DATA_ENV} (or data_dir=) at the folder that holds workloads/manifest.json.")
    return json.loads(path.read_text(encoding="utf-8"))


def list_workloads(data_dir: str | Path | None = None) -> list[str]:
    """Names of the sets in the manifest, in the order the builder wrote them."""
    return list(load_manifest(data_dir)["workloads"])


def load_workload(name: str, limit: int | None = None, data_dir: str | Path | None = None) -> Workload:
    """Load a set by name, after checking its file against the manifest's sha256.

    limit keeps only the first `limit` requests (for a quick CPU run); the label says so.
    """
    if limit is not None:
        _check_count("limit", limit)
    entries = load_manifest(data_dir)["workloads"]
    if name not in entries:
        raise ValueError(f"unknown workload {name!r}: the available ones are {list(entries)}. "
                         "Fix: pass one of those names (list_workloads() gives them).")
    entry = entries[name]
    path = workloads_dir(data_dir) / entry["file"]
    if not path.is_file():
        raise FileNotFoundError(f"workload {name!r} is in the manifest but {path} is missing. Fix: `{REBUILD}`.")
    digest = _sha256(path)
    if digest != entry["sha256"]:
        raise ValueError(f"workload file {path} is corrupt or was modified: its sha256 is {digest[:12]}..., the "
                         f"manifest says {entry['sha256'][:12]}.... Fix: restore it (git checkout data/workloads) "
                         f"or rebuild every set with `{REBUILD}`.")
    requests = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            requests.append(Request.from_dict(json.loads(line)))
        except (json.JSONDecodeError, ValueError) as err:
            raise ValueError(f"{path}:{lineno}: {err}. Fix: `{REBUILD}`.") from err
    if len(requests) != entry["num_requests"]:
        raise ValueError(f"{path} holds {len(requests)} requests, the manifest says {entry['num_requests']}. "
                         f"Fix: `{REBUILD}`.")
    workload = Workload(name, entry["version"], entry["description"], tuple(requests), entry)
    return workload if limit is None else workload.head(limit)


def check_tokenizer(workload: Workload, tokenizer: Any) -> None:
    """Raise ValueError unless `tokenizer` reproduces every stored prompt_tokens count.

    The stored counts hold only for the embedded tokenizer; use this before trusting them
    (e.g. in a KV-size calculation) with a tokenizer you are not sure of.
    """
    counted = [len(ids) for ids in workload.prompt_ids(tokenizer)]
    wrong = [(r.id, r.prompt_tokens, n) for r, n in zip(workload.requests, counted) if r.prompt_tokens != n]
    if wrong:
        rid, stored, got = wrong[0]
        where = workload.manifest.get("provenance", {}).get("tokenizer", EMBEDDED_TOKENIZER)
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} does not match workload "
                         f"{workload.label}: {len(wrong)} of {len(counted)} prompts count differently (request "
                         f"{rid}: stored {stored} tokens, this tokenizer gives {got}). The stored prompt_tokens were "
                         f"counted with the embedded tokenizer ({where}). Fix: load that one "
                         f"(AutoTokenizer.from_pretrained('{where}')), or, for another model, count with "
                         "workload.prompt_ids(tokenizer) instead of prompt_tokens.")
