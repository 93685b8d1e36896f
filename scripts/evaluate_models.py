"""Evaluate the embedded models on the held-out test split and write their model card.

The card's job is to make every claim about `data/models/target` and `data/models/draft`
checkable: each figure in `data/models/README.md` is read from `data/models/eval.json`
(written here) or from the two `training.json` files (written by `build_models.py`), and
the card is regenerated from them, never edited by hand.

What is measured, all on the CPU in fp32 and greedy, so any machine reproduces it:

- Perplexity: each test file is encoded as bos + text + eos and cut into consecutive
  windows of 512 tokens; every token but the leading bos is predicted once, and the
  token-weighted mean NLL gives the perplexity. Next-token top-1 accuracy comes from the
  same pass.
- A unigram baseline, to say what "low" means. The training text is not shipped, so the
  unigram (add-one smoothed) is fitted on half of the test files and scored on the other
  half; the two models are scored on that same half too, so the comparison is like for like.
- Draft-target agreement: the target greedily continues prompts cut from test files; at each
  position the draft, given the same prefix, proposes its argmax. The match rate is the
  per-token acceptance rate alpha that greedy speculative decoding sees, and
  (1 - alpha^(k+1)) / (1 - alpha) is the expected tokens per verification step if matches
  were independent. The greedy speculative loop is then actually run, to measure the
  tokens per step for real (matches cluster, so the two differ) and to check that it emits
  exactly the target's greedy tokens.
- CPU decode time of HF `generate` (warm-up, then the median of several runs).

Run from the repository root (about a minute on two CPU cores):

    python scripts/evaluate_models.py              # measure, write eval.json and README.md
    python scripts/evaluate_models.py --card-only  # re-render README.md from eval.json

One file, over the house ~300 lines: the brief asks for a single script, and the
measurement and the card it feeds are easier to check side by side.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "models"
TEST_FILE = ROOT / "data" / "corpus" / "test.jsonl.gz"
NAMES = ("target", "draft")

PROTOCOL = {
    "seed": 1234,             # torch.manual_seed and the prompt-position generator
    "dtype": "float32",       # weights are stored in bf16 and cast up for the CPU
    "window": 512,            # tokens predicted per window (the training sequence length)
    "halves": "test files sorted by path: 0-based even positions fit the unigram, odd positions are scored",
    "prompts": 64,            # agreement / speculative prompts cut from test files
    "prompt_tokens": 128,     # tokens of file text before each cut
    "decode_tokens": 32,      # greedy tokens the target writes after each cut
    "k_max": 8,               # draft lengths k = 1..k_max for the formula table
    "sim_k": 4,               # draft length of the simulated speculative loop
    "samples": 3,             # greedy continuation samples
    "sample_tokens": 48,
    "sample_context_lines": 8,  # lines of file text before the first top-level def in a sample prompt
    "speed_new_tokens": 32,
    "speed_repeats": 5,
}


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_test() -> list[tuple[str, str]]:
    """(path, text) of every held-out file, sorted by path."""
    if not TEST_FILE.exists():
        sys.exit(f"evaluate_models: {TEST_FILE} is missing; run scripts/build_models.py --out data first")
    with gzip.open(TEST_FILE, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return sorted((r["path"], r["text"]) for r in rows)


def load(name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = MODELS / name
    if not (folder / "model.safetensors").exists():
        sys.exit(f"evaluate_models: no weights in {folder}; run scripts/build_models.py --out data first")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    return AutoTokenizer.from_pretrained(folder), model


def score_files(model, files: list[list[int]], window: int) -> list[dict]:
    """Per file: summed NLL, tokens predicted and top-1 hits, over consecutive windows."""
    import torch
    import torch.nn.functional as F

    out = []
    with torch.no_grad():
        for ids in files:
            x = torch.tensor(ids)
            nll = hits = 0.0
            for s in range(0, len(ids) - 1, window):
                inp, tgt = x[s:s + window], x[s + 1:s + window + 1]
                logits = model(input_ids=inp[None, :len(tgt)]).logits[0].float()
                nll += F.cross_entropy(logits, tgt, reduction="sum").item()
                hits += (logits.argmax(-1) == tgt).sum().item()
            out.append({"nll": nll, "tokens": len(ids) - 1, "hits": hits})
    return out


def summarise(per_file: list[dict], idx: list[int]) -> dict:
    tokens = sum(per_file[i]["tokens"] for i in idx)
    nll = sum(per_file[i]["nll"] for i in idx) / tokens
    return {"files": len(idx), "tokens": tokens, "nll": nll, "perplexity": math.exp(nll),
            "top1": sum(per_file[i]["hits"] for i in idx) / tokens}


def unigram(files: list[list[int]], fit: list[int], scored: list[int], vocab: int) -> dict:
    """Add-one smoothed token frequencies from the fit files, scored on the other files."""
    counts = [0] * vocab
    for i in fit:
        for t in files[i][1:]:          # the leading bos is never predicted
            counts[t] += 1
    total = sum(counts) + vocab
    logp = [math.log((c + 1) / total) for c in counts]
    best = max(range(vocab), key=counts.__getitem__)
    per_file = [{"nll": -sum(logp[t] for t in files[i][1:]), "tokens": len(files[i]) - 1,
                 "hits": sum(t == best for t in files[i][1:])} if i in scored else None
                for i in range(len(files))]
    return {"smoothing": "add-one", "vocab": vocab, "fit_tokens": sum(counts), **summarise(per_file, scored)}


def greedy(model, ids, n: int):
    """n argmax tokens after ids [batch, T] with a KV cache; eos does not stop it."""
    import torch

    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        new = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for _ in range(n - 1):
            out = model(input_ids=new[-1], past_key_values=out.past_key_values, use_cache=True)
            new.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(new, 1)


def cut_prompts(files: list[list[int]], p: dict):
    """p['prompts'] cuts of p['prompt_tokens'] tokens, cycling over files long enough, seeded positions."""
    import torch

    gen = torch.Generator().manual_seed(p["seed"])
    need = p["prompt_tokens"] + p["decode_tokens"]
    eligible = [i for i, ids in enumerate(files) if len(ids) > need]
    cuts = []
    for j in range(p["prompts"]):
        i = eligible[j % len(eligible)]
        pos = int(torch.randint(p["prompt_tokens"], len(files[i]) - p["decode_tokens"], (1,), generator=gen))
        cuts.append((i, pos))
    prompts = torch.tensor([files[i][pos - p["prompt_tokens"]:pos] for i, pos in cuts])
    return prompts, cuts, len(eligible)


def agreement(target, draft, prompts, p: dict) -> tuple[dict, object]:
    """Draft argmax vs the target's greedy token at every position of the target's continuation."""
    import torch

    cont = greedy(target, prompts, p["decode_tokens"])
    full = torch.cat([prompts, cont], 1)
    rows = slice(prompts.shape[1] - 1, full.shape[1] - 1)
    with torch.no_grad():
        d_pred = draft(input_ids=full).logits[:, rows].argmax(-1)
        t_pred = target(input_ids=full).logits[:, rows].argmax(-1)
    match = (d_pred == cont)
    alpha = match.float().mean().item()
    per_prompt = match.float().mean(1).tolist()
    return {"positions": match.numel(), "matches": int(match.sum()), "alpha": alpha,
            "alpha_per_prompt_quartiles": statistics.quantiles(per_prompt, n=4),
            "alpha_by_offset": match.float().mean(0).tolist(),
            "target_self_consistency": (t_pred == cont).float().mean().item(),
            "expected_tokens_per_step": {str(k): (1 - alpha ** (k + 1)) / (1 - alpha) for k in range(1, p["k_max"] + 1)},
            }, cont


def speculative(target, draft, prompts, reference, k: int, n: int) -> dict:
    """Run the greedy speculative loop per prompt: draft proposes k, target verifies in one pass."""
    import torch

    steps = emitted = identical = 0
    accepted = [0] * (k + 1)
    for prompt, ref in zip(prompts, reference):
        seq = prompt
        while len(seq) - len(prompt) < n:
            proposal = greedy(draft, seq[None], k)[0]
            with torch.no_grad():
                verdict = target(input_ids=torch.cat([seq, proposal])[None]).logits[0, len(seq) - 1:].argmax(-1)
            m = 0
            while m < k and proposal[m] == verdict[m]:
                m += 1
            seq = torch.cat([seq, proposal[:m], verdict[m:m + 1]])
            steps, emitted, accepted[m] = steps + 1, emitted + m + 1, accepted[m] + 1
        identical += bool(torch.equal(seq[len(prompt):len(prompt) + n], ref))
    return {"k": k, "steps": steps, "tokens": emitted, "tokens_per_step": emitted / steps,
            "accepted_histogram": accepted, "identical_to_target_greedy": identical, "prompts": len(prompts)}


def sample_prompts(rows: list[tuple[str, str]], p: dict) -> list[tuple[str, str]]:
    """(path, text up to the first top-level def line's end) for evenly spaced files.

    The prompt stops before that line's newline: the tokenizer merges a newline with the indentation
    after it, so a prompt ending in a bare newline would force a token split never seen in training.
    """
    found = []
    for path, text in rows:
        lines = text.splitlines(keepends=True)
        at = next((i for i, line in enumerate(lines) if line.startswith("def ")), None)
        if at is not None:
            found.append((path, "".join(lines[max(0, at - p["sample_context_lines"]):at + 1]).rstrip("\n")))
    step = (len(found) - 1) / max(1, p["samples"] - 1)
    return [found[round(i * step)] for i in range(p["samples"])]


def speed(model, tok, prompt, p: dict) -> dict:
    """Seconds for HF generate to write speed_new_tokens greedy tokens at batch 1, after a warm-up."""
    import torch

    n = p["speed_new_tokens"]
    kw = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=tok.pad_token_id)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with torch.no_grad():
        out = model.generate(prompt, **kw)
        times = []
        for _ in range(p["speed_repeats"]):
            t0 = time.perf_counter()
            model.generate(prompt, **kw)
            times.append(time.perf_counter() - t0)
    same = torch.equal(out[0, prompt.shape[1]:], greedy(model, prompt, n)[0])
    med = statistics.median(times)
    return {"prompt_tokens": prompt.shape[1], "new_tokens": n, "seconds": times, "median_s": med,
            "min_s": min(times), "max_s": max(times), "tokens_per_s": n / med, "matches_greedy_loop": same,
            "load_average_1min": load}


def facts(name: str, model) -> dict:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"parameters": sum(p.numel() for p in model.parameters()), "layers": c.num_hidden_layers,
            "hidden": c.hidden_size, "intermediate": c.intermediate_size, "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads, "head_dim": head_dim, "vocab": c.vocab_size,
            "context": c.max_position_embeddings, "tied_embeddings": bool(c.tie_word_embeddings),
            "stored_dtype": "bfloat16", "weights_bytes": (MODELS / name / "model.safetensors").stat().st_size,
            "kv_bytes_per_token_bf16": 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 2}


def environment() -> dict:
    import tokenizers
    import torch
    import transformers

    cpu = platform.processor() or "cpu"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform()}


def evaluate() -> dict:
    import torch

    p = PROTOCOL
    torch.manual_seed(p["seed"])
    t_start = time.time()
    rows = load_test()
    (tok, target), (_, draft) = load("target"), load("draft")
    models = {"target": target, "draft": draft}
    files = [ids + [tok.eos_token_id] for ids in tok([t for _, t in rows], add_special_tokens=True)["input_ids"]]
    fit, scored = list(range(0, len(files), 2)), list(range(1, len(files), 2))
    ev = {"generated_by": "scripts/evaluate_models.py", "protocol": p, "environment": environment(),
          "weights": {n: {"sha256": sha256_file(MODELS / n / "model.safetensors")} for n in NAMES},
          "test_set": {"file": "data/corpus/test.jsonl.gz", "sha256": sha256_file(TEST_FILE),
                       "files": len(files), "tokens": sum(map(len, files)),
                       "halves": {"fit": [rows[i][0] for i in fit], "scored": [rows[i][0] for i in scored]}},
          "models": {}}
    for name, model in models.items():
        per_file = score_files(model, files, p["window"])
        ev["models"][name] = {**facts(name, model), "test": summarise(per_file, list(range(len(files)))),
                              "scored_half": summarise(per_file, scored)}
        print(f"{name}: test perplexity {ev['models'][name]['test']['perplexity']:.3f}", flush=True)
    ev["unigram"] = unigram(files, fit, scored, len(tok))
    print(f"unigram: scored-half perplexity {ev['unigram']['perplexity']:.1f}", flush=True)

    prompts, cuts, n_eligible = cut_prompts(files, p)
    agree, cont = agreement(target, draft, prompts, p)
    ev["agreement"] = {"eligible_files": n_eligible, "cuts": [[rows[i][0], pos] for i, pos in cuts], **agree}
    print(f"agreement alpha {agree['alpha']:.4f}", flush=True)
    ev["speculative"] = speculative(target, draft, prompts, cont, p["sim_k"], p["decode_tokens"])
    print(f"speculative k={p['sim_k']}: {ev['speculative']['tokens_per_step']:.3f} tokens/step", flush=True)

    ev["samples"] = []
    for path, text in sample_prompts(rows, p):
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        ev["samples"].append({"path": path, "prompt": text, **{
            n: tok.decode(greedy(m, ids, p["sample_tokens"])[0], skip_special_tokens=False) for n, m in models.items()}})

    for name, model in models.items():
        ev["models"][name]["cpu_speed"] = speed(model, tok, prompts[:1], p)
        print(f"{name}: {ev['models'][name]['cpu_speed']['median_s']:.3f} s for {p['speed_new_tokens']} tokens", flush=True)
    ev["eval_seconds"] = round(time.time() - t_start, 1)
    return ev


# ----------------------------------------------------------------------------- the card

def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _load(m: dict) -> str:
    loads = [m[n]["cpu_speed"].get("load_average_1min") for n in NAMES]
    return ", ".join(f"{n} {x:.1f}" if x is not None else f"{n} unknown" for n, x in zip(NAMES, loads))


def _fence(text: str) -> str:
    return "```python\n" + text.rstrip("\n") + "\n```"


def render_card(ev: dict, train: dict[str, dict]) -> str:
    """The model card, as Markdown, from eval.json and the two training.json records only."""
    p, env, m, uni, ag, sp = ev["protocol"], ev["environment"], ev["models"], ev["unigram"], ev["agreement"], ev["speculative"]
    tr, corpus = train["target"], train["target"]["corpus"]
    hy, tenv = tr["hyper"], tr["environment"]
    half = ev["test_set"]["halves"]
    cost = m["draft"]["cpu_speed"]["median_s"] / m["target"]["cpu_speed"]["median_s"]
    out = [f"""# Embedded models: `target` and `draft`

Generated by `{ev['generated_by']}` on {env['date']} from `eval.json` and the two `training.json` files;
edit the script, not this file.

Two small Llama models trained from scratch on the Python {corpus['python']} standard library's source, so
that the lab runs with real models where no model hub can be reached: `target`
({m['target']['parameters']:,} parameters) and `draft` ({m['draft']['parameters']:,} parameters,
{m['target']['parameters'] / m['draft']['parameters']:.1f}x smaller, distilled from the target). They share one
byte-level BPE tokenizer of {m['target']['vocab']:,} tokens, saved in each folder; the tokenizer adds the bos token itself.

**For:** teaching the mechanics of inference on any machine: decode speed and memory, KV-cache sizes,
batching, speculative decoding (acceptance rate, tokens per step, and when a draft is too slow to pay off),
quantization (the perplexities below are the reference to compare against), prefix caching.
**Not for:** writing or completing code. They are tiny and trained on a few megabytes of one library; their
greedy continuations (samples below) look like Python but soon repeat themselves or lose the thread. Nothing
they write should be run or trusted.

## Architecture
"""]
    keys = [("parameters", "parameters", "{:,}"), ("layers", "layers", "{}"), ("hidden size", "hidden", "{}"),
            ("MLP size", "intermediate", "{}"), ("attention heads", "heads", "{}"), ("KV heads (GQA)", "kv_heads", "{}"),
            ("head dim", "head_dim", "{}"), ("vocabulary", "vocab", "{:,}"), ("context (positions)", "context", "{:,}"),
            ("weights on disk (bf16 safetensors)", "weights_bytes", "{:,} bytes"),
            ("KV cache per token (bf16)", "kv_bytes_per_token_bf16", "{:,} bytes")]
    out.append(_table(["", "target", "draft"],
                      [[label] + [fmt.format(m[n][k]) for n in NAMES] for label, k, fmt in keys]))
    out.append("\nBoth: Llama (RMSNorm, SwiGLU, RoPE), tied input/output embeddings, stored in bfloat16.\n")

    out.append(f"""## Held-out evaluation

On the test split (`{ev['test_set']['file']}`: {ev['test_set']['files']} files, {ev['test_set']['tokens']:,} tokens), never
used in training nor in model selection. Each file is encoded as bos + text + eos and cut into consecutive windows of
{p['window']} tokens; every token but the leading bos is predicted once; {p['dtype']} on the CPU. Perplexity is exp of
the token-weighted mean NLL (nats).

The unigram baseline needs token counts from text the models were trained on, which is not shipped, so it is fitted
(add-one smoothing, {uni['vocab']:,} tokens) on half of the test files ({len(half['fit'])} files, {uni['fit_tokens']:,}
tokens; rule: {p['halves']}) and scored on the other half ({uni['files']} files, {uni['tokens']:,} tokens). The models
are scored on that same half as well, for a like-for-like comparison.
""")
    cells = lambda r: [f"{r['nll']:.4f}", f"**{r['perplexity']:.2f}**", f"{100 * r['top1']:.1f}%"]
    rows = [[f"`{n}`"] + cells(m[n]["test"]) + cells(m[n]["scored_half"]) for n in NAMES]
    rows.append(["unigram baseline", "", "", ""] + cells(uni))
    out.append(_table(["model", "test NLL", "test perplexity", "test top-1",
                       "scored-half NLL", "scored-half perplexity", "scored-half top-1"], rows))
    out.append("\nTop-1 is next-token accuracy (argmax equals the next token; for the unigram, always its most frequent token). "
               "Validation losses during training (below) used bf16 autocast on a GPU and the validation split, so they are "
               "close to, not equal to, these figures.\n")

    exp = ag["expected_tokens_per_step"]
    q = ag["alpha_per_prompt_quartiles"]
    out.append(f"""## Draft-target agreement (speculative decoding)

{p['prompts']} prompts of {p['prompt_tokens']} tokens cut at seeded positions from the {ag['eligible_files']} test files
long enough; the target greedily writes {p['decode_tokens']} tokens after each; at every one of those
{ag['positions']:,} positions the draft, given the same prefix, proposes its argmax.

- Per-token acceptance rate **alpha = {ag['alpha']:.3f}** ({ag['matches']:,} of {ag['positions']:,}); per prompt the
  quartiles are {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f}; first generated position {ag['alpha_by_offset'][0]:.3f}, last
  {ag['alpha_by_offset'][-1]:.3f}.
- Expected tokens per target verification step, (1 - alpha^(k+1)) / (1 - alpha), which assumes matches are independent;
  the speed-up column is that divided by (k c + 1), with c = {cost:.2f} the measured CPU cost of a draft step relative to a
  target step (ratio of the HF `generate` times below):
""")
    out.append(_table(["draft length k"] + list(exp), [["tokens per step"] + [f"{v:.2f}" for v in exp.values()],
                      ["speed-up at c"] + [f"{v / (int(k) * cost + 1):.2f}x" for k, v in exp.items()]]))
    hist = ", ".join(f"{i}: {c}" for i, c in enumerate(sp["accepted_histogram"]))
    out.append(f"""
- **Measured**: the greedy speculative loop run for real on the same prompts with k = {sp['k']} (draft proposes
  {sp['k']} tokens greedily, target checks them in one pass, the longest matching prefix plus the target's own next
  token is kept) took {sp['steps']:,} target steps for {sp['tokens']:,} tokens: **{sp['tokens_per_step']:.2f} tokens per
  step**, against {exp[str(sp['k'])]:.2f} from the formula. Draft tokens accepted per step ({hist}). It reproduced the
  target's plain greedy output on {sp['identical_to_target_greedy']} of {sp['prompts']} prompts, as it must (the target's
  argmax in one full forward pass equals its KV-cached greedy token at {100 * ag['target_self_consistency']:.1f}% of positions).
