"""N-gram speculation (prompt lookup) replayed on the text a greedy target writes: where it pays and where it does not.

An n-gram drafter runs no model: it finds the longest n-gram (between `prompt_lookup_min` and `prompt_lookup_max`
tokens) that ends the text so far and occurred before, and proposes the k tokens that followed its first
occurrence (`propose`: vLLM 0.26's `_find_longest_matched_ngram_and_propose_tokens`, step for step). Under greedy
decoding the target's tokens do not depend on the drafts, so what an n-gram drafter accepts is fixed by the text the
target writes: `replay` walks that text as vLLM's engine does (the prefill's token, then a proposal, the longest
agreeing prefix accepted, one more token from the target; a step with nothing to propose is a plain decode step,
not counted as a draft) and counts what vLLM's counters would.

Two texts, two regimes (`ngram_acceptance`):
- "journey": the embedded target's own greedy continuation of the journey prompts, what vLLM's n-gram runs on the
  embedded pair decode (their counters are the cross-check). Completion of unseen code repeats little of its
  prompt, so n-gram drafts rarely and accepts what the text repeats of itself.
- "copy-edit": requests whose answer rewrites code in the prompt (`copy_edit_requests`: a function from the
  held-out corpus, then the same function with one identifier renamed). The embedded 4.7M model cannot copy a
  prompt (it has no such skill at this size), so the answer replayed here is the edited function itself: the
  acceptance an n-gram drafter gets from a target that writes the edit, as a code assistant does. Labelled so.
"""
from __future__ import annotations

import gzip
import io
import json
import random
import re
import tokenize
from collections.abc import Sequence
from typing import Any

from ... import validate
from ...config import DATA_DIR
from ...hardware.device import torch_threads
from ...workloads import load_workload
from .acceptance import acceptance_report, counters_consistent, length_gap_stderr
from .loops import SpeculativeRun, Step, greedy, load_pair, provenance

LOOKUP = (2, 5)  # vLLM's prompt_lookup_min / prompt_lookup_max as lab 08 runs them
TEXTS = ("journey", "copy-edit")
COPY_LABEL = "replayed on the edited function: the acceptance of a target that writes the edit"


def propose(tokens: Sequence[int], k: int, lookup: tuple[int, int] = LOOKUP) -> list[int]:
    """vLLM 0.26's n-gram proposal for `tokens` (the prompt and every token so far): the longest n-gram,
    lookup[0] <= n <= lookup[1], that ends `tokens` and occurred earlier, at its earliest occurrence; the up to k
    tokens after it (fewer where the text ends first), or none."""
    lo, hi = lookup
    total = len(tokens)
    if total < lo:
        return []
    for n in range(min(hi, total - 1), lo - 1, -1):
        suffix = list(tokens[total - n:])
        for start in range(0, total - n):  # an occurrence ending before the last token
            if list(tokens[start:start + n]) == suffix:
                return list(tokens[start + n:start + n + k])
    return []


def replay(prompt: Sequence[int], written: Sequence[int], max_new_tokens: int, k: int,
           lookup: tuple[int, int] = LOOKUP) -> SpeculativeRun:
    """N-gram speculation over a greedy target that writes `written` after `prompt` (at least max_new_tokens + k
    tokens, so a draft near the end is judged as vLLM judges it: before the cut at max_new_tokens)."""
    owner = "replay"
    validate.integer(owner, "k", k, "draft at least one token per step, e.g. k=4.", 1)
    validate.integer(owner, "max_new_tokens", max_new_tokens, "generate at least one token, e.g. 64.", 1)
    if len(written) < max_new_tokens + k:
        raise validate.refuse(owner, "written", f"{len(written)} tokens", f"at least max_new_tokens + k = "
                              f"{max_new_tokens + k}", "decode or take a longer continuation.")
    seq, out = list(prompt), [written[0]]  # the prefill's token: vLLM proposes only once a token is out
    steps: list[Step] = []
    while len(out) < max_new_tokens:
        drafts = propose(seq + out, k, lookup)
        at = len(out)
        accepted = next((i for i in range(len(drafts)) if drafts[i] != written[at + i]), len(drafts))
        new = list(written[at:at + accepted + 1])[:max_new_tokens - at]  # accepted drafts + the target's next token
        if drafts:
            steps.append(Step(tuple(drafts), accepted, tuple(i < accepted for i in range(len(drafts))), tuple(new),
                              0.0, 0.0))
        out += new
    return SpeculativeRun(k, out, steps)


