"""Lab 07, prefix caching: hashed KV blocks reused across requests that share a prompt's start.

Modules import one way, each only from those before it:
workloads < simulated < reuse < runs < scarce < serving < checks < lab < record.

- `workloads`: the shared-prefix sets at any length, their variants, distinct prefixes in an order;
- `simulated`: `mechanisms.prefix.simulate` on the embedded tokenizer's real token ids, on any machine;
- `reuse`: the shared prefix's K/V computed once in transformers and reused, on this machine;
- `runs`: the simulator's prediction against vLLM's counters (`counters`), caching off and on (`on_off`);
- `scarce`: the simulator's evictions against vLLM's own block pool when memory is scarce;
- `serving`: the hit rate from a server's `/metrics` under Poisson load, next to TTFT;
- `checks`: the readers of the on/off runs and the notebook's Checks cell (on the lab's object, which it reads
  without importing);
- `lab`: the notebook's steps as one object's methods (`PrefixLab`), each keeping what it made;
- `record`: the GPU recording steps (prefix-on-off, prefix-serve, prefix-scarce), which only
  scripts/record_reference.py calls.
"""