""")

    sr = [[f"`{n}`", f"{c['median_s'] * 1000:.0f} ms", f"{c['min_s'] * 1000:.0f}-{c['max_s'] * 1000:.0f} ms",
           f"{c['tokens_per_s']:.0f}"] for n, c in ((n, m[n]["cpu_speed"]) for n in NAMES)]
    same = ", ".join(f"{n} {'yes' if m[n]['cpu_speed']['matches_greedy_loop'] else 'NO'}" for n in NAMES)
    s0 = m["target"]["cpu_speed"]
    out.append(f"""## CPU speed

HF `generate`, batch 1, a {s0['prompt_tokens']}-token prompt, {s0['new_tokens']} greedy new tokens (eos ignored), {p['dtype']},
one warm-up then the median of {p['speed_repeats']} runs, on {env['cpu']} ({env['cpu_count']} cores, {env['torch_threads']}
torch threads; 1-minute load average before timing: {_load(m)}). Wall-clock times on a shared machine move with its
load; the perplexities and agreement figures above do not.

The draft has {m['target']['parameters'] / m['draft']['parameters']:.1f}x fewer parameters but is only
{s0['median_s'] / m['draft']['cpu_speed']['median_s']:.1f}x faster: at these sizes the fixed cost of each layer and step
weighs as much as the weights, so parameter count is a poor guide to speed. The tokens `generate` wrote equal those of
the script's own KV-cached greedy loop: {same}.

