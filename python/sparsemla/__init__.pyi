# Type stubs of the public sparsemla API (the functions live in _ops.py; docs/PYTHON.md describes
# shapes and dtypes). tests/python/test_stubs.py checks every public name and every parameter list
# here against the runtime module.
from typing import Any, Literal, TypedDict

from . import flashmla as flashmla
from . import testing as testing
from ._C import DecodeShape
from ._C import Error as Error

# A numpy array or a torch tensor (anything with __dlpack__); dtypes and shapes: docs/PYTHON.md.
_Array = Any
_Path = Literal["auto", "cpu", "cuda-generic", "cuda-sm90"]

__version__: str
BYTES_PER_TOKEN: int
INDEXER_BYTES_PER_TOKEN: int
INDEXER_MAX_TOPK: int
DEFAULT_SCALE: float
HAS_TORCH_OPS: bool

class DecodePlan:
    path: str
    num_splits: int
    num_sms: int
    adaptive_splits: bool
    one_wave: int
    fused_combine: bool
    head_blocks_per_cta: int
    workspace_bytes: int
    shape: DecodeShape
    packed: tuple[int, ...]
    def __init__(self, plan: Any) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class _VerifyResult(TypedDict):
    passed: bool
    elements: int
    special_mismatches: int
    tolerance_failures: int
    max_abs_error: float
    max_bound_ratio: float
    cosine_diff: float
    first_bad: int
    summary: str

def built_with_cuda() -> bool: ...
def cpu_isa() -> str: ...
def float_to_bf16_bits(x: _Array) -> _Array: ...
def bf16_bits_to_float(b: _Array) -> _Array: ...
def quantize(x: _Array, *, block: int = 64, sanitise: bool = True) -> tuple[_Array, _Array]: ...
def quantize_indexer(x: _Array) -> tuple[_Array, _Array]: ...
def dequantize_rows(cache: _Array, slots: _Array, *, block_size: int | None = None,
                    scrub: bool = True, out: _Array | None = None) -> _Array: ...
def dequantize_indexer_rows(cache: _Array, slots: _Array, *, block_size: int | None = None,
                            layout: Literal["normal", "shuffle"] = "normal",
                            out: _Array | None = None) -> _Array: ...
def build_rope_table(positions: int, layer: Literal["window", "compressed", "custom"] = "compressed", *,
                     theta: float = 10000.0, yarn: bool = False, yarn_factor: float = 16.0,
                     yarn_original_len: int = 65536, yarn_beta_fast: float = 32.0,
                     yarn_beta_slow: float = 1.0) -> _Array: ...
def inverse_rope(x: _Array, positions: _Array, rope: _Array, *, path: _Path = "auto") -> _Array: ...
def merge_ranks(rank_out: _Array, rank_lse: _Array, *, sink: _Array | None = None,
                positions: _Array | None = None, rope: _Array | None = None,
                out: _Array | None = None, lse: _Array | None = None, return_lse: bool = True,
                path: _Path = "auto") -> tuple[_Array, _Array | None]: ...
def shard_list(indices: _Array, indptr: _Array | None = None, *, num_ranks: int, rank: int,
               interleave: int = 1, num_slots: int = 0, lengths: _Array | None = None,
               width: int | None = None, row_valid: _Array | None = None,
               out: tuple[_Array, _Array] | None = None,
               path: _Path = "auto") -> tuple[_Array, _Array]: ...
def write_window(kv: _Array, positions: _Array, slots: _Array, rope: _Array, cache: _Array, *,
                 block_size: int | None = None, sanitise: bool = True,
                 path: _Path = "auto") -> _Array: ...
def write_compressor_state(kv: _Array, score: _Array, positions: _Array, state_slots: _Array,
                           state: _Array, *, ratio: int = 4, head_dim: int = 512,
                           ape: _Array | None = None, path: _Path = "auto") -> _Array: ...
