"""How a number is measured, in one place.

- `offline`: the timing protocol (warm-up, memory monitor, one Result) for any engine.
- `loadgen`: the online load generator (seeded Poisson arrivals, streamed requests).
- `client`: the load generator's own instrument checks (did it keep up; its ceiling).
- `prom`: the server's `/metrics`, parsed by prometheus_client and sampled over a test.
- `vllm_bench`: `vllm bench serve` run on the lab's workloads, its result next to the lab's (`compare_serve`).
- `referee`: the verdict on the two clients: steady-state rates over rounds against a Welch bound.
- `goodput`: the requests per second meeting latency targets (an SLO), by `vllm bench serve --goodput`'s rule.
- `capacity`: the highest arrival rate at which an SLO holds, a bounded search answered as an interval.
- `sse_stub`: a stdlib-only stub server for the client's ceiling.

Modules are imported by name (`from lablib.bench import loadgen`): importing this package
loads none of them, so `python -m lablib.bench.sse_stub` needs nothing beyond the stdlib.
"""
