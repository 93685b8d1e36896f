"""One module per lab's multi-run experiment; a notebook cell is one call into here.

- `journey`: the ladder of steps on one workload (lab 01, the main job, lab 10).
- `batching`: lab 01's reading of its runs: the decode step's cost against batch size, prefill vs decode, Checks.
- `sweeps`: engine-restart sweeps shared by the labs (one engine per configuration).
- `kv`: lab 03, KV capacity against gpu_memory_utilization, the cold-start cross-check.
- `scheduling`: lab 04, continuous batching: vLLM against HF, the scheduler knobs.
- `serving`: lab 05, the OpenAI server under Poisson load, and the referee.

Modules are imported by name (`from lablib.experiments import serving`).
"""