def compress(positions: _Array, request_index: _Array, state_slots: _Array, out_slots: _Array,
             state_block_table: _Array, state: _Array, norm_weight: _Array, rope: _Array,
             cache: _Array, *, ratio: int = 4, block_size: int | None = None,
             norm_eps: float = 1e-06, sanitise: bool = True, two_stage: bool = False,
             scratch: _Array | None = None, path: _Path = "auto") -> _Array: ...
def compress_indexer(positions: _Array, request_index: _Array, state_slots: _Array,
                     out_slots: _Array, state_block_table: _Array, state: _Array,
                     norm_weight: _Array, rope: _Array, cache: _Array, *,
                     block_size: int | None = None, norm_eps: float = 1e-06,
                     sanitise: bool = True, two_stage: bool = False,
                     scratch: _Array | None = None, path: _Path = "auto") -> _Array: ...
def gather_indexer_keys(token_to_seq: _Array, cu_seqlen: _Array, block_table: _Array,
                        cache: _Array, *, block_size: int | None = None,
                        layout: Literal["normal", "shuffle"] = "normal",
                        k_fp8: _Array | None = None, k_scale: _Array | None = None,
                        path: _Path = "auto") -> tuple[_Array, _Array]: ...
def indexer_workspace_size(q: _Array, w: _Array, cache: _Array, block_table: _Array,
                           row_request: _Array, num_candidates: _Array, topk: int, *,
                           block_size: int | None = None,
                           layout: Literal["normal", "shuffle"] = "normal",
                           width: int | None = None,
                           order: Literal["by_index", "by_score"] = "by_index",
                           with_scores: bool = False, path: _Path = "auto") -> int: ...
def indexer_topk(q: _Array, w: _Array, cache: _Array, block_table: _Array, row_request: _Array,
                 num_candidates: _Array, topk: int, *, block_size: int | None = None,
                 layout: Literal["normal", "shuffle"] = "normal", width: int | None = None,
                 order: Literal["by_index", "by_score"] = "by_index", return_lengths: bool = False,
                 return_scores: bool = False, out: _Array | None = None,
                 lengths: _Array | None = None, scores: _Array | None = None,
                 workspace: _Array | None = None,
                 path: _Path = "auto") -> Any: ...
def indexer_candidates_from_positions(positions: _Array, *, out: _Array | None = None) -> _Array: ...
def indexer_q_prep(q: _Array, positions: _Array, rope: _Array, w_raw: _Array, *,
                   q_out: _Array | None = None, w_out: _Array | None = None,
                   path: _Path = "auto") -> tuple[_Array, _Array]: ...
def alloc_ragged(max_rows: int, width: int, like: _Array) -> tuple[_Array, _Array]: ...
def build_ragged_from_dense(dense: _Array, lengths: _Array, *, request_index: _Array | None = None,
                            num_slots: int = 0, row_valid: _Array | None = None,
                            out: tuple[_Array, _Array] | None = None,
                            path: _Path = "auto") -> tuple[_Array, _Array]: ...
def build_window_lists(positions: _Array, block_table: _Array, block_size: int, *,
                       request_index: _Array | None = None, window: int = 128,
                       width: int | None = None, row_valid: _Array | None = None,
                       out: tuple[_Array, _Array] | None = None,
                       path: _Path = "auto") -> tuple[_Array, _Array]: ...
def build_topk_lists(topk: _Array, block_table: _Array, block_size: int, *,
                     topk_length: _Array | None = None, request_index: _Array | None = None,
                     row_valid: _Array | None = None, out: tuple[_Array, _Array] | None = None,
                     path: _Path = "auto") -> tuple[_Array, _Array]: ...
def build_compressed_all_lists(positions: _Array, block_table: _Array, block_size: int,
                               max_compressed: int, *, ratio: int = 128,
                               request_index: _Array | None = None, width: int | None = None,
                               row_valid: _Array | None = None,
                               out: tuple[_Array, _Array] | None = None,
                               path: _Path = "auto") -> tuple[_Array, _Array]: ...
