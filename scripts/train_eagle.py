"""Train the embedded target's EAGLE-1 head on the target's own features, on the CPU, and measure its acceptance.

Why: lab 08 compares drafters. A draft model relearns the language from tokens; an EAGLE head (one decoder
layer, `lablib.models.eagle`) reads the target's last hidden state and extrapolates it one position, so it
should agree with the target more often at the same size. vLLM 0.26 loads it with `{"method": "eagle"}`.

Objective (EAGLE-1, Li et al. 2024): on windows of the training corpus the frozen target gives its features
h_0..h_T (after the final norm, what vLLM hands its drafter). Row p of the head reads [e(x_{p+1}), h_p + noise]
and predicts f_{p+1}; the loss is smooth-L1(f_{p+1}, h_{p+1}) (regression on the feature) plus w_cls times the
cross-entropy from the target's next-token distribution softmax(lm_head(h_{p+1})) to the head's
softmax(lm_head(f_{p+1})). The uniform noise on the input features (EAGLE's augmentation, a fraction of their
RMS) teaches the head to draft on from its own, imperfect features. The head is trained teacher-forced; the
drafting it is used for feeds it its own features after the first draft, which is what the held-out loop
measures.

Data: the training split of the Python 3.12 standard library that `scripts/build_models.py` made the target
from: its own `collect_corpus` / `split_of` / `encode_files` / `batches`, with the target's tokenizer. Model
selection on the validation split (teacher-forced top-1 agreement with the target's argmax: the quantity that
greedy acceptance depends on); the held-out measurement on the journey workload (cut from the test split): the
greedy loop `lablib.experiments.speculative.greedy_eagle` on the first 64 prompts x 64 new tokens at k = 4,
counted with vLLM's definitions, beside the embedded draft model's loop on the same prompts.

Reproducible: seeded (initialisation, windows, noise), float32 on the CPU, a fixed thread count; the corpus
sha256, the Python it came from, every hyper-parameter, the loss curve and the versions go to training.json.
The defaults (1,600 steps of 4 x 512 tokens, about 1.6 passes over the training split; learning rate and fc's
initialisation picked on 150-step pilots by validation agreement) take about 20-25 minutes on ONE CPU thread;
on a shared 2-core machine a second thread made each step 3-6x slower, not faster (OpenMP threads spin against
the other jobs). `--quick` is a smoke run of every stage in seconds.

    python scripts/train_eagle.py --stdlib /usr/lib/python3.12          # writes data/models/eagle/
    python scripts/train_eagle.py --quick --out /tmp/eagle               # smoke run
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lablib.experiments.speculative import acceptance as speculative_acceptance, loops
from lablib.hardware.device import device_facts
from lablib.models import eagle, load_hf_model, load_tokenizer, resolve_model
from lablib.workloads import load_workload


def build_models():
    """scripts/build_models.py as a module: its corpus functions made the target's data; they are reused here."""
    spec_ = importlib.util.spec_from_file_location("build_models", ROOT / "scripts" / "build_models.py")
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    return mod


def python_of(stdlib: Path) -> str | None:
    """The version of the Python whose standard library this is (its interpreter beside it), if one is there."""
    for exe in (stdlib.parents[1] / "bin" / stdlib.name, Path("/usr/bin") / stdlib.name):
        try:
            out = subprocess.run([str(exe), "-c", "import platform; print(platform.python_version())"],
                                 check=False, capture_output=True, text=True, timeout=30)
            if out.returncode == 0:
                return out.stdout.strip()
        except OSError:
            continue
    return None


def corpus(bm, stdlib: Path, tok, target_dir: Path, quick: bool) -> tuple[dict, dict]:
    """Training and validation streams, and what they are (compared with the corpus the target was trained on)."""
    files = bm.collect_corpus(stdlib)
    parts: dict[str, list] = {"train": [], "validation": [], "test": []}
    for rel, text in files:
        parts[bm.split_of(rel)].append((rel, text))
    if quick:
        parts = {k: v[:4] for k, v in parts.items()}
    streams = {k: bm.encode_files(tok, [t for _, t in parts[k]]) for k in ("train", "validation")}
    theirs = json.loads((target_dir / "training.json").read_text()).get("corpus", {})
    info = {"stdlib": str(stdlib), "python": python_of(stdlib), "sha256": bm.corpus_sha256(files),
            "files": {k: len(v) for k, v in parts.items()}, "bytes": {k: sum(len(t) for _, t in v)
                                                                    for k, v in parts.items()},
            "tokens": {k: len(v) for k, v in streams.items()}, "split_rule": theirs.get("split_rule"),
            "target_corpus": {k: theirs.get(k) for k in ("python", "sha256", "files", "bytes")},
            "same_corpus_as_target": bm.corpus_sha256(files) == theirs.get("sha256")}
    return streams, info


