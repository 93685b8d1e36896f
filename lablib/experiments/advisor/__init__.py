"""Lab 10's tuning advisor: a deployment's goal to vLLM's settings, each resting on a measurement.

Modules import one way: latency < plan.

- `latency`: per-token latency, lab 09's cost model calibrated per batch on lab 06's recorded 8B runs;
- `plan`: the `Goal`, the advice row by row (fit, weights, load, prefix caching, speculation), the config text.
"""
