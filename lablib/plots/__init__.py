"""Figures, one file per lab topic, from Results (or rows made from them) only; `lablib.plots` re-exports them.

Every builder returns a plain `plotly.graph_objects.Figure` (it renders with no kernel) and
follows the rules in `style`: one colour per rung or engine in every figure (`colour`), provenance
once, as the title's second line (`provenance`), every axis with its unit, log axes where values
span decades.
"""
from .batching import (
                    LATENCY_METRICS,
                    latency_cdf,
                    memory_timeline,
                    phase_breakdown,
                    throughput_vs_batch,
)
from .journey import journey
from .kv import block_table_heatmap, fragmentation_bars, gpu_memory_utilization_figure
from .scheduling import gantt, result_gantt_rows, schedule_tradeoff, scheduler_figure
from .style import (
                    COLOURS,
                    RECORDED_MARK,
                    ROOFLINE_UNKNOWN,
                    colour,
                    is_synthetic,
                    ordered_colours,
                    palette_for,
                    provenance,
                    series_name,
                    synthetic_line,
                    synthetic_note,
                    trace_name,
)

__all__ = ["LATENCY_METRICS", "latency_cdf", "memory_timeline", "phase_breakdown", "throughput_vs_batch", "journey",
           "block_table_heatmap", "fragmentation_bars", "gpu_memory_utilization_figure", "gantt", "result_gantt_rows",
           "schedule_tradeoff", "scheduler_figure", "COLOURS", "RECORDED_MARK", "ROOFLINE_UNKNOWN", "colour",
           "is_synthetic", "ordered_colours", "palette_for", "provenance", "series_name", "synthetic_line",
           "synthetic_note", "trace_name"]
