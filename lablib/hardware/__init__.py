"""What this machine is and can hold: device facts, the memory monitor, the roofline, the fit estimator, the GPU's
tier (which shape and dtype the live labs run on it), and whether a run had its CPU to itself (the contention check).

The engines use it before they start (a configuration that cannot fit is refused with the
knob to change); the benchmark uses it while they run (memory sampled in the background,
achieved bandwidth against the GPU's peak). No torch at import.
"""
from .contention import CpuMeter, CpuShare
from .device import device_facts, library_versions, machine_summary, nvml_memory
from .fit import FitReport, check_fit, fit_table
from .memory import MemoryMonitor
from .roofline import GPU_PEAKS, Roofline, lookup_gpu
from .tiers import Tier, tier_of, tier_table

__all__ = ["CpuMeter", "CpuShare", "device_facts", "library_versions", "machine_summary", "nvml_memory", "FitReport",
           "check_fit", "fit_table", "MemoryMonitor", "GPU_PEAKS", "Roofline", "lookup_gpu", "Tier", "tier_of", "tier_table"]
