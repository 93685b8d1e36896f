"""What runs: model specs and presets, checkpoint checks, architectures, synthetic checkpoints, drafters.

No torch at import: loading a model (transformers) happens inside the functions that load one.
"""
from .architecture import (
                   LABEL,
                   architectures,
                   bytes_per_element,
                   kv_bytes_per_token,
                   parameter_count,
                   shape,
)
from .presets import DEFAULT_MODEL, EMBEDDED, PRESETS, resolve_model
from .spec import (
                   ModelSpec,
                   check_model_dir,
                   check_tokenizer,
                   embedded_path,
                   load_hf_model,
                   load_tokenizer,
                   prompt_tokenizer,
)
from .synthetic import make_synthetic, synthetic_spec

__all__ = ["LABEL", "architectures", "bytes_per_element", "kv_bytes_per_token", "parameter_count", "shape",
           "DEFAULT_MODEL", "EMBEDDED", "PRESETS", "resolve_model", "ModelSpec", "check_model_dir", "check_tokenizer",
           "embedded_path", "load_hf_model", "load_tokenizer", "prompt_tokenizer", "make_synthetic", "synthetic_spec"]
