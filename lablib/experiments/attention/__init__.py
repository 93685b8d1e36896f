"""Lab 02, attention: the IO model's prediction, then the kernels and the engines measured against it.

Modules import one way, each only from those before it: findings < backends < study < sdpa_cost < checks < lab;
record after sdpa_cost.

- `findings`: the IO model's prediction and what each measurement says;
- `backends`: vLLM's attention backends, one engine per `attention_backend`;
- `study`: the notebook's calls: kernels here, the GPU sweep, HF prefill per kernel, the journey rung;
- `sdpa_cost`: PyTorch's SDPA backends one by one, each twice (what a first meeting with a shape costs);
- `checks`: the notebook's Checks cell, on the lab's object;
- `lab`: the notebook's steps as one object's methods (`AttentionLab`), each keeping what it measured;
- `record`: the GPU recording step `attention`, which only scripts/record_reference.py calls.
"""
