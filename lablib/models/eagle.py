"""An EAGLE-1 head for the embedded target: a drafter that reads the target's own features.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty") drafts at
the feature level. The target's last hidden state h_p (what its lm_head turns into the logits after token
p) carries far more than the token it becomes, so a head of ONE decoder layer predicts the next feature
from [embedding of the next token, this feature]: row p reads [e(x_{p+1}), h_p] and outputs f_{p+1}, an
estimate of h_{p+1}; the target's own lm_head turns f_{p+1} into a draft of x_{p+2}. Further drafts
continue on the head's own features: [e(draft), f] -> the next f. A draft model must relearn the
language from tokens; the head only extrapolates one step of the target's computation, which is why a
0.9M-parameter head can agree with the target more often than a 0.9M-parameter draft model.

The layout is exactly what vLLM 0.26 loads for `{"method": "eagle"}`, read from the released wheel:

- `model_executor/models/llama_eagle.py`: `LlamaModel.__init__` builds `fc = ReplicatedLinear(2 * hidden,
  hidden, bias=False)` (lines 95-103) and `config.num_hidden_layers` decoder layers, layer 0 with
  `disable_input_layernorm` (line 88: `i == 0`; lines 40-44 replace its input_layernorm by nn.Identity, as
  SafeAILab's cnets.py does). `forward` (lines 114-124) is `fc(torch.cat((input_embeds, hidden_states),
  dim=-1))` (embedding FIRST), the layer, `hidden_states + residual`, and NO final norm: the feature goes
  straight to the lm_head (`LlamaForCausalLM.compute_logits`, models/llama.py line 532).
  `EagleLlamaForCausalLM.load_weights` (lines 170-182) prefixes every name but lm_head with "model." and
  the loader maps q/k/v and gate/up onto vLLM's fused qkv_proj/gate_up_proj (lines 53-62), so the file
  holds HF names: `fc.weight` [hidden, 2*hidden] and `layers.0.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,
  down}_proj, post_attention_layernorm}.weight`. A `layers.0.input_layernorm.weight` would fail the load
  (models/utils.py AutoWeightsLoader: "There is no module or parameter named ...": its module is an
  Identity); a `.bias` is ignored (utils.py `load_weights` appends ".bias" to the ignored suffixes).
- embed_tokens and lm_head are not stored: `v1/worker/gpu/spec_decode/eagle/utils.py` `load_eagle_model`
  (and `v1/spec_decode/llm_base_proposer.py` `_maybe_share_embeddings` / `_maybe_share_lm_head` on the V1
  runner) give the head the target's when the checkpoint has none (`has_own_embed_tokens` is set only by
  an "embed_tokens" weight name: models/utils.py `process_eagle_weight`). The embedded target ties them.
  The absent embed_tokens is no load error because `EagleLlamaForCausalLM.load_weights` returns None
  (llama_eagle.py line 182), which turns the loader's "weights not initialized" check off
  (model_loader/default_loader.py lines 436-445). vLLM names the layer `model.layers.5` inside the engine
  (line 89: `i + start_layer_id`, the target's layer count, so its KV cache is the head's own); in the file
  it is `layers.0`, as the module tree reads it.
- config.json is a Llama config with `num_hidden_layers: 1`. `config/speculative.py` (lines 913-931) wraps
  it in `EAGLEConfig` for method "eagle", and `transformers_utils/configs/eagle.py` (lines 46-53) turns
  each architecture into `f"Eagle{arch}"` unless it already starts with "Eagle"; `EagleLlamaForCausalLM`
  is the registry's name (models/registry.py line 605), so it is written as is.
- The feature is the target's output AFTER its final norm: vLLM's `LlamaModel.forward` returns
  `self.norm(hidden_states, residual)` (models/llama.py line 435), and the V2 runner passes that output to
  the speculator (`v1/worker/gpu/model_runner.py`, `propose(..., spec_hidden_states, ...)`). In
  transformers it is `target.model(...).last_hidden_state`.
- Positions: the drafter's row p holds token x_{p+1} at RoPE position p, the position of the feature it
  reads (`v1/worker/gpu/spec_decode/autoregressive/speculator.py`, `_prepare_prefill_inputs_kernel`:
  input ids shifted left by one, target positions copied); each further draft moves one position on.

`EagleHead` is that module in torch with transformers' `LlamaDecoderLayer` (same parameter names, same
maths: with the Identity input norm both compute h + attn(h), then + mlp(norm(.))). `save_head` /
`load_head` write and read the vLLM layout in bf16; `check_head_dir` checks a folder against it from the
JSON and safetensors headers alone (no torch), so `speculative_config("eagle", ...)` can refuse a bad head
before an engine starts. `draft_tokens` drafts k tokens after a prompt; the greedy loop that verifies them
is `lablib.experiments.speculative.greedy_eagle`; `scripts/train_eagle.py` trains the shipped head.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from .. import validate
from .spec import embedded_path

ARCHITECTURE = "EagleLlamaForCausalLM"  # vLLM 0.26's registry name for an EAGLE-1 Llama head
OWNER = "EagleHead"
WEIGHTS = "model.safetensors"
TRAIN_HINT = "train a head for this target (python scripts/train_eagle.py --target FOLDER --out FOLDER)"


def eagle_path() -> Path:
    """The shipped head for the embedded target: data/models/eagle."""
    return embedded_path("eagle")


def head_config(target_config: dict[str, Any]) -> dict[str, Any]:
    """The head's config.json: the target's Llama config with one layer and vLLM's EAGLE architecture name."""
    return {**target_config, "architectures": [ARCHITECTURE], "num_hidden_layers": 1}


