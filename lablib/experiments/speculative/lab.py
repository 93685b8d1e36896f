"""Lab 08 as one object: each step of the notebook is one method, and what it measured stays on the object.

A notebook cell calls one step (`lab.loop(...)`, `lab.costs()`, `lab.vllm(...)`): the step runs the experiment of
the module that owns it, keeps the value (`lab.study`, `lab.model`, `lab.gpu`, ...), prints its sentences and
returns the table to show. The figures read those values (`lablib.plots.speculative`), and the Checks cell takes
the whole object (`checks.checks(lab)`), so no cell passes the others' variables around.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from ...config import lab_id
from ...results.store import ResultStore
from ...session import frame, LabSteps, Shown
from . import acceptance, eagle_8b, loops, maths, ngram, sampling, study, synthetic, vllm_runs

RULE_COLUMNS = ["prompt", "temperature", "rule", "accept_prob", "tv_from_p", "n", "bins", "statistic", "df",
                "p_value", "verdict", "detectable_w"]
LOOP_COLUMNS = ["temperature", "rule", "prompts", "k", "position", "n", "n_plain", "statistic", "df", "p_value",
                "verdict", "detectable_w"]
VLLM_COLUMNS = ["name", "batch", "model_runner", "async_scheduling", "output_tok_s", "speedup",
                "mean_acceptance_length", "acceptance_rate", "alpha", "implied_c", "counters_consistent",
                "token_match", "first_divergence"]
NGRAM_COLUMNS = ["text", "k", "requests", "drafted_share", "num_drafts", "tokens_per_draft", "measured_length",
                 "length_stderr", "tokens_per_step", "counters_consistent"]
SYNTHETIC_COLUMNS = ["name", "batch", "label", "set_length", "mean_acceptance_length", "length_gap", "output_tok_s",
                     "speedup"]



class SpeculativeLab(LabSteps):
    """Lab 08's measurements, one attribute per step, filled in as the notebook runs them (None until then)."""

    CALL = "(...)"
    STEPS = {"study": "loop", "hf": "assisted", "harness": "harness_runs", "drafters": "drafter_acceptance",
             "sampling_rule": "sampling", "sampling_loop": "sampling", "model": "batch_model", "gpu": "vllm",
             "ngram_rows": "ngram_texts"}

    def __init__(self, store: ResultStore | None = None) -> None:
        self.store = store if store is not None else ResultStore.for_lab(lab_id("08"))  # every live run lands here
        self.study: dict[str, Any] | None = None  # `loop`: the CPU study (acceptance and speed per k)
        self.hf: dict[str, Any] | None = None  # `assisted`: transformers' assisted generation against greedy
        self.harness: dict[str, Any] | None = None  # `harness`: the pair as HFEngine rungs through bench.run
        self.drafters: list[dict[str, Any]] | None = None  # `drafters`: the draft model and the EAGLE head
        self.sampling_rule: list[dict[str, Any]] | None = None  # `sampling`: the rule at one position
        self.sampling_loop: list[dict[str, Any]] | None = None  # `sampling`: the whole loop against plain sampling
        self.model: dict[str, Any] | None = None  # `batch_model`: where speculation stops paying, at 8B scale
        self.gpu: Shown | None = None  # `vllm`: vLLM's drafters against the pinned baseline
        self.ngram_rows: list[dict[str, Any]] | None = None  # `ngram_texts`: n-gram on the journey and on code edits
        self.synthetic: Shown | None = None  # `synthetic_8b`: the same at real size, acceptance set
        self.eagle: Shown | None = None  # `eagle_head_8b`: an EAGLE head at real size, the trained head's acceptance

    @cached_property
    def pair(self) -> tuple[Any, Any, Any]:
        """The embedded target, its draft and their tokenizer, loaded once for every CPU step."""
        return loops.load_pair()

    def maths(self, alphas: Sequence[float] = (0.5, 0.7, 0.9), ks: Sequence[int] = (2, 4, 8),
              costs: Sequence[float] = (0.0, 0.05, 0.2, 1.0)) -> dict[str, Any]:
        """The formula's three tables (`maths.maths_tables`); the break-even alpha pivoted to k by c."""
        tables = {name: frame(rows) for name, rows in maths.maths_tables(alphas, ks, costs).items()}
        tables["break_even"] = tables["break_even"].pivot(index="k", columns="c", values="break_even_alpha")
        return tables

    def loop(self, n_prompts: int = 4, max_new_tokens: int = 32, ks: Sequence[int] = (2, 4), rounds: int = 3) -> Any:
        """The greedy loop on the embedded pair, live on this CPU (`study.cpu_study`): prints it, returns the
        acceptance table."""
        self.study = study.cpu_study(n_prompts=n_prompts, max_new_tokens=max_new_tokens, ks=ks, rounds=rounds,
                                     pair=self.pair)
        print(study.loop_lines(self.study))
        return frame(study.acceptance_table(self.study))

    def assisted(self, n_prompts: int = 1, max_new_tokens: int = 32, k: int = 4) -> None:
        """transformers' assisted generation on the same pair against greedy (`loops.assisted_matches`)."""
        self.hf = hf = loops.assisted_matches(self.pair, n_prompts=n_prompts, max_new_tokens=max_new_tokens, k=k)
        print(f"transformers' assisted generation: {hf['identical']} of {hf['prompts']} journey prompts identical "
              f"to greedy ({hf['max_new_tokens']} tokens, k={hf['k']})")

    def harness_runs(self, n_prompts: int = 16, max_new_tokens: int = 32, k: int = 4) -> Any:
        """The pair as the journey's lab 08 rungs, each run by `bench.run` (`study.harness_runs`)."""
        self.harness = study.harness_runs(n_prompts=n_prompts, max_new_tokens=max_new_tokens, k=k, store=self.store)
        print(study.harness_lines(self.harness))
        return frame(self.harness["rows"])

    def drafter_acceptance(self, drafters: Sequence[str] = acceptance.MODEL_DRAFTERS, n_prompts: int = 16,
                           max_new_tokens: int = 32, ks: Sequence[int] = (2, 4), head: Any = None) -> Any:
        """Each drafter's loop on the same prompts, counted alike (`acceptance.drafter_acceptance`; `head`: an EAGLE
        head of your own, by default the shipped one)."""
        self.drafters = acceptance.drafter_acceptance(drafters, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                                                      ks=ks, pair=self.pair, head=head)
        print(acceptance.drafter_lines(self.drafters))
        return frame(acceptance.drafter_table(self.drafters))

    def sampling(self, temperatures: Sequence[float] = (1.0, 0.7), prompts: Sequence[int] = (0, 3),
                 n: int = 200_000, n_prompts: int = 4, runs: int = 150, plain_runs: int = 600, k: int = 2,
                 position: int = 2) -> tuple[Any, Any]:
        """Both chi-square tests at temperature T: the rule at one position on `prompts` (`sampling.rule_test`, n
        trials) and the whole loop at output `position` on `n_prompts` prompts (`sampling.loop_test`)."""
        self.sampling_rule = sampling.rule_test(self.pair, prompts=prompts, temperatures=temperatures, n=n)
        self.sampling_loop = sampling.loop_test(self.pair, temperatures=temperatures, n_prompts=n_prompts, runs=runs,
                                                plain_runs=plain_runs, k=k, position=position)
        return frame(self.sampling_rule)[RULE_COLUMNS], frame(self.sampling_loop)[LOOP_COLUMNS]

    def costs(self) -> Any:
        """The cost side of `loop`'s study: c and verify_cost two ways against the speedup it measured."""
        print(study.cost_lines(self.ran("study")))
        return frame(study.cost_table(self.study))

    def batch_model(self, k: int = 4, draft: str = "llama-3.2-1b") -> Any:
        """The batch model at 8B scale (`maths.batch_model`, a `draft` architecture) at the alpha `loop` measured
        for this k."""
        alpha = study.study_row(self.ran("study"), k)["alpha"]
        self.model = m = maths.batch_model(alpha=alpha, k=k, draft=draft)
        print(f"alpha {m['alpha']:.3f}, k={m['k']}: E = {m['tokens_per_step']:.2f} tokens per step; slower than "
              f"plain decoding from batch {m['reversal']}")
        return frame(m["rows"])

    def vllm(self, batches: Sequence[int] = (1, 4, 16, 64), ks: Sequence[int] = (2, 4),
             prompt_lookup: tuple[int, int] = (2, 5)) -> Any:
        """vLLM's drafters against the pinned baseline, live or recorded (`vllm_runs.gpu_study`; `prompt_lookup`:
        n-gram's window)."""
        self.gpu = vllm_runs.gpu_study(batches=batches, ks=ks, prompt_lookup=prompt_lookup, store=self.store)
        print(vllm_runs.engine_lines(self.gpu))
        return vllm_runs.gpu_table(self.gpu, "rows", VLLM_COLUMNS)

    def cross_check(self) -> Any:
        """vLLM's mean acceptance length against the loop's on the same prompts (gap), and against E(alpha of the
        loop, k) (formula_gap)."""
        return vllm_runs.gpu_table(self.ran("gpu"), "cross_check")

    def ngram_texts(self, ks: Sequence[int] = (2, 4), n_prompts: int = 64, max_new_tokens: int = 64) -> Any:
        """N-gram replayed on the target's journey text and on code-edit requests (`ngram.ngram_acceptance`), its
        journey counts set against vLLM's n-gram runs of `vllm` above where they decoded the same requests."""
        self.ngram_rows = ngram.ngram_acceptance(ks=ks, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                                                 pair=self.pair)
        checked = ngram.against_grid(self.ngram_rows, None if self.gpu is None else self.gpu.value)
        print(ngram.ngram_lines(self.ngram_rows, checked))
        return frame([{c: r.get(c) for c in NGRAM_COLUMNS} for r in self.ngram_rows])

    def synthetic_8b(self, k: int = 4, force: bool | None = False) -> Any:
        """The same at real size: a synthetic 8B target, the acceptance length set (`synthetic.synthetic_study`;
        recorded unless `force=True` on a GPU)."""
        self.synthetic = synthetic.synthetic_study(k=k, force=force)
        print(synthetic.synthetic_lines(self.synthetic))
        return vllm_runs.gpu_table(self.synthetic, "rows", SYNTHETIC_COLUMNS)

    def eagle_head_8b(self, force: bool | None = False) -> Any:
        """An EAGLE head of the 8B's shape on the synthetic 8B, acceptance set to the trained head's per position,
        k 1-6 x batches 1-64 (`eagle_8b.eagle_study`; recorded unless `force=True` on a GPU: ~30 minutes of 8B
        engines). Returns each batch's best k; `eagle_8b.surface(lab.eagle.value)` has every point."""
        self.eagle = eagle_8b.eagle_study(force=force)
        draft = self.synthetic  # the 1B draft model's study, where `synthetic_8b` ran before
        print(eagle_8b.eagle_lines(self.eagle, None if draft is None else draft.value))
        return None if self.eagle.value is None else frame(eagle_8b.best_k(self.eagle.value))

    def summary(self) -> None:
        """What this run showed, in three lines (`study.summary_lines`)."""
        print(study.summary_lines(self.ran("study"), self.ran("model")))
