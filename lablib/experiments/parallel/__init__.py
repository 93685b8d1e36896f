"""Lab 09, tensor parallelism: what splitting a model over t GPUs should buy, and what vLLM measured.

Modules import one way, each only from those before it: model < fit < nodes < runs < record < study.

- `model`: the TP cost model swept over shapes, links and batches;
- `fit`: how many GPUs each shape needs, and the refusal a user meets before renting anything;
- `nodes`: which multi-node path pays from which shape;
- `runs`: vLLM at TP=t on the synthetic checkpoints (`measure`);
- `record`: the GPU recording steps (`record`, `record_scaling`) and what is recorded yet;
- `study`: the notebook's calls, live or recorded: `tp1_baseline`, `tp_scaling`, `refusals`.
"""
