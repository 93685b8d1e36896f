"""Lab 07 as one object: each step of the notebook is one method, and what it made stays on the object.

A notebook cell calls one step (`lab.repeats()`, `lab.on_off()`, `lab.serve()`): the step runs the module that
owns it on the lab's CPU engine and store, keeps the value (`lab.idea`, `lab.onoff`, `lab.served`, ...) and returns
what the cell shows; the figures (`lablib.plots.prefix`) read those values, and the Checks cell takes the whole
object (`checks.checks(lab)`).
"""
from __future__ import annotations

from functools import cached_property
from typing import Any

from ...config import HFConfig, lab_id
from ...engines.hf import HFEngine
from ...results.store import ResultStore
from ...session import frame, LabSteps
from . import checks, reuse, runs, scarce, serving, simulated

SCARCE_COLUMNS = ["order", "num_blocks", "kv_blocks", "predicted_hit_rate", "vllm_hit_rate", "predicted_evictions",
                  "per_request_exact"]
AGREEMENT_COLUMNS = ["model", "workload", "identical", "of", "diverged"]
COUNTER_COLUMNS = {1: ["workload", "predicted_hits", "vllm_hits", "predicted_queries", "vllm_queries",
                       "per_request_exact", "exact"],
                   32: ["workload", "predicted_hits", "vllm_hits", "predicted_queries", "vllm_queries",
                        "per_request_exact", "exact", "differ"]}



