"""What was measured: the Result record, the store, comparisons, and the recorded reference runs.

`record` is the base layer (engines build RequestRecords); `store`, `compare` and
`reference` read and write what the measurements produced.
"""
from .compare import table, token_agreement
from .record import RequestRecord, Result, summarise
from .store import ResultStore, load_results, results_dir

__all__ = ["table", "token_agreement", "RequestRecord", "Result", "summarise", "ResultStore", "load_results", "results_dir"]
