"""Lab 09 beyond one machine: which multi-node path to use when, read off the fit table rather than asserted.

How many GPUs one copy of the model needs (its smallest t in `parallel_fit.fit_rows`) decides the engine's
shape: one GPU (TP=1), one node (vLLM's multiprocess executor, TP=t over NVLink), or several nodes (TP within each
node, pipeline stages across them: vLLM's Ray executor, or its multiprocess executor with
nnodes/node_rank/master_addr: the engine on node 0, `vllm serve --headless` on the others). How many copies the
traffic needs decides the serving layer in front of them: one engine needs none; several replicas want a router
(vLLM's production-stack), and a fleet of large replicas on Kubernetes gains from KV-cache-aware routing and
prefill/decode disaggregation (llm-d) or a standard serving
API with autoscaling (KServe). The lab's load generator and referee take any OpenAI-compatible base URL, so they
measure each of these the same way.

`engine_plans` is the fit table as plans (per shape and GPU: GPUs, nodes, the engine knobs); `multi_node_paths`
one row per path with, per GPU, the smallest shape from which it pays, every size computed from the fit table.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import validate
from .fit import fit_rows

GPUS = ("H200", "L4", "T4")  # a large, a small and a smallest GPU of the fit table: where each path starts differs
GPUS_PER_NODE = 8  # an HGX/DGX node; the fit table's largest t
ONE_GPU, ONE_NODE, NODES = "one GPU", "one node", "several nodes"


def _where(cell: Any, per_node: int) -> str:
    """Where one copy of a shape runs, from its fit-table cell (the smallest t, or "> 8")."""
    if cell == 1:
        return ONE_GPU
    return ONE_NODE if isinstance(cell, int) and cell <= per_node else NODES


def engine_plans(fits: Sequence[dict[str, Any]] | None = None, gpus: Sequence[str] = GPUS,
                 per_node: int = GPUS_PER_NODE) -> list[dict[str, Any]]:
    """Per shape and GPU: the smallest t one copy needs (the fit table's), where it runs, and the engine's knobs."""
    fits = list(fit_rows() if fits is None else fits)
    validate.integer("engine_plans", "per_node", per_node, "GPUs in one machine, e.g. 8.")
    out = []
    for r in fits:
        for g in gpus:
            if g not in r:
                priced = ", ".join(k for k in r if k not in ("model", "scheme", "weights_GB", "provenance"))
                raise validate.refuse("engine_plans", "gpus", g, f"a GPU of the fit table ({priced})",
                                      "pass GPUs that fit_rows(...) priced.")
            where = _where(r[g], per_node)
            knobs = {ONE_GPU: "tensor_parallel_size=1",
                     ONE_NODE: f"tensor_parallel_size={r[g]}, distributed_executor_backend='mp'",
                     NODES: f"tensor_parallel_size={per_node} per node, pipeline_parallel_size=nodes; "
                            "distributed_executor_backend='ray', or 'mp' with nnodes/node_rank/master_addr"}[where]
            out.append({"model": r["model"], "scheme": r["scheme"], "weights_GB": r["weights_GB"], "gpu": g,
                        "smallest_t": r[g], "runs on": where, "engine knobs": knobs})
    return out


def _first(plans: list[dict[str, Any]], gpu: str, wanted: set[str]) -> str:
    """The smallest shape (by weights) on `gpu` whose copy runs on one of `wanted`, said with its size."""
    hits = sorted((p for p in plans if p["gpu"] == gpu and p["runs on"] in wanted), key=lambda p: p["weights_GB"])
    if not hits:
        big = max((p for p in plans if p["gpu"] == gpu), key=lambda p: p["weights_GB"])
        return f"none of these shapes (the largest, {big['model']} {big['scheme']}, needs t={big['smallest_t']})"
    p = hits[0]
    return f"from {p['model']} {p['scheme']} ({p['weights_GB']:.0f} GB of weights, smallest t {p['smallest_t']})"


def _last(plans: list[dict[str, Any]], gpu: str, wanted: set[str]) -> str:
    """The largest shape on `gpu` whose copy still runs on one of `wanted`."""
    hits = sorted((p for p in plans if p["gpu"] == gpu and p["runs on"] in wanted), key=lambda p: p["weights_GB"])
    if not hits:
        return "none of these shapes"
    p = hits[-1]
    return f"up to {p['model']} {p['scheme']} ({p['weights_GB']:.0f} GB)"


# (path, what it is, use it when, which copies it serves, "from" the smallest of them / "up to" the largest)
PATHS = (
    ("vLLM on one GPU", "one engine, tensor_parallel_size=1; more traffic: more copies behind any router",
     "the model fits one GPU: a second GPU buys more as a second replica than as TP=2", {ONE_GPU}, "up to"),
    ("vLLM's multiprocess executor on one node", "distributed_executor_backend='mp', tensor_parallel_size=t over "
     "NVLink (lab 09's measured runs)", "one copy needs 2-8 GPUs of one machine", {ONE_NODE}, "from"),
    ("vLLM's Ray executor across nodes", "a Ray cluster (`ray start` on each node, vLLM's run_cluster.sh), "
     "distributed_executor_backend='ray': TP within a node, PP across nodes",
     "one copy needs more GPUs than one node has, and a Ray cluster is there or wanted (KubeRay on Kubernetes)",
     {NODES}, "from"),
    ("vLLM's multiprocess executor across nodes", "the engine on node 0 and `vllm serve --headless` (workers only) "
     "on every other node, each with nnodes, node_rank, master_addr (and master_port): no Ray",
     "one copy needs several nodes and a job scheduler (Slurm, a LeaderWorkerSet) starts one process per node", {NODES}, "from"),
    ("vLLM production-stack", "vLLM's Helm chart: a router (session and prefix-aware) in front of vLLM replicas "
     "on Kubernetes, with their metrics", "traffic needs a second replica of a one-GPU or one-node engine",
     {ONE_GPU, ONE_NODE}, "from"),
    ("llm-d", "Kubernetes-native vLLM serving: KV-cache-aware routing, prefill/decode disaggregation, multi-node "
     "replicas (LeaderWorkerSet)", "a fleet of replicas that each take several GPUs: routing to cached prefixes "
     "and splitting prefill from decode save whole GPUs", {ONE_NODE, NODES}, "from"),
    ("KServe", "Kubernetes' model-serving API (InferenceService) with vLLM as its runtime: autoscaling, scale to "
     "zero, many models behind one platform; multi-node through Ray", "an organisation serving many models "
     "on Kubernetes that wants one API and autoscaling for them all", {ONE_GPU, ONE_NODE, NODES}, "from"),
)


def multi_node_paths(fits: Sequence[dict[str, Any]] | None = None, gpus: Sequence[str] = GPUS,
                     per_node: int = GPUS_PER_NODE) -> list[dict[str, Any]]:
    """One row per path (PATHS): what it is, when to use it, and per GPU of `gpus` the shapes of the fit table from
    which it pays (the smallest copy it serves, or for one GPU the largest that still fits), computed from the
    smallest t of each shape. Every path is driven the same way from the lab: an OpenAI-compatible base URL."""
    plans = engine_plans(fits, gpus, per_node)
    out = []
    for path, what, when, serves, side in PATHS:
        row = {"path": path, "what": what, "use it when": when}
        for g in gpus:
            row[f"pays on {g}"] = (_last if side == "up to" else _first)(plans, g, serves)
        out.append(row)
    return out


def needs_several_nodes(fits: Sequence[dict[str, Any]] | None = None, gpu: str = "H200",
                        per_node: int = GPUS_PER_NODE) -> list[str]:
    """The shapes of the fit table one copy of which needs more than one node of `gpu`s ("model scheme")."""
    return [f"{p['model']} {p['scheme']}" for p in engine_plans(fits, (gpu,), per_node) if p["runs on"] == NODES]


def nodes_line(fits: Sequence[dict[str, Any]] | None = None, gpus: Sequence[str] = GPUS,
               per_node: int = GPUS_PER_NODE) -> str:
    """One sentence, per GPU: the shapes one copy of which needs more than one node (from the fit table)."""
    parts = [f"on {g}: {', '.join(needs_several_nodes(fits, g, per_node)) or 'none of these shapes'}" for g in gpus]
    return f"One copy needs more than one node of {per_node} GPUs " + "; ".join(parts) + "."
