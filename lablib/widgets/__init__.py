"""Interactive panels (ipywidgets), one file per lab topic; every handler is one call into lablib.

Their figures are static plotly figures redrawn into an `ipywidgets.Output` (`figure.FigureArea`), so a
panel still draws after a browser refresh (a plotly FigureWidget does not).
"""
from .advisor import AdvisorPanel
from .batching import BatchingPanel
from .figure import FigureArea
from .kv import KVCalculator, VRAMChart
from .quantization import QuantizationExplorer
from .speculative import SpeedupExplorer
from .text import code_sample

__all__ = ["AdvisorPanel", "BatchingPanel", "FigureArea", "KVCalculator", "QuantizationExplorer", "SpeedupExplorer",
           "VRAMChart", "code_sample"]
