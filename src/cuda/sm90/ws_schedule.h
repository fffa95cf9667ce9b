// src/cuda/sm90/ws_schedule.h: which named barriers the two warp groups of the warp-specialised
// decode kernel (decode_partial_ws.cuh) take part in at tile i of a split of n tiles. Host and
// device code: the kernel's loops call these, and tests/cpp/test_ws_schedule.cpp replays both
// groups' barrier sequences for every n to prove that each barrier phase gets exactly one event of
// each group and that no group can arrive at a phase before the previous phase of that barrier
// completed (the hardware counts arrivals, not phases).
//
// In program order: the QK warps run Q.K(0) -> arrive kScores, then per iteration i < n - 1:
//             [wait kKFree[parity(i - 1)] if qk_waits_k_free] -> [wait kPartFree if
//             qk_waits_part_free(i + 1)] -> Q.K(i+1) beside the conversion of tile i+2 (if
//             qk_converts) -> arrive kScores;
// per tile i the PV warps: wait kScores -> read scores(i) -> [arrive kPartFree if
// pv_arrives_part_free] ->
//             softmax, P.V(i) -> [arrive kKFree[parity(i)] if pv_arrives_k_free]
#pragma once

#include <cstdint>

#include "sparsemla/format.h"  // SPARSEMLA_HOST_DEVICE

namespace sparsemla::cuda_generic::ws_schedule {

// The QK warps' Q.K of tile i overwrites the scores of tile i-1: it waits until the PV warps
// read them.
SPARSEMLA_HOST_DEVICE constexpr bool qk_waits_part_free(int32_t i) {
  return i > 0;
}
// The PV warps release the scores of tile i when a Q.K of tile i+1 will wait for them.
SPARSEMLA_HOST_DEVICE constexpr bool pv_arrives_part_free(int32_t i, int32_t n) {
  return qk_waits_part_free(i + 1) && i + 1 < n;
}
// In iteration i the QK warps convert tile i+2 (when there is one) into K buffer (i + 2) % 3,
// which held tile i-1: from i = 1 on they wait for its P.V.
SPARSEMLA_HOST_DEVICE constexpr bool qk_converts(int32_t i, int32_t n) {
  return i + 2 < n;
}
SPARSEMLA_HOST_DEVICE constexpr bool qk_waits_k_free(int32_t i, int32_t n) {
  return i >= 1 && qk_converts(i, n);
}
// The PV warps release K buffer i % 3 after the P.V of tile i when the QK warps' iteration i+1
// waits for it.
SPARSEMLA_HOST_DEVICE constexpr bool pv_arrives_k_free(int32_t i, int32_t n) {
  return qk_waits_k_free(i + 1, n);
}
// kKFree alternates between two barrier ids by the released tile's parity: the PV warps may
// release tile i+1 before the QK warps have waited for tile i.
SPARSEMLA_HOST_DEVICE constexpr int32_t k_free_parity(int32_t tile) {
  return tile & 1;
}

}  // namespace sparsemla::cuda_generic::ws_schedule
