"""What drafts for a target on vLLM: vLLM's `speculative_config` for one method, checked before an engine starts.

Speculative decoding needs a drafter the target can verify: a draft model sharing the target's vocabulary, an
EAGLE head made for the target's width and vocabulary (`eagle.check_head_dir`), or n-gram lookups in the prompt.
`speculative_config` builds vLLM's dict for each and refuses every bad knob with a message naming the field, so a
wrong drafter fails here, in milliseconds, rather than minutes into an engine's start. Lab 08 compares the three
methods; lab 10's ladder runs the EAGLE head (`lablib.experiments.journey`).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import validate
from .eagle import check_head_dir, eagle_path
from .spec import embedded_path

METHODS = ("draft_model", "ngram", "eagle")  # what lablib builds a config for (lab 08 runs all three)
# vLLM 0.26's SpeculativeMethod (vllm/config/speculative.py), its MTP model types folded into "mtp"
VLLM_METHODS = ("ngram", "ngram_gpu", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle",
                "eagle3", "extract_hidden_states", "mtp", "dflash", "dspark")
NOT_IN_THIS_LAB = {
    "eagle3": "an EAGLE-3 head trained for the embedded target; none ships (out of this lab's scope)",
}
REFUSED_WITH_SPECULATION = ("min_p", "logit_bias")  # vLLM 0.26 raises on these with any speculative method


def _config_json(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def speculative_config(method: str, k: int, *, prompt_lookup_min: int | None = None,
                       prompt_lookup_max: int | None = None, draft: str | Path | None = None,
                       target: str | Path | None = None, sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's `speculative_config` for one method, every bad knob refused before an engine starts.

    `draft_model` drafts with a small model (the embedded draft unless `draft` names another folder; its
    vocabulary must be the target's, as vLLM requires); `eagle` with an EAGLE-1 head (the one trained for the
    embedded target, data/models/eagle, unless `draft` names another head folder; checked against vLLM's layout
    and the target's width and vocabulary by `lablib.models.eagle.check_head_dir`); `ngram` looks the last
    prompt_lookup_min..max tokens up in the prompt and proposes what followed (vLLM's defaults 5 and 5).
    `sampling` is what the run would pass to SamplingParams: lablib's worker decodes greedily, and vLLM 0.26
    raises mid-run on min_p and logit_bias with any speculative method, so both are refused here.
    """
    owner = "speculative_config"
    if method not in VLLM_METHODS:
        raise validate.refuse(owner, "method", method, f"a method vLLM 0.26 has: {', '.join(VLLM_METHODS)}",
                              f"this lab runs {', '.join(METHODS[:-1])} and {METHODS[-1]}.")
    if method not in METHODS:
        needs = NOT_IN_THIS_LAB.get(method, "weights or code this lab does not ship")
        raise validate.refuse(owner, "method", method, f"{' or '.join(METHODS)} in this lab",
                              f"{method} needs {needs}.")
    validate.integer(owner, "k", k, "draft at least one token per step, e.g. k=4 (num_speculative_tokens).")
    bad = sorted(set(sampling or {}) & set(REFUSED_WITH_SPECULATION))
    if bad:
        raise validate.refuse(owner, "sampling", {b: sampling[b] for b in bad},  # type: ignore[index]
                              f"no {' or '.join(REFUSED_WITH_SPECULATION)} with speculative decoding",
                              "vLLM 0.26 raises on them with any speculative method: drop them, or run without one.")
    other = sorted(set(sampling or {}) - {"temperature"})
    if other or (sampling or {}).get("temperature", 0) != 0:
        raise validate.refuse(owner, "sampling", sampling, "greedy decoding (temperature 0) only",
                              "lablib's vLLM worker decodes greedily, so the counters read as the formula does.")
    if method == "ngram":
        lo = validate.optional_integer(owner, "prompt_lookup_min", prompt_lookup_min, "an n-gram length >= 1, e.g. 2.")
        hi = validate.optional_integer(owner, "prompt_lookup_max", prompt_lookup_max, "an n-gram length >= 1, e.g. 5.")
        lo, hi = lo or hi or 5, hi or lo or 5  # vLLM's rule: one given sets the other; neither, both 5
        if lo > hi:
            raise validate.refuse(owner, "prompt_lookup_min", lo, f"<= prompt_lookup_max={hi}",
                                  "the shortest n-gram looked up cannot be longer than the longest.")
        if draft is not None:
            raise validate.refuse(owner, "draft", str(draft), "None with ngram (it drafts from the prompt)",
                                  "drop draft, or use method='draft_model'.")
        return {"method": "ngram", "num_speculative_tokens": k, "model": None,  # None: the engine adds no draft
                "prompt_lookup_min": lo, "prompt_lookup_max": hi}
    for name, value in (("prompt_lookup_min", prompt_lookup_min), ("prompt_lookup_max", prompt_lookup_max)):
        if value is not None:
            raise validate.refuse(owner, name, value, f"None with {method} (n-gram knobs)",
                                  "drop it, or use method='ngram'.")
    target_path = Path(target) if target is not None else embedded_path("target")
    if method == "eagle":
        head = Path(draft) if draft is not None else eagle_path()
        check_head_dir(head, _config_json(target_path))  # refuses a head vLLM would not load, or one for another target
        return {"method": "eagle", "num_speculative_tokens": k, "model": str(head)}
    draft_path = Path(draft) if draft is not None else embedded_path("draft")
    dv, tv = _config_json(draft_path).get("vocab_size"), _config_json(target_path).get("vocab_size")
    if dv is None or tv is None or dv != tv:
        raise validate.refuse(owner, "draft", str(draft_path), f"a draft whose vocab_size equals the target's ({tv})"
                              f"; this one has {dv}", "vLLM scores the draft's token ids with the target: use a "
                              "draft trained on the target's tokenizer (the embedded draft, data/models/draft).")
    return {"method": "draft_model", "num_speculative_tokens": k, "model": str(draft_path)}


def synthetic_eagle_config(k: int, rates: Sequence[float], head: Any, target: Any) -> dict[str, Any]:
    """vLLM's speculative_config for an EAGLE head at k with vLLM 0.26's synthetic rejection sampler at `rates` (one
    per drafted position, each in [0, 1], non-increasing: what vLLM accepts), refused here before an engine starts.
    For a random-weight head of real size: its cost is real, the acceptance is set."""
    rates = check_rate_list(k, rates)
    spec = speculative_config("eagle", k, draft=head, target=target)
    return {**spec, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}


def check_rate_list(k: int, rates: Sequence[float]) -> list[float]:
    """k rates, each in [0, 1], non-increasing: what vLLM 0.26 takes as synthetic_acceptance_rates."""
    rates = [float(r) for r in rates]
    if len(rates) != k or not all(0.0 <= r <= 1.0 for r in rates) or any(b > a for a, b in zip(rates, rates[1:])):
        raise validate.refuse("eagle_config", "rates", rates, f"{k} rates (one per drafted position) in [0, 1], "
                              "non-increasing", "take them from head_rates(ks) at the same k.")
    return rates
