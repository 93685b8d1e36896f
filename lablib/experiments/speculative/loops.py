"""Lab 08's greedy speculative loops on the CPU: the embedded pair in plain torch, one step at a time.

The loop is the textbook one (Leviathan et al. 2023; Chen et al. 2023):

1. the draft proposes k tokens, one forward each, feeding its own KV cache;
2. the target scores all k+1 positions (the last accepted token and the k drafts) in ONE forward pass;
3. the longest prefix of drafts equal to the target's argmax is kept, and the target's own argmax at
   the first disagreement (the correction) or after all k (the bonus) is appended;
4. both KV caches are cropped back to the tokens now in the sequence.

Under greedy decoding a draft token is kept only if it is what the target would have chosen, so the
output IS the target's greedy output, token for token: the draft changes the speed, never the text.
`greedy` is the naive path it is tested against (one target forward per token).

Every step drafts k tokens, the last one included: the counters stay those of k-token drafts (the
formula's assumption) and the output is cut exactly at max_new_tokens (at most k wasted draft forwards
per request). EOS is not a stop token (fixed output lengths, as every lablib benchmark).

The same loop with an EAGLE-1 head as the drafter is `greedy_eagle` (the head: `lablib.models.eagle`, trained
for the embedded target by scripts/train_eagle.py): the head drafts from the target's own features, which the
verify pass hands it for free. `hf_assisted` is transformers' assisted generation on the same pair, k drafts a
step, and `assisted_matches` checks it against `greedy`. Every timing is labelled as this CPU's (`provenance`).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

from ... import validate
from ...engines.hf import exact_draft_length, quiet_assistant_call_notice
from ...hardware.device import device_facts, torch_threads
from ...models import load_hf_model, load_tokenizer, resolve_model
from ...models.eagle import check_pair, load_head, propose, target_features
from ...workloads import load_workload

OWNER = "greedy_speculative"


@dataclass(frozen=True)
class Step:
    """One draft-then-verify step."""

    drafted: tuple[int, ...]  # the k token ids the draft proposed
    accepted: int  # drafts the target agreed with, 0..k (vLLM's count: before the cut at max_new_tokens)
    accepted_mask: tuple[bool, ...]  # position i = 1..k accepted; under greedy always a prefix
    emitted: tuple[int, ...]  # appended to the output: accepted drafts + correction/bonus, cut at max_new_tokens
    draft_s: float  # wall time of the k draft forwards (this CPU)
    verify_s: float  # wall time of the one verify forward


@dataclass(frozen=True)
class SpeculativeRun:
    """One request decoded speculatively: exactly max_new_tokens new tokens, and the steps that made them."""

    k: int  # draft tokens per step
    tokens: list[int]  # the new tokens (prompt excluded)
    steps: list[Step]  # in order


def import_torch() -> Any:
    import torch  # deferred: torch

    return torch


def _ids(owner: str, input_ids: Any, vocab: int) -> list[int]:
    """A prompt as a list of ids: a list, a 1-D tensor or a (1, L) tensor."""
    ids = input_ids.reshape(-1).tolist() if hasattr(input_ids, "reshape") else list(input_ids)
    return validate.integers(owner, "input_ids", ids, f"pass a non-empty prompt of token ids in 0..{vocab - 1} "
                             "(one request: tokenizer(text).input_ids).", 0, vocab - 1)


def check_loop_args(target: Any, draft: Any | None, input_ids: Any, max_new_tokens: int, k: int | None,
           owner: str = OWNER) -> list[int]:
    """Refuse bad arguments before any forward pass: k, max_new_tokens, the vocabularies, the context."""
    vocab = target.config.vocab_size
    if k is not None:
        validate.integer(owner, "k", k, "draft at least one token per step, e.g. k=4.", 1)
    validate.integer(owner, "max_new_tokens", max_new_tokens, "generate at least one token, e.g. 64.", 1)
    if draft is not None and draft.config.vocab_size != vocab:
        raise validate.refuse(owner, "draft.vocab_size", draft.config.vocab_size,
                              f"{vocab} (the target's: the target scores the draft's ids)",
                              "use a draft trained on the target's tokenizer: the embedded draft, data/models/draft.")
    ids = _ids(owner, input_ids, vocab)
    limit = target.config.max_position_embeddings
    if len(ids) + max_new_tokens + (k or 0) > limit:
        raise validate.refuse(owner, "max_new_tokens", max_new_tokens,
                              f"prompt ({len(ids)}) + max_new_tokens + k within the context of {limit}",
                              "shorten the prompt or ask for fewer tokens.")
    return ids


def cache_length(cache: Any) -> int:
    return 0 if cache is None else cache.get_seq_length()


def crop_cache(cache: Any, length: int) -> None:
    """Crop a DynamicCache to its first `length` positions (crop takes minus the number to remove)."""
    if cache_length(cache) > length:
        cache.crop(length - cache_length(cache))


def forward_argmax(model: Any, fed: list[int], cache: Any, keep: int) -> tuple[Any, Any]:
    """One forward over `fed` on top of `cache`: the argmax at the last `keep` positions, and the cache."""
    torch = import_torch()
    out = model(torch.tensor([fed]), past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:].argmax(-1), out.past_key_values


def greedy(target: Any, input_ids: Any, max_new_tokens: int) -> list[int]:
    """The naive path: one target forward per new token, KV cache kept, argmax (EOS ignored)."""
    seq = check_loop_args(target, None, input_ids, max_new_tokens, None)
    out: list[int] = []
    cache, fed = None, seq
    with import_torch().inference_mode():
        while len(out) < max_new_tokens:
            best, cache = forward_argmax(target, fed, cache, 1)
            fed = [int(best[0])]
            out += fed
    return out


def greedy_speculative(target: Any, draft: Any, input_ids: Any, max_new_tokens: int, k: int) -> SpeculativeRun:
    """The draft proposes k tokens, the target verifies them in one pass; output = the target's greedy tokens."""
    seq = check_loop_args(target, draft, input_ids, max_new_tokens, k)
    n_prompt = len(seq)
    steps: list[Step] = []
    t_cache = d_cache = None  # each holds every sequence position but the last token, which it is fed next
    with import_torch().inference_mode():
        while len(seq) - n_prompt < max_new_tokens:
            drafts: list[int] = []
            t0 = time.perf_counter()
            for _ in range(k):  # 1. draft: feed what its cache has not seen yet (the prompt, on the first step)
                best, d_cache = forward_argmax(draft, (seq + drafts)[cache_length(d_cache):], d_cache, 1)
                drafts.append(int(best[0]))
            t1 = time.perf_counter()
            # 2. verify: row i of `best` is the target's choice after seq + drafts[:i], i = 0..k
            best, t_cache = forward_argmax(target, (seq + drafts)[cache_length(t_cache):], t_cache, k + 1)
            best = best.tolist()
            t2 = time.perf_counter()
            accepted = next((i for i in range(k) if drafts[i] != best[i]), k)  # 3. longest agreeing prefix
            new = drafts[:accepted] + [best[accepted]]  # + the correction, or the bonus when all k agreed
            crop_cache(t_cache, len(seq) + accepted)  # 4. drop rejected drafts; the new last token is fed next step
            crop_cache(d_cache, len(seq) + accepted)
            new = new[:max_new_tokens - (len(seq) - n_prompt)]
            mask = tuple(i < accepted for i in range(k))
            steps.append(Step(tuple(drafts), accepted, mask, tuple(new), t1 - t0, t2 - t1))
            seq += new
    return SpeculativeRun(k, seq[n_prompt:], steps)


