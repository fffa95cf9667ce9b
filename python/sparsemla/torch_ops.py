"""torch.ops.sparsemla.*: the operations as torch custom ops (imported by sparsemla when torch is).

Every op is destination-passing: it writes into tensors the caller allocated and declares them in
``mutates_args``, returns nothing (``sparse_decode`` also has a functional form returning
``(out, lse)``), never synchronises with the host and never reads tensor data on the host, so the
ops are opaque nodes under ``torch.compile(fullgraph=True)`` (fake implementations give the shapes)
and can be captured in ``torch.cuda.graph``. CUDA work goes to the current stream of the tensors'
device. The public functions of ``sparsemla`` call these ops when given torch tensors; the ops take
the same arguments positionally (``block_size`` 0: from the cache's shape), the decode its arrays
as one list, its integer options as another and its plan as integers (``DecodePlan.packed``).
"""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _ops

_NS = "sparsemla::"
_LIB = torch.library


def _op(name, mutates):
    return _LIB.custom_op(_NS + name, mutates_args=mutates)


@_op("write_window", ("cache",))
def write_window(kv: Tensor, positions: Tensor, slots: Tensor, rope: Tensor, cache: Tensor,
                 block_size: int, sanitise: bool, path: str) -> None:
    """Window writer (sparsemla.write_window)."""
    _ops._r_write_window(kv, positions, slots, rope, cache, block_size, sanitise, path)


@_op("write_compressor_state", ("state",))
def write_compressor_state(kv: Tensor, score: Tensor, ape: Optional[Tensor], positions: Tensor,
                           state_slots: Tensor, state: Tensor, ratio: int, head_dim: int,
                           path: str) -> None:
    """Compressor state writer (sparsemla.write_compressor_state)."""
    _ops._r_write_compressor_state(kv, score, ape, positions, state_slots, state, ratio, head_dim,
                                   path)


@_op("compress", ("cache", "scratch"))
def compress(positions: Tensor, request_index: Tensor, state_slots: Tensor, out_slots: Tensor,
             state_block_table: Tensor, state: Tensor, norm_weight: Tensor, rope: Tensor,
             cache: Tensor, block_size: int, ratio: int, norm_eps: float, sanitise: bool,
             scratch: Optional[Tensor], path: str) -> None:
    """KV compressor (sparsemla.compress)."""
    _ops._r_compress(positions, request_index, state_slots, out_slots, state_block_table, state,
                     norm_weight, rope, cache, block_size, ratio, norm_eps, sanitise, scratch, path)


@_op("compress_indexer", ("cache", "scratch"))
def compress_indexer(positions: Tensor, request_index: Tensor, state_slots: Tensor,
                     out_slots: Tensor, state_block_table: Tensor, state: Tensor,
                     norm_weight: Tensor, rope: Tensor, cache: Tensor, block_size: int,
                     norm_eps: float, sanitise: bool, scratch: Optional[Tensor],
                     path: str) -> None:
    """Indexer-key compressor (sparsemla.compress_indexer)."""
    _ops._r_compress_indexer(positions, request_index, state_slots, out_slots, state_block_table,
                             state, norm_weight, rope, cache, block_size, norm_eps, sanitise,
                             scratch, path)


@_op("gather_indexer_keys", ("k_fp8", "k_scale"))
def gather_indexer_keys(token_to_seq: Tensor, cu_seqlen: Tensor, block_table: Tensor,
                        cache: Tensor, block_size: int, layout: str, k_fp8: Tensor,
                        k_scale: Tensor, path: str) -> None:
    """Indexer-key gather (sparsemla.gather_indexer_keys)."""
    _ops._r_gather_indexer_keys(token_to_seq, cu_seqlen, block_table, cache, block_size, layout,
                                k_fp8, k_scale, path)


@_op("build_ragged_from_dense", ("out_indices", "out_indptr"))
def build_ragged_from_dense(dense: Tensor, lengths: Tensor, request_index: Optional[Tensor],
                            num_slots: int, row_valid: Optional[Tensor], out_indices: Tensor,
                            out_indptr: Tensor, path: str) -> None:
    """Dense rows + lengths -> ragged list (sparsemla.build_ragged_from_dense)."""
    _ops._r_build_ragged_from_dense(dense, lengths, request_index, num_slots, row_valid,
                                    out_indices, out_indptr, path)


@_op("build_window_lists", ("out_indices", "out_indptr"))
def build_window_lists(positions: Tensor, request_index: Optional[Tensor], block_table: Tensor,
                       block_size: int, window: int, width: int, row_valid: Optional[Tensor],
                       out_indices: Tensor, out_indptr: Tensor, path: str) -> None:
    """Window lists (sparsemla.build_window_lists)."""
    _ops._r_build_window_lists(positions, request_index, block_table, block_size, window, width,
                               row_valid, out_indices, out_indptr, path)


@_op("build_topk_lists", ("out_indices", "out_indptr"))
def build_topk_lists(topk: Tensor, topk_length: Optional[Tensor], request_index: Optional[Tensor],
                     block_table: Tensor, block_size: int, row_valid: Optional[Tensor],
                     out_indices: Tensor, out_indptr: Tensor, path: str) -> None:
    """Ratio-4 top-k lists (sparsemla.build_topk_lists)."""
    _ops._r_build_topk_lists(topk, topk_length, request_index, block_table, block_size, row_valid,
                             out_indices, out_indptr, path)


