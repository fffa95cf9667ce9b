"""sparsemla.testing: the planner and gate functions behind `plan_decode`, for tests and studies.

Engines do not need these: `sparsemla.plan_decode` makes every decision they make. They are the
reference functions of docs/CONTRACT.md 4.4 (planners), 4.5 (adaptive splits), 5 (the provenance
gate) and 7 (the architecture gate), and the measured path rule `auto_prefers_sm90` (docs/PERF.md),
exposed so that tests can pin their values.
"""

from ._ops import (adaptive_active_splits, adaptive_one_wave, auto_prefers_sm90,
                   may_skip_extra_scrub, plan_generic, plan_iters, plan_sm90_tuned,
                   plan_specialised_ref, select_gpu_path)

__all__ = [
    "adaptive_active_splits", "adaptive_one_wave", "auto_prefers_sm90", "may_skip_extra_scrub",
    "plan_generic", "plan_iters", "plan_sm90_tuned", "plan_specialised_ref", "select_gpu_path",
]