def greedy_eagle(target: Any, head: Any, input_ids: Any, max_new_tokens: int, k: int) -> SpeculativeRun:
    """The same loop with an EAGLE-1 head as the drafter (`lablib.models.eagle`); output = the target's greedy tokens.

    The head drafts from the target's features, so the target must have read a position before the head can
    draft after it: the target first reads the prompt but its last token (no token comes out of that), and from
    then on every step is the loop above. 1. the head reads the features it has not seen (row p: [e(x_{p+1}),
    h_p]) and drafts k tokens on its own features; 2. the target verifies [last token, k drafts] in one pass,
    which also gives the features of the positions it accepts; 3. the longest agreeing prefix + the correction;
    4. the target's cache is cropped to the sequence and the head's to the rows built from the target's features:
    its rows built from its own drafted features are dropped, and rebuilt next step from the verified ones.
    vLLM's first token comes from the prefill, undrafted; here every token comes from a step, as in
    `greedy_speculative`, so the two loops' counters compare one for one.
    """
    seq = check_loop_args(target, None, input_ids, max_new_tokens, k, "greedy_eagle")
    check_pair(target, head, "greedy_eagle")
    if len(seq) < 2:
        raise validate.refuse("greedy_eagle", "input_ids", seq, "at least 2 tokens (the head reads the feature "
                              "of the token before the last)", "pass the prompt with its bos token, as tokenizers add.")
    n_prompt, steps, h_cache = len(seq), [], None
    with import_torch().inference_mode():
        features, _, t_cache = target_features(target, seq[:-1], None)  # the head's rows: tokens seq[1:], these
        tokens = seq[1:]
        while len(seq) - n_prompt < max_new_tokens:
            t0 = time.perf_counter()
            drafts, h_cache = propose(target, head, h_cache, tokens, features, k)  # 1.
            t1 = time.perf_counter()
            verified, best, t_cache = target_features(target, [seq[-1], *drafts], t_cache)  # 2. rows 0..k
            t2 = time.perf_counter()
            accepted = next((i for i in range(k) if drafts[i] != best[i]), k)  # 3.
            new = drafts[:accepted] + [best[accepted]]
            crop_cache(t_cache, len(seq) + accepted)  # 4.
            crop_cache(h_cache, len(seq) - 1)
            tokens, features = new, verified[:, :accepted + 1]  # the head's next rows, all from the target
            mask = tuple(i < accepted for i in range(k))
            new = new[:max_new_tokens - (len(seq) - n_prompt)]
            steps.append(Step(tuple(drafts), accepted, mask, tuple(new), t1 - t0, t2 - t1))
            seq += new
    return SpeculativeRun(k, seq[n_prompt:], steps)