def _renamed(text: str, name: str, new: str) -> str | None:
    """`text` with every use of the identifier `name` renamed to `new`: Python's NAME tokens only, never an
    attribute (`self.name`), a string or a comment; None where the text does not tokenize (a block cut mid-string)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    lines = text.split("\n")
    edits = [t.start for i, t in enumerate(tokens) if t.type == tokenize.NAME and t.string == name
             and not (i and tokens[i - 1].type == tokenize.OP and tokens[i - 1].string == ".")]
    for row, col in reversed(edits):  # right to left: earlier columns stay valid
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len(name):]
    return "\n".join(lines) if edits else None


def copy_edit_requests(n: int = 32, seed: int = 1729, max_lines: int = 16) -> list[dict[str, str]]:
    """Code-edit requests from the held-out corpus (data/corpus/test.jsonl.gz): a function's first lines (up to
    max_lines), then a comment asking for it again with one identifier renamed, and the answer: those lines with
    that identifier renamed (`_renamed`: uses of the name, not attributes, strings or comments). The identifier is
    the function's first parameter (not self or cls) or, without one, its name; the renamed one is `new_<it>`."""
    validate.integer("copy_edit_requests", "n", n, "requests, e.g. 32.", 1, 256)
    files = [json.loads(line) for line in gzip.open(DATA_DIR / "corpus" / "test.jsonl.gz", "rt")]
    found: list[dict[str, str]] = []
    for f in files:
        lines = f["text"].splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"(\s*)def (\w+)\(([^)]*)\)", line)
            if not m:
                continue
            params = [p.split("=")[0].split(":")[0].strip(" *") for p in m.group(3).split(",")]
            params = [p for p in params if p.isidentifier() and p not in ("self", "cls")]
            name = params[0] if params else m.group(2)
            block = [line.strip() if j == 0 else x for j, x in enumerate(lines[i:i + max_lines])]
            indent = len(m.group(1))
            text = "\n".join(x[indent:] if x[:indent].isspace() else x for x in block)  # dedented: it tokenizes
            edited = _renamed(text, name, f"new_{name}")
            if len(block) < 6 or edited is None or edited.count(f"new_{name}") < 2:
                continue  # too short, cut mid-string, or the name used once: nothing to copy around the edit
            prompt = f"{text}\n\n# The same code, with `{name}` renamed to `new_{name}`:\n"
            found.append({"prompt": prompt, "answer": edited + "\n", "source": f["path"], "renamed": name})
    if len(found) < n:
        raise validate.refuse("copy_edit_requests", "n", n, f"at most {len(found)} (functions in the corpus)",
                              f"n={len(found)} or fewer.")
    picked = random.Random(seed).sample(found, n)
    return [{"id": f"copy-edit-{i:03d}", **r} for i, r in enumerate(picked)]


def _texts(text: str, n_prompts: int, max_new_tokens: int, k_max: int, pair: Any) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the written continuation's ids) per request of `text`."""
    target, _, tok = pair
    need = max_new_tokens + k_max
    if text == "journey":
        prompts = load_workload("journey", limit=n_prompts).prompt_ids(tok)
        return [(list(p), greedy(target, p, need)) for p in prompts]
    out = []
    for r in copy_edit_requests(n_prompts):
        prompt = tok(r["prompt"]).input_ids
        answer = tok(r["answer"], add_special_tokens=False).input_ids
        pad = [-(i + 1) for i in range(max(0, need - len(answer)))]  # past a short answer: ids that never repeat
        out.append((prompt, (answer + pad)[:need]))
    return out


