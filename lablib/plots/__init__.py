"""Figures, one file per lab topic, from Results (or rows made from them) only; `lablib.plots` re-exports them.

Every builder returns a plain `plotly.graph_objects.Figure` (it renders with no kernel) and
labels a recorded or synthetic run wherever it draws one (`style`).
"""
from .batching import LATENCY_METRICS, latency_cdf, memory_timeline, phase_breakdown, throughput_vs_batch
from .journey import journey
from .kv import block_table_heatmap, fragmentation_bars, gpu_memory_utilization_figure
from .scheduling import gantt, result_gantt_rows, schedule_tradeoff, scheduler_figure
from .style import ROOFLINE_UNKNOWN, is_synthetic, series_name, synthetic_line, synthetic_note

__all__ = ["LATENCY_METRICS", "latency_cdf", "memory_timeline", "phase_breakdown", "throughput_vs_batch", "journey",
           "block_table_heatmap", "fragmentation_bars", "gpu_memory_utilization_figure", "gantt", "result_gantt_rows",
           "schedule_tradeoff", "scheduler_figure", "ROOFLINE_UNKNOWN", "is_synthetic", "series_name",
           "synthetic_line", "synthetic_note"]
