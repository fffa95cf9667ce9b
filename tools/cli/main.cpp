// The `sparsemla` command-line tool.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "sparsemla/error.h"

int main(int argc, char** argv) {
  CLI::App app{"sparsemla: DeepSeek-V4 sparse MLA decode against an FP8 paged KV cache"};
  app.require_subcommand(1);
  sparsemla::tools::register_format(app);
  sparsemla::tools::register_selfcheck(app);
  sparsemla::tools::register_run(app);
  sparsemla::tools::register_bench(app);
  sparsemla::tools::register_serve_sim(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const sparsemla::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
