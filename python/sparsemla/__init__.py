"""sparsemla: DeepSeek-V4 sparse MLA decode against an FP8 paged KV cache, with its cache writers,
list builders, decode plans, planners and gates (see docs/PYTHON.md).

numpy arrays run on the CPU backend; torch CUDA tensors on the GPU, zero copy through DLPack, on
the tensor's current stream. When torch is importable the operations are also registered as
``torch.ops.sparsemla.*`` custom ops (set SPARSEMLA_NO_TORCH=1 to skip importing torch).
"""

import os as _os

# torch first (when present): its CUDA runtime is then the one the extension binds to as well.
_torch = None
if not _os.environ.get("SPARSEMLA_NO_TORCH"):
    try:
        import torch as _torch
    except ImportError:
        _torch = None

from . import _C  # noqa: E402
from ._ops import (BYTES_PER_TOKEN, DEFAULT_SCALE, INDEXER_BYTES_PER_TOKEN, DecodePlan, Error,
                   adaptive_active_splits, adaptive_one_wave, alloc_ragged, auto_prefers_sm90,
                   bf16_bits_to_float,
                   build_compressed_all_lists, build_ragged_from_dense, build_rope_table,
                   build_topk_lists, build_window_lists, built_with_cuda, compress,
                   compress_indexer, decode_num_splits, dequantize_indexer_rows, dequantize_rows,
                   float_to_bf16_bits, gather_indexer_keys, inverse_rope, is_supported,
                   max_compressed_entries, may_skip_extra_scrub, plan_decode, plan_decode_for,
                   plan_generic, plan_iters, plan_sm90_tuned, plan_specialised_ref, quantize,
                   quantize_indexer, select_gpu_path, sparse_decode, sparse_decode_reference,
                   unsupported_reason, verify_decode_output, write_compressor_state, write_window)

__version__ = _C.__version__

# True when torch.ops.sparsemla.* are registered.
HAS_TORCH_OPS = False
if _torch is not None:
    from . import torch_ops as _torch_ops  # noqa: E402,F401  (registers the custom ops)

    HAS_TORCH_OPS = True

from . import flashmla  # noqa: E402

__all__ = [
    "BYTES_PER_TOKEN", "DEFAULT_SCALE", "INDEXER_BYTES_PER_TOKEN", "DecodePlan", "Error",
    "HAS_TORCH_OPS", "__version__", "adaptive_active_splits", "adaptive_one_wave", "alloc_ragged",
    "auto_prefers_sm90", "bf16_bits_to_float", "build_compressed_all_lists",
    "build_ragged_from_dense", "build_rope_table", "build_topk_lists", "build_window_lists",
    "built_with_cuda", "compress", "compress_indexer", "decode_num_splits",
    "dequantize_indexer_rows", "dequantize_rows", "flashmla", "float_to_bf16_bits",
    "gather_indexer_keys", "inverse_rope", "is_supported", "max_compressed_entries",
    "may_skip_extra_scrub", "plan_decode", "plan_decode_for", "plan_generic", "plan_iters",
    "plan_sm90_tuned", "plan_specialised_ref", "quantize", "quantize_indexer", "select_gpu_path",
    "sparse_decode", "sparse_decode_reference", "unsupported_reason", "verify_decode_output",
    "write_compressor_state", "write_window",
]
