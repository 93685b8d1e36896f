"""Build the lab's workloads in `data/workloads/` from the held-out test files.

Why these sets: every lab measures on the same requests, so numbers from different labs,
engines and machines can sit on one plot. The prompts are cut from the corpus's test
split (`data/corpus/test.jsonl.gz`, files the embedded models never saw in training or
model selection), so the embedded target continues them as well as it can anything, and
speculative decoding, quantization and caching show realistic behaviour.

- journey: 64 completion prompts cut at line boundaries, 3/4 short (16-96 tokens) and 1/4
  long (256-1024 tokens), in shuffled order; output lengths log-normal (median 64,
  sigma 1, clipped to [8, 512]), the heavy tail of real chat traffic.
- shared-prefix-N (N = 128, 512, 1024): 32 requests whose first N tokens are identical:
  bos, the first N-3 (or N-2) tokens of one file, a long file header / system prompt, and
  the line break(s) before a distinct 16-64 token snippet starting at a top-level line of
  another file. The three sets share the header file and the snippets: only the prefix
  length changes. The builder tokenizes every prompt and checks that the longest common
  token prefix is exactly N (a header cut inside whitespace would merge with the snippet's
  first token; such files are skipped), so a prefix cache can reuse exactly N tokens.
- calibration / evaluation: non-overlapping 512-token windows (bos + 511 tokens), from two
  disjoint groups of files (largest first, each to the group with fewer windows), 64
  calibration windows and up to 64 evaluation windows, sampled with the seed.

Everything is drawn from `random.Random(SEED)` streams, so a rebuild on any machine gives
byte-identical files; `manifest.json` records each file's sha256, the corpus's sha256 and
length statistics, and README.md is generated from the same numbers. Bump a set's entry
in VERSIONS whenever its content changes (the builder warns when it sees that).

    python scripts/build_workloads.py            # writes data/workloads/
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import hashlib
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lablib.workloads import Request, length_stats  # noqa: E402

SEED = 1729
CONTEXT = 2048
CORPUS = "data/corpus/test.jsonl.gz"
TOKENIZER = "data/models/target"
SCRIPT = "scripts/build_workloads.py"
SYSTEM = "You complete Python code."
PREFIX_LENGTHS = (128, 512, 1024)
WINDOW = 512
VERSIONS = {"journey": 1, "shared-prefix-128": 1, "shared-prefix-512": 1, "shared-prefix-1024": 1,
            "calibration": 1, "evaluation": 1}
DESCRIPTIONS = {
    "journey": "The mixed-length set every lab uses: 64 code-completion prompts cut at line boundaries from "
               "held-out files, 48 short (16-96 tokens) and 16 long (256-1024 tokens) in shuffled order, with "
               "log-normal output lengths (median 64, sigma 1, clipped to [8, 512]) like real chat traffic.",
    "shared-prefix": "32 requests whose first {n} tokens are the same: bos, the first {m} tokens of {path} (a "
                     "long file header; in chat form it is the system message) and a line break, then a distinct "
                     "16-64 token snippet from another file; 32 output tokens each. For prefix caching.",
    "calibration": "64 windows of 512 tokens (bos + 511) from the calibration half of the held-out files, for "
                   "quantization calibration; no file is shared with `evaluation`. Output length 1.",
    "evaluation": "Up to 64 windows of 512 tokens (bos + 511) from the evaluation half of the held-out files, "
                  "for perplexity; no file is shared with `calibration`. Output length 1.",
}


class Source:
    """One held-out file: its text, line spans and whole-file token offsets."""

    def __init__(self, path: str, text: str, tok: Any) -> None:
        self.path, self.text, self.tok = path, text, tok
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        self.ids = enc["input_ids"]
        self.token_starts = [a for a, _ in enc["offset_mapping"]]
        self.spans, pos = [], 0  # (start, end without the newline) of every line
        for line in text.splitlines(keepends=True):
            self.spans.append((pos, pos + len(line.rstrip("\r\n"))))
            pos += len(line)
        self.line_token = [bisect.bisect_left(self.token_starts, a) for a, _ in self.spans]

    def blank(self, i: int) -> bool:
        a, b = self.spans[i]
        return not self.text[a:b].strip()

    def top_level(self, i: int) -> bool:
        """A line that starts a statement or comment at column 0: def, class, import, @, #, a name."""
        c = self.text[self.spans[i][0]:self.spans[i][0] + 1]
        return c != "" and (c.isalpha() or c in "_@#")

    def tokens_after(self, i: int) -> int:
        """Approximate tokens from the start of line i to the end of the file."""
        return len(self.ids) - self.line_token[i]

    def cut(self, s: int, e: int) -> str:
        return self.text[self.spans[s][0]:self.spans[e][1]]

    def count(self, text: str) -> int:
        return len(self.tok(text)["input_ids"])


