"""The quantizer: a model folder in, a compressed-tensors folder out, made by llm-compressor 0.14.

Quantization stores each weight in fewer bits plus a scale shared by a group of weights:
int4 with one scale per 64 or 128 weights (W4A16: the GEMM dequantizes on the fly, activations stay
16-bit), or 8-bit with one scale per output channel (FP8, INT8), where the activations are quantized
too, per token, as they arrive (W8A8: the GEMM itself runs in 8 bits). Decode reads every weight once
per token, so fewer bytes per weight is more tokens per second where decode is bandwidth-bound.

Four schemes (`SCHEMES`), each a recipe of llm-compressor (the vLLM project's own tool; AutoAWQ is
deprecated and AutoGPTQ archived, and neither runs with transformers 5):

- `gptq-w4a16`: GPTQ (Frantar et al. 2022) rounds one weight column at a time and corrects the
  columns not yet rounded for the error, using the Hessian of the layer's inputs on calibration data.
  Symmetric int4, one scale per group.
- `awq-w4a16`: AWQ (Lin et al. 2023) scales the input channels that see large activations up before
  rounding (and the previous op down), so the salient weights lose less; then round-to-nearest,
  asymmetric int4 (a scale and a zero point per group).
- `fp8-dynamic`: FP8 E4M3 weights, one scale per output channel, read from the weights alone; activations
  quantized per token at run time. No calibration data.
- `w8a8-int8`: SmoothQuant (Xiao et al. 2022) moves activation outliers into the weights, then GPTQ
  rounds the weights to int8 per channel; activations int8 per token at run time.

Group size (W4A16 only; the 8-bit schemes are per channel). A group must tile every quantized Linear's
input width. 128 is the standard (llm-compressor's `W4A16` preset, most published GPTQ/AWQ checkpoints;
a bf16 scale per 128 weights adds 0.125 bit per weight), so it is the default wherever it divides every
width. The embedded target's `down_proj` takes the MLP's intermediate width, 704 = 5.5 x 128 = 11 x 64:
128 cannot tile it (llm-compressor refuses at initialize, vLLM's loader fails), so the default there is
64, the largest size that tiles all its widths (256 and 704) and one both of vLLM's 4-bit kernels take
(Machete: 64 or 128; Marlin: 32, 64 or 128). It costs twice the scales (4.25 instead of 4.125 bits per
weight) and rounds slightly more accurately. `default_group_size` picks 128, else 64, else 32.

How it runs. llm-compressor 0.14 pins compressed-tensors 0.19 and vLLM 0.26 pins 0.17, so on a GPU
machine the quantizer lives in its own environment. `quantize` therefore does every check here (pure
standard library: config.json and the safetensors headers give every Linear's width with no torch), then
starts `python -m lablib.models.quantize_worker` in a process of its own (`quant_environment` says which
interpreter: this one where llm-compressor imports, else the quantization environment) with a job file, and
waits. The worker writes into a sibling folder that is renamed into
place only when everything is written, so a failed run leaves no half-written output behind. The worker runs in
a session of its own, whose whole process group `quantize` ends on any exception (a timeout, Ctrl-C); for the
duration of the call a SIGTERM (a job scheduler's, `timeout`'s) becomes a KeyboardInterrupt in the caller, so the
same cleanup runs: no worker keeps its RAM and GPU memory, no `.partial-*` folder stays.

The output folder holds what vLLM and transformers load with no flags (`config.json` with its
`quantization_config`, `model.safetensors`, the tokenizer files), llm-compressor's own readable recipe
(`recipe.yaml`), its log (`quantize.log`: GPTQ's per-layer errors) and `quantization.json`: the scheme,
group size, calibration set and samples, seconds, weight bytes, versions, machine.

    python -m lablib.models.quantize data/models/target /tmp/q/gptq --scheme gptq-w4a16
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import validate
from ..workloads import Workload, load_workload
from .spec import check_model_dir, embedded_path

OWNER = "quantize"
ROOT = Path(__file__).resolve().parents[2]  # the project root: the worker runs as `-m lablib.models.quantize_worker`
KERNEL_GROUPS = (128, 64, 32)  # the group sizes vLLM's 4-bit kernels take (Machete 64/128, Marlin 32/64/128)
INSTALL = "pip install 'lablib[quant]' (llmcompressor 0.14.0.1)"


@dataclass(frozen=True)
class Scheme:
    """One quantization scheme: what is stored, how it is found, what it needs."""

    name: str  # the key in SCHEMES, e.g. "gptq-w4a16"
    method: str  # the llm-compressor recipe the worker builds: "gptq", "awq", "fp8", "smoothquant+gptq"
    weight_bits: int  # bits per stored weight
    weight_type: str  # "int" or "float" (FP8 E4M3)
    symmetric: bool  # False: a zero point per group as well as a scale
    grouped: bool  # True: one scale per group of `group_size` input weights; False: one per output channel
    activations: str  # "16-bit" (weight-only) or what each token's activations become at run time
    calibrated: bool  # needs calibration data (the Hessian, the activation statistics)
    summary: str  # one sentence for tables

    def row(self) -> dict[str, Any]:
        return asdict(self)


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("gptq-w4a16", "gptq", 4, "int", True, True, "16-bit", True,
           "GPTQ: int4 symmetric per group, error-corrected with calibration Hessians"),
    Scheme("awq-w4a16", "awq", 4, "int", False, True, "16-bit", True,
           "AWQ: salient input channels scaled up, then int4 asymmetric per group"),
    Scheme("fp8-dynamic", "fp8", 8, "float", True, False, "FP8 E4M3 per token, at run time", False,
           "FP8 E4M3 weights per channel, FP8 activations per token; no calibration"),
    Scheme("w8a8-int8", "smoothquant+gptq", 8, "int", True, False, "int8 per token, at run time", True,
           "SmoothQuant then GPTQ: int8 weights per channel, int8 activations per token"),
)}


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def _ignored(module: str, ignore: tuple[str, ...]) -> bool:
    """llm-compressor's matching: a name, a name's last parts, or `re:<regex>` on the module's full name."""
    for pattern in ignore:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return True
        elif module == pattern or module.endswith("." + pattern):
            return True
    return False


