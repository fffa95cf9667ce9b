// tools/cli/commands.h: each subcommand of the `sparsemla` CLI registers itself on the app.
#pragma once

#include <CLI/CLI.hpp>

namespace sparsemla::tools {
void register_format(CLI::App& app);     // sparsemla format
void register_selfcheck(CLI::App& app);  // sparsemla selfcheck
void register_run(CLI::App& app);        // sparsemla run
void register_bench(CLI::App& app);      // sparsemla bench
void register_serve_sim(CLI::App& app);  // sparsemla serve-sim
}  // namespace sparsemla::tools
