// Every architecture's tiny reference model (testdata/arch) on the CUDA backend:
//   - prefill logits against HF transformers: relative L2 error <= 3e-3 per position;
//   - greedy continuation (prefill + 15 single-token decode steps, replayed as CUDA graphs)
//     equal to HF generate's ids, with the host feeding the argmax back and with the argmax
//     kept on the device;
//   - exact mode against the CPU backend: relative L2 <= 1e-5 per position;
//   - decode replayed from graphs equals eager decode (logits within 1e-5 relative L2).
// Skips, saying so, where no GPU is present.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_support.h"
#include "model/model_test_util.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

// A model on any backend with prefill / greedy helpers (the CPU tests' LoadedModel, with
// the backend passed in).
struct DeviceModel {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;

  DeviceModel(const std::filesystem::path& path, std::unique_ptr<Backend> b)
      : file(gguf::File::open(path.string())), backend(std::move(b)), model(Model::load(*file, *backend)) {}
  int vocab() const { return model->hparams().n_vocab; }

  std::vector<float> prefill_logits(const std::vector<int32_t>& ids) {
    return prefill_all_logits(*model, *backend, ids, 128);
  }

  // Greedy decoding; every step's logits are appended to `all_logits` when given.
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int n, std::vector<float>* all_logits = nullptr) {
    return greedy_decode(*model, *backend, prompt, n, 256, all_logits);
  }
};

std::unique_ptr<Backend> cuda_backend(bool exact, bool graphs) {
  CudaOptions o;
  o.exact = exact;
  o.graphs = graphs;
  return std::make_unique<CudaBackend>(o);
}

class CudaArchReference : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaArchReference, PrefillLogitsMatchTransformers) {
  KILN_REQUIRE_GPU();
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  KILN_REQUIRE_TESTDATA(logits_path, "arch/" + ref["logits_file"].get<std::string>());
  const std::vector<float> expected = read_f32_file(logits_path);
  const int64_t rows = ref["logits_shape"][0], vocab = ref["logits_shape"][1];
  const int64_t first = ref["logits_first_position"];

  DeviceModel m(gguf_path, cuda_backend(false, true));
  ASSERT_EQ(m.vocab(), vocab);
  const std::vector<int32_t> ids = to_ids(ref["ids"]);
  const std::vector<float> logits = m.prefill_logits(ids);
  ASSERT_EQ(int64_t(logits.size()), int64_t(ids.size()) * vocab);
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* ours = logits.data() + (first + r) * vocab;
    const float* theirs = expected.data() + r * vocab;
    const double err = relative_l2(ours, theirs, vocab);
    worst = std::max(worst, err);
    EXPECT_LE(err, 3e-3) << name << " position " << first + r << ": logit[0] ours " << ours[0] << " theirs "
                         << theirs[0] << ", argmax ours " << argmax_row(ours, vocab) << " theirs "
                         << argmax_row(theirs, vocab);
  }
  std::printf("[ cuda %s ] max relative L2 error vs HF over %lld positions: %.3g\n", name.c_str(), (long long)rows,
              worst);
}

// Two ways of decoding greedily: the host reads each step's logits and feeds the argmax
// back, and the device keeps the argmax (Model::forward_greedy) with the host one step ahead.
// Both run their decode steps as graph replays.
TEST_P(CudaArchReference, GreedyDecodeMatchesTransformers) {
  KILN_REQUIRE_GPU();
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  const std::vector<int32_t> prompt = to_ids(ref["greedy_prompt_ids"]);
  const std::vector<int32_t> expected = to_ids(ref["greedy_continuation_ids"]);
  const int n = int(expected.size());
  for (const bool on_device : {false, true}) {
    const std::string label = "cuda " + name + (on_device ? " (argmax on the device)" : "");
    auto backend = std::make_unique<CudaBackend>(CudaOptions{});
    CudaBackend* cuda = backend.get();
    DeviceModel m(gguf_path, std::move(backend));
    const std::vector<int32_t> got =
        on_device ? greedy_decode_on_device(*m.model, *cuda, prompt, n) : m.greedy(prompt, n);
    expect_same_tokens(got, expected, label);
    // The decode steps ran from graphs: captures of the prompt's pass, the first step's (its
    // token uploaded) and the later steps' shapes, once for each step slot (step_io.h); the
    // rest replays.
    EXPECT_GE(cuda->graphs().replays(), int64_t(n) - 1 - 2 * cuda::StepIo::kSlots)
        << label << ": decode steps were not replayed";
    std::printf("[ %s ] graphs: %lld captured, %lld replayed, %lld eager passes\n", label.c_str(),
                (long long)cuda->graphs().captures(), (long long)cuda->graphs().replays(),
                (long long)cuda->graphs().eager_passes());
  }
}