def linear_widths(model_dir: str | Path, ignore: tuple[str, ...] = ("lm_head",)) -> dict[str, int]:
    """Input width of every Linear the quantizer targets (`ignore` left out), from the safetensors headers.

    A 2-D `*.weight` is a Linear's [out, in] unless it is an embedding table; a tied lm_head has no
    tensor of its own and takes hidden_size.
    """
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    widths: dict[str, int] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        for name, dims in _safetensors_shapes(f).items():
            if name.endswith(".weight") and len(dims) == 2 and "embed" not in name and ".wte" not in name:
                widths[name[:-len(".weight")]] = dims[1]
    if not widths:  # *.bin weights: a Llama-style config says it
        h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        hd = cfg.get("head_dim") or h // heads
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            widths.update({p + "self_attn.q_proj": h, p + "self_attn.k_proj": h, p + "self_attn.v_proj": h,
                           p + "self_attn.o_proj": heads * hd, p + "mlp.gate_proj": h, p + "mlp.up_proj": h,
                           p + "mlp.down_proj": cfg["intermediate_size"]})
    if "lm_head" not in widths and cfg.get("hidden_size"):
        widths["lm_head"] = cfg["hidden_size"]
    return {m: w for m, w in widths.items() if not _ignored(m, tuple(ignore))}


def default_group_size(widths: dict[str, int]) -> int | None:
    """128 if it tiles every width, else 64, else 32; None when none of vLLM's kernel sizes does."""
    return next((g for g in KERNEL_GROUPS if all(w % g == 0 for w in widths.values())), None)