def max_compressed_entries(max_model_len: int, ratio: int = 128) -> int: ...
def plan_decode(num_tokens: int, num_heads: int, width_main: int, width_extra: int = 0, *,
                has_extra: bool | None = None, device: Any = "cpu", path: _Path = "auto",
                num_splits: int = 0, adaptive_splits: bool = False, deterministic: bool = False,
                num_sms: int = 0, caches_aligned: bool = True) -> DecodePlan: ...

# The keywords of the decode family (at run time **kwargs, checked against _C.DECODE_INPUTS and
# _C.DECODE_CONFIG); the stub spells them out.
def sparse_decode(q: _Array, main_cache: _Array, main_indices: _Array,
                  main_indptr: _Array | None = None, *, main_lengths: _Array | None = None,
                  extra_cache: _Array | None = None, extra_indices: _Array | None = None,
                  extra_indptr: _Array | None = None, extra_lengths: _Array | None = None,
                  sink: _Array | None = None, positions: _Array | None = None,
                  rope: _Array | None = None, main_block_size: int | None = None, main_width: int = 0,
                  main_rows_per_length: int = 1, extra_block_size: int | None = None,
                  extra_width: int = 0, extra_rows_per_length: int = 1, num_splits: int = 0,
                  num_sms: int = 0, adaptive_splits: bool = False, deterministic: bool = False,
                  extra_cache_sanitised: bool = False, kv_connector: bool = False,
                  scale: float | None = None, path: _Path = "auto", plan: DecodePlan | None = None,
                  out: _Array | None = None, lse: _Array | None = None,
                  workspace: _Array | None = None, return_lse: bool = False) -> Any: ...
def plan_decode_for(q: _Array, main_cache: _Array, main_indices: _Array,
                    main_indptr: _Array | None = None, **kwargs: Any) -> DecodePlan: ...
def decode_num_splits(q: _Array, main_cache: _Array, main_indices: _Array,
                      main_indptr: _Array | None = None, **kwargs: Any) -> int: ...
def unsupported_reason(q: _Array, main_cache: _Array, main_indices: _Array,
                       main_indptr: _Array | None = None, **kwargs: Any) -> str | None: ...
def is_supported(q: _Array, main_cache: _Array, main_indices: _Array,
                 main_indptr: _Array | None = None, **kwargs: Any) -> bool: ...
def sparse_decode_reference(q: _Array, main_cache: _Array, main_indices: _Array,
                            main_indptr: _Array | None = None, *, return_abs_mean: bool = False,
                            **kwargs: Any) -> tuple[Any, ...]: ...
def verify_decode_output(out: _Array, ref: _Array, abs_mean: _Array) -> _VerifyResult: ...

__all__ = [
    "__version__", "alloc_ragged", "bf16_bits_to_float", "build_compressed_all_lists",
    "build_ragged_from_dense", "build_rope_table", "build_topk_lists", "build_window_lists",
    "built_with_cuda", "BYTES_PER_TOKEN", "compress", "compress_indexer", "cpu_isa",
    "decode_num_splits",
    "DecodePlan", "DEFAULT_SCALE", "dequantize_indexer_rows", "dequantize_rows", "Error",
    "flashmla", "float_to_bf16_bits", "gather_indexer_keys", "HAS_TORCH_OPS",
    "INDEXER_BYTES_PER_TOKEN", "indexer_candidates_from_positions", "INDEXER_MAX_TOPK",
    "indexer_q_prep", "indexer_topk", "indexer_workspace_size", "inverse_rope", "is_supported", "max_compressed_entries",
    "merge_ranks", "plan_decode", "plan_decode_for", "quantize", "quantize_indexer", "shard_list",
    "sparse_decode",
    "sparse_decode_reference", "testing", "unsupported_reason", "verify_decode_output",
    "write_compressor_state", "write_window",
]