def step_loss(target, head, window: torch.Tensor, noise: float, w_cls: float, gen: torch.Generator | None):
    """EAGLE-1's loss on windows of T+1 tokens: feature regression + w_cls x cross-entropy to the target."""
    with torch.no_grad():
        h = target.model(window).last_hidden_state  # (B, T+1, H): h_0..h_T
        want = h[:, 1:]
        p = F.softmax(target.lm_head(want), -1)
        agree_to = p.argmax(-1)
        inp = h[:, :-1]
        if noise and gen is not None:
            rms = inp.pow(2).mean().sqrt()
            inp = inp + (torch.rand(inp.shape, generator=gen) * 2 - 1) * noise * rms
        e = target.model.embed_tokens(window[:, 1:])
    f = head(e, inp)
    logits = target.lm_head(f)
    reg = F.smooth_l1_loss(f, want)
    cls = -(p * F.log_softmax(logits, -1)).sum(-1).mean()
    agree = (logits.argmax(-1) == agree_to).float().mean()
    return reg + w_cls * cls, reg, cls, agree


@torch.no_grad()
def validate_head(target, head, stream: torch.Tensor, seq: int, windows: int, w_cls: float) -> dict:
    """Loss and teacher-forced top-1 agreement on consecutive validation windows (no noise)."""
    head.eval()
    n = min(windows, (len(stream) - 1) // seq)
    x = stream[: n * seq + 1].long()
    got = []
    for i in range(0, n, 8):
        rows = [x[j * seq: j * seq + seq + 1] for j in range(i, min(n, i + 8))]
        got.append([float(v) for v in step_loss(target, head, torch.stack(rows), 0.0, w_cls, None)])
    head.train()
    mean = [sum(g[i] for g in got) / len(got) for i in range(4)]
    return {"val_loss": round(mean[0], 4), "val_reg": round(mean[1], 4), "val_cls": round(mean[2], 4),
            "val_agreement": round(mean[3], 4)}


def train(bm, target, head, streams: dict, args) -> dict:
    """AdamW, warm-up then cosine to a tenth; keeps the weights with the best validation agreement."""
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    noise_gen = torch.Generator().manual_seed(args.seed + 1)
    data = bm.batches(streams["train"], args.batch, args.seq, gen)
    curve, best, best_state, t0, acc = [], -1.0, None, time.time(), []
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = next(data)
        loss, reg, cls, agree = step_loss(target, head, torch.cat([x, y[:, -1:]], 1), args.noise, args.w_cls,
                                          noise_gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        acc.append([loss.item(), reg.item(), cls.item(), agree.item()])
        if step % args.eval_every == 0 or step == args.steps:
            val = validate_head(target, head, streams["validation"], args.seq, args.val_windows, args.w_cls)
            mean = [sum(a[i] for a in acc) / len(acc) for i in range(4)]
            curve.append({"step": step, "train_loss": round(mean[0], 4), "train_reg": round(mean[1], 4),
                          "train_cls": round(mean[2], 4), "train_agreement": round(mean[3], 4), **val,
                          "lr": lr, "elapsed_s": round(time.time() - t0, 1)})
            acc = []
            print(f"step {step}: train {mean[0]:.3f} (agree {mean[3]:.3f}), val {val['val_loss']:.3f} "
                  f"(agree {val['val_agreement']:.3f}), {time.time() - t0:.0f}s", flush=True)
            if val["val_agreement"] > best:
                best, best_state = val["val_agreement"], {k: v.detach().clone() for k, v in head.state_dict().items()}
    head.load_state_dict(best_state)
    kept = max(curve, key=lambda c: c["val_agreement"])
    return {"curve": curve, "best_step": kept["step"], "best_val_agreement": kept["val_agreement"],
            "best_val_loss": kept["val_loss"], "train_seconds": round(time.time() - t0, 1)}


def held_out(target, draft, head, tok, args) -> dict:
    """The greedy loop with the head and with the embedded draft on the same journey prompts: vLLM's counters."""
    prompts = load_workload("journey", limit=args.eval_prompts).prompt_ids(tok)
    t0 = time.time()
    runs = {"eagle": [loops.greedy_eagle(target, head, p, args.eval_tokens, args.k) for p in prompts],
            "draft_model": [loops.greedy_speculative(target, draft, p, args.eval_tokens, args.k) for p in prompts]}
    greedy = [loops.greedy(target, p, args.eval_tokens) for p in prompts]
    out = {"workload": "journey", "prompts": len(prompts), "max_new_tokens": args.eval_tokens, "k": args.k,
           "seconds": round(time.time() - t0, 1)}
    for name, rs in runs.items():
        rep = speculative_acceptance.acceptance_report(rs)
        out[name] = {**rep.row(), "identical_to_greedy": sum(r.tokens == g for r, g in zip(rs, greedy)),
                     "counters_consistent": speculative_acceptance.counters_consistent(rep.counters, args.k)[0]}
        print(f"{name}: mean acceptance length {rep.measured_length:.3f} +/- {rep.length_stderr:.3f}, per position "
              f"{[round(x, 3) for x in rep.measured_per_position]}, identical to greedy "
              f"{out[name]['identical_to_greedy']}/{len(prompts)}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=ROOT / "data" / "models" / "target")
    ap.add_argument("--draft", type=Path, default=ROOT / "data" / "models" / "draft", 
                    help="the draft model compared on the same prompts")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "models" / "eagle")
    ap.add_argument("--stdlib", type=Path, default=Path("/usr/lib/python3.12"),
                    help="the Python 3.12 standard library folder the target was trained on")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--w-cls", type=float, default=1.0, help="weight of the cross-entropy beside the regression")
    ap.add_argument("--noise", type=float, default=0.1, help="uniform input-feature noise, fraction of their RMS")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--val-windows", type=int, default=32)
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--eval-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads: 1 on a shared 2-core machine (OpenMP threads spin against other jobs)")
    ap.add_argument("--quick", action="store_true", help="a smoke run of every stage")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.batch, args.seq, args.eval_every, args.warmup = 6, 2, 64, 3, 2
        args.val_windows, args.eval_prompts, args.eval_tokens = 4, 2, 8
    if not args.stdlib.is_dir():
        sys.exit(f"train_eagle: no standard library at {args.stdlib}; pass --stdlib with a Python 3.12 stdlib folder "
                 "(the target was trained on Python 3.12.3's; the split is by path, so another 3.12 keeps it)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.time()
    bm = build_models()
    target_spec = resolve_model(str(args.target))
    target, tok = load_hf_model(target_spec), load_tokenizer(target_spec)
    target.requires_grad_(False)
    streams, corpus_info = corpus(bm, args.stdlib, tok, args.target, args.quick)
    print(json.dumps(corpus_info, indent=1), flush=True)
    head = eagle.new_head(target, args.seed)
    log = train(bm, target, head, streams, args)
    head.eval()
    folder = eagle.save_head(head, args.out)
    head = eagle.load_head(folder, target)  # measure what was written (bf16 weights, read back as float32)
    draft = load_hf_model(resolve_model(str(args.draft)))
    acceptance = held_out(target, draft, head, tok, args)
    n_params = sum(p.numel() for p in head.parameters())
    hyper = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
             if k not in ("out", "target", "draft", "stdlib")}
    facts = device_facts()
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": __import__("transformers").__version__, "tokenizers": __import__("tokenizers").__version__,
           "safetensors": __import__("safetensors").__version__, "cpu": facts.get("cpu") or platform.processor(),
           "threads": args.threads, "platform": platform.platform(), "date": time.strftime("%Y-%m-%d")}
    curve = log["curve"]
    summary = {"first": curve[0], "best": next(c for c in curve if c["step"] == log["best_step"]), "last": curve[-1]}
    (folder / "training.json").write_text(json.dumps(
        {"model": "eagle", "method": "EAGLE-1 (fc + one decoder layer; vLLM 0.26 method 'eagle')",
         "target": str(args.target.relative_to(ROOT) if args.target.is_relative_to(ROOT) else args.target),
         "parameters": n_params, "weights_bytes": (folder / eagle.WEIGHTS).stat().st_size,
         "objective": f"smooth-L1 on the next feature + {args.w_cls} x cross-entropy to the target's next-token "
                      f"distribution; input features + uniform noise of {args.noise} x their RMS",
         "seed": args.seed, "steps": args.steps, "hyper": hyper, "corpus": corpus_info, "environment": env,
         "loss_summary": summary, **log, "held_out": acceptance,
         "total_seconds": round(time.time() - t_start, 1),
         "reproduce": "python scripts/train_eagle.py --stdlib " + str(args.stdlib)}, indent=1) + "\n")
    print(f"saved {folder}: {n_params:,} parameters, best val agreement {log['best_val_agreement']:.3f} at step "
          f"{log['best_step']}, {time.time() - t_start:.0f}s in all", flush=True)


if __name__ == "__main__":
    main()