""")
    out.append(_table(["model", f"median time for {s0['new_tokens']} tokens", "range", "tokens/s"], sr))

    out.append(f"""
## Samples

Greedy continuations ({p['sample_tokens']} tokens) of {p['samples']} held-out files, each prompt being the
{p['sample_context_lines']} lines before the file's first top-level `def` and that line up to its colon (not its newline:
the tokenizer merges a newline with the indentation after it, so the model must choose both).
""")
    for s in ev["samples"]:
        last = s["prompt"].rsplit("\n", 1)[-1]
        out.append(f"**`{s['path']}`** prompt:\n\n{_fence(s['prompt'])}\n")
        for n in NAMES:
            out.append(f"`{n}` continues (after the prompt's last line):\n\n{_fence(last + s[n])}\n")

    out.append(f"""## Training data and split

- Source: {corpus['source']}, from `{corpus['stdlib']}` (Python {corpus['python']}), sorted by path.
- Corpus sha256 (paths and texts): `{corpus['sha256']}`.
- Split rule: {corpus['split_rule']}.
""")
    out.append(_table(["split", "files", "bytes", "tokens"],
                      [[k, corpus["files"][k], f"{corpus['bytes'][k]:,}", f"{corpus['tokens'][k]:,}"] for k in corpus["files"]]))
    epochs = hy["steps"] * hy["batch"] * hy["seq"] / corpus["tokens"]["train"]
    out.append(f"""
