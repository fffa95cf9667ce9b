# Type stubs of sparsemla.flashmla (checked by tests/python/test_stubs.py).
from typing import Any

from . import DecodePlan

class FlashMLASchedMeta:
    have_initialized: bool
    config: Any
    plan: DecodePlan | None
    shape: tuple[int, int, int, int, int | None] | None
    def __init__(self) -> None: ...

def get_mla_metadata(*args: Any, **kwargs: Any) -> tuple[FlashMLASchedMeta, None]: ...
def flash_mla_with_kvcache(q: Any, k_cache: Any, block_table: Any, cache_seqlens: Any,
                           head_dim_v: int, tile_scheduler_metadata: FlashMLASchedMeta | None,
                           num_splits: Any = None, softmax_scale: float | None = None,
                           causal: bool = False, is_fp8_kvcache: bool = True,
                           indices: Any = None, attn_sink: Any = None,
                           extra_k_cache: Any = None, extra_indices_in_kvcache: Any = None,
                           topk_length: Any = None,
                           extra_topk_length: Any = None) -> tuple[Any, Any]: ...
