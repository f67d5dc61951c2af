// The `kiln` command: one binary, one subcommand per verb.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln - run open-weight language models on CPUs and NVIDIA GPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kiln 0.1.0");
  kiln::cli::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kiln::Error& e) {
    fmt::print(stderr, "kiln: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
