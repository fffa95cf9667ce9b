// PLACEHOLDER (to be replaced by its owner): throws so nothing silently succeeds.
#include "sparsemla/error.h"
#include "sparsemla/plan.h"
namespace sparsemla {
int64_t plan_head_blocks(int32_t) { throw Error("not implemented"); }
int64_t plan_iters(int64_t, int64_t, int64_t) { throw Error("not implemented"); }
int32_t plan_generic(const PlanShape&) { throw Error("not implemented"); }
int32_t plan_specialised_ref(const PlanShape&) { throw Error("not implemented"); }
int32_t adaptive_one_wave(const PlanShape&, int32_t) { throw Error("not implemented"); }
int32_t adaptive_active_splits(int64_t, int64_t, int32_t, int32_t) { throw Error("not implemented"); }
}  // namespace sparsemla
