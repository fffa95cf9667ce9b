// sparsemla/sparsemla.h: the whole public API.
#pragma once

#include "sparsemla/backend.h"
#include "sparsemla/context_parallel.h"
#include "sparsemla/decode.h"
#include "sparsemla/error.h"
#include "sparsemla/format.h"
#include "sparsemla/gather.h"
#include "sparsemla/indexer.h"
#include "sparsemla/indexer_prep.h"
#include "sparsemla/lists.h"
#include "sparsemla/numerics.h"
#include "sparsemla/plan.h"
#include "sparsemla/rope.h"
#include "sparsemla/verify.h"
#include "sparsemla/version.h"
#include "sparsemla/writer.h"