class PrefixLab(LabSteps):
    """Lab 07's measurements, one attribute per step, filled in as the notebook runs them (None until then)."""

    STEPS = {"idea": "repeats", "chain": "hash_chain", "lengths": "prefix_lengths", "advice": "advice_runs",
             "demo": "eviction_demo", "scarce": "scarce_memory", "seq": "counters(1)", "onoff": "on_off"}

    def __init__(self, store: ResultStore | None = None) -> None:
        self.store = store if store is not None else ResultStore.for_lab(lab_id("07"))  # every live vLLM run
        self.idea: Any = None  # `repeats`: what a repeated prompt hits, by prompt length (a DataFrame)
        self.chain: list[dict[str, Any]] | None = None  # `hash_chain`: two requests' chained block hashes
        self.demo: Any = None  # `eviction_demo`: a pool small enough to evict
        self.lengths: list[dict[str, Any]] | None = None  # `prefix_lengths`: hit rate against shared length
        self.advice: dict[str, Any] | None = None  # `advice_runs`: shared part first, a line first, multi-turn
        self.scarce: list[dict[str, Any]] | None = None  # `scarce_memory`: the simulator with too few blocks
        self.scarce_vllm: Any = None  # `scarce_on_vllm`: vLLM with a pool of that size
        self.seq: Any = None  # `counters(1)`: vLLM's counters, one request at a time
        self.batch: Any = None  # `counters(32)`: 32 at once
        self.onoff: Any = None  # `on_off`: caching off, then on
        self.reuse: dict[str, Any] | None = None  # `reuse_study`: the shared prefix's K/V reused in transformers
        self.served: Any = None  # `serve`: a server under Poisson load

    @cached_property
    def hf(self) -> HFEngine:
        """The embedded model on the CPU on every machine: its tokenizer feeds the simulator the token ids an engine
        would be sent, and `reuse_study` measures prefix reuse on this machine's CPU."""
        return HFEngine("embedded", HFConfig(device="cpu"))

    def repeats(self) -> Any:
        """The last-token rule on real token ids (`simulated.repeat_rows`), by prompt length."""
        self.idea = frame(simulated.repeat_rows(self.hf)).set_index("prompt_tokens")
        return self.idea

    def hash_chain(self) -> Any:
        """The chained hashes of two requests' first blocks (`simulated.chain_rows`)."""
        self.chain = simulated.chain_rows(self.hf)
        return frame(self.chain)

    def eviction_demo(self) -> Any:
        """Blocks shared, kept and evicted in a small pool (`simulated.eviction_demo`)."""
        self.demo = simulated.eviction_demo()
        return self.demo

    def prefix_lengths(self) -> list[dict[str, Any]]:
        """The simulator's hit rate against the shared-prefix length (`simulated.prefix_length_rows`)."""
        self.lengths = simulated.prefix_length_rows(self.hf)
        return self.lengths

    def advice_runs(self) -> dict[str, Any]:
        """The usual advice tested on one set (`runs.advice`)."""
        self.advice = runs.advice(self.hf)
        return self.advice

    def scarce_memory(self) -> list[dict[str, Any]]:
        """Hit rate and evictions against the pool's capacity, per arrival order (`simulated.scarce_memory_rows`)."""
        self.scarce = simulated.scarce_memory_rows()
        return self.scarce

    def scarce_on_vllm(self) -> Any:
        """The embedded model on vLLM with a pool of 48, then 80 blocks (`scarce.scarce_vllm`): prints the verdicts,
        returns the table."""
        self.scarce_vllm = scarce.scarce_vllm(store=self.store)
        print(scarce.scarce_lines(self.scarce_vllm))
        return self.scarce_vllm.table(SCARCE_COLUMNS)

    def counters(self, max_num_seqs: int) -> Any:
        """vLLM's prefix-cache counters against the simulator's (`runs.counters`), 1 or 32 requests at a time: prints
        each workload's verdict in full, returns the table (`lab.seq` / `lab.batch` keep what was shown)."""
        shown = runs.counters(max_num_seqs, store=self.store)
        if max_num_seqs == 1:
            self.seq = shown
        else:
            self.batch = shown
        print("\n".join(r["verdict"] for r in shown.value or []) + f"\n[{shown.label}]")
        return shown.table(COUNTER_COLUMNS[max_num_seqs])

    def on_off(self) -> Any:
        """Each model with prefix caching off, then on (`runs.on_off`)."""
        self.onoff = runs.on_off(store=self.store)
        return self.onoff

    def on_off_pairs(self) -> Any:
        """Caching on beside off per model and workload (`runs.on_off_pairs`), labelled."""
        return checks.part(self.ran("onoff"), "runs", runs.on_off_pairs).table()

    def reuse_study(self, workload: str = "shared-prefix-512", requests: int = 8, rounds: int = 3) -> Any:
        """The shared prefix's K/V computed once in transformers and reused, on this machine (`reuse.reuse_study`)."""
        self.reuse = reuse.reuse_study(self.hf, workload, requests=requests, rounds=rounds)
        print(reuse.reuse_lines(self.reuse))
        return frame(self.reuse["rows"])

    def agreement(self) -> Any:
        """Greedy tokens with caching on against off (`checks.agreement_lines`): prints what they say, returns the
        table."""
        print(checks.agreement_lines(self.ran("onoff")))
        return checks.part(self.onoff, "agreement").table(AGREEMENT_COLUMNS)

    def serve(self) -> Any:
        """The synthetic 8B served under Poisson load, caching off then on, per rate (`serving.serve`)."""
        self.served = serving.serve(store=self.store)
        print(serving.serve_lines(self.served))
        return self.served

    def summary(self) -> None:
        """The simulator's cases in three lines, every number from this run."""
        idea, lengths = self.ran("idea"), self.ran("lengths")
        advice, demo = self.ran("advice"), self.ran("demo")
        print(f"simulated here: a repeated 64-token prompt caches {idea.loc[64, 'cached_second_time']} tokens; a "
              f"{lengths[1]['shared_tokens']}-token shared prefix caches {lengths[1]['cached_per_later_request']} per "
              "later request")
        print(f"hit rate {lengths[0]['hit_rate']:.0%} at {lengths[0]['shared_tokens']} shared tokens, "
              f"{lengths[-1]['hit_rate']:.0%} at {lengths[-1]['shared_tokens']}; line first: "
              f"{advice['per-request line first'].hits} hits; multi-turn: "
              f"{list(advice['multi-turn'].cached_tokens[:5])} ...")
        print(f"eviction picture: {demo.evictions} hashes evicted, cached per request {list(demo.cached_tokens)}")
