"""Lab 09, tensor parallelism: what splitting a model over t GPUs should buy, and what vLLM measured.

Modules import one way, each only from those before it: model < fit < nodes < runs < grid < study < checks < lab;
record after grid.

- `model`: the TP cost model swept over shapes, links and batches;
- `fit`: how many GPUs each shape needs, and the refusal a user meets before renting anything;
- `nodes`: which multi-node path pays from which shape;
- `runs`: vLLM at TP=t on the synthetic checkpoints (`measure`);
- `grid`: the planned GPU runs (the TP=1 baseline, the scaling grid in parts), measured run by run, and what is
  recorded of them yet (`remaining_runs`);
- `study`: the notebook's calls, live or recorded: `tp1_baseline`, `tp_scaling`, `refusals`;
- `checks`: the notebook's Checks cell, on the lab's object;
- `lab`: the notebook's steps as one object's methods (`ParallelLab`), each keeping what it made;
- `record`: the GPU recording steps (`record`, `record_scaling`), which only scripts/record_reference.py calls.
"""
