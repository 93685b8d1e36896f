"""The attendee's GPU: which model shape and dtype the live labs run on it, and what it cannot run, said up front.

A lab that measures speed at real size needs a checkpoint the GPU holds with room to spare for the KV cache. The
rule here: the largest of the Llama shapes in SHAPES (8B, 3B, 1B; synthetic weights) whose 16-bit weights take at
most half the GPU's memory (the other half: the KV cache, activations, CUDA graphs). On the GPUs an attendee meets:
T4 16 GB, L4 and A10G 24 GB take the 3B; A100 40/80 GB, H100 and H200 the 8B.

What vLLM 0.26 does per compute capability, read from its source (the reason each row says what it says):
- 16-bit type: bfloat16 needs compute capability 8.0 (Ampere); a T4 (7.5) runs float16.
- Attention (vllm/platforms/cuda.py's priorities, each backend's supports_compute_capability): FLASH_ATTN from 8.0
  (FlashAttention 3 on 9.0, Hopper; 2 elsewhere); FlashInfer from 8.0 (its 7.5 support is switched off in 0.26); a
  T4 gets TRITON_ATTN.
- FP8 weights (quantization/fp8.py: minimum capability 7.5): native FP8 GEMMs (W8A8) from 8.9 (Ada, Hopper); on 7.5
  to 8.6 the FP8 Marlin kernel keeps the weights in FP8 and computes in 16 bits (W8A16): the bytes halve, the
  arithmetic does not.
- FP8 KV cache: FLASH_ATTN takes it only as FlashAttention 3 on 9.0; elsewhere vLLM picks FlashInfer (8.0+). On a
  T4 only TRITON_ATTN declares it, which this lab has not verified there, so the labs leave it out (`vllm_refusal`).
- Tensor parallelism needs as many GPUs as its size.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..models.architecture import architectures, parameter_count
from .device import device_facts

SHAPES = ("llama-3.1-8b", "llama-3.2-3b", "llama-3.2-1b")  # largest first: the first that fits is the lab's
WEIGHT_SHARE = 0.5  # at most this share of the GPU's memory for the 16-bit weights

# What the rehearsal fakes (NVML's own names, totals and capabilities) for each GPU an attendee may have.
REHEARSAL_GPUS: dict[str, dict[str, Any]] = {
    "T4": {"name": "Tesla T4", "memory_mib": 15360, "capability": (7, 5)},
    "L4": {"name": "NVIDIA L4", "memory_mib": 23034, "capability": (8, 9)},
    "A10G": {"name": "NVIDIA A10G", "memory_mib": 23028, "capability": (8, 6)},
    "A100-40": {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "capability": (8, 0)},
    "A100-80": {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "capability": (8, 0)},
    "H100": {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "capability": (9, 0)},
    "H200": {"name": "NVIDIA H200", "memory_mib": 143771, "capability": (9, 0)},
}


@dataclass(frozen=True)
class Tier:
    """One GPU as the labs use it: the shape and dtype they run, and how vLLM 0.26 runs each feature there."""

    gpu: str  # NVML's name
    memory_bytes: int
    capability: tuple[int, int]
    count: int  # GPUs visible
    model: str  # the synthetic shape the live labs run at real size, "synthetic:<architecture>"
    dtype: str  # "bfloat16" or "float16"
    attention: str  # vLLM's attention backend for a 16-bit KV cache
    fp8_weights: str  # how FP8 weights run
    fp8_kv_cache: str  # the backend that takes an FP8 KV cache
    cannot: dict[str, str] = field(default_factory=dict)  # feature -> why it cannot run on this machine

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """What a lab prints before it starts anything: the shape and dtype, then each feature's way of running."""
        gib = self.memory_bytes / 2**30
        out = [f"{self.count} x {self.gpu} ({gib:.0f} GiB, compute capability {self.capability[0]}."
               f"{self.capability[1]}): live labs run {self.model} in {self.dtype}",
               f"attention: {self.attention}; FP8 weights: {self.fp8_weights}; FP8 KV cache: {self.fp8_kv_cache}"]
        out += [f"cannot run here: {what}: {why}" for what, why in self.cannot.items()]
        return out


def vllm_refusal(capability: tuple[int, int], gpu: str, *, dtype: str = "auto", quantization: str | None = None,
                 kv_cache_dtype: str = "auto") -> str | None:
    """Why vLLM 0.26 cannot run these settings on a GPU of `capability` (the message, naming the field, the allowed
    values and the fix), or None where it can. The one rule `engines.vllm.preflight` and the labs' choices share."""
    major, minor = capability
    if (major, minor) < (7, 5):
        return (f"VLLMConfig: allowed on compute capability 7.5 or newer (vLLM 0.26's minimum, FP8 weights included: "
                f"its FP8 Marlin kernel; FP8 GEMMs from 8.9); this GPU ({gpu}) is "
                f"{major}.{minor}. Fix: a newer GPU; the labs show the H200's recordings here.")
    if dtype == "bfloat16" and major < 8:  # "auto": vLLM falls back to float16 itself (_resolve_auto_dtype)
        return (f"VLLMConfig.dtype='bfloat16': allowed 'auto' or 'float16' on this GPU ({gpu}, compute capability "
                f"{major}.{minor}: bfloat16 needs 8.0). Fix: VLLMConfig(dtype='auto') (vLLM then runs a bf16 "
                "checkpoint in float16) or dtype='float16'.")
    if kv_cache_dtype.startswith("fp8") and major < 8:
        return (f"VLLMConfig.kv_cache_dtype={kv_cache_dtype!r}: allowed 'auto' on compute capability {major}.{minor} "
                f"({gpu}; an FP8 KV cache needs FlashInfer, 8.0+, or FlashAttention 3, 9.0, in vLLM 0.26; not "
                "verified on Triton's attention here). Fix: kv_cache_dtype='auto'.")
    return None


