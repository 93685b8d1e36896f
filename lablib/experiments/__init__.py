"""One module per lab's multi-run experiment; a notebook cell is one call into here.

- `journey`: the ladder of steps on one workload (lab 01, the main job, lab 10).
- `batching`: lab 01's reading of its runs: the decode step's cost against batch size, prefill vs decode, Checks.
- `sweeps`: engine-restart sweeps shared by the labs (one engine per configuration).
- `kv`: lab 03, KV capacity against gpu_memory_utilization, the cold-start cross-check.
- `scheduling`: lab 04, continuous batching: vLLM against HF, the scheduler knobs.
- `serving`: lab 05, the OpenAI server under Poisson load, and the referee.
- `attention` (+ `attention_findings`, `attention_vllm`): lab 02, the kernels timed against sequence length, the
  IO model's prediction next to them, vLLM's attention backends.
- `quantization/` (a package: `measures`, `checkpoints`, `sizes`, `quality`, `verdicts`, `speed_runs`): lab 06,
  llm-compressor's schemes for size and quality on the CPU, speed by batch on vLLM.
- `prefix` (+ `prefix_workloads`, `prefix_simulated`, `prefix_checks`, `prefix_reuse`, `prefix_serving`): lab 07,
  the simulator's prediction against vLLM's counters, the seeds' advice tested, the saving in transformers on the
  CPU, the hit rate from a server's /metrics under load.
- `speculative` (+ `speculative_loops`, `speculative_acceptance`, `speculative_study`, `speculative_vllm`,
  `speculative_sampling`, `speculative_synthetic`): lab 08,
  the greedy loops on the embedded pair against the formula, the CPU costs, the batch model, vLLM's methods by batch.
- `parallel` (+ `parallel_model`, `parallel_fit`): lab 09, the TP cost model swept, the fit, TP runs.
- `advisor` (+ `advisor_latency`): lab 10, a deployment's goal to vLLM's settings, each on a recorded run or the
  cost model, with per-token latency predicted by the cost model calibrated per batch on lab 06's 8B runs.

A lab's module keeps what its notebook calls and re-exports the parts beside it, so `experiments.<lab>.name`
is always the name to use.

Modules are imported by name (`from lablib.experiments import serving`).
"""