## Training

Hyper-parameters (both models): seed {hy['seed']}, {hy['steps']:,} steps (draft {hy['draft_steps']:,}) of
{hy['batch']} x {hy['seq']} tokens (about {epochs:.0f} passes over the training tokens), AdamW (betas 0.9/0.95,
weight decay 0.1), peak learning rate {hy['lr']}, {hy['warmup']} warm-up steps then cosine decay to a tenth, gradient
clipping 1.0, bf16 autocast; validation every {hy['eval_every']} steps, and the weights with the best validation loss
are kept.
""")
    tr_rows = []
    for n in NAMES:
        t = train[n]
        best = min(t["curve"], key=lambda r: r["val_loss"])
        tr_rows.append([f"`{n}`", t["objective"], f"{t['best_val_loss']:.4f}", best["step"],
                        f"{t['train_seconds']:.0f} s", t["environment"]["device"]])
    out.append(_table(["model", "objective", "best validation loss", "at step", "training time", "hardware"], tr_rows))
    out.append(f"""
Environment: torch {tenv['torch']}, transformers {tenv['transformers']}, tokenizers {tenv['tokenizers']}, {tenv['date']}.
The draft is distilled from the target's kept (best) weights. The target over-fits: its training loss keeps falling
while its validation loss turns up after step {min(tr['curve'], key=lambda r: r['val_loss'])['step']}, and early stopping
keeps that step. Loss curve (nats; full curves with learning rates and times in each `training.json`):
""")
    by_step = {n: {r["step"]: r for r in train[n]["curve"]} for n in NAMES}
    steps = sorted(set(by_step["target"]) | set(by_step["draft"]))
    fmt = lambda n, s, k: f"{by_step[n][s][k]:.3f}" if s in by_step[n] else ""
    out.append(_table(["step", "target train", "target val", "draft train", "draft val"],
                      [[s, fmt("target", s, "train_loss"), fmt("target", s, "val_loss"),
                        fmt("draft", s, "train_loss"), fmt("draft", s, "val_loss")] for s in steps]))

    out.append(f"""