def _check_group_size(scheme: Scheme, group_size: int | None, widths: dict[str, int]) -> int | None:
    if not scheme.grouped:
        if group_size is not None:
            raise validate.refuse(OWNER, "group_size", group_size, f"None for {scheme.name} (one scale per output "
                                  "channel, no groups)", "leave group_size out, or pick a W4A16 scheme.")
        return None
    gcd = math.gcd(*widths.values())
    fits = [g for g in KERNEL_GROUPS[::-1] if gcd % g == 0]
    if group_size is None:
        group_size = default_group_size(widths)
        if group_size is None:
            raise validate.refuse(OWNER, "group_size", None, f"a size that divides every Linear's input width "
                                  f"(their common divisor is {gcd}; none of {list(KERNEL_GROUPS)} does)",
                                  f"pass group_size= a divisor of {gcd}, or quantize per channel (fp8-dynamic).")
        return group_size
    validate.integer(OWNER, "group_size", group_size, f"pass one of {fits or list(KERNEL_GROUPS)}.", 1)
    bad = next(((m, w) for m, w in widths.items() if w % group_size), None)
    if bad:
        module, width = bad
        raise validate.refuse(OWNER, "group_size", group_size,
                              f"a size that divides every targeted Linear's input width; {module} takes {width} "
                              f"= {width / group_size:g} x {group_size}. Sizes that divide all of them among vLLM's "
                              f"kernel sizes: {fits or 'none'}",
                              f"pass group_size={fits[-1]}." if fits else f"pass a divisor of {gcd}.")
    return group_size


def _check_dirs(model_dir: Path, out_dir: Path) -> dict[str, Any]:
    try:
        cfg = check_model_dir(model_dir)
    except ValueError as e:
        why, _, fix = str(e).partition(" Fix: ")
        raise validate.refuse(OWNER, "model_dir", str(model_dir), f"a model folder with config.json and weights "
                              f"({why})", fix or "point at the folder save_pretrained() wrote.") from None
    if cfg.get("quantization_config"):
        method = cfg["quantization_config"].get("quant_method", "unknown")
        raise validate.refuse(OWNER, "model_dir", str(model_dir), f"an unquantized model folder (this one is "
                              f"already quantized: config.json has quantization_config, quant_method={method!r})",
                              "quantize the bf16/fp16 folder it was made from: rounding rounded weights compounds "
                              "the error, and the packed weights are no dense checkpoint.")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise validate.refuse(OWNER, "out_dir", str(out_dir), "a folder that does not exist yet, or an empty one",
                              "pick a new folder, or delete this one if its contents are no longer needed.")
    return cfg


def _calibration(scheme: Scheme, calibration: str | Workload | None, num_samples: int) -> Workload | None:
    if not scheme.calibrated:
        return None
    if calibration is None:
        raise validate.refuse(OWNER, "calibration", None, f"a workload name or Workload ({scheme.name} needs "
                              "calibration data)", "pass calibration='calibration' (data/workloads/calibration.jsonl).")
    if isinstance(calibration, str):
        if calibration == "evaluation":
            raise validate.refuse(OWNER, "calibration", calibration, "any set but 'evaluation' (quality is scored on "
                                  "it: calibrating on it flatters the result)", "pass calibration='calibration'.")
        try:
            calibration = load_workload(calibration)
        except (ValueError, FileNotFoundError) as e:
            raise validate.refuse(OWNER, "calibration", calibration, "a workload in data/workloads/manifest.json "
                                  f"whose file is present and intact ({str(e).split(' Fix:')[0]})",
                                  "restore data/workloads (git checkout data/workloads) or rebuild it with "
                                  "`python scripts/build_workloads.py`; the lab's set is 'calibration'.") from None
    validate.integer(OWNER, "num_samples", num_samples, f"pass 1..{len(calibration)} (the set "
                     f"{calibration.label} holds {len(calibration)}).", 1, len(calibration))
    return calibration.head(num_samples)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
