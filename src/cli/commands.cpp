#include "cli/commands.h"

namespace kiln::cli {

void register_commands(CLI::App& app) {
  (void)app;
}

}  // namespace kiln::cli
