"""lablib: the helper library behind the LLM-inference optimisation labs.

Layers, each importing only the ones before it:
mechanisms (pure-Python simulators) → models, workloads → engines → bench, results,
gpu, memory, roofline, fit (measurement) → plots, widgets, report (presentation) → labs/ notebooks.
"""
from . import (config, engines, machine, mechanisms, online, plots, plots_serving, reference, results, sweeps,
               vllm_bench, widgets)
from .bench import prepare, run
from .config import BenchConfig, HFConfig, VLLMConfig
from .engines import HFEngine, PreparedRequest, VLLMEngine
from .gpu import device_facts, library_versions
from .journey import run_journey
from .memory import MemoryMonitor
from .models import PRESETS, ModelSpec, resolve_model
from .results import RequestRecord, Result, ResultStore, load_results, table
from .roofline import GPU_PEAKS, Roofline, lookup_gpu
from .workloads import Request, Workload, list_workloads, load_workload

__all__ = [
    "config", "engines", "machine", "mechanisms", "online", "plots", "plots_serving", "reference", "results", "sweeps",
    "vllm_bench", "widgets",
    "prepare", "run", "BenchConfig", "HFConfig", "VLLMConfig", "HFEngine", "PreparedRequest", "VLLMEngine",
    "MemoryMonitor", "device_facts", "library_versions", "run_journey", "PRESETS", "ModelSpec", "resolve_model",
    "RequestRecord", "Result", "ResultStore", "load_results", "table", "GPU_PEAKS", "Roofline",
    "lookup_gpu", "Request", "Workload", "list_workloads", "load_workload",
]