# any one: transformers can build the tokenizer from it


def _tokenizer_dir(model_dir: Path, cfg: dict[str, Any]) -> Path:
    """Where the worker's tokenizer comes from: the model's own folder, or, for a synthetic checkpoint (no tokenizer:
    random weights read ids, not text), the embedded target's, whose ids are valid in any larger vocabulary (as
    `prompt_tokenizer` feeds a synthetic model). A folder with neither is refused: transformers would build an
    empty tokenizer from the config alone, the calibration texts would become empty id lists, and llm-compressor
    would fail inside the worker with a float 'indices' tensor."""
    if any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        return model_dir
    if (model_dir / "synthetic.json").is_file():
        embedded = embedded_path("target")
        vocab = json.loads((embedded / "config.json").read_text())["vocab_size"]
        if vocab > int(cfg.get("vocab_size") or 0):
            raise validate.refuse(OWNER, "model_dir", str(model_dir), f"a synthetic checkpoint whose vocabulary "
                                  f"holds the embedded tokenizer's {vocab} ids (this one's vocab_size is "
                                  f"{cfg.get('vocab_size')})", "copy a tokenizer of this vocabulary into the folder "
                                  f"(one of {', '.join(TOKENIZER_FILES)}).")
        return embedded.resolve()
    raise validate.refuse(OWNER, "model_dir", str(model_dir), f"a model folder with its tokenizer (one of "
                          f"{', '.join(TOKENIZER_FILES)}; the quantizer tokenizes its calibration texts and saves the "
                          "tokenizer beside the quantized weights)", "copy the tokenizer files the model came with "
                          "into the folder (AutoTokenizer.from_pretrained(hub_id).save_pretrained(folder)).")


QUANT_PYTHON, QUANT_SITE = "LABLIB_QUANT_PYTHON", "LABLIB_QUANT_SITE"  # where the quantization environment is
QUANT_VENV = ROOT / ".venv-quant"  # what `scripts/setup.sh quant` makes beside a vLLM .venv


def _has_llmcompressor(exe: str, pythonpath: str | None) -> bool:
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('llmcompressor') else 3)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | ({"PYTHONPATH": pythonpath} if pythonpath else {})
    try:
        return subprocess.run([exe, "-c", probe], capture_output=True, env=env).returncode == 0
    except OSError:  # no such interpreter (a typo in $LABLIB_QUANT_PYTHON): refused with the rest, under "Tried"
        return False


def quant_environment(python: str | None = None) -> tuple[str, str]:
    """The interpreter that runs the quantization worker, and the PYTHONPATH it gets (the project root first).

    llm-compressor and vLLM cannot share an environment, so a GPU machine has two. Asked in this order:
    `python=` (another interpreter, its own packages); this interpreter when llm-compressor imports here (the CPU
    lab's .venv, or a process started in the quantization environment; its PYTHONPATH is kept); $LABLIB_QUANT_PYTHON
    (another interpreter); $LABLIB_QUANT_SITE (a folder of packages for this interpreter, the lent GPU machine's
    /tmp/site-q, used instead of this process's PYTHONPATH, which holds vLLM's); `.venv-quant/bin/python`
    (`scripts/setup.sh quant`). A worker in another environment never inherits this one's PYTHONPATH: vLLM's
    compressed-tensors 0.17 there would shadow llm-compressor's 0.19."""
    root = str(ROOT)
    if python is not None:
        if not (Path(python).is_file() or shutil.which(python)):
            raise validate.refuse(OWNER, "python", python, "a Python interpreter", "pass the path of the quantization "
                                  "environment's python, e.g. .venv-quant/bin/python.")
        candidates = [("python=", python, root)]
    elif importlib.util.find_spec("llmcompressor") is not None:
        return sys.executable, os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    else:
        candidates = [(f"${QUANT_PYTHON}", os.environ.get(QUANT_PYTHON), root),
                      (f"${QUANT_SITE}", sys.executable if os.environ.get(QUANT_SITE) else None,
                       os.pathsep.join([root, os.environ.get(QUANT_SITE, "")])),
                      (str(QUANT_VENV), str(QUANT_VENV / "bin" / "python") if (QUANT_VENV / "bin" / "python").is_file()
                       else None, root)]
    tried = []
    for where, exe, path in candidates:
        if exe is None:
            continue
        if _has_llmcompressor(exe, path):
            return exe, path
        tried.append(f"{where} ({exe})")
    raise validate.refuse(OWNER, "python", python or sys.executable, "an interpreter where llm-compressor 0.14 imports",
                          f"{INSTALL} here; or make the quantization environment beside vLLM's with "
                          f"`scripts/setup.sh quant` (.venv-quant); or point ${QUANT_PYTHON} at its python, or "
                          f"${QUANT_SITE} at a folder holding it (the lent GPU machine: /tmp/site-q, "
                          "../shared/gpu/README.md)" + (f". Tried without it: {', '.join(tried)}" if tried else "")
                          + ".")


