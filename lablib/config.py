"""Run configurations: small frozen records, checked the moment they are made.

A configuration that cannot work (a batch of 0, a negative token budget, an unknown
engine) is refused here, with the field, the value, the allowed range and the fix, before
any model loads or any GPU memory is touched.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import validate

# Where the project's data lives: data/ beside the package, or $LABLIB_DATA (a copy elsewhere, a test's folder).
DATA_DIR = Path(os.environ.get("LABLIB_DATA", Path(__file__).resolve().parent.parent / "data"))

HF_MODES = ("naive", "static", "continuous")  # continuous: transformers' own (generate_batch's manager)
# transformers' attention implementations the HF engine takes: eager materialises the N x N scores (the textbook
# kernel, lab 01's naive baseline), sdpa is PyTorch's fused scaled_dot_product_attention (transformers' default;
# FlashAttention-2 on a GPU that has it), flex_attention compiles once per prompt length (lab 02 says when it pays).
HF_ATTENTION = ("eager", "sdpa", "flex_attention")
# transformers' own speculative decoding ("assisted generation", batch 1 only): a draft model proposes, or
# prompt lookup (n-gram: the continuation of the last matching n-gram in the prompt); the target verifies.
HF_SPECULATIVE = ("", "draft", "ngram")
DTYPES = ("auto", "float32", "float16", "bfloat16")


# The labs, in order: (id, what it does, what it needs to run live). The one list of lab ids.
LABS = sorted([
    ("00_setup", "this page: hardware, NVML, what fits", "cpu"),
    ("01_batching", "naive HF generate vs static batching; the memory wall; prefill vs decode", "cpu"),
    ("03_kv_cache", "KV-cache sizes, fragmentation and paging, the gpu_memory_utilization sweep", "vllm"),
    ("04_continuous_batching", "static vs continuous batching (Gantt), HF vs vLLM on the journey, scheduler knobs",
     "vllm"),
    ("02_attention", "the IO model of attention, naive vs FlashAttention kernels against sequence length", "vllm"),
    ("05_serving", "the OpenAI server under Poisson load, /metrics, vllm bench serve as referee", "vllm"),
    ("06_quantization", "GPTQ/AWQ W4A16, FP8, W8A8 with llm-compressor: memory, speed and quality", "vllm"),
    ("07_prefix_caching", "hashed KV blocks: the simulator's hits against vLLM's counters, TTFT vs shared prefix",
     "vllm"),
    ("08_speculative_decoding", "draft, n-gram and EAGLE: acceptance maths, the loop, where it stops paying", "vllm"),
    ("09_tensor_parallelism", "the TP cost model, what fits on 1/2/4/8 GPUs, TP=1 measured as the baseline", "vllm"),
    ("10_the_whole_journey", "every rung on one workload, each lab's gain, and the tuning advisor", "vllm"),
])
LAB_IDS = tuple(lab for lab, _, _ in LABS)


def lab_id(number: str) -> str:
    """A lab's id from its number: lab_id("08") is "08_speculative_decoding"."""
    for lab in LAB_IDS:
        if lab.startswith(number + "_"):
            return lab
    raise validate.refuse("lab_id", "number", number, ", ".join(lab[:2] for lab in LAB_IDS),
                          "pass a lab's two-digit number, e.g. '08'.")


