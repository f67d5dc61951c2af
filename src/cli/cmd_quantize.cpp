// `kiln quantize IN.gguf OUT.gguf TYPE`: converts a model's matrices to TYPE.
#include <fmt/core.h>

#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "cli/format.h"
#include "cli/progress.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "quant/model_quantizer.h"
#include "quant/quant.h"

namespace kiln::cli {
namespace {

struct QuantizeCli {
  std::string input, output, type;
  int threads = 0;
  bool allow_requantize = false;
};

std::string quantizable_type_names() {
  std::string out;
  size_t n = 0;
  const TypeTraits* all = all_types(&n);
  for (size_t i = 0; i < n; ++i)
    if (can_quantize(all[i].type) && all[i].type != GgmlType::Q8_1 && all[i].type != GgmlType::Q8_K)
      out += (out.empty() ? "" : ", ") + std::string(all[i].name);
  return out;
}

void run(const QuantizeCli& cli) {
  const auto type = type_from_name(cli.type);
  if (!type || !can_quantize(*type) || *type == GgmlType::Q8_1 || *type == GgmlType::Q8_K)
    fail("cannot quantize into '{}'; kiln quantizes into: {}", cli.type, quantizable_type_names());
  if (cli.input == cli.output) fail("input and output are the same file: {}", cli.input);

  auto input = gguf::File::open(cli.input);
  ProgressBar bar(fmt::format("quantizing to {}", type_name(*type)));
  QuantizeOptions options;
  options.type = *type;
  options.threads = cli.threads;
  options.allow_requantize = cli.allow_requantize;
  options.progress = [&](uint64_t done, uint64_t total, const std::string& name) { bar.update(done, total, name); };

  const auto start = std::chrono::steady_clock::now();
  const QuantizeReport r = quantize_model(*input, cli.output, options);
  bar.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(stderr, "{}: {} matrices to {}, {} to a fallback type (rows not whole blocks), {} kept; {} -> {} in {:.1f}s\n",
             cli.output, r.tensors_quantized, type_name(*type), r.tensors_fallback, r.tensors_kept,
             human_bytes(r.input_bytes), human_bytes(r.output_bytes), seconds);
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto cli = std::make_shared<QuantizeCli>();
  auto* cmd = app.add_subcommand("quantize", "Convert a model's weight matrices to another tensor type");
  cmd->add_option("input", cli->input, "Input GGUF (weights F32, F16 or BF16)")->required();
  cmd->add_option("output", cli->output, "Output GGUF file")->required();
  cmd->add_option("type", cli->type, "Target type, e.g. q4_0, q8_0, q4_K, q6_K, iq4_nl, mxfp4, f16")->required();
  cmd->add_option("-t,--threads", cli->threads, "Threads (default: all cores)");
  cmd->add_flag("--allow-requantize", cli->allow_requantize, "Accept inputs whose matrices are already quantized");
  cmd->footer("Norms, vectors and MoE routers stay in float. Matrices whose rows are not whole blocks of TYPE\n"
              "get the nearest type that fits (e.g. q4_K -> q4_0 -> f16).");
  cmd->callback([cli] { run(*cli); });
}

}  // namespace kiln::cli
