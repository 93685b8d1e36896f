"""Lab 06 as one object: the knobs are its attributes, each step of the notebook is one method, and what a step made
stays on the object.

A notebook cell sets a knob (`lab.gate_pct = 1.0`) or calls one step (`lab.quantize()`, `lab.score()`,
`lab.speed()`): the step runs the module that owns it with the lab's knobs, keeps the value (`lab.made`,
`lab.quality`, `lab.speeds`, ...), prints its sentences and returns the table to show. The figures
(`lablib.plots.quantization`) and the explorer read those values, and the Checks cell takes the whole object
(`checks.checks(lab)`), so no cell passes the others' variables around.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...config import lab_id
from ...models import embedded_path
from ...models.quantize import SCHEMES, quantize
from ...results.store import ResultStore
from ...session import frame, LabSteps, Shown
from . import checkpoints, layers, quality, recording, sizes, speed_runs, verdicts, vllm_ppl
from .measures import work_folder

QUALITY_COLUMNS = ["scheme", "weight_bytes", "ppl", "ppl_change_pct", "agreement", "identical", "first_divergence",
                   "gate", "provenance"]
LM_HEAD_COLUMNS = ["lm_head", "stored_as", "weight_bytes", "size_vs_kept_pct", "ppl_change_pct", "agreement",
                   "first_divergence"]
LAYER_COLUMNS = ["quantized", "linears", "weight_bytes", "saved_pct", "ppl_change_pct", "cost_per_saved", "agreement",
                 "first_divergence"]
SPEED_COLUMNS = ["scheme", "batch", "decode_tok_s", "roofline_tok_s", "of_roofline", "weight_gib", "kv_tokens",
                 "kv_cache_dtype", "linear_kernels"]



class QuantizationLab(LabSteps):
    """Lab 06's knobs and measurements, one attribute per step, filled in as the notebook runs them (None until
    then)."""

    STEPS = {"made": "quantize", "stored": "storage", "quality": "score", "vllm": "vllm_quality", "lm_heads": "lm_head",
             "parts": "layers", "speeds": "speed", "weights": "weights_alone"}
    OPTIONAL = frozenset({"weights"})

    def __init__(self, store: ResultStore | None = None) -> None:
        self.store = store if store is not None else ResultStore.for_lab(lab_id("06"))  # every live vLLM run
        self.schemes: list[str] = vllm_ppl.default_schemes()  # what this run quantizes live (this machine's default)
        self.gate_pct = 1.0  # the quality gate: perplexity at most this many percent above bf16's
        self.num_samples = 16  # calibration windows per calibrated scheme
        self.eval_texts = 16  # evaluation windows the perplexity is taken over
        self.prompts = 4  # journey prompts decoded greedily against bf16
        self.new_tokens = 16  # greedy tokens per prompt
        self.lm_head_scheme = "fp8-dynamic"  # `lm_head` quantizes this scheme (one of schemes) with lm_head too
        self.layer_scheme = "gptq-w4a16"  # `layers` quantizes this scheme (one of schemes) into MLP, attention apart
        self.work: Path = work_folder()  # checkpoints land here; a re-run asking for the same quantization reuses them
        self.made: list[dict[str, Any]] | None = None  # `quantize`: one row per checkpoint made or reused
        self.stored: list[dict[str, Any]] | None = None  # `storage`: what each checkpoint stores
        self.quality: list[dict[str, Any]] | None = None  # `score`: perplexity and agreement against bf16
        self.vllm: Shown | None = None  # `vllm_quality`: the same checkpoints' perplexity as vLLM runs them
        self.lm_heads: list[dict[str, Any]] | None = None  # `lm_head`: lm_head kept 16-bit, then quantized
        self.parts: list[dict[str, Any]] | None = None  # `layers`: every Linear, the MLP alone, attention alone
        self.weights: list[dict[str, Any]] | None = None  # `weights_alone`: the byte arithmetic on 8B and 70B shapes
        self.speeds: Shown | None = None  # `speed`: decode speed and memory per scheme and batch, on vLLM

    def scheme_table(self) -> Any:
        """What each scheme stores per weight (`models.quantize.SCHEMES`)."""
        return frame([s.row() for s in SCHEMES.values()])

    def group_sizes(self) -> Any:
        """Which 4-bit group sizes tile this model's Linear widths (`checkpoints.group_size_rows`)."""
        return frame(checkpoints.group_size_rows())

    def refusal(self, scheme: str, **kw: Any) -> None:
        """Asks the quantizer for `scheme` with `kw` into a folder of the work dir and prints its refusal, which comes
        before any work; says so if it was not refused."""
        try:
            quantize(embedded_path("target"), f"{self.work}/refused", scheme, **kw)
        except ValueError as e:
            print(e)
        else:
            print(f"not refused: {scheme} {kw} was quantized into {self.work}/refused")

    def quantize(self) -> Any:
        """Every scheme quantized live, or reused (`checkpoints.quantize_all`): the table without its folders."""
        self.made = checkpoints.quantize_all(self.schemes, work_dir=self.work, num_samples=self.num_samples)
        return frame(self.made).drop(columns=["folder"])

    def recipe(self, scheme: str = "gptq-w4a16") -> None:
        """The recipe llm-compressor wrote beside `scheme`'s checkpoint (`checkpoints.recipe_text`)."""
        print(checkpoints.recipe_text(self.work, scheme))

    def storage(self) -> Any:
        """What each checkpoint stores, from its safetensors headers (`sizes.storage_rows`)."""
        self.stored = sizes.storage_rows(self.schemes, self.work)
        return frame(self.stored).drop(columns=["provenance"])

    def score(self) -> Any:
        """Every checkpoint's quality against bf16 on this CPU at the gate (`quality.quality_table`), no loading
        bars."""
        with checkpoints.quiet_progress():  # no loading bars: a dozen per checkpoint
            self.quality = quality.quality_table(self.schemes, max_increase_pct=self.gate_pct, **self._scoring())
        return frame(self.quality)[QUALITY_COLUMNS]

    def vllm_quality(self) -> None:
        """The same checkpoints' perplexity as vLLM runs them, beside this run's CPU rows (`vllm_ppl.gpu_quality`)."""
        self.vllm = vllm_ppl.gpu_quality(self.schemes, cpu_rows=self.ran("quality"), work_dir=self.work,
                                         eval_texts=self.eval_texts, store=self.store)
        print(vllm_ppl.gpu_quality_lines(self.vllm))

    def gate(self, pct: float | None = None) -> Any:
        """The quality table re-judged at `pct` (the lab's gate by default) without measuring again
        (`quality.gate_rows`)."""
        rows = quality.gate_rows(self.ran("quality"), self.gate_pct if pct is None else pct)
        return frame(rows)[["scheme", "passed", "increase_pct", "sentence"]]

    def under_one_percent(self) -> None:
        """"The accuracy loss is under 1%", answered from this run's perplexities (`verdicts.under_one_percent`)."""
        print(verdicts.under_one_percent(self.ran("quality")))

    def lm_head(self) -> Any:
        """`lm_head_scheme` with lm_head kept 16-bit, then quantized too (`quality.lm_head_rows`)."""
        self.lm_heads = quality.lm_head_rows(self.lm_head_scheme, quality=self.ran("quality"),
                                             max_increase_pct=self.gate_pct, **self._scoring())
        print(quality.lm_head_sentence(self.lm_heads))
        return frame(self.lm_heads)[LM_HEAD_COLUMNS]

    def layers(self) -> Any:
        """`layer_scheme` into the MLP only, then attention only, beside every Linear (`layers.layer_rows`)."""
        self.parts = layers.layer_rows(self.layer_scheme, quality=self.ran("quality"),
                                       max_increase_pct=self.gate_pct, **self._scoring())
        print(layers.layer_sentence(self.parts))
        return frame(self.parts)[LAYER_COLUMNS]

    def weights_alone(self) -> Any:
        """The byte arithmetic on the published 8B and 70B shapes, and what fits one H200 (`sizes.weights_alone`)."""
        self.weights = sizes.weights_alone()
        return frame(self.weights)

    def speed(self) -> Any:
        """Decode speed and memory per scheme and batch through vLLM, live on a GPU, else the H200's recording
        (`recording.speed`): prints what the FP8 KV cache holds, returns the table."""
        self.speeds = recording.speed(store=self.store)
        print(speed_runs.kv_sentence(self.speeds.value))
        return self.speeds.table(SPEED_COLUMNS)

    def claims(self) -> Any:
        """Each common claim about quantized serving with this run's verdict and evidence (`verdicts.claims`)."""
        return frame(verdicts.claims(self.ran("quality"), self.ran("stored"), self.ran("lm_heads"),
                                      self.ran("weights"), self.ran("speeds"), self.ran("parts"),
                                      recording=vllm_ppl.quality_recording()))

    def summary(self) -> None:
        """This run's numbers per scheme, one line each (`verdicts.headline`)."""
        print(verdicts.headline(self.ran("stored"), self.ran("quality"), self.gate_pct))

    def _scoring(self) -> dict[str, Any]:
        """The knobs every scoring step passes alike."""
        return {"work_dir": self.work, "eval_texts": self.eval_texts, "prompts": self.prompts,
                "max_new_tokens": self.new_tokens, "num_samples": self.num_samples}
