"""Lab 09 beyond one machine: each path's threshold is read off the fit table it is given (a made-up table moves it)."""
from __future__ import annotations

import pytest

from lablib.experiments.parallel import fit, nodes as parallel_nodes
from lablib.experiments.parallel import nodes


def test_plans_follow_each_shapes_smallest_t():
    plans = {(p["model"], p["scheme"], p["gpu"]): p for p in parallel_nodes.engine_plans()}
    fits = {(r["model"], r["scheme"]): r for r in fit.fit_rows()}
    for (m, s, g), p in plans.items():
        assert p["smallest_t"] == fits[(m, s)][g]
        assert p["runs on"] == ("one GPU" if p["smallest_t"] == 1 else "one node" if p["smallest_t"] != "> 8"
                                else "several nodes")
    assert plans[("llama-3.1-70b", "bf16", "H200")]["engine knobs"] == (
        "tensor_parallel_size=2, distributed_executor_backend='mp'")
    assert "nnodes/node_rank/master_addr" in plans[("llama-3.1-70b", "bf16", "T4")]["engine knobs"]
    assert parallel_nodes.needs_several_nodes(gpu="H200") == [] and parallel_nodes.needs_several_nodes(gpu="T4") == [
        "llama-3.1-70b bf16", "qwen2.5-72b bf16"]


def test_each_path_pays_from_the_shape_the_fit_table_says():
    rows = {r["path"]: r for r in parallel_nodes.multi_node_paths()}
    assert set(rows) == {p[0] for p in nodes.PATHS}
    assert rows["vLLM's Ray executor across nodes"]["pays on T4"] == (
        "from llama-3.1-70b bf16 (141 GB of weights, smallest t > 8)")
    assert rows["vLLM's Ray executor across nodes"]["pays on H200"] == (
        "none of these shapes (the largest, qwen2.5-72b bf16, needs t=2)")
    assert rows["vLLM on one GPU"]["pays on H200"] == "up to qwen2.5-72b fp8 (75 GB)"
    assert rows["vLLM's multiprocess executor on one node"]["pays on H200"].startswith("from llama-3.1-70b bf16")


def test_a_different_fit_table_moves_the_thresholds():
    made = [{"model": "small", "scheme": "bf16", "weights_GB": 10.0, "H200": 1},
            {"model": "mid", "scheme": "bf16", "weights_GB": 300.0, "H200": 4},
            {"model": "huge", "scheme": "bf16", "weights_GB": 2000.0, "H200": "> 8"}]
    rows = {r["path"]: r for r in parallel_nodes.multi_node_paths(made, gpus=("H200",))}
    assert rows["vLLM's Ray executor across nodes"]["pays on H200"].startswith("from huge bf16 (2000 GB")
    assert rows["vLLM's multiprocess executor on one node"]["pays on H200"].startswith("from mid bf16 (300 GB")
    assert rows["vLLM on one GPU"]["pays on H200"] == "up to small bf16 (10 GB)"
    four = {r["path"]: r for r in parallel_nodes.multi_node_paths(made, gpus=("H200",), per_node=2)}  # nodes of 2 GPUs
    assert four["vLLM's Ray executor across nodes"]["pays on H200"].startswith("from mid bf16")
    with pytest.raises(ValueError, match=r"engine_plans\.gpus='B200': allowed a GPU of the fit table \(H200\)"):
        parallel_nodes.multi_node_paths(made, gpus=("B200",))


def test_the_nodes_line_names_what_needs_several_nodes_per_gpu():
    assert parallel_nodes.nodes_line(gpus=("H200", "T4")) == ("One copy needs more than one node of 8 GPUs on H200: none of these "
                                                   "shapes; on T4: llama-3.1-70b bf16, qwen2.5-72b bf16.")