@_op("build_compressed_all_lists", ("out_indices", "out_indptr"))
def build_compressed_all_lists(positions: Tensor, request_index: Optional[Tensor],
                               block_table: Tensor, block_size: int, ratio: int,
                               max_compressed: int, width: int, row_valid: Optional[Tensor],
                               out_indices: Tensor, out_indptr: Tensor, path: str) -> None:
    """Ratio-128 lists (sparsemla.build_compressed_all_lists)."""
    _ops._r_build_compressed_all_lists(positions, request_index, block_table, block_size, ratio,
                                       max_compressed, width, row_valid, out_indices, out_indptr,
                                       path)


@_op("inverse_rope", ("x",))
def inverse_rope(x: Tensor, positions: Tensor, rope: Tensor, path: str) -> None:
    """Standalone inverse RoPE in place (sparsemla.inverse_rope)."""
    _ops._r_inverse_rope(x, positions, rope, path)


@_op("indexer_topk", ("indices", "lengths", "scores", "workspace"))
def indexer_topk(q: Tensor, w: Tensor, cache: Tensor, block_table: Tensor, row_request: Tensor,
                 num_candidates: Tensor, topk: int, block_size: int, layout: str, order: str,
                 indices: Tensor, lengths: Optional[Tensor], scores: Optional[Tensor],
                 workspace: Optional[Tensor], path: str) -> None:
    """Lightning-indexer top-k into indices (and lengths, scores) (sparsemla.indexer_topk). A
    missing workspace is allocated on the current stream when the size query asks for one."""
    _ops._r_indexer_topk(q, w, cache, block_table, row_request, num_candidates, topk, block_size,
                         layout, order, indices, lengths, scores, workspace, path)


@_op("indexer_q_prep", ("q_out", "w_out"))
def indexer_q_prep(q: Tensor, positions: Tensor, rope: Tensor, w_raw: Tensor, q_out: Tensor,
                   w_out: Tensor, path: str) -> None:
    """Indexer query prep (sparsemla.indexer_q_prep)."""
    _ops._r_indexer_q_prep(q, positions, rope, w_raw, q_out, w_out, path)


@_op("merge_ranks", ("out", "lse"))
def merge_ranks(rank_out: Tensor, rank_lse: Tensor, sink: Optional[Tensor],
                positions: Optional[Tensor], rope: Optional[Tensor], out: Tensor,
                lse: Optional[Tensor], path: str) -> None:
    """Context-parallel merge of the ranks' (out, lse), sink applied once (sparsemla.merge_ranks)."""
    _ops._r_merge_ranks(rank_out, rank_lse, sink, positions, rope, out, lse, path)


@_op("shard_list", ("out_indices", "out_indptr"))
def shard_list(indices: Tensor, indptr: Optional[Tensor], lengths: Optional[Tensor],
               num_ranks: int, rank: int, interleave: int, num_slots: int,
               row_valid: Optional[Tensor], out_indices: Tensor, out_indptr: Tensor, width: int,
               path: str) -> None:
    """One rank's part of a list, local slot ids (sparsemla.shard_list)."""
    _ops._r_shard_list(indices, indptr, lengths, num_ranks, rank, interleave, num_slots,
                       row_valid, out_indices, out_indptr, width, path)


@_op("sparse_decode_out", ("out", "lse", "workspace"))
def sparse_decode_out(inputs: List[Optional[Tensor]], out: Tensor, lse: Optional[Tensor],
                      workspace: Optional[Tensor], config: List[int], scale: float, path: str,
                      plan: Optional[List[int]]) -> None:
    """Sparse decode into out (and lse) (sparsemla.sparse_decode). inputs: the arrays named by
    sparsemla._C.DECODE_INPUTS (None where absent); config: the integers of _C.DECODE_CONFIG;
    plan: a DecodePlan's ``packed`` integers, or None (the call plans itself). A missing workspace
    is allocated on the current stream when the plan needs one (graph-safe: the caching allocator
    serves captures)."""
    _ops._r_sparse_decode(inputs, out, lse, workspace, config, scale, path, plan)


@_op("sparse_decode", ())
def sparse_decode(inputs: List[Optional[Tensor]], config: List[int], scale: float, path: str,
                  plan: Optional[List[int]]) -> Tuple[Tensor, Tensor]:
    """Functional sparse decode: returns (out bf16 [T, H, 512], lse fp32 [T, H])."""
    q = inputs[0]
    out = torch.empty((q.shape[0], q.shape[1], 512), dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    _ops._r_sparse_decode(inputs, out, lse, None, config, scale, path, plan)
    return out, lse


@sparse_decode.register_fake
def _(inputs, config, scale, path, plan):
    q = inputs[0]
    return (q.new_empty((q.shape[0], q.shape[1], 512)),
            q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))


def _no_output(*args, **kwargs):
    """The fake implementation of the destination-passing ops: nothing to return."""
    return None


for _dest in (write_window, write_compressor_state, compress, compress_indexer, gather_indexer_keys,
              build_ragged_from_dense, build_window_lists, build_topk_lists,
              build_compressed_all_lists, inverse_rope, indexer_topk, indexer_q_prep,
              merge_ranks, shard_list, sparse_decode_out):
    _dest.register_fake(_no_output)

_ops._TORCH = torch
