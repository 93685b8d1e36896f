"""The model card (data/models/README.md) and its figures (data/models/eval.json) agree with each other,
with the training records and with the weights on disk. Pure file checks: no torch, well under a second.

If a test here fails after the weights, the test split or the evaluation changed, rerun
`python scripts/evaluate_models.py` (a minute or two on the CPU) to refresh eval.json and the card.
"""

import hashlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "data" / "models"
NAMES = ("target", "draft")
RERUN = "rerun `python scripts/evaluate_models.py`"


@pytest.fixture(scope="module")
def ev() -> dict:
    path = MODELS / "eval.json"
    assert path.exists(), f"{path} is missing; {RERUN}"
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def card() -> str:
    path = MODELS / "README.md"
    assert path.exists(), f"{path} is missing; {RERUN}"
    return path.read_text()


@pytest.fixture(scope="module")
def training() -> dict:
    return {n: json.loads((MODELS / n / "training.json").read_text()) for n in NAMES}


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("evaluate_models")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", NAMES)
def test_figures_come_from_the_current_weights(ev, name):
    assert ev["weights"][name]["sha256"] == sha256(MODELS / name / "model.safetensors"), \
        f"{name}/model.safetensors changed since eval.json was written; {RERUN}"


def test_figures_come_from_the_current_test_split(ev, training):
    assert ev["test_set"]["sha256"] == sha256(ROOT / ev["test_set"]["file"]), f"test split changed; {RERUN}"
    assert ev["test_set"]["tokens"] == training["target"]["corpus"]["tokens"]["test"]
    assert ev["test_set"]["files"] == training["target"]["corpus"]["files"]["test"]


@pytest.mark.parametrize("name", NAMES)
def test_model_facts_match_training_record(ev, training, name):
    m = ev["models"][name]
    assert m["parameters"] == training[name]["parameters"]
    assert m["weights_bytes"] == (MODELS / name / "model.safetensors").stat().st_size
    assert m["kv_bytes_per_token_bf16"] == 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * 2


def test_card_is_rendered_from_the_records(ev, card, training, script):
    assert card == script.render_card(ev, training), f"README.md was edited by hand or is stale; {RERUN} --card-only"


def test_card_prints_the_recorded_perplexities(ev, card):
    for name in NAMES:
        m = ev["models"][name]
        row = next(line for line in card.splitlines() if line.startswith(f"| `{name}` | {m['test']['nll']:.4f}"))
        assert f"**{m['test']['perplexity']:.2f}**" in row
        assert f"**{m['scored_half']['perplexity']:.2f}**" in row
    row = next(line for line in card.splitlines() if line.startswith("| unigram baseline"))
    assert f"**{ev['unigram']['perplexity']:.2f}**" in row
    assert f"alpha = {ev['agreement']['alpha']:.3f}" in card
    assert f"{ev['speculative']['tokens_per_step']:.2f} tokens per" in card


def test_perplexities_are_ordered(ev):
    t, d, u = ev["models"]["target"], ev["models"]["draft"], ev["unigram"]
    assert t["test"]["perplexity"] < d["test"]["perplexity"]
    assert t["scored_half"]["perplexity"] < d["scored_half"]["perplexity"] < u["perplexity"]
    for rec in (t["test"], t["scored_half"], d["test"], d["scored_half"], u):
        assert rec["perplexity"] == pytest.approx(2.718281828459045 ** rec["nll"])
        assert 0.0 < rec["top1"] < 1.0


def test_unigram_is_scored_on_the_same_half_as_the_models(ev):
    halves = ev["test_set"]["halves"]
    assert not set(halves["fit"]) & set(halves["scored"])
    for name in NAMES:
        assert ev["models"][name]["scored_half"]["tokens"] == ev["unigram"]["tokens"]


def test_agreement_and_speculative_figures(ev):
    ag, sp = ev["agreement"], ev["speculative"]
    assert 0.0 < ag["alpha"] < 1.0
    assert ag["alpha"] == pytest.approx(ag["matches"] / ag["positions"])
    assert ag["positions"] == ev["protocol"]["prompts"] * ev["protocol"]["decode_tokens"]
    for k, v in ag["expected_tokens_per_step"].items():
        assert v == pytest.approx((1 - ag["alpha"] ** (int(k) + 1)) / (1 - ag["alpha"]))
    assert 1.0 <= sp["tokens_per_step"] <= sp["k"] + 1
    assert sum(sp["accepted_histogram"]) == sp["steps"]
    assert sum((m + 1) * c for m, c in enumerate(sp["accepted_histogram"])) == sp["tokens"]
    assert sp["identical_to_target_greedy"] == sp["prompts"], "speculative decoding must reproduce the target's greedy output"


def test_card_prose_has_no_stray_placeholders(card):
    prose = card.split("## Samples")[0] + card.split("## Training data")[1]  # samples are model output
    assert not re.search(r"\{[a-z_\[\]'\"]+\}|\bNone\b|\bnan\b|\binf\b", prose)
