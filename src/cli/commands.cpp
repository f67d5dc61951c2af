#include "cli/commands.h"

namespace kiln::cli {

void register_commands(CLI::App& app) {
  register_info(app);
  register_tensor(app);
  register_quantize(app);
  register_tokenize(app);
  register_template(app);
  register_run(app);
  register_chat(app);
  register_bench(app);
  register_synth(app);
  register_logits(app);
}

}  // namespace kiln::cli
