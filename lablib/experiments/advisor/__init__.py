"""Lab 10: the tuning advisor (a deployment's goal to vLLM's settings, each resting on a measurement), and the
lab's steps over the whole road (`journey`) and the advisor as one object.

Modules import one way: latency < plan < lab < checks.

- `latency`: per-token latency, lab 09's cost model calibrated per batch on lab 06's recorded 8B runs;
- `plan`: the `Goal`, the advice row by row (fit, weights, load, prefix caching, speculation), the config text;
- `lab`: the notebook's steps as one object's methods (`JourneyLab`: the whole road, the goals advised);
- `checks`: the notebook's Checks cell, on that object.
"""