def vllm_tensors(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor vLLM 0.26's EagleLlamaForCausalLM loads for this config, name -> shape (HF names)."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    layer = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
             "self_attn.o_proj": (h, q), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
             "mlp.down_proj": (h, inter), "post_attention_layernorm": (h,)}
    return {"fc.weight": (h, 2 * h), **{f"layers.0.{name}.weight": shape for name, shape in layer.items()}}


def check_head_config(config: dict[str, Any], target_config: dict[str, Any], where: str = "the head") -> None:
    """Refuse a head config vLLM would not load as EAGLE-1, or one made for another target."""
    if config.get("architectures") != [ARCHITECTURE] or config.get("model_type") != "llama":
        raise validate.refuse(OWNER, "architectures", config.get("architectures"),
                              f"[{ARCHITECTURE!r}] with model_type 'llama' (vLLM 0.26's EAGLE-1 Llama head)",
                              f"{where} is not an EAGLE-1 head: {TRAIN_HINT}.")
    if config.get("num_hidden_layers") != 1:
        raise validate.refuse(OWNER, "num_hidden_layers", config.get("num_hidden_layers"),
                              "1 (EAGLE-1 is one decoder layer after fc)", f"{TRAIN_HINT}.")
    for field, why in (("hidden_size", "fc takes [token embedding, target feature], each the target's width"),
                       ("vocab_size", "the head drafts through the target's embedding and lm_head")):
        if config.get(field) != target_config.get(field):
            raise validate.refuse(OWNER, field, config.get(field),
                                  f"{target_config.get(field)}, the target's {field} ({why})",
                                  f"{where} belongs to another target: {TRAIN_HINT}.")


def check_head_dir(path: str | Path, target_config: dict[str, Any]) -> dict[str, Any]:
    """A head folder checked against vLLM's layout and the target, from config.json and the safetensors header."""
    from safetensors import (  # deferred: safetensors, which imports numpy
        SafetensorError,
        safe_open,
    )

    folder = Path(path)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise validate.refuse(OWNER, "path", str(folder), "a folder with a readable config.json and "
                              f"{WEIGHTS} (what save_head writes)", f"restore it (git checkout data/models/eagle) "
                              f"or {TRAIN_HINT} ({e.__class__.__name__}).") from None
    check_head_config(config, target_config, str(folder))
    try:
        with safe_open(str(folder / WEIGHTS), "np") as f:
            got = {name: tuple(f.get_slice(name).get_shape()) for name in sorted(f.keys())}
    except (OSError, SafetensorError) as e:  # missing, truncated, not safetensors
        raise validate.refuse(OWNER, "path", str(folder), f"a folder with a readable {WEIGHTS}",
                              f"restore it (git checkout data/models/eagle) or {TRAIN_HINT} ({e}).") from None
    want = vllm_tensors(config)
    if got != want:
        diff = sorted(set(got) ^ set(want)) or [n for n in want if got[n] != want[n]]
        raise validate.refuse(OWNER, "tensors", diff, "exactly vLLM's EAGLE-1 names and shapes "
                              "(fc.weight and layers.0.* without input_layernorm)", f"{TRAIN_HINT}.")
    return config