## Reproduce

    python scripts/build_models.py --out data   # on a GPU: corpus, tokenizer, both models, training.json
    python scripts/evaluate_models.py           # on any CPU: eval.json and this card

Training on another GPU or library version gives close, not bit-identical, weights; the evaluation is deterministic
for given weights (seeded, greedy, fp32). `eval.json` records the sha256 of the weights it measured
(target `{ev['weights']['target']['sha256'][:16]}...`, draft `{ev['weights']['draft']['sha256'][:16]}...`) and
`tests/test_model_card.py` checks them against the files in this folder.

## License

The training text and `data/corpus/test.jsonl.gz` are CPython standard-library source, distributed under the PSF
License Agreement (Python Software Foundation License, version 2); the weights and tokenizer are derived from it.
Keep the PSF notice when redistributing the corpus.

## Evaluation run

{env['date']}, {ev['eval_seconds']:.0f} s on {env['cpu']} ({env['torch_threads']} threads), Python {env['python']},
torch {env['torch']}, transformers {env['transformers']}, tokenizers {env['tokenizers']}, {env['platform']}.
""")
    return "\n".join(out)


def read_training() -> dict[str, dict]:
    return {n: json.loads((MODELS / n / "training.json").read_text()) for n in NAMES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--card-only", action="store_true", help="re-render README.md from the existing eval.json")
    args = ap.parse_args()
    if args.card_only:
        ev = json.loads((MODELS / "eval.json").read_text())
    else:
        ev = evaluate()
        (MODELS / "eval.json").write_text(json.dumps(ev, indent=1) + "\n")
    (MODELS / "README.md").write_text(render_card(ev, read_training()))
    print(json.dumps({"target_ppl": ev["models"]["target"]["test"]["perplexity"],
                      "draft_ppl": ev["models"]["draft"]["test"]["perplexity"],
                      "unigram_ppl": ev["unigram"]["perplexity"], "alpha": ev["agreement"]["alpha"],
                      "spec_tokens_per_step": ev["speculative"]["tokens_per_step"],
                      "target_s": ev["models"]["target"]["cpu_speed"]["median_s"],
                      "draft_s": ev["models"]["draft"]["cpu_speed"]["median_s"]}))


if __name__ == "__main__":
    main()