def messages(code: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"Continue this Python code:\n```python\n{code}\n```"}]


def snippet(rng: random.Random, src: Source, target: int, lo: int, starts: list[int],
            with_bos: bool) -> tuple[str, int, int, int] | None:
    """(text, tokens, first line, last line): whole lines from a random start, as many as keep the
    token count <= target; None if that is under lo."""
    s = rng.choice(starts)
    extra = 0 if with_bos else 1
    n_first = src.count(src.cut(s, s)) - extra
    if n_first > target:
        return None
    best, left, right = s, s, min(len(src.spans) - 1, s + target)  # largest e: count(s, e) <= target
    while left <= right:
        mid = (left + right) // 2
        if src.count(src.cut(s, mid)) - extra <= target:
            best, left = mid, mid + 1
        else:
            right = mid - 1
    while best > s and src.blank(best):
        best -= 1
    text = src.cut(s, best)
    n = src.count(text) - extra
    return (text, n, s, best) if n >= lo else None


def build_journey(rng: random.Random, sources: list[Source]) -> list[Request]:
    kinds = ["short"] * 48 + ["long"] * 16
    rng.shuffle(kinds)
    seen, out = set(), []
    for kind in kinds:
        while True:
            if kind == "short":
                lo, target, fit = 16, rng.randint(16, 96), sources
            else:
                lo, target = 256, round(math.exp(rng.uniform(math.log(256), math.log(1024))))
                fit = [s for s in sources if len(s.ids) >= target * 1.2]
            src = rng.choices(fit, weights=[math.sqrt(len(s.ids)) for s in fit])[0]
            starts = [i for i in range(len(src.spans)) if src.top_level(i) and (kind == "short" or
                                                                                 src.tokens_after(i) >= target)]
            got = snippet(rng, src, target, lo, starts, with_bos=True) if starts else None
            if got and got[0] not in seen:
                break
        text, n, s, e = got
        seen.add(text)
        new = max(8, min(512, round(rng.lognormvariate(math.log(64), 1.0))))
        assert n + new <= CONTEXT
        out.append(Request(f"journey-{len(out):03d}", text, tuple(messages(text)), new, n,
                           {"source": src.path, "lines": [s + 1, e + 1], "kind": kind}))
    return out


