#pragma once
// Each subcommand lives in its own file (cli/cmd_<name>.cpp) and registers itself here.
#include <CLI/CLI.hpp>

namespace kiln::cli {

void register_commands(CLI::App& app);

// One registration function per subcommand file.
void register_info(CLI::App& app);
void register_tensor(CLI::App& app);
void register_quantize(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_template(CLI::App& app);
void register_run(CLI::App& app);
void register_chat(CLI::App& app);
void register_bench(CLI::App& app);
void register_synth(CLI::App& app);
void register_logits(CLI::App& app);

}  // namespace kiln::cli