def hf_assisted(target: Any, draft: Any, input_ids: Any, max_new_tokens: int, k: int) -> list[int]:
    """transformers' assisted generation with exactly k assistant tokens per step (no schedule, no early stop).

    `exact_draft_length` (the engine's own setting) makes every proposal k tokens, as in `greedy_speculative`,
    except near the end, where HF drafts fewer (max_length - 1 caps it).
    The draft's config is restored afterwards.
    """
    torch = import_torch()
    ids = check_loop_args(target, draft, input_ids, max_new_tokens, k)
    gen = copy.deepcopy(target.generation_config)
    gen.update(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
    saved, mine = draft.generation_config, exact_draft_length(copy.deepcopy(draft.generation_config), k)
    draft.generation_config = mine
    quiet_assistant_call_notice()  # transformers' own call to the draft warns of a mix this call never passes
    try:
        with torch.inference_mode():
            x = torch.tensor([ids])
            out = target.generate(x, attention_mask=torch.ones_like(x), generation_config=gen, assistant_model=draft)
    finally:
        draft.generation_config = saved
    return out[0, len(ids):].tolist()


def provenance(threads: int | None = None) -> str:
    """The label every timing carries: which CPU, how many torch threads."""
    torch = import_torch()
    return (f"measured on this machine's CPU ({device_facts().get('cpu') or 'unknown CPU'}), torch "
            f"{torch.__version__}, {threads or torch.get_num_threads()} thread(s)")


def load_pair() -> tuple[Any, Any, Any]:
    """The embedded target, its draft (float32, CPU, eval) and the shared tokenizer."""
    spec = resolve_model("embedded-target")
    return load_hf_model(spec), load_hf_model(resolve_model("embedded-draft")), load_tokenizer(spec)


def load_eagle(target: Any) -> Any:
    """The EAGLE head shipped for the embedded target (data/models/eagle; float32, CPU, eval), checked against it."""
    return load_head(target=target)


_threads = torch_threads  # torch on n threads, restored after (lablib.hardware.device)


def assisted_matches(pair: tuple[Any, Any, Any] | None = None, n_prompts: int = 1, max_new_tokens: int = 32,
                     k: int = 4, threads: int = 1) -> dict[str, Any]:
    """transformers' assisted generation (`hf_assisted`, the same pair, k drafts a step) against `greedy`."""
    validate.integer("assisted_matches", "n_prompts", n_prompts, "journey prompts to compare, e.g. 1.", 1, 64)
    with _threads(threads):
        target, draft, tok = pair or load_pair()
        prompts = load_workload("journey", limit=n_prompts).prompt_ids(tok)
        same = [hf_assisted(target, draft, p, max_new_tokens, k) == greedy(target, p, max_new_tokens) for p in prompts]
    return {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "k": k, "identical": sum(same),
            "all_identical": all(same)}
