"""lablib: the helper library behind the LLM-inference optimisation labs.

Folders are layers; each imports only from the ones before it (tests/test_layout.py walks
the imports to keep it so):

    validate, stats, config, results.record     the field checks, percentiles, frozen configs, the one Result
    models/, workloads                          what runs, and on what
    mechanisms/                                 pure-Python teaching models (no torch)
    hardware/                                   device facts, memory monitor, roofline, the fit estimator
    engines/                                    HF, vLLM in a worker, the OpenAI server: one call shape
    bench/                                      how a number is measured (offline, online, the referee)
    results/ (store, compare, reference)        what was measured, and the H200 recordings
    session                                     the one live-or-recorded switch and its labels
    experiments/                                one module per lab's multi-run experiment
    plots/, widgets/                            presentation, from Results only
    report, cli, instructor/                    the main job (`lablab`), its HTML report, the instructor's run-all

Names are re-exported lazily (PEP 562): `import lablib` loads nothing heavy, and
`import lablib.mechanisms` or the vLLM worker never load plotly or ipywidgets.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BenchConfig": "config", "HFConfig": "config", "VLLMConfig": "config", "ServerConfig": "config",
    "ModelSpec": "models", "PRESETS": "models", "resolve_model": "models",
    "Request": "workloads", "Workload": "workloads", "list_workloads": "workloads", "load_workload": "workloads",
    "HFEngine": "engines", "VLLMEngine": "engines", "ServerEngine": "engines", "PreparedRequest": "engines",
    "device_facts": "hardware", "library_versions": "hardware", "MemoryMonitor": "hardware",
    "GPU_PEAKS": "hardware", "Roofline": "hardware", "lookup_gpu": "hardware",
    "prepare": "bench.offline", "run": "bench.offline",
    "RequestRecord": "results", "Result": "results", "ResultStore": "results", "load_results": "results", "results_dir": "results",
    "table": "results", "token_agreement": "results",
    "run_journey": "experiments.journey", "live_or_recorded": "session", "Checks": "session",
}
_MODULES = ("validate", "stats", "config", "models", "workloads", "mechanisms", "hardware", "engines", "bench",
            "results", "session", "experiments", "plots", "widgets", "report", "cli", "instructor")
__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