def common_prefix(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return n


def draw_suffixes(seed: int, sources: list[Source], head: Source) -> list[tuple[Source, tuple]]:
    """32 distinct 16-64 token snippets, each from a top-level line of a file other than head."""
    rng, suffixes, seen = random.Random(f"{seed}-suffix"), [], set()
    others = [s for s in sources if s is not head]
    while len(suffixes) < 32:
        src = rng.choice(others)
        starts = [i for i in range(len(src.spans)) if src.top_level(i)]
        got = snippet(rng, src, rng.randint(16, 64), 16, starts, with_bos=False) if starts else None
        if got and (src.path, got[2]) not in seen:
            seen.add((src.path, got[2]))
            suffixes.append((src, got))
    return suffixes


def shared_prefix_set(n: int, head: Source, suffixes: list, cut_ok: Any, tok: Any) -> list[Request] | None:
    """The set whose prompts share exactly n tokens, or None if head cannot give them."""
    for k in (n - 3, n - 2):  # file tokens; bos and the line break(s) before the snippet make n
        header = tok.decode(head.ids[:k])
        if not cut_ok(head.text[len(header):len(header) + 1]):
            continue
        joiner = "\n" if header.endswith("\n") else "\n\n"
        system = f"{SYSTEM} The file open in the editor begins:\n```python\n{header}\n```"
        reqs = [(header + joiner + text, messages(text, system), src, s, e) for src, (text, _, s, e) in suffixes]
        ids = tok([p for p, *_ in reqs])["input_ids"]
        if ids[0][:k + 1] == [tok.bos_token_id] + head.ids[:k] and common_prefix(ids) == n:
            chat = [tok(tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)["input_ids"] for _, m, *_ in reqs]
            meta = {"prefix_source": head.path, "prefix_file_tokens": k, "shared_prefix_tokens": n,
                    "shared_prefix_chat_tokens": common_prefix(chat)}
            return [Request(f"shared-prefix-{n}-{i:03d}", p, tuple(m), 32, len(x),
                            {"source": src.path, "lines": [s + 1, e + 1], **meta})
                    for i, ((p, m, src, s, e), x) in enumerate(zip(reqs, ids))]
    return None


def build_shared_prefix(seed: int, sources: list[Source], tok: Any) -> dict[str, list[Request]]:
    """One header file and one suffix list for all three lengths. The cleanest cut wins: a header
    ending a line, else ending a word, else anywhere; files are tried in a seeded order."""
    order = [s for s in sources if len(s.ids) >= max(PREFIX_LENGTHS)]
    random.Random(f"{seed}-header").shuffle(order)
    for cut_ok in (lambda c: c == "\n", lambda c: c.isspace(), lambda c: True):
        for head in order:
            suffixes = draw_suffixes(seed, sources, head)
            sets = {f"shared-prefix-{n}": shared_prefix_set(n, head, suffixes, cut_ok, tok) for n in PREFIX_LENGTHS}
            if all(sets.values()):
                return sets
    raise RuntimeError("no held-out file gives a header that stays the same tokens for every prefix length")


def windows(src: Source, tok: Any) -> list[tuple[str, int]]:
    """Non-overlapping (text, token offset) windows that re-tokenize to exactly WINDOW tokens."""
    out, i, span = [], 0, WINDOW - 1
    while i + span <= len(src.ids):
        for shift in range(8):
            piece = src.ids[i + shift:i + shift + span]
            text = tok.decode(piece)
            if len(piece) == span and tok(text)["input_ids"] == [tok.bos_token_id] + piece:
                out.append((text, i + shift))
                i += shift
                break
        i += span
    return out


def build_quantization_sets(rng: random.Random, sources: list[Source],
                            tok: Any) -> tuple[dict[str, list[Request]], dict[str, list[str]]]:
    """The calibration and evaluation windows, and the files of each group."""
    groups: dict[str, list[tuple[Source, list]]] = {"calibration": [], "evaluation": []}
    for src in sorted(sources, key=lambda s: (-len(s.ids), s.path)):
        wins = windows(src, tok)
        size = {g: sum(len(w) for _, w in v) for g, v in groups.items()}
        groups["evaluation" if size["evaluation"] < size["calibration"] else "calibration"].append((src, wins))
    out = {}
    for name, members in groups.items():
        pool = [(src, text, off) for src, wins in members for text, off in wins]
        assert name != "calibration" or len(pool) >= 64, f"only {len(pool)} calibration windows"
        picked = sorted(rng.sample(range(len(pool)), min(64, len(pool))))
        out[name] = [Request(f"{name}-{k:03d}", pool[j][1], tuple(messages(pool[j][1])), 1, WINDOW,
                             {"source": pool[j][0].path, "token_offset": pool[j][2], "group": name})
                     for k, j in enumerate(picked)]
    return out, {name: sorted(s.path for s, _ in members) for name, members in groups.items()}


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def readme(manifest: dict) -> str:
    cols = ["min", "p50", "mean", "p90", "max", "total"]
    lines = ["# Workloads", "", "Generated by `python scripts/build_workloads.py` (do not edit by hand; the numbers "
             "below come from the files). Load them with `lablib.workloads.load_workload(name)`, which checks each "
             "file against the sha256 in `manifest.json`.", "",
             "Every request has a completion form (`prompt`, for the embedded base model) and a chat form "
             "(`messages`, for an instruct model's chat template). `prompt_tokens` counts the completion form with "
             f"the embedded tokenizer (`{TOKENIZER}`), bos included; other tokenizers give other counts.", "",
             "## Length statistics (tokens)", "",
             "| set | v | requests | prompt " + " | prompt ".join(cols) + " | output " + " | output ".join(cols) + " |",
             "|---" * (3 + 2 * len(cols)) + "|"]
    for name, e in manifest["workloads"].items():
        p, o = e["stats"]["prompt_tokens"], e["stats"]["output_tokens"]
        lines.append(f"| {name} | {e['version']} | {e['num_requests']} | " + " | ".join(str(p[c]) for c in cols)
                     + " | " + " | ".join(str(o[c]) for c in cols) + " |")
    for name, e in manifest["workloads"].items():
        pv = e["provenance"]
        lines += ["", f"## {name} (version {e['version']})", "", e["description"], "",
                  f"- file: `{e['file']}`, {e['num_requests']} requests, sha256 `{e['sha256']}`",
                  f"- source: `{pv['corpus']}` (sha256 `{pv['corpus_sha256']}`), seed {pv['seed']}, "
                  f"script `{pv['script']}`, tokenizer `{pv['tokenizer']}`"]
        if "shared_prefix_tokens" in e:
            lines.append(f"- shared prefix: {e['shared_prefix_tokens']} tokens in completion form, "
                         f"{e['shared_prefix_chat_tokens']} once chat-templated with the embedded tokenizer")
        if "source_files" in e:
            lines.append(f"- files: {', '.join(f'`{p}`' for p in e['source_files'])}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="data folder (corpus, models, workloads)")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer
    from transformers.utils import logging
    logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(args.data / "models" / "target")
    corpus = args.data / "corpus" / "test.jsonl.gz"
    with gzip.open(corpus, "rt", encoding="utf-8") as f:
        rows = sorted((json.loads(line) for line in f), key=lambda r: r["path"])
    sources = [Source(r["path"], r["text"], tok) for r in rows]

    sets = {"journey": build_journey(random.Random(f"{args.seed}-journey"), sources)}
    sets.update(build_shared_prefix(args.seed, sources, tok))
    quant, files = build_quantization_sets(random.Random(f"{args.seed}-quant"), sources, tok)
    sets.update(quant)
    assert not set(files["calibration"]) & set(files["evaluation"])

    out = args.data / "workloads"
    out.mkdir(parents=True, exist_ok=True)
    old = out / "manifest.json"
    old = json.loads(old.read_text())["workloads"] if old.is_file() else {}
    provenance = {"corpus": CORPUS, "corpus_sha256": sha256_file(corpus), "seed": args.seed, "script": SCRIPT,
                  "tokenizer": TOKENIZER, "tokenizer_sha256": sha256_file(args.data / "models/target/tokenizer.json")}
    manifest = {"schema": 1, "workloads": {}}
    for name, reqs in sets.items():
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in reqs), encoding="utf-8")
        kind = "shared-prefix" if name.startswith("shared-prefix") else name
        meta = reqs[0].meta
        entry = {"version": VERSIONS[name],
                 "description": DESCRIPTIONS[kind].format(n=meta.get("shared_prefix_tokens"),
                                                          m=meta.get("prefix_file_tokens"),
                                                          path=meta.get("prefix_source")),
                 "file": path.name, "sha256": sha256_file(path), "num_requests": len(reqs), "provenance": provenance,
                 "stats": {"prompt_tokens": length_stats([r.prompt_tokens for r in reqs]),
                           "output_tokens": length_stats([r.max_new_tokens for r in reqs])}}
        if kind == "shared-prefix":
            entry["shared_prefix_tokens"] = meta["shared_prefix_tokens"]
            entry["shared_prefix_chat_tokens"] = min(r.meta["shared_prefix_chat_tokens"] for r in reqs)
        if name in files:
            entry["source_files"] = files[name]
        was = old.get(name, {})
        if was.get("version") == entry["version"] and was.get("sha256") != entry["sha256"]:
            print(f"warning: {name} changed but is still version {entry['version']}: bump VERSIONS[{name!r}]")
        manifest["workloads"][name] = entry
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(readme(manifest), encoding="utf-8")
    size = sum(p.stat().st_size for p in out.iterdir())
    for name, e in manifest["workloads"].items():
        print(f"{name:20s} {e['num_requests']:3d} requests  prompt {e['stats']['prompt_tokens']}  "
              f"output {e['stats']['output_tokens']}")
    print(f"wrote {out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