def ngram_acceptance(texts: Sequence[str] = TEXTS, ks: Sequence[int] = (2, 4), n_prompts: int = 32,
                     max_new_tokens: int = 64, lookup: tuple[int, int] = LOOKUP,
                     pair: tuple[Any, Any, Any] | None = None) -> list[dict[str, Any]]:
    """N-gram's acceptance per text and k, counted as vLLM counts (`AcceptanceReport.row()`, plus the share of
    decode steps that drafted anything, the draft tokens per draft, and the tokens per decode step, drafted or
    not: what a verify pass that costs one plain step turns into a speedup), on the journey (the embedded target's greedy text:
    what vLLM's n-gram runs decode) and on copy-edit requests (the edited code: COPY_LABEL)."""
    owner = "ngram_acceptance"
    for t in texts:
        validate.choice(owner, "texts", t, TEXTS)
    ks = validate.integers(owner, "ks", ks, "draft lengths, e.g. (2, 4).")
    validate.integer(owner, "n_prompts", n_prompts, "requests per text, e.g. 32.", 1, 64)
    validate.integer(owner, "max_new_tokens", max_new_tokens, "new tokens per request, e.g. 64.")
    lo, hi = lookup
    if not 1 <= lo <= hi:
        raise validate.refuse(owner, "lookup", list(lookup), "(min, max) with 1 <= min <= max", "e.g. (2, 5).")
    with torch_threads(1):  # one thread, as the label says (a second one slows the small models on a shared CPU)
        return _acceptance_rows(texts, ks, n_prompts, max_new_tokens, lookup, pair or load_pair())


NOT_FOR_NGRAM = ("alpha", "predicted_length", "length_gap", "predicted_per_position", "gap_per_position",
                 "conditional_per_position")  # the i.i.d. formula's reading assumes k drafts every step: n-gram varies


def _acceptance_rows(texts: Sequence[str], ks: Sequence[int], n_prompts: int, max_new_tokens: int,
                     lookup: tuple[int, int], pair: Any) -> list[dict[str, Any]]:
    rows = []
    for text in texts:
        written = _texts(text, n_prompts, max_new_tokens, max(ks), pair)
        for k in ks:
            runs = [replay(p, w, max_new_tokens, k, lookup) for p, w in written]
            steps = sum(len(r.steps) for r in runs)
            decode_steps = steps + sum(max_new_tokens - 1 - sum(len(s.emitted) for s in r.steps) for r in runs)
            rep = acceptance_report(runs) if steps else None
            rows.append({"text": text, "k": k, "lookup": list(lookup), "requests": len(runs),
                         "max_new_tokens": max_new_tokens,
                         **({**rep.row(), **dict.fromkeys(NOT_FOR_NGRAM)} if rep else {"num_drafts": 0}),
                         "drafted_share": steps / decode_steps if decode_steps else 0.0,
                         "tokens_per_step": (max_new_tokens - 1) * len(runs) / decode_steps if decode_steps else None,
                         "tokens_per_draft": rep.counters.num_draft_tokens / steps if rep else None,
                         "counters_consistent": bool(rep) and counters_consistent(rep.counters, k, False)[0],
                         "label": COPY_LABEL if text == "copy-edit" else "the embedded target's greedy text",
                         "provenance": provenance(1)})
    return rows