def plan(model_dir: str | Path, out_dir: str | Path, scheme: str, *, group_size: int | None = None,
         calibration: str | Workload | None = "calibration", num_samples: int = 64,
         ignore: tuple[str, ...] = ("lm_head",)) -> dict[str, Any]:
    """Every check `quantize` makes before any work, and the job it would send the worker (no subprocess)."""
    validate.choice(OWNER, "scheme", scheme, list(SCHEMES), f"pick one of {list(SCHEMES)}.")
    spec = SCHEMES[scheme]
    model_dir, out_dir = Path(model_dir).resolve(), Path(out_dir).resolve()
    ignore = tuple(ignore)
    if not all(isinstance(p, str) and p for p in ignore):
        raise validate.refuse(OWNER, "ignore", ignore, "a tuple of module names or 're:' patterns",
                              "pass e.g. ignore=('lm_head',).")
    cfg = _check_dirs(model_dir, out_dir)
    widths = linear_widths(model_dir, ignore)
    if not widths:
        raise validate.refuse(OWNER, "ignore", ignore, "patterns that leave some Linear to quantize",
                              "ignore fewer modules, e.g. ignore=('lm_head',).")
    group_size = _check_group_size(spec, group_size, widths)
    cal = _calibration(spec, calibration, num_samples)
    tokenizer_dir = _tokenizer_dir(model_dir, cfg)
    return {"model_dir": str(model_dir), "out_dir": str(out_dir), "scheme": spec.name, "scheme_details": spec.row(),
            "group_size": group_size, "tokenizer_dir": str(tokenizer_dir),
            "ignore": list(ignore), "targets": len(widths), "source_dtype": cfg.get("dtype") or cfg.get("torch_dtype"),
            "calibration": None if cal is None else {"workload": cal.label, "samples": len(cal),
                                                     "tokens": cal.total_prompt_tokens},
            "texts": None if cal is None else [r.prompt for r in cal.requests],
            "max_seq_length": None if cal is None else max(cal.prompt_lengths)}


