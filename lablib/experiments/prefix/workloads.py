"""Lab 07's workloads: the shared-prefix sets at any length, the advice's variants, distinct prefixes in an order.

The variants put the usual advice (the shared part first, stable) to the test on the same text:
- `shared-first`: the shipped set as it is (one N-token system prompt, then each request's own);
- `shared-after`: the same requests with a per-request line (a user and a date) put first, so
  every block's chained hash differs from the first token on and nothing is shared;
- `multi-turn`: a chat where each turn's prompt is the previous turn's plus a new message.

Every workload's token ids come from `bench.offline.prepare`, the function every engine run
uses, so the prediction and the measurement count the same tokens.

`shared_prefix_set` cuts the shipped 1024-token set's shared prompt to any length (checked token by token),
`distinct_prefix_prompts` gives several system prompts arriving in an order (grouped, popular,
round-robin), and `lab_workloads` is the list the lab runs on vLLM. `LAB` and `BIG` name the lab's
Results and the synthetic checkpoint whose prefill is long enough for TTFT to show the saving.
"""
from __future__ import annotations

from typing import Any

from ... import validate
from ...bench.offline import prepare
from ...config import BenchConfig, lab_id
from ...models import embedded_path, load_tokenizer, resolve_model
from ...workloads import Request, Workload, load_workload

LAB = lab_id("07")
BIG = "llama-3.1-8b"  # the synthetic checkpoint whose prefill is long enough for TTFT to show the saving
VARIANTS = ("shared-first", "shared-after", "multi-turn")
SHARED_SETS = ("shared-prefix-128", "shared-prefix-512", "shared-prefix-1024")
ODD_LENGTH = 200  # a shared prefix that is not a multiple of the block size: 12.5 blocks, so 192 tokens can hit
LENGTHS = (128, ODD_LENGTH, 512, 1024)  # the shipped sets and the odd one
ORDERS = ("grouped", "popular", "round-robin")  # how requests with distinct prefixes arrive (scarce_memory_rows)


def variant(kind: str, base: str | Workload = "shared-prefix-512", tokenizer: Any = None,
            turns: int | None = None) -> Workload:
    """One of VARIANTS built from a shared-prefix set (see the module docstring).

    `tokenizer` (the served model's) counts each new prompt's tokens for its Request record; the
    embedded target's tokenizer when None. `turns` caps the multi-turn chat (default: every request)."""
    validate.choice("variant", "kind", kind, VARIANTS)
    wl = base if isinstance(base, Workload) else load_workload(base)
    if kind == "shared-first":
        return wl
    if tokenizer is None:
        from transformers import AutoTokenizer  # deferred: transformers

        tokenizer = AutoTokenizer.from_pretrained(str(embedded_path("target")))

    def req(i: int, r: Request, prompt: str, suffix: str) -> Request:
        n = len(tokenizer(prompt)["input_ids"])
        return Request(f"{r.id}-{suffix}", prompt, ({"role": "user", "content": prompt},), r.max_new_tokens, n,
                       {**r.meta, "variant": kind})

    if kind == "shared-after":
        reqs = [req(i, r, f"# asked by user-{i:03d} on 2026-12-{1 + i % 28:02d}\n{r.prompt}", "after")
                for i, r in enumerate(wl.requests)]
    else:
        shared = _common_prefix_chars(wl)
        n = len(wl.requests) if turns is None else validate.integer("variant", "turns", turns, "e.g. 8 turns.")
        text, reqs = wl.requests[0].prompt[:shared], []
        for i, r in enumerate(wl.requests[:n]):
            text = f"{text}\n# turn {i + 1}\n{r.prompt[shared:]}"
            reqs.append(req(i, r, text, f"turn{i + 1}"))
    return Workload(f"{wl.name}-{kind}", wl.version, f"{wl.description} ({kind})", tuple(reqs),
                    {**wl.manifest, "num_requests": len(reqs), "variant": kind})


def _common_prefix_chars(wl: Workload) -> int:
    """Characters every prompt of the set shares at its start."""
    first = wl.requests[0].prompt
    n = len(first)
    for r in wl.requests[1:]:
        n = min(n, next((i for i, (a, b) in enumerate(zip(first, r.prompt)) if a != b), min(len(first), len(r.prompt))))
    return n


def embedded_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is not None:
        return tokenizer
    return load_tokenizer(resolve_model("embedded"))


def shared_tokens(prompts: list[list[int]]) -> int:
    """How many leading token ids every prompt shares."""
    first = prompts[0]
    return min((next((i for i, (a, b) in enumerate(zip(first, p)) if a != b), min(len(first), len(p)))
                for p in prompts[1:]), default=len(first))