TEST_P(CudaArchReference, ExactModeMatchesCpu) {
  KILN_REQUIRE_GPU();
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  const std::vector<int32_t> ids = to_ids(ref["ids"]);
  DeviceModel cpu(gguf_path, std::make_unique<CpuBackend>());
  DeviceModel gpu(gguf_path, cuda_backend(true, false));
  const std::vector<float> want = cpu.prefill_logits(ids), got = gpu.prefill_logits(ids);
  ASSERT_EQ(got.size(), want.size());
  const int64_t vocab = cpu.vocab();
  double worst = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    const double err = relative_l2(got.data() + r * vocab, want.data() + r * vocab, vocab);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-5) << name << " position " << r;
  }
  std::printf("[ cuda %s ] exact mode: max relative L2 vs CPU %.3g\n", name.c_str(), worst);
}

TEST_P(CudaArchReference, GraphDecodeEqualsEagerDecode) {
  KILN_REQUIRE_GPU();
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  const std::vector<int32_t> prompt = to_ids(ref["greedy_prompt_ids"]);
  std::vector<float> eager_logits, graph_logits;
  DeviceModel eager(gguf_path, cuda_backend(false, false));
  DeviceModel graphed(gguf_path, cuda_backend(false, true));
  const auto a = eager.greedy(prompt, 12, &eager_logits);
  const auto b = graphed.greedy(prompt, 12, &graph_logits);
  EXPECT_EQ(a, b) << name;
  ASSERT_EQ(eager_logits.size(), graph_logits.size());
  const int64_t vocab = eager.vocab();
  for (size_t r = 0; r < eager_logits.size() / size_t(vocab); ++r)
    EXPECT_LE(relative_l2(graph_logits.data() + r * vocab, eager_logits.data() + r * vocab, vocab), 1e-5)
        << name << " step " << r;
}

// Prefill with q/k/v and gate/up as column ranges of one buffer (one product over weights
// side by side, the default) against separate outputs and one product per part: the same
// rounded inputs, only the products' f32 accumulation order may differ.
TEST_P(CudaArchReference, JoinedPartsMatchSeparateParts) {
  KILN_REQUIRE_GPU();
  const std::string name = GetParam();
  KILN_REQUIRE_TESTDATA(ref_path, "arch/" + name + ".ref.json");
  KILN_REQUIRE_TESTDATA(gguf_path, "arch/" + name + ".gguf");
  const nlohmann::json ref = read_json(ref_path);
  CudaOptions separate_options;
  separate_options.joined_parts = false;
  DeviceModel joined(gguf_path, cuda_backend(false, true));
  DeviceModel separate(gguf_path, std::make_unique<CudaBackend>(separate_options));
  ASSERT_TRUE(static_cast<CudaBackend&>(*joined.backend).options().joined_parts) << "KILN_CUDA_PREFILL_JOIN=0 set?";
  const std::vector<int32_t> ids = to_ids(ref["ids"]);
  ASSERT_GE(ids.size(), size_t(9)) << "a prefill of at most 8 tokens never joins";
  const std::vector<float> a = joined.prefill_logits(ids), b = separate.prefill_logits(ids);
  ASSERT_EQ(a.size(), b.size());
  const int64_t vocab = joined.vocab();
  double worst = 0;
  for (size_t r = 0; r < a.size() / size_t(vocab); ++r) {
    const double err = relative_l2(a.data() + r * vocab, b.data() + r * vocab, vocab);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-3) << name << " position " << r << ": logit[0] joined " << a[r * vocab] << " separate "
                         << b[r * vocab];
  }
  std::printf("[ cuda %s ] joined vs separate parts: max relative L2 %.3g\n", name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Arch, CudaArchReference,
                         ::testing::Values("llama", "llama31-ropescale", "qwen2", "qwen3", "qwen3moe", "mixtral",
                                           "gemma2", "gptoss", "qwen3next", "qwen35"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace kiln::testing