def quantize(model_dir: str | Path, out_dir: str | Path, scheme: str, *, group_size: int | None = None,
             calibration: str | Workload | None = "calibration", num_samples: int = 64,
             ignore: tuple[str, ...] = ("lm_head",), python: str | None = None, threads: int | None = None,
             timeout_s: float = 3600.0) -> dict[str, Any]:
    """Quantize `model_dir` into `out_dir` with llm-compressor, in a worker process; returns quantization.json.

    scheme: one of SCHEMES. group_size: W4A16 only (default: see the module docstring; 64 on the embedded
    target). calibration: a workload name or Workload (the lab's 'calibration' set, 64 windows of 512
    tokens, disjoint from 'evaluation'), first `num_samples` of it; unused by fp8-dynamic. ignore: modules
    kept in 16 bits (llm-compressor's names or 're:' patterns). python: the interpreter with llm-compressor
    (default: `quant_environment`'s choice). threads: torch threads in the worker (default: torch's own choice).

    Every refusal comes before the worker starts: an unknown scheme, a group size that does not divide a
    targeted width, a missing calibration set, an output folder that is not empty, a folder already
    quantized, an interpreter without llm-compressor.
    """
    job = plan(model_dir, out_dir, scheme, group_size=group_size, calibration=calibration,
               num_samples=num_samples, ignore=ignore)
    validate.optional_integer(OWNER, "threads", threads, "pass e.g. threads=1, or None for torch's default.")
    validate.number(OWNER, "timeout_s", timeout_s, "pass seconds, e.g. 3600.", 0.0, low_open=True)
    exe, pythonpath = quant_environment(python)
    out = Path(job["out_dir"])
    out.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_interrupts():
        return _run_worker(job, exe, pythonpath, threads, timeout_s)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt while the block runs (in the main thread: the only one Python lets set a
    handler; elsewhere nothing changes), so the worker's cleanup runs; the previous handler is put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM) while the quantization worker ran")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _run_worker(job: dict[str, Any], exe: str, pythonpath: str, threads: int | None,
                timeout_s: float) -> dict[str, Any]:
    """Run the worker on `job` in a work folder beside the output, then move its checkpoint into place."""
    out = Path(job["out_dir"])
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    job.update(out_dir=str(work / "model"), threads=threads, result=str(work / "result.json"))
    (work / "job.json").write_text(json.dumps(job))
    log = work / "quantize.log"
    env = {**os.environ, "PYTHONPATH": pythonpath, "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    t0 = time.perf_counter()
    try:
        with open(log, "wb") as logf:
            proc = subprocess.Popen([exe, "-m", "lablib.models.quantize_worker", str(work / "job.json")], cwd=ROOT,
                                    env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout_s)
            except BaseException:  # a timeout or Ctrl-C: end the worker's whole group
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        if rc != 0 or not (work / "result.json").is_file():
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the quantization worker ({exe}) failed with exit status {rc}; its log ends:\n{tail}")
        result = json.loads((work / "result.json").read_text())
        model = work / "model"
        shutil.move(str(log), model / "quantize.log")
        facts = {**{k: v for k, v in job.items() if k not in ("texts", "out_dir", "result", "threads")},
                 **result, "out_dir": str(out), "wall_s": round(time.perf_counter() - t0, 2),
                 "weight_bytes": sum(f.stat().st_size for f in model.glob("*.safetensors"))}
        (model / "quantization.json").write_text(json.dumps(facts, indent=2) + "\n")
        if out.exists():
            out.rmdir()  # empty (checked above)
        model.rename(out)
        return facts
    finally:
        shutil.rmtree(work, ignore_errors=True)


def read_facts(folder: str | Path) -> dict[str, Any] | None:
    """A quantized folder's quantization.json (None if it has none)."""
    path = Path(folder) / "quantization.json"
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: list[str] | None = None) -> None:
    """`python -m lablib.models.quantize MODEL OUT --scheme S`: prints quantization.json's facts."""
    p = argparse.ArgumentParser(prog="python -m lablib.models.quantize", description=__doc__.split("\n")[0])
    p.add_argument("model_dir")
    p.add_argument("out_dir")
    p.add_argument("--scheme", required=True, choices=list(SCHEMES))
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--num-samples", type=int, default=64)
    p.add_argument("--calibration", default="calibration")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    facts = quantize(a.model_dir, a.out_dir, a.scheme, group_size=a.group_size, calibration=a.calibration,
                     num_samples=a.num_samples, threads=a.threads)
    print(json.dumps({k: facts[k] for k in ("scheme", "group_size", "calibration", "seconds", "wall_s",
                                            "weight_bytes", "device", "out_dir")}, default=str))


if __name__ == "__main__":
    main()
