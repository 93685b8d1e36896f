"""Lab 05, serving: vLLM's OpenAI server under Poisson load, refereed by `vllm bench serve`, and its SLO capacity.

Modules import one way, each only from those before it: runs < capacity < pareto < lab < checks; record after pareto.

- `runs`: the rate sweep, the concurrency sweep and the referee's rounds on one server (live, or recorded);
- `capacity`: the highest arrival rate meeting a latency target, on the server or on lab 04's simulator;
- `pareto`: tok/s per GPU against tok/s per user over max_num_seqs, the token budget and the weight scheme;
- `lab`: the notebook's steps as one object's methods (`ServingLab`), each keeping what it measured;
- `checks`: the notebook's Checks cell, on that object;
- `record`: the GPU recording step(s), which only scripts/record_reference.py calls.
"""
