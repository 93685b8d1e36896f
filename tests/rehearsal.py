"""A lab rehearsed live on this CPU: its notebook run in a kernel that sees an H200 and vLLM, both fake (test support).

Before a notebook goes live on the lent GPU (ten minutes of device time a try), run it here the way it runs there:
NVML reports one NVIDIA H200, `vllm` is the fake in tests/fake_vllm (the worker process, the engine loop, the
counters), and a synthetic checkpoint is its config with a token weights file (the fake engine reads only the
config). `session.mode()` then says live, so every vLLM cell takes its live path. What this catches is a cell that
fails only on the live path (an engine argument vLLM 0.26 has and the code misspells, a name a later cell needs, a
check whose live data never came); what it cannot is what needs CUDA itself (lab 02's kernels, HF on the GPU), and
a difference the real numbers make. The fake's numbers mean nothing, so the Checks cell's live claims are evaluated
(a claim that raises fails) but not asserted; one without live data is reported (on one fake GPU, lab 09's TP=2
has none, as on the real one-GPU machine). Lab 06's quantized checkpoints are the lab's own (results/quantized).

    python -m tests.rehearsal labs/08_speculative_decoding.ipynb   # each failing cell, its error
    python -m tests.rehearsal --gpu T4 labs/03_kv_cache.ipynb      # another GPU (lablib.hardware.tiers)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_vllm"

PREAMBLE = f'''
import os, sys, json, struct
os.environ["LABLIB_RESULTS"] = "{{results}}"  # the rehearsal's fake Results stay out of the lab's results/
sys.path.insert(0, {str(FAKE)!r})
os.environ["PYTHONPATH"] = os.pathsep.join([{str(FAKE)!r}, {str(ROOT)!r}, *filter(None, [os.environ.get("PYTHONPATH")])])
import pynvml
_GiB = 2**30
pynvml.nvmlInit = lambda: None
pynvml.nvmlShutdown = lambda: None
pynvml.nvmlDeviceGetCount = lambda: 1
pynvml.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{{i}}"
_GPU = {{gpu}}
pynvml.nvmlDeviceGetName = lambda h: _GPU["name"]
pynvml.nvmlDeviceGetCudaComputeCapability = lambda h: _GPU["capability"]
pynvml.nvmlDeviceGetMemoryInfo = lambda h: type("M", (), {{"used": _GiB, "free": _GPU["memory_mib"] * 2**20 - _GiB,
                                                          "total": _GPU["memory_mib"] * 2**20}})()
import lablib.models.synthetic as _syn
from pathlib import Path as _P

def _config_only(name, folder, seed=0, dtype="bfloat16"):
    cfg = {{k: v for k, v in _syn.architectures()[name].items() if not k.startswith("_")}}
    folder = _P(folder); folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({{**cfg, "dtype": dtype}}))
    data = bytes(2048)  # one bf16 tensor of 1024 zeros: a weights file whose header matches its size
    head = json.dumps({{"w": {{"dtype": "BF16", "shape": [1024], "data_offsets": [0, len(data)]}}}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + data)
    (folder / "synthetic.json").write_text(json.dumps({{"architecture": name, "label": _syn.LABEL, "rehearsal": True}}))
    return folder

_syn.make_synthetic = _config_only
_syn.ROOT = _P("{{synthetic}}")  # config-only checkpoints, never where real ones are made
import lablib.session

_REHEARSAL_NOT_LIVE = []

def _rehearsed(self, shown, claim, test, detail=None):  # the fake's numbers mean nothing: evaluate, do not assert
    if not shown.live or shown.value is None:  # as on the real machine: not measured here; rehearse() reports it
        _REHEARSAL_NOT_LIVE.append({{"claim": claim, "label": shown.label}})
        self.not_here.append(f"{{claim}} ({{shown.label}})")
        return
    self.not_here.append(f"{{claim}} (rehearsed on the fake vLLM: {{bool(test(shown.value))}})")

lablib.session.Checks.live = _rehearsed
lablib.session.mode.cache_clear()
print(lablib.session.mode()["banner"])
from lablib.hardware.tiers import tier_of
print("\\n".join(tier_of().lines()))
import lablib.experiments.journey as _journey
_journey.default_model = lambda: "embedded"  # HF at real size needs CUDA and real weights: the CPU climbs the embedded
'''


def rehearse(notebook: str | Path, workdir: str | Path, timeout: int = 1200,
             not_live_ok: tuple[str, ...] = (), gpu: str = "H200") -> list[dict[str, str]]:
    """Run `notebook` live against the fakes; one entry per cell that raised (index, first line, error), and one per
    live claim that had no live data unless its text starts with one of `not_live_ok`.

    `gpu`: the GPU NVML reports, a key of lablib.hardware.tiers.REHEARSAL_GPUS (T4, L4, A10G, A100-40, A100-80,
    H100, H200): its name, memory and compute capability, so a lab's choices for that GPU run (the fake vLLM does
    not check them against the hardware). The journey's default model stays the embedded one: HF rungs at real size
    need CUDA and real weights.

    Its Results go to workdir/results and its synthetic checkpoints to workdir/synthetic; lab 06's quantized
    checkpoints are the lab's own folder (results/quantized: the same quantizations, reused where already made)."""
    import nbformat
    from nbclient import NotebookClient

    from lablib.results.store import results_dir

    path, work = Path(notebook), Path(workdir)
    (work / "results").mkdir(parents=True, exist_ok=True)
    shared = results_dir() / "quantized"
    shared.mkdir(parents=True, exist_ok=True)
    if not (work / "results" / "quantized").exists():
        (work / "results" / "quantized").symlink_to(shared, target_is_directory=True)
    nb = nbformat.read(path, as_version=4)
    from lablib.hardware.tiers import REHEARSAL_GPUS

    if gpu not in REHEARSAL_GPUS:
        raise ValueError(f"rehearse: gpu={gpu!r}: allowed {sorted(REHEARSAL_GPUS)}; Fix: pick one of them.")
    preamble = PREAMBLE.replace("{results}", str(work / "results")).replace("{synthetic}", str(work / "synthetic")) \
        .replace("{gpu}", repr(REHEARSAL_GPUS[gpu]))
    nb.cells.insert(0, nbformat.v4.new_code_cell(preamble))
    nb.cells.append(nbformat.v4.new_code_cell('print("REHEARSAL-NOT-LIVE", json.dumps(_REHEARSAL_NOT_LIVE))'))
    NotebookClient(nb, kernel_name="python3", timeout=timeout, allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    failed = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                failed.append({"cell": i - 1, "source": cell.source.splitlines()[0][:100],
                               "error": f"{out['ename']}: {out['evalue']}"[:600]})
    tail = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    for claim in json.loads(tail.split("REHEARSAL-NOT-LIVE", 1)[1]) if "REHEARSAL-NOT-LIVE" in tail else []:
        if not claim["claim"].startswith(not_live_ok):
            failed.append({"cell": "checks", "source": claim["claim"][:100], "error": f"no live data: {claim['label']}"})
    banner = "".join(o.get("text", "") for o in nb.cells[0].get("outputs", []))
    if "LIVE" not in banner:
        failed.insert(0, {"cell": -1, "source": "preamble", "error": f"not live: {banner.strip()[:300]}"})
    return failed


if __name__ == "__main__":
    import tempfile

    args, gpu = sys.argv[1:], "H200"
    if args[:1] == ["--gpu"]:
        gpu, args = args[1], args[2:]
    for nb in args:
        print(f"== {nb} (fake {gpu})")
        for f in rehearse(nb, tempfile.mkdtemp(prefix="rehearsal-"), gpu=gpu):
            print(f"cell {f['cell']}: {f['source']}\n    {f['error']}")