@dataclass(frozen=True)
class HFConfig:
    """Hugging Face `generate`: one request at a time ("naive"), left-padded batches ("static"), or transformers' own
    continuous batching with a paged KV cache ("continuous": the manager behind `generate_batch`)."""

    mode: str = "naive"  # "naive": batch of 1, request after request; "static": fixed batches of batch_size;
    # "continuous": up to batch_size requests decode together, a finished one's slot refilled at the next step
    batch_size: int = 1  # requests per batch (static), requests in flight (continuous)
    dtype: str = "auto"  # weights dtype; "auto" = float32 on the CPU, bfloat16 on a GPU (float16 below 8.0: a T4)
    device: str = "auto"  # "auto" = "cuda" when a GPU is visible, else "cpu"
    attn_implementation: str = "sdpa"  # HF_ATTENTION; "eager" is the naive N x N kernel (lab 02)
    speculative: str = ""  # HF_SPECULATIVE: "" off, "draft" (draft_model proposes), "ngram" (prompt lookup), lab 08
    num_speculative_tokens: int = 4  # tokens proposed per verify step (k), when speculative is on
    draft_model: str = "embedded-draft"  # the draft for speculative="draft": it must share the target's vocabulary
    compile: bool = False  # a static KV cache and the decode step compiled (torch.compile; CUDA graphs on a GPU): the
    # transformers optimisation guide's recipe, naive or static mode only

    def __post_init__(self) -> None:
        validate.choice("HFConfig", "mode", self.mode, HF_MODES, "'naive' for one request at a time, 'static' to batch, "
                        "'continuous' for transformers' continuous batching.")
        validate.choice("HFConfig", "attn_implementation", self.attn_implementation, HF_ATTENTION)
        validate.choice("HFConfig", "speculative", self.speculative, HF_SPECULATIVE,
                        "'' for plain decoding, 'draft' for a draft model, 'ngram' for prompt lookup.")
        validate.integer("HFConfig", "num_speculative_tokens", self.num_speculative_tokens,
                         "propose 1-16 tokens per step, e.g. 4.", 1, 16)
        if self.speculative and self.mode != "naive":
            raise validate.refuse("HFConfig", "speculative", self.speculative,
                                  f"'' with mode={self.mode!r} (transformers' assisted generation runs one sequence "
                                  "at a time)", "mode='naive', or speculative=''.")
        validate.integer("HFConfig", "batch_size", self.batch_size, "use 1 for naive generate, 2-64 for static batching.")
        if not isinstance(self.compile, bool):
            raise validate.refuse("HFConfig", "compile", self.compile, "True or False", "compile=True for the static "
                                  "cache and the compiled decode step, False for generate's defaults.")
        if self.compile and (self.mode == "continuous" or self.speculative):
            field, value = ("mode", self.mode) if self.mode == "continuous" else ("speculative", self.speculative)
            raise validate.refuse("HFConfig", field, value, "mode 'naive' or 'static' with speculative='' when "
                                  "compile=True (the static cache and the compiled step are generate's own path)",
                                  "compile=False, or mode='static' without speculation.")
        if self.mode == "naive" and self.batch_size != 1:
            raise validate.refuse("HFConfig", "batch_size", self.batch_size, "1 with mode='naive' (naive generate runs "
                                  "one request at a time)", "mode='static' to batch, or batch_size=1.")
        validate.choice("HFConfig", "dtype", self.dtype, DTYPES)
        validate.choice("HFConfig", "device", self.device, ("auto", "cpu", "cuda"))

    @property
    def engine(self) -> str:
        return f"hf-{self.mode}" + ("-compile" if self.compile else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BenchConfig:
    """The timing protocol's own knobs, the same for every engine."""

    warmup_requests: int = 1  # requests run (and discarded) before the timer starts: loads kernels, caches
    max_new_tokens: int | None = None  # override every request's output length (None: the workload's own)
    seed: int = 0  # torch seed set before the run (recorded as bench_seed); decoding is greedy: tie-breaks only
    monitor_interval_s: float = 0.05  # memory sampling period
    progress: bool = True  # a progress bar while the run goes
    tags: dict[str, Any] = field(default_factory=dict)  # free-form labels stored in the Result's config
    # Requests in flight at most: the workload runs in waves of this many, one engine call each, every request
    # arriving at t=0 (a later wave's TTFT includes its wait). None: all at once, the engine's scheduler decides.
    # One started engine then serves a whole batch-size sweep (an engine start costs a minute on the H200).
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        validate.integer("BenchConfig", "warmup_requests", self.warmup_requests, "0 to skip the warm-up, 1 usually.", 0)
        validate.optional_integer("BenchConfig", "max_concurrency", self.max_concurrency,
                                  "requests in flight at most, e.g. 1 for one at a time, or None for all at once.")
        validate.optional_integer("BenchConfig", "max_new_tokens", self.max_new_tokens,
                                  "ask for at least one new token, or None to keep the workload's lengths.")
        validate.integer("BenchConfig", "seed", self.seed, "any integer >= 0, e.g. 0.", 0)
        validate.number("BenchConfig", "monitor_interval_s", self.monitor_interval_s, "e.g. 0.05 (20 samples a second).",
                        0.001, 10)


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# vLLM 0.26's `LLM(attention_backend=...)` (VLLM_ATTENTION_BACKEND is gone in 0.26: it is ignored with a warning)
ATTENTION_BACKENDS = (None, "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
QUANTIZATIONS = (None, "fp8", "awq", "gptq", "compressed-tensors", "bitsandbytes")
# vLLM's executors for more than one GPU: None lets vLLM pick (its multiprocess executor on one machine), "mp" forces
# it, "ray" runs the workers on a Ray cluster (one machine or many: `ray start` on each node first)
EXECUTOR_BACKENDS = (None, "mp", "ray")
# vLLM's load formats the labs use: None/"auto" the checkpoint's files; "dummy" random weights drawn by vLLM at load
# (no weights on disk: a synthetic shape too large for the disk; vLLM 0.26 quantizes them online layer by layer)
LOAD_FORMATS = (None, "auto", "dummy")


@dataclass(frozen=True)
class VLLMConfig:
    """vLLM engine knobs (the `LLM(...)` arguments the labs turn). Changing any of them restarts the engine."""

    gpu_memory_utilization: float = 0.9  # fraction of the GPU vLLM may take: weights + activations + KV cache
    max_num_seqs: int = 256  # most sequences decoding at once (continuous batching's batch size cap)
    max_num_batched_tokens: int | None = None  # token budget per scheduler step (prefill chunks + decodes); None = vLLM's default
    max_model_len: int | None = None  # longest prompt + output; None = the model's own context
    enable_prefix_caching: bool = False  # reuse KV blocks of prompts already seen (lab 07); vLLM 0.26 turns it on
    # for Llama by default, the lab turns it off unless asked: the journey repeats its prompts, so hits would flatter
    enforce_eager: bool = False  # True: no CUDA graphs (faster start, slower decode)
    dtype: str = "auto"  # weights/activations dtype; "auto" = the checkpoint's
    quantization: str | None = None  # None, "fp8" (dynamic), or the checkpoint's scheme
    kv_cache_dtype: str = "auto"  # "fp8" halves KV memory on Hopper/Ada
    speculative_config: dict[str, Any] | None = None  # e.g. {"model": draft_path, "num_speculative_tokens": 4}
    tensor_parallel_size: int = 1  # GPUs each layer's matrices are split across (two all-reduces per layer)
    pipeline_parallel_size: int = 1  # stages the layers are split into, one GPU (or TP group) each; GPUs used =
    # tensor_parallel_size x pipeline_parallel_size
    distributed_executor_backend: str | None = None  # EXECUTOR_BACKENDS: how the workers of a TP/PP engine run
    disable_custom_all_reduce: bool = False  # True: NCCL's all-reduce instead of vLLM's custom kernel (lab 09 compares)
    # vLLM's multiprocess executor across machines (EngineArgs nnodes/node_rank/master_addr/master_port, passed
    # unchanged): node 0 runs the engine (this config, node_rank=0), every other node runs `vllm serve MODEL
    # --headless --nnodes N --node-rank R --master-addr ADDR` (workers only: VLLMEngine refuses node_rank > 0);
    # None: one machine (vLLM's defaults)
    nnodes: int | None = None  # machines the engine spans; tensor_parallel_size x pipeline_parallel_size across all
    node_rank: int | None = None  # this machine's index, 0..nnodes-1 (node 0 holds the engine core and its API)
    master_addr: str | None = None  # node 0's address, the same on every node (torch.distributed's rendezvous)
    master_port: int | None = None  # node 0's rendezvous port, 1..65535; None: vLLM's default
    seed: int = 0
    attention_backend: str | None = None  # None: vLLM picks (FLASH_ATTN, i.e. FA3, on an H200); lab 02 sweeps it
    # the KV cache's bytes, exactly (vLLM 0.26's kv_cache_memory_bytes): vLLM then skips its memory profiling and
    # gpu_memory_utilization only gates the start (that much must be free); None: what gpu_memory_utilization leaves.
    # Engines started together (`lablib.engines.together`) set it: profiling reads the whole GPU's free memory, which
    # the other engines' starts change under it
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None  # a KV pool of exactly this many 16-token blocks (one is vLLM's null
    # block), whatever gpu_memory_utilization leaves: lab 07's scarce-memory run; needs max_model_len to fit in it
    load_format: str | None = None  # LOAD_FORMATS; "dummy": vLLM draws random weights (a synthetic shape, no files)
    # vLLM's CompilationConfig as a dict, passed unchanged (`LLM(compilation_config=...)`); None: vLLM's defaults.
    # Lab 09 pins {"pass_config": {"fuse_allreduce_rms": False}}: vLLM 0.26's default -O2 fuses all-reduce + RMSNorm
    # into one FlashInfer kernel for TP > 1 on Hopper (vllm/config/vllm.py, enable_allreduce_rms_fusion)
    compilation_config: dict[str, Any] | None = None
    # vLLM 0.26 moves draft_model and ngram speculation to its V1 model runner with async scheduling off
    # (vllm/config/vllm.py), so a speculative run set against a default baseline compares two engines: lab 08 pins
    # both in every run. None leaves vLLM's choice.
    async_scheduling: bool | None = None  # False: async scheduling off (an `LLM(...)` argument)
    model_runner_v2: bool | None = None  # False: the V1 runner; VLLMEngine.start sets VLLM_USE_V2_MODEL_RUNNER=0

    def __post_init__(self) -> None:
        validate.fraction("VLLMConfig", "gpu_memory_utilization", self.gpu_memory_utilization,
                          "e.g. 0.9 (vLLM's default), lower it if other processes share the GPU.")
        validate.integer("VLLMConfig", "max_num_seqs", self.max_num_seqs, "e.g. 256 (vLLM's default), 1 for one at a time.")
        validate.integer("VLLMConfig", "tensor_parallel_size", self.tensor_parallel_size, "1 for one GPU.")
        validate.integer("VLLMConfig", "pipeline_parallel_size", self.pipeline_parallel_size, "1 for no pipeline.")
        validate.choice("VLLMConfig", "distributed_executor_backend", self.distributed_executor_backend,
                        EXECUTOR_BACKENDS)
        if not isinstance(self.disable_custom_all_reduce, bool):
            raise validate.refuse("VLLMConfig", "disable_custom_all_reduce", self.disable_custom_all_reduce,
                                  "True or False", "True for NCCL's all-reduce, False (the default) for vLLM's own.")
        self._check_nodes()
        validate.choice("VLLMConfig", "attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        for name in ("max_num_batched_tokens", "max_model_len"):
            validate.optional_integer("VLLMConfig", name, getattr(self, name),
                                      "a positive token count, or None for vLLM's default.")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise validate.refuse("VLLMConfig", "max_num_batched_tokens", self.max_num_batched_tokens,
                                  f">= max_num_seqs={self.max_num_seqs} (every running sequence needs a token per step)",
                                  "raise max_num_batched_tokens or lower max_num_seqs.")
        validate.optional_integer("VLLMConfig", "kv_cache_memory_bytes", self.kv_cache_memory_bytes,
                                  "the KV cache's size in bytes, e.g. 2 * 2**30, or None for what "
                                  "gpu_memory_utilization leaves.")
        validate.optional_integer("VLLMConfig", "num_gpu_blocks_override", self.num_gpu_blocks_override,
                                  "a number of KV blocks (16 tokens each), or None for what the memory leaves.")
        if self.num_gpu_blocks_override is not None:
            # vLLM's start check counts every block, but its null block (block 0) is never handed out: a pool of
            # exactly max_model_len / 16 blocks starts, then never schedules a request of max_model_len tokens
            need = None if self.max_model_len is None else -(-self.max_model_len // 16) + 1
            if need is None or self.num_gpu_blocks_override < need:
                raise validate.refuse(
                    "VLLMConfig", "num_gpu_blocks_override", self.num_gpu_blocks_override,
                    "enough 16-token blocks for one request of max_model_len tokens, plus vLLM's null block"
                    + ("" if need is None else f" (max_model_len={self.max_model_len}: at least {need})"),
                    "set max_model_len to the longest prompt + output the run sends, and at least that many "
                    "tokens / 16 blocks + 1: a pool that cannot hold one such request never schedules it.")
        validate.choice("VLLMConfig", "dtype", self.dtype, DTYPES)
        validate.choice("VLLMConfig", "load_format", self.load_format, LOAD_FORMATS)
        if self.compilation_config is not None and not isinstance(self.compilation_config, dict):
            raise validate.refuse("VLLMConfig", "compilation_config", self.compilation_config,
                                  "a dict of vLLM's CompilationConfig fields, or None",
                                  'e.g. {"pass_config": {"fuse_allreduce_rms": False}}.')
        validate.choice("VLLMConfig", "kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        validate.choice("VLLMConfig", "quantization", self.quantization, QUANTIZATIONS)
        validate.integer("VLLMConfig", "seed", self.seed, "any integer >= 0, e.g. 0.", 0)
        for name in ("async_scheduling", "model_runner_v2"):
            if getattr(self, name) not in (None, True, False):
                raise validate.refuse("VLLMConfig", name, getattr(self, name), "None, True or False",
                                      "None leaves vLLM's choice; False pins it off in every run.")

    def _check_nodes(self) -> None:
        """nnodes > 1 is vLLM's multiprocess executor across machines: named explicitly, with node 0's address, a
        node_rank below nnodes and the GPUs split evenly over the nodes (Ray places its workers itself)."""
        validate.optional_integer("VLLMConfig", "nnodes", self.nnodes, "None for one machine, else how many.")
        validate.optional_integer("VLLMConfig", "node_rank", self.node_rank, "0 on the first node, 1 on the next, ...",
                                  0)
        if self.master_port is not None:
            validate.integer("VLLMConfig", "master_port", self.master_port, "a TCP port, e.g. 29501.", 1, 65535)
        nodes = self.nnodes or 1
        if nodes == 1:
            if self.node_rank not in (None, 0):
                raise validate.refuse("VLLMConfig", "node_rank", self.node_rank, "None or 0 on one machine (nnodes "
                                      f"{self.nnodes})", "set nnodes to the number of machines, or drop node_rank.")
            return
        if self.distributed_executor_backend != "mp":
            raise validate.refuse("VLLMConfig", "distributed_executor_backend", self.distributed_executor_backend,
                                  f"'mp' with nnodes={nodes} (vLLM's multiprocess executor across machines)",
                                  "pass distributed_executor_backend='mp'; for a Ray cluster use 'ray' and no nnodes.")
        if self.node_rank is None or self.node_rank >= nodes:
            raise validate.refuse("VLLMConfig", "node_rank", self.node_rank, f"0..{nodes - 1} with nnodes={nodes}",
                                  "0 on the first machine, 1 on the next, and so on.")
        if not isinstance(self.master_addr, str) or not self.master_addr:
            raise validate.refuse("VLLMConfig", "master_addr", self.master_addr, f"node 0's address with nnodes={nodes}",
                                  "pass the first machine's IP or host name, the same on every node.")
        if self.gpus % nodes:
            raise validate.refuse("VLLMConfig", "nnodes", nodes, f"a divisor of tensor_parallel_size x "
                                  f"pipeline_parallel_size={self.gpus} (the same GPUs on every node)",
                                  "e.g. TP=8 within each node and pipeline_parallel_size=nnodes across them.")

    @property
    def gpus_per_node(self) -> int:
        """GPUs the engine takes on each machine: gpus / nnodes."""
        return self.gpus // (self.nnodes or 1)

    @property
    def engine(self) -> str:
        return "vllm"

    @property
    def gpus(self) -> int:
        """GPUs one engine takes: tensor_parallel_size x pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `vllm.LLM`, leaving vLLM's defaults where the config says None (the model runner is
        an environment variable, not an argument: VLLMEngine.start sets it)."""
        kw = {k: v for k, v in asdict(self).items() if v is not None}
        kw.pop("model_runner_v2", None)
        return kw

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ServerConfig:
    """How to start the server. None leaves vLLM's own default."""

    model: str  # local model folder (or hub id) passed as --model
    port: int = 8000  # TCP port on 127.0.0.1; 0 picks a free one when the server starts
    api_key: str | None = field(default=None, repr=False)  # bearer token clients must send; None: a random one
    tokenizer: str | None = None  # --tokenizer, when it is not in the model folder
    served_model_name: str | None = None  # the name clients put in "model"; None: the --model string
    max_num_seqs: int | None = None  # most sequences in one running batch
    gpu_memory_utilization: float | None = None  # fraction (0, 1] of GPU memory vLLM may take (weights + KV)
    max_model_len: int | None = None  # context length; shorter frees KV cache for more sequences
    enable_prefix_caching: bool | None = None  # True/False force it on/off
    dtype: str | None = None  # "auto", "float16", "bfloat16", ...
    extra_args: tuple[str, ...] = ()  # any other api_server flags, verbatim

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise validate.refuse("ServerConfig", "model", self.model, "a model folder or hub id",
                                  "pass the folder save_pretrained() wrote, e.g. str(lablib.models.embedded_path()).")
        validate.integer("ServerConfig", "port", self.port, "0 for a free port, or e.g. 8000.", 0, 65535)
        if self.api_key is None:
            object.__setattr__(self, "api_key", secrets.token_urlsafe(24))
        elif not isinstance(self.api_key, str) or not self.api_key or any(c.isspace() for c in self.api_key):
            raise validate.refuse("ServerConfig", "api_key", "<hidden>", "a non-empty string without spaces",
                                  "None for a random key.")
        for name in ("max_num_seqs", "max_model_len"):
            validate.optional_integer("ServerConfig", name, getattr(self, name), "or None for vLLM's default.")
        if self.gpu_memory_utilization is not None:
            validate.fraction("ServerConfig", "gpu_memory_utilization", self.gpu_memory_utilization, "e.g. 0.9.")
        validate.choice("ServerConfig", "enable_prefix_caching", self.enable_prefix_caching, (None, True, False))
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if not all(isinstance(a, str) for a in self.extra_args):
            raise validate.refuse("ServerConfig", "extra_args", self.extra_args, "a sequence of strings",
                                  "e.g. ('--max-num-batched-tokens', '2048').")

    @property
    def name(self) -> str:
        """The model name clients send."""
        return self.served_model_name or self.model

    def to_dict(self) -> dict[str, Any]:
        """The knobs a Result records (the API key left out)."""
        d = asdict(self)
        d.pop("api_key")
        d["extra_args"] = list(self.extra_args)
        return d
