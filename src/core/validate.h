// src/core/validate.h: argument validation of every public operation (throws sparsemla::Error).
// One function per params struct; shared checks for the views they contain.
#pragma once

#include "sparsemla/decode.h"
#include "sparsemla/gather.h"
#include "sparsemla/lists.h"
#include "sparsemla/writer.h"

namespace sparsemla::core {

// Shared pieces (src/core/validate.cpp).
void check_cache(const char* op, const char* arg, const CacheView& c);
void check_indexer_cache(const char* op, const char* arg, const IndexerCacheView& c);
void check_rope(const char* op, const char* arg, const RopeTable& r);
void check_state(const char* op, const char* arg, const StateCacheView& s, int64_t row_width);
void check_nonneg(const char* op, const char* arg, int64_t v);

// Per operation (src/core/validate_writers.cpp, validate_gather.cpp, validate_decode.cpp,
// validate_lists.cpp).
void validate(const WindowWriterParams& p);
void validate(const StateWriterParams& p);
void validate(const CompressorParams& p);
void validate(const IndexerCompressorParams& p);
void validate(const GatherParams& p);
void validate(const DecodeParams& p);
void validate(const DenseToRaggedParams& p);
void validate(const WindowListParams& p);
void validate(const TopkListParams& p);
void validate(const CompressedAllListParams& p);

// Host-data checks of the list builders (request_index in range, positions >= 0 for valid rows),
// which read the row inputs: the CPU backend runs them before writing anything.
void validate_rows(const DenseToRaggedParams& p);
void validate_rows(const WindowListParams& p);
void validate_rows(const TopkListParams& p);
void validate_rows(const CompressedAllListParams& p);

}  // namespace sparsemla::core