def cross_check(rows: Sequence[dict[str, Any]], vllm_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The journey replay's mean acceptance length against vLLM's n-gram runs of the embedded pair (lab 08's grid,
    live or recorded) at the same k and lookup: the same greedy text, so the same counts up to bf16's flipped
    near-ties in vLLM's text. The gap in standard errors (the replay's, and vLLM's from its own num_drafts) treats
    the two as independent samples; they decode the same prompts, so this is a loose check (a systematic gap of a
    few percent passes it): `ngram_lines` says which way the gaps lean."""
    out = []
    for r in rows:
        if r["text"] != "journey" or not r.get("num_drafts"):
            continue
        for v in vllm_rows:
            if (v.get("method") != "ngram" or v.get("k") != r["k"] or v.get("mean_acceptance_length") is None
                    or list(v.get("prompt_lookup") or ()) != list(r["lookup"])):
                continue
            se = length_gap_stderr(r, v["num_drafts"])
            gap = v["mean_acceptance_length"] - r["measured_length"]
            out.append({"k": r["k"], "batch": v["batch"], "vllm_length": v["mean_acceptance_length"],
                        "replay_length": r["measured_length"], "gap": gap, "stderr": se, "gap_in_stderrs": gap / se,
                        "within_3_stderrs": abs(gap) <= 3 * se, "provenance": v.get("provenance")})
    return out


def ngram_lines(rows: Sequence[dict[str, Any]], checked: Sequence[dict[str, Any]] = ()) -> str:
    """Per text at the largest k: how often n-gram drafted, its mean acceptance length when it did, the tokens per
    decode step; and the cross-check's widest gap. Every number from the rows."""
    parts = []
    for text in dict.fromkeys(r["text"] for r in rows):
        r = max((x for x in rows if x["text"] == text), key=lambda x: x["k"])
        if not r.get("num_drafts"):
            parts.append(f"{text}: no step found an n-gram to draft from at k={r['k']}")
            continue
        parts.append(f"{text}, k={r['k']}: drafted at {r['drafted_share']:.0%} of decode steps, mean acceptance "
                     f"length {r['measured_length']:.2f} when it did, {r['tokens_per_step']:.2f} tokens per step")
    text = "N-gram (lookup " + "-".join(map(str, rows[0]["lookup"])) + ") " + "; ".join(parts) + "." if rows else ""
    if checked:
        worst = max(checked, key=lambda c: abs(c["gap_in_stderrs"]))
        higher = sum(c["gap"] > 0 for c in checked)
        text += (f" vLLM's n-gram on the same journey text: {len(checked)} runs, widest gap "
                 f"{worst['gap']:+.3f} ({worst['gap_in_stderrs']:+.1f} standard errors, k={worst['k']}, batch "
                 f"{worst['batch']}); vLLM's length is the higher in {higher} of {len(checked)}.")
    return text + f" [copy-edit: {COPY_LABEL}]" if any(r["text"] == "copy-edit" for r in rows) else text


def against_grid(rows: Sequence[dict[str, Any]], grid: dict[str, Any] | None) -> list[dict[str, Any]]:
    """`cross_check` against lab 08's vLLM grid value (`vllm_runs.gpu_study`), only where the grid decoded the
    same requests (as many journey prompts, as many tokens) as the replay; otherwise nothing to compare."""
    if not grid or not rows:
        return []
    work = grid.get("workload") or {}
    journey = [r for r in rows if r["text"] == "journey"]
    if not journey or work.get("requests") != journey[0]["requests"] or work.get("max_new_tokens") != journey[0][
            "max_new_tokens"]:
        return []
    return cross_check(rows, grid["rows"])


def copy_pays_more(rows: Sequence[dict[str, Any]]) -> bool:
    """At every k replayed on both texts: n-gram drafts at a larger share of steps and makes more tokens per step
    on the code edits than on the journey."""
    by = {(r["text"], r["k"]): r for r in rows}
    ks = [k for (t, k) in by if t == "journey" and ("copy-edit", k) in by]
    return bool(ks) and all(by["copy-edit", k]["drafted_share"] > by["journey", k]["drafted_share"] and
                            (by["copy-edit", k]["tokens_per_step"] or 0) > (by["journey", k]["tokens_per_step"] or 0)
                            for k in ks)


def agrees_with_vllm(rows: Sequence[dict[str, Any]], grid: dict[str, Any]) -> bool:
    """Lab 08's live claim: the grid has n-gram runs on the replay's requests, each within 3 standard errors."""
    checked = against_grid(rows, grid)
    return bool(checked) and all(x["within_3_stderrs"] for x in checked)