def gpu_refusal(**settings: Any) -> str | None:
    """`vllm_refusal` for this machine's first GPU (NVML); None without a GPU (nothing live to refuse)."""
    tier = tier_of()
    return None if tier is None else vllm_refusal(tier.capability, tier.gpu, **settings)


def weight_bytes_16bit(architecture: str) -> int:
    """Bytes of a shape's weights in a 16-bit type (its parameter count x 2)."""
    return 2 * parameter_count(architectures()[architecture])


def shape_for(memory_bytes: int) -> str | None:
    """The largest of SHAPES whose 16-bit weights take at most WEIGHT_SHARE of `memory_bytes`; None if none does."""
    return next((s for s in SHAPES if weight_bytes_16bit(s) <= WEIGHT_SHARE * memory_bytes), None)


def tier_of(facts: dict[str, Any] | None = None) -> Tier | None:
    """This machine's first GPU as a Tier (from `device_facts`, NVML), or None where there is no NVIDIA GPU.

    A GPU too small for the 1B shape is still a Tier (model "embedded", with the reason under `cannot`)."""
    facts = device_facts() if facts is None else facts
    if not facts.get("gpu"):
        return None
    memory = int((facts.get("gpu_memory_bytes") or [0])[0])
    cc_text = facts.get("cuda_compute_capability") or "0.0"
    cc = tuple(int(x) for x in cc_text.split("."))[:2]
    count = int(facts.get("gpu_count") or len(facts.get("gpu_names") or []) or 1)
    cannot: dict[str, str] = {}
    shape = shape_for(memory)
    if shape is None:
        smallest = SHAPES[-1]
        cannot["real-size speed"] = (f"{smallest}'s 16-bit weights ({weight_bytes_16bit(smallest) / 1e9:.1f} GB) "
                                     f"take more than {WEIGHT_SHARE:.0%} of {memory / 1e9:.1f} GB: the labs run the "
                                     "embedded model here, whose speed numbers are launch overhead")
    if cc < (7, 5):
        cannot["vLLM"] = f"vLLM 0.26 needs compute capability 7.5 or more (this GPU has {cc_text})"
    elif cc < (8, 0):
        cannot["FP8 KV cache"] = ("only TRITON_ATTN declares it below compute capability 8.0 in vLLM 0.26, not verified "
                                  "here: the labs leave it out")
    if count < 2:
        cannot["tensor parallelism"] = f"needs 2 or more GPUs ({count} here): lab 09 shows the H200's recordings"
    bf16 = cc >= (8, 0)
    return Tier(
        gpu=facts["gpu"], memory_bytes=memory, capability=cc, count=count,
        model=f"synthetic:{shape}" if shape else "embedded", dtype="bfloat16" if bf16 else "float16",
        attention=("FLASH_ATTN (FlashAttention 3)" if cc[0] == 9 else "FLASHINFER (vLLM 0.26's first choice on 10.x)"
                   if cc[0] == 10 else "FLASH_ATTN (FlashAttention 2)" if bf16
                   else "TRITON_ATTN (FlashAttention and FlashInfer need 8.0 in vLLM 0.26)"),
        fp8_weights=("W8A8: FP8 GEMMs on the tensor cores" if cc >= (8, 9) else
                     "W8A16: FP8 Marlin, weights in FP8, arithmetic in 16 bits (no FP8 tensor cores before 8.9)"),
        fp8_kv_cache=("FLASH_ATTN (FlashAttention 3)" if cc[0] == 9 else "FLASHINFER (FLASH_ATTN takes FP8 only "
                      "as FlashAttention 3, on 9.0)" if bf16 else "left out here (only TRITON_ATTN declares it)"),
        cannot=cannot)


def tier_table(facts: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per GPU an attendee may have (REHEARSAL_GPUS, NVML's figures), and this machine's first, if it has
    one: the shape and dtype the live labs run there, each feature's way of running, what cannot run."""
    here = tier_of(facts)
    tiers = ([("this machine", here)] if here is not None else []) + [
        (key, tier_of({"gpu": g["name"], "gpu_memory_bytes": [g["memory_mib"] * 2**20], "gpu_count": 1,
                       "cuda_compute_capability": "{}.{}".format(*g["capability"])}))
        for key, g in REHEARSAL_GPUS.items()]
    return [{"gpu": key if key != "this machine" else f"this machine: {t.gpu}", "memory_gib": round(t.memory_bytes /
             2**30, 1), "capability": "{}.{}".format(*t.capability), "model": t.model, "dtype": t.dtype,
             "weights_gb": round(weight_bytes_16bit(t.model.split(":", 1)[1]) / 1e9, 1) if ":" in t.model else None,
             "attention": t.attention.split(" (")[0] + (" (FA3)" if "3)" in t.attention else " (FA2)" if "2)" in
                                                         t.attention else ""),
             "fp8_weights": t.fp8_weights.split(":")[0], "fp8_kv_cache": t.fp8_kv_cache.split(" (")[0],
             "cannot": "; ".join(t.cannot) or "-"} for key, t in tiers]


def live_model(default: str = "embedded") -> str:
    """The model a live real-size run takes by default: this GPU's shape (tier_of), else `default`: no GPU, or one
    torch cannot use (a CPU-only torch, CUDA_VISIBLE_DEVICES=""), where the HF rungs would run a real-size shape on
    the CPU."""
    tier = tier_of()
    if tier is None:
        return default
    import torch  # deferred: torch

    return tier.model if torch.cuda.is_available() else default
