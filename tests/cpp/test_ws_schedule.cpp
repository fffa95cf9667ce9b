// The named-barrier protocol of the warp-specialised generic decode kernel
// (src/cuda/sm90/decode_partial_ws.cuh, schedule in ws_schedule.h), checked on the host for
// every tile count of a split: both warp groups' barrier events are replayed in every interleaving
// the barriers allow. Each barrier phase must get exactly one event of each group (128 QK + 256 PV
// threads = the count of 384), no reachable state may deadlock, and no group may take part in a
// phase of a barrier before that barrier's previous phase completed (the hardware counts arrivals,
// so such an early arrival would complete the previous phase with the wrong threads). The GPU suite
// runs the kernel itself at 0..8 tiles (GpuDecodeGeneric.Hb4EdgeTileCountsMatchHb1BitForBit).
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda/sm90/ws_schedule.h"

namespace sparsemla::test {
namespace {

namespace ws = cuda_generic::ws_schedule;

enum Barrier : int { kScores = 0, kPartFree = 1, kKFree0 = 2, kNumBarriers = 4 };
struct Event {
  int barrier;
  bool sync;  // bar.sync (waits for the phase to complete) or bar.arrive (does not wait)
};
enum Group : int { kQk = 0, kPv = 1 };

// The QK warps' barrier events over a split of n tiles, in program order (qk_loop): the Q.K of
// tile 0, then per iteration i the Q.K of tile i+1 beside the conversion of tile i+2.
std::vector<Event> qk_events(int32_t n) {
  std::vector<Event> e;
  if (n == 0) return e;
  e.push_back({kScores, false});
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (ws::qk_waits_k_free(i, n)) e.push_back({kKFree0 + ws::k_free_parity(i - 1), true});
    if (ws::qk_waits_part_free(i + 1)) e.push_back({kPartFree, true});
    e.push_back({kScores, false});
  }
  return e;
}

// The PV warps' events with the QK warps (pv_loop; their own 256-thread barriers left out).
std::vector<Event> pv_events(int32_t n) {
  std::vector<Event> e;
  for (int32_t i = 0; i < n; ++i) {
    e.push_back({kScores, true});
    if (ws::pv_arrives_part_free(i, n)) e.push_back({kPartFree, false});
    if (ws::pv_arrives_k_free(i, n)) e.push_back({kKFree0 + ws::k_free_parity(i), false});
  }
  return e;
}

struct Replay {
  std::array<std::vector<Event>, 2> events;

  // Events of group g on barrier b among its first `pc` events.
  int issued(int g, int pc, int b) const {
    int k = 0;
    for (int j = 0; j < pc; ++j) k += events[g][j].barrier == b ? 1 : 0;
    return k;
  }
  // Whether group g may execute its event at pc[g] now; an error message when doing so would
  // join a phase whose predecessor has not completed.
  bool can_step(const std::array<int, 2>& pc, int g, std::string* error) const {
    if (pc[g] >= static_cast<int>(events[g].size())) return false;
    const Event ev = events[g][pc[g]];
    const int phase = issued(g, pc[g], ev.barrier);
    const int other = issued(1 - g, pc[1 - g], ev.barrier);
    if (other < phase) {
      *error = "group " + std::to_string(g) + " joins phase " + std::to_string(phase) +
               " of barrier " + std::to_string(ev.barrier) + " before phase " +
               std::to_string(phase - 1) + " completed";
      return true;  // reachable: report it
    }
    // A sync waits until the other group's event of the same phase happened.
    return !ev.sync || other >= phase + 1;
  }
};

// What a walk over every interleaving met: the first early arrival, the first deadlock (a state
// where neither group can move before both are done), and whether both groups finished.
struct Exploration {
  std::string early_arrival;
  std::string deadlock;
  bool finished = false;
};

// Depth-first over the states (pc_qk, pc_pv); stops at the first early arrival or deadlock.
Exploration explore(const Replay& r) {
  Exploration x;
  std::set<std::pair<int, int>> seen;
  std::vector<std::array<int, 2>> stack = {{0, 0}};
  while (!stack.empty()) {
    const std::array<int, 2> pc = stack.back();
    stack.pop_back();
    if (!seen.insert({pc[0], pc[1]}).second) continue;
    const std::string at = " at (" + std::to_string(pc[0]) + ", " + std::to_string(pc[1]) + ")";
    const bool done = pc[kQk] == static_cast<int>(r.events[kQk].size()) &&
                      pc[kPv] == static_cast<int>(r.events[kPv].size());
    x.finished = x.finished || done;
    bool moved = false;
    for (int g : {kQk, kPv}) {
      std::string error;
      if (!r.can_step(pc, g, &error)) continue;
      if (!error.empty()) {
        x.early_arrival = error + at;
        return x;
      }
      std::array<int, 2> next = pc;
      ++next[g];
      stack.push_back(next);
      moved = true;
    }
    if (!done && !moved) {
      x.deadlock = "deadlock" + at;
      return x;
    }
  }
  return x;
}

void check_schedule(int32_t n) {
  SCOPED_TRACE("tiles=" + std::to_string(n));
  Replay r;
  r.events = {qk_events(n), pv_events(n)};
  for (int b = 0; b < kNumBarriers; ++b) {
    EXPECT_EQ(r.issued(kQk, static_cast<int>(r.events[kQk].size()), b),
              r.issued(kPv, static_cast<int>(r.events[kPv].size()), b))
        << "barrier " << b << ": unequal event counts";
  }
  const Exploration x = explore(r);
  EXPECT_TRUE(x.early_arrival.empty()) << x.early_arrival;
  EXPECT_TRUE(x.deadlock.empty()) << x.deadlock;
  EXPECT_TRUE(x.finished);
}

TEST(WsSchedule, EveryTileCountPairsEveryPhaseWithoutDeadlockOrEarlyArrival) {
  for (int32_t n = 0; n <= 48; ++n) check_schedule(n);
}

// The checker itself: a schedule in which the PV warps release K buffers on ONE barrier id (no
// parity) lets them arrive for tile i+1 before the QK warps waited for tile i; the checker must
// find that state.
TEST(WsSchedule, CheckerFindsAnEarlyArrivalWithoutTheParityIds) {
  const int32_t n = 8;
  Replay r;
  r.events = {qk_events(n), pv_events(n)};
  for (int g : {kQk, kPv}) {
    for (Event& e : r.events[g]) {
      if (e.barrier == kKFree0 + 1) e.barrier = kKFree0;
    }
  }
  EXPECT_FALSE(explore(r).early_arrival.empty());
}

}  // namespace
}  // namespace sparsemla::test
