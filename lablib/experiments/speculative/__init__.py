"""Lab 08, speculative decoding: a draft proposes k tokens, the target verifies them in one forward.

Modules import one way, each only from those before it:
maths < loops < acceptance < ngram < sampling < study < vllm_runs < synthetic < eagle_8b < lab < checks; record after eagle_8b.

- `maths`: the formula's tables and the batch model at 8B scale (where the verify pass stops being free);
- `loops`: the greedy loops on the embedded pair (draft model, EAGLE head, transformers' assisted generation);
- `acceptance`: the loops' steps as vLLM's counters next to the i.i.d. formula, drafters compared;
- `ngram`: n-gram (prompt lookup) replayed on the target's text and on code edits, vLLM's proposer step for step;
- `sampling`: the loop at temperature T and the chi-square tests that it keeps the target's distribution;
- `study`: the CPU speed study (`cpu_study`), the costs c and verify_cost, and its tables;
- `vllm_runs`: the draft model, n-gram and EAGLE on vLLM against a pinned baseline (`gpu_study`);
- `synthetic`: the same at real size on a synthetic 8B target, acceptance set, speed real;
- `eagle_8b`: an EAGLE head at that size, at the trained head's per-position acceptance, k 1-6, batches 1-64;
- `lab`: the notebook's steps as one object's methods (`SpeculativeLab`), each keeping what it measured;
- `checks`: the notebook's Checks cell, on that object;
- `record`: the GPU recording steps `speculative`, `speculative-8b` and `speculative-eagle-8b-<part>`, which only
  scripts/record_reference.py calls.
"""
