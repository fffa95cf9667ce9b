"""sparsemla: DeepSeek-V4 sparse MLA decode against an FP8 paged KV cache, with its cache writers,
list builders and decode plans (see docs/PYTHON.md); the planner and gate functions behind
`plan_decode` are in `sparsemla.testing`.

numpy arrays run on the CPU backend; torch CUDA tensors on the GPU, zero copy through DLPack, on
the tensor's current stream. When torch is importable the operations are also registered as
``torch.ops.sparsemla.*`` custom ops (set SPARSEMLA_NO_TORCH=1 to skip importing torch).
"""

import os as _os

# torch first (when present): its CUDA libraries load before the extension, which carries its own
# static CUDA runtime (both work in the driver's primary context, so pointers and streams are shared).
_torch = None
if not _os.environ.get("SPARSEMLA_NO_TORCH"):
    try:
        import torch as _torch
    except ImportError:
        _torch = None

from . import _C  # noqa: E402
from ._ops import (BYTES_PER_TOKEN, DEFAULT_SCALE, INDEXER_BYTES_PER_TOKEN, DecodePlan, Error,
                   alloc_ragged, bf16_bits_to_float, build_compressed_all_lists,
                   build_ragged_from_dense, build_rope_table, build_topk_lists, build_window_lists,
                   built_with_cuda, compress, compress_indexer, cpu_isa, decode_num_splits,
                   dequantize_indexer_rows, dequantize_rows, float_to_bf16_bits,
                   gather_indexer_keys, indexer_candidates_from_positions,
                   indexer_q_prep, indexer_topk, indexer_workspace_size, INDEXER_MAX_TOPK,
                   inverse_rope, is_supported, max_compressed_entries, merge_ranks,
                   plan_decode, plan_decode_for, quantize, quantize_indexer, sparse_decode,
                   shard_list, sparse_decode_reference, unsupported_reason, verify_decode_output,
                   write_compressor_state, write_window)

__version__ = _C.__version__

# True when torch.ops.sparsemla.* are registered.
HAS_TORCH_OPS = False
if _torch is not None:
    from . import torch_ops as _torch_ops  # noqa: E402,F401  (registers the custom ops)

    HAS_TORCH_OPS = True

from . import flashmla  # noqa: E402
from . import testing  # noqa: E402

__all__ = [
    "__version__", "alloc_ragged", "bf16_bits_to_float", "build_compressed_all_lists",
    "build_ragged_from_dense", "build_rope_table", "build_topk_lists", "build_window_lists",
    "built_with_cuda", "BYTES_PER_TOKEN", "compress", "compress_indexer", "cpu_isa",
    "decode_num_splits",
    "DecodePlan", "DEFAULT_SCALE", "dequantize_indexer_rows", "dequantize_rows", "Error",
    "flashmla", "float_to_bf16_bits", "gather_indexer_keys", "HAS_TORCH_OPS",
    "INDEXER_BYTES_PER_TOKEN", "indexer_candidates_from_positions", "INDEXER_MAX_TOPK",
    "indexer_q_prep", "indexer_topk", "indexer_workspace_size", "inverse_rope", "is_supported", "max_compressed_entries", "merge_ranks",
    "plan_decode", "plan_decode_for", "quantize", "quantize_indexer", "shard_list", "sparse_decode",
    "sparse_decode_reference", "testing", "unsupported_reason", "verify_decode_output",
    "write_compressor_state", "write_window",
]
