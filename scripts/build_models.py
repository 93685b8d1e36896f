"""Build the lab's embedded models: a tokenizer, a target and a draft, trained on Python's own source.

Why these models exist: the lab must run where no model hub can be reached and still
teach with real numbers. Speculative decoding needs a draft that often agrees with its
target, quantization needs a model whose quality can measurably drop, and prefix caching
needs prompts that share long headers. Python code gives all three, and the corpus, the
standard library's own source, is on every machine that has Python.

Reproducibility: the corpus is the `.py` files of one stdlib folder (tests, encodings
tables and generated data excluded), sorted by path; its sha256 and the Python version it
came from are written beside the weights with the seed, every hyper-parameter and the loss
curves. Files are split by a hash of their relative path, so the split is the same on any
machine: 1 in 20 is validation (early stopping), 1 in 20 is test (never seen in training
or model selection; exported to `data/corpus/test.jsonl.gz` for the model card, the
quantization sets and the workloads).

The target is a small Llama (GQA, RoPE, tied embeddings); the draft is 5x smaller and is
trained by distillation from the target (cross-entropy on the data plus KL to the target's
next-token distribution), which is how real drafts are made to agree with their target.

Run on a GPU (a few minutes on one H200):

    python scripts/build_models.py --out data            # full build
    python scripts/build_models.py --out /tmp/d --quick  # a CPU smoke run of every stage
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

EXCLUDE_DIRS = {"test", "tests", "idle_test", "encodings", "pydoc_data", "site-packages",
                "dist-packages", "__pycache__", "lib2to3", "turtledemo", "ensurepip"}
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")

TARGET = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=5, num_attention_heads=4,
              num_key_value_heads=2)
DRAFT = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def split_of(relpath: str) -> str:
    """'validation', 'test' or 'train', from a hash of the path: the same on every machine."""
    bucket = int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16) % 20
    return {0: "validation", 1: "test"}.get(bucket, "train")


def collect_corpus(stdlib: Path) -> list[tuple[str, str]]:
    """(relative path, source) for every stdlib .py file outside the excluded folders, sorted."""
    files = []
    for p in sorted(stdlib.rglob("*.py")):
        rel = p.relative_to(stdlib).as_posix()
        if set(rel.split("/")[:-1]) & EXCLUDE_DIRS or p.name.startswith("test_"):
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append((rel, text))
    if not files:
        sys.exit(f"build_models: no .py files under {stdlib}; pass --stdlib with a Python stdlib folder")
    return files


def corpus_sha256(files: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for rel, text in files:
        h.update(rel.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style): every byte sequence encodes, indentation merges into tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>", padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    return fast


def encode_files(tok, texts: list[str]) -> torch.Tensor:
    """One long stream: <bos> file <eos> <bos> file <eos> ..."""
    ids = []
    for enc in tok(texts, add_special_tokens=True)["input_ids"]:
        ids.extend(enc + [tok.eos_token_id])
    return torch.tensor(ids, dtype=torch.int32)


def make_model(shape: dict, tok, seed: int, max_pos: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), max_position_embeddings=max_pos, rope_theta=10000.0,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, attn_implementation="sdpa", **shape)
    return LlamaForCausalLM(cfg)


def batches(stream: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    while True:
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen)
        x = torch.stack([stream[s:s + seq + 1] for s in starts.tolist()]).long()
        yield x[:, :-1], x[:, 1:]


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, seq: int, device, max_windows: int = 64) -> float:
    """Mean next-token cross-entropy (nats) over consecutive windows of a held-out stream."""
    model.eval()
    n = min(max_windows, (len(stream) - 1) // seq)
    x = stream[: n * seq + 1].long()
    inp, tgt = x[:-1].view(n, seq).to(device), x[1:].view(n, seq).to(device)
    total = 0.0
    for i in range(0, n, 16):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=inp[i:i + 16]).logits.float()
        total += F.cross_entropy(logits.flatten(0, 1), tgt[i:i + 16].flatten(), reduction="sum").item()
    model.train()
    return total / (n * seq)


def train(model, train_ids, val_ids, args, device, teacher=None, label="target") -> dict:
    """AdamW with warm-up and cosine decay; keeps the weights with the best validation loss."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    data = batches(train_ids, args.batch, args.seq, gen)
    curve, best, best_state, t0 = [], float("inf"), None, time.time()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = (t.to(device, non_blocking=True) for t in next(data))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=x).logits.float()
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            if teacher is not None:
                with torch.no_grad():
                    t_logp = F.log_softmax(teacher(input_ids=x).logits.float(), -1)
                kl = F.kl_div(F.log_softmax(logits, -1), t_logp, log_target=True, reduction="batchmean") / x.shape[1]
                loss = 0.5 * loss + 0.5 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            val = evaluate(model, val_ids, args.seq, device)
            curve.append({"step": step, "train_loss": round(loss.item(), 4), "val_loss": round(val, 4),
                          "lr": lr, "elapsed_s": round(time.time() - t0, 1)})
            print(f"[{label}] step {step} train {loss.item():.3f} val {val:.3f} ({time.time() - t0:.0f}s)", flush=True)
            if val < best:
                best, best_state = val, {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    return {"curve": curve, "best_val_loss": best, "train_seconds": round(time.time() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="data folder to write models/ and corpus/ into")
    ap.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--draft-steps", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=150)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--quick", action="store_true", help="tiny run of every stage (CPU smoke test)")
    args = ap.parse_args()
    if args.quick:
        args.steps = args.draft_steps = 4
        args.batch, args.seq, args.eval_every, args.warmup, args.vocab = 2, 64, 2, 2, 512
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)

    files = collect_corpus(args.stdlib)
    if args.quick:
        files = files[:60]
    parts = {"train": [], "validation": [], "test": []}
    for rel, text in files:
        parts[split_of(rel)].append((rel, text))
    corpus = {"source": "Python standard library .py files (tests, encodings, pydoc_data, lib2to3, "
                        "turtledemo, ensurepip excluded)", "stdlib": str(args.stdlib),
              "python": platform.python_version(), "sha256": corpus_sha256(files),
              "files": {k: len(v) for k, v in parts.items()},
              "bytes": {k: sum(len(t) for _, t in v) for k, v in parts.items()},
              "split_rule": "sha256(relative path)[:8] as int % 20: 0 validation, 1 test, else train"}
    print(json.dumps(corpus, indent=1), flush=True)

    t0 = time.time()
    tok = train_tokenizer([t for _, t in parts["train"]], args.vocab)
    streams = {k: encode_files(tok, [t for _, t in v]) for k, v in parts.items()}
    corpus["tokens"] = {k: len(v) for k, v in streams.items()}
    print(f"tokenizer {len(tok)} tokens, corpus encoded in {time.time() - t0:.0f}s: {corpus['tokens']}", flush=True)

    out = args.out
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "corpus" / "test.jsonl.gz", "wt", encoding="utf-8") as f:
        for rel, text in parts["test"]:
            f.write(json.dumps({"path": rel, "text": text}) + "\n")

    hyper = {k: v for k, v in vars(args).items() if k not in ("out", "stdlib")}
    env = {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
           "tokenizers": __import__("tokenizers").__version__, "device": torch.cuda.get_device_name() if
           device.type == "cuda" else platform.processor() or "cpu", "date": time.strftime("%Y-%m-%d")}
    target = make_model(TARGET, tok, args.seed, args.max_pos)
    t_log = train(target, streams["train"], streams["validation"], args, device, label="target")
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    draft = make_model(DRAFT, tok, args.seed + 1, args.max_pos)
    d_args = argparse.Namespace(**{**vars(args), "steps": args.draft_steps})
    d_log = train(draft, streams["train"], streams["validation"], d_args, device, teacher=target, label="draft")

    for name, model, log, how in (("target", target, t_log, "next-token cross-entropy"),
                                  ("draft", draft, d_log, "0.5 cross-entropy + 0.5 KL to the target (distillation)")):
        folder = out / "models" / name
        model.to(torch.bfloat16).save_pretrained(folder)
        tok.save_pretrained(folder)
        n_params = sum(p.numel() for p in model.parameters())
        (folder / "training.json").write_text(json.dumps(
            {"model": name, "parameters": n_params, "objective": how, "seed": args.seed, "hyper": hyper,
             "corpus": corpus, "environment": env, **log}, indent=1))
        print(f"saved {name}: {n_params:,} parameters, best val loss {log['best_val_loss']:.3f}", flush=True)


if __name__ == "__main__":
    main()