@functools.cache
def _head_class() -> type:
    """EagleHead, defined on first use: torch and transformers load only when a head is made."""
    import torch  # deferred: torch
    from torch import nn  # deferred: torch
    from transformers import LlamaConfig  # deferred: transformers
    from transformers.models.llama.modeling_llama import (  # deferred: transformers
        LlamaDecoderLayer,
        LlamaRotaryEmbedding,
    )

    class EagleHead(nn.Module):
        """fc over [embedding, feature], then one Llama decoder layer without its input norm (vLLM's layout)."""

        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__()
            self.config_dict = dict(config)
            self.config = LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"})
            self.config._attn_implementation = "sdpa"
            h = self.config.hidden_size
            self.fc = nn.Linear(2 * h, h, bias=False)
            layer = LlamaDecoderLayer(self.config, layer_idx=0)
            layer.input_layernorm = nn.Identity()  # llama_eagle.py lines 40-44
            self.layers = nn.ModuleList([layer])
            self.rotary_emb = LlamaRotaryEmbedding(self.config)  # its inv_freq is not persistent: not saved

        def forward(self, embeds: Any, features: Any, cache: Any = None) -> Any:
            """Next features, (B, T, H), for rows [embeds | features] at the positions after what `cache` holds."""
            seen = 0 if cache is None else cache.get_seq_length()
            n = embeds.shape[1]
            x = self.fc(torch.cat((embeds, features), dim=-1))  # embedding first: llama_eagle.py line 115
            positions = torch.arange(seen, seen + n).unsqueeze(0)
            mask = None  # sdpa's own causal mask is right when nothing is cached or one row is fed
            if seen and n > 1:  # rows on top of a cache: row i sees the cache and rows 0..i
                mask = torch.ones(n, seen + n, dtype=torch.bool).tril(seen)[None, None]
            return self.layers[0](x, attention_mask=mask, position_embeddings=self.rotary_emb(x, positions),
                                  past_key_values=cache, use_cache=cache is not None)

    return EagleHead


def __getattr__(name: str) -> Any:
    if name == "EagleHead":
        return _head_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def new_head(target: Any, seed: int = 0) -> Any:
    """A freshly initialised head shaped for `target` (float32, on the CPU), seeded.

    Every matrix is normal(0, initializer_range), except that fc's embedding half is scaled up by
    rms(final-norm weight) / rms(embedding): the target's features come out of its final RMSNorm with an RMS
    of about its norm weights' (1.7 for the embedded target), its tied embeddings are ~20x smaller, and fc would
    start by ignoring the token it is told about until Adam grows those weights (on the embedded target: 0.37
    against 0.33 teacher-forced agreement after 150 steps)."""
    import torch  # deferred: torch

    torch.manual_seed(seed)
    head = _head_class()(head_config(target.config.to_diff_dict()))  # = the target's config.json
    std, h = target.config.initializer_range, target.config.hidden_size
    with torch.no_grad():
        for p in head.parameters():
            if p.ndim == 2:
                torch.nn.init.normal_(p, 0.0, std)
        norm, embed = target.model.norm.weight.float(), target.model.embed_tokens.weight.float()
        head.fc.weight[:, :h] *= norm.pow(2).mean().sqrt() / embed.pow(2).mean().sqrt()
    return head