def shared_prefix_set(tokens: int, tokenizer: Any = None) -> Workload:
    """The shipped set with an N-token shared prefix for any N from 3 to 1024 (e.g. ODD_LENGTH, not a multiple of 16).

    Built as the shipped sets are (bos, the first N - 2 tokens of uu.py, a line break, then each request's own
    snippet), by cutting shared-prefix-1024's shared prompt at a token boundary; the result is checked token by
    token with the embedded tokenizer (`tokenizer`, when given, must be the same one)."""
    validate.integer("shared_prefix_set", "tokens", tokens,
                     "e.g. 200 (12.5 blocks of 16); 1024 is the longest shipped.", 3, 1024)
    tok, base = embedded_tokenizer(tokenizer), load_workload("shared-prefix-1024")
    ids = tok(base.requests[0].prompt)["input_ids"]
    head = tok.decode(ids[1:1023])  # the 1024 set's shared text without bos and its closing line break
    if not all(r.prompt.startswith(head + "\n") for r in base.requests):
        raise RuntimeError("shared-prefix-1024's prompts do not start with its shared text: this tokenizer is not the "
                           "one the sets were built with. Fix: pass tokenizer=None (the embedded one).")
    cut = tok.decode(ids[1:tokens - 1])
    reqs = []
    for r in base.requests:
        prompt = cut + "\n" + r.prompt[len(head) + 1:]
        got = tok(prompt)["input_ids"]
        if got[:tokens] != ids[:tokens - 1] + tok("\n", add_special_tokens=False)["input_ids"]:
            raise RuntimeError(f"shared_prefix_set({tokens}): request {r.id} does not start with the {tokens} shared "
                               "tokens once tokenized (the cut merged with the line break). Fix: pick another length.")
        system, *rest = r.messages  # chat form: the header is the system message's code block, as in the shipped sets
        messages = ({"role": system["role"], "content": system["content"].replace(head, cut + "\n", 1)}, *rest)
        reqs.append(Request(r.id.replace("1024", str(tokens)), prompt, messages, r.max_new_tokens, len(got),
                            {**r.meta, "shared_prefix_tokens": tokens}))
    about = f"shared-prefix-1024's requests with the shared prompt cut to {tokens} tokens"
    keep = {k: v for k, v in base.manifest.items() if k in ("version", "num_requests", "provenance")}
    return Workload(f"shared-prefix-{tokens}", base.version, about, tuple(reqs),
                    {**keep, "description": about, "shared_prefix_tokens": tokens, "built_from": "shared-prefix-1024"})


def shared_set(tokens: int, tokenizer: Any = None) -> Workload:
    """shared-prefix-N: the shipped file for 128, 512 and 1024, else built by `shared_prefix_set`."""
    name = f"shared-prefix-{tokens}"
    return load_workload(name) if name in SHARED_SETS else shared_prefix_set(tokens, tokenizer)


def token_ids(workload: Workload, engine: Any) -> list[list[int]]:
    return [list(p.prompt_ids) for p in prepare(workload, engine, BenchConfig(warmup_requests=0))]


def distinct_prefix_prompts(prefixes: int = 8, per_prefix: int = 4, prefix_tokens: int = 128,
                            order: str = "round-robin", tokenizer: Any = None) -> list[list[int]]:
    """`prefixes` different system prompts (the first prefix_tokens token ids of distinct evaluation windows), each
    followed by per-request snippets (shared-prefix-128's own parts), prefixes x per_prefix requests in `order`:

    - "grouped": every request of prefix 0, then of prefix 1, ... (each prefix reused at once);
    - "popular": every other request uses prefix 0, the rest take the others in turn;
    - "round-robin": prefix 0, 1, ..., then 0 again (each reused only after every other prefix)."""
    validate.choice("distinct_prefix_prompts", "order", order, ORDERS)
    validate.integer("distinct_prefix_prompts", "prefixes", prefixes, "2 to 64 (the evaluation windows).", 2, 64)
    validate.integer("distinct_prefix_prompts", "per_prefix", per_prefix, "e.g. 4.", 1)
    validate.integer("distinct_prefix_prompts", "prefix_tokens", prefix_tokens, "1 to 511 tokens (a window's).", 1, 511)
    n = prefixes * per_prefix
    if order == "grouped":
        which = [k // per_prefix for k in range(n)]
    elif order == "popular":
        which = [0 if k % 2 == 0 else 1 + (k // 2) % (prefixes - 1) for k in range(n)]
    else:
        which = [k % prefixes for k in range(n)]
    return prefixed(which, prefix_tokens, embedded_tokenizer(tokenizer))


def prefixed(which: list[int], prefix_tokens: int, tok: Any) -> list[list[int]]:
    """Request k: evaluation window which[k]'s first prefix_tokens ids, then shared-prefix-128's k-th own snippet."""
    evaluation = load_workload("evaluation").requests[:max(which) + 1]
    windows = [tok(r.prompt)["input_ids"][:prefix_tokens] for r in evaluation]
    own = [tok(r.prompt)["input_ids"][128:] for r in load_workload("shared-prefix-128").requests]
    return [windows[i] + own[k % len(own)] for k, i in enumerate(which)]


def lab_workloads(tokenizer: Any = None) -> list[Workload]:
    """What the lab runs on vLLM: the shipped sets, the odd-length set, the shared-after and multi-turn variants."""
    return ([load_workload(n) for n in SHARED_SETS] + [shared_prefix_set(ODD_LENGTH, tokenizer)]
            + [variant(k, "shared-prefix-512", tokenizer) for k in ("shared-after", "multi-turn")])