def save_head(head: Any, folder: str | Path) -> Path:
    """config.json + model.safetensors in bf16, the names vLLM loads (checked before writing)."""
    from safetensors.torch import save_file  # deferred: safetensors

    state = {k: v.detach().to("cpu").bfloat16().contiguous() for k, v in head.state_dict().items()}
    want = vllm_tensors(head.config_dict)
    if {k: tuple(v.shape) for k, v in state.items()} != want:
        raise validate.refuse(OWNER, "state_dict", sorted(state), f"vLLM's names {sorted(want)}",
                              "make the head with new_head or load_head (their modules carry vLLM's names).")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**head.config_dict, "dtype": "bfloat16"}, indent=2) + "\n")
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    return folder


def load_head(folder: str | Path | None = None, target: Any = None) -> Any:
    """A saved head (default: the shipped one) as float32 on the CPU, in eval mode; checked against `target`."""
    from safetensors.torch import load_file  # deferred: safetensors

    folder = Path(folder) if folder is not None else eagle_path()
    target_config = target.config.to_diff_dict() if target is not None else json.loads(
        (embedded_path("target") / "config.json").read_text())
    config = check_head_dir(folder, target_config)
    head = _head_class()(config)
    head.load_state_dict({k: v.float() for k, v in load_file(str(folder / WEIGHTS)).items()}, strict=True)
    return head.eval()


def check_pair(target: Any, head: Any, owner: str) -> None:
    """Refuse a head whose width or vocabulary is not the target's, before any forward pass."""
    for field in ("hidden_size", "vocab_size"):
        mine, theirs = getattr(head.config, field), getattr(target.config, field)
        if mine != theirs:
            raise validate.refuse(owner, f"head.{field}", mine, f"{theirs}, the target's {field}",
                                  f"use a head trained for this target: {TRAIN_HINT}.")


def target_features(target: Any, ids: list[int], cache: Any) -> tuple[Any, list[int], Any]:
    """One target forward over `ids` on top of `cache`: its features (after the final norm, as vLLM hands them
    to the drafter), its argmax at each position, and the cache."""
    import torch  # deferred: torch

    out = target.model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    features = out.last_hidden_state
    return features, target.lm_head(features)[0].argmax(-1).tolist(), out.past_key_values


def propose(target: Any, head: Any, cache: Any, tokens: list[int], features: Any, k: int) -> tuple[list[int], Any]:
    """k drafts: feed rows [e(tokens[i]), features[i]] (the target's features, not yet seen by the head's cache),
    then continue on the head's own features, one row per further draft. Returns the drafts and the cache."""
    import torch  # deferred: torch
    from transformers import DynamicCache  # deferred: transformers

    cache = DynamicCache() if cache is None else cache
    embed = target.model.embed_tokens
    f = head(embed(torch.tensor([tokens])), features, cache)[:, -1:]
    drafts = [int(target.lm_head(f)[0, -1].argmax())]
    while len(drafts) < k:
        f = head(embed(torch.tensor([drafts[-1:]])), f, cache)
        drafts.append(int(target.lm_head(f)[0, -1].argmax()))
    return drafts, cache


def draft_tokens(target: Any, head: Any, input_ids: Any, k: int) -> list[int]:
    """The k tokens the head drafts after a prompt (at least 2 tokens), as the first step of `greedy_eagle` does:
    the target reads all but the last prompt token, the head reads those features, then drafts."""
    import torch  # deferred: torch

    owner = "draft_tokens"
    validate.integer(owner, "k", k, "draft at least one token, e.g. k=4.")
    check_pair(target, head, owner)
    ids = input_ids.reshape(-1).tolist() if hasattr(input_ids, "reshape") else list(input_ids)
    validate.integers(owner, "input_ids", ids, "a prompt of token ids (tokenizer(text).input_ids).", 0,
                      target.config.vocab_size - 1)
    if len(ids) < 2:
        raise validate.refuse(owner, "input_ids", ids, "at least 2 tokens (the head reads the feature of the "
                              "token before the last)", "pass the prompt with its bos token, as the tokenizer adds.")
    with torch.inference_mode():
        features, _, _ = target_features(target, ids[:-1], None)
        return propose(target, head, None, ids[1:], features, k)[0]
