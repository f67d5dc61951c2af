// `kiln tensor` against ggml's own dequantization of every zoo type, and `kiln quantize`
// end to end on the stories260K model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "cli/run_kiln.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "quant/quant.h"
#include "support/testdata.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

fs::path temp_dir(const char* name) {
  const fs::path dir = fs::temp_directory_path() / (std::string(name) + "-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

// The zoo types: name and shape from index.tsv.
struct ZooType { std::string name; int rows, cols; };

std::vector<ZooType> zoo_types(const fs::path& index) {
  std::ifstream in(index);
  std::string line;
  std::getline(in, line);  // header
  std::vector<ZooType> out;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    ZooType t;
    std::string id, block, size;
    f >> t.name >> id >> block >> size >> t.rows >> t.cols;
    if (!t.name.empty()) out.push_back(t);
  }
  return out;
}

TEST(CliTensor, EqualsGgmlDequantizationForEveryZooType) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(index, "quant/zoo/index.tsv");
  const fs::path dir = temp_dir("kiln-tensor-test");
  const auto types = zoo_types(index);
  ASSERT_EQ(types.size(), 27u);
  for (const ZooType& z : types) {
    SCOPED_TRACE(z.name);
    const auto type = type_from_name(z.name);
    ASSERT_TRUE(type) << "unknown type name " << z.name;
    const std::vector<uint8_t> q = read_bytes(index.parent_path() / (z.name + ".q"));
    const std::vector<uint8_t> want = read_bytes(index.parent_path() / (z.name + ".deq.f32"));

    gguf::Writer w;
    w.set_string("general.architecture", "zoo");
    w.add_tensor("zoo." + z.name, *type, {z.cols, z.rows}, std::span<const uint8_t>(q));
    const fs::path model = dir / (z.name + ".gguf");
    w.write(model.string());

    const fs::path out = dir / (z.name + ".f32");
    const CommandResult r = run_kiln("tensor " + shell_quote(model.string()) + " zoo." + z.name + " -o " + shell_quote(out.string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<uint8_t> got = read_bytes(out);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i += 4) {
      float a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      if (std::isnan(a) && std::isnan(b)) continue;
      ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
          << "element " << i / 4 << " (row " << i / 4 / z.cols << ", col " << i / 4 % z.cols << "): kiln " << a
          << ", ggml " << b;
    }
  }
  fs::remove_all(dir);
}

TEST(CliTensor, UnknownTensorIsAnError) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  const CommandResult r = run_kiln("tensor " + shell_quote(model.string()) + " no.such.tensor -o /dev/null");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("no tensor named 'no.such.tensor'"), std::string::npos) << r.output;
}

// Relative RMS error between two float tensors.
double relative_rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    ref += double(b[i]) * b[i];
  }
  return std::sqrt(err / std::max(ref, 1e-30));
}

std::vector<float> dequantize_tensor(const gguf::TensorInfo& t) {
  std::vector<float> out(size_t(t.elements()));
  const int64_t cols = t.shape[0];
  const size_t row = *row_bytes(t.type, cols);
  for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.type, t.data + size_t(r) * row, out.data() + r * cols, cols);
  return out;
}

TEST(CliQuantize, Stories260KToQ8_0AndQ4_K) {
  KILN_REQUIRE_BINARY();
  KILN_REQUIRE_TESTDATA(model, "models/stories260K.gguf");
  const fs::path dir = temp_dir("kiln-quantize-test");
  const auto source = gguf::File::open(model.string());

  // Rows of stories260K are 64 long (ffn_down: 172). 64 is whole q8_0 blocks but not
  // whole q4_K blocks (256), so q4_K falls back to q4_0 there; 172 fits no block size and
  // falls back to f16. Bound on each matrix's relative RMS error: q8_0 keeps ~8 bits,
  // q4_0 ~4 (ggml's round trips on the zoo: 0.06% and 1.1% of the values' scale).
  struct Case { const char* type; GgmlType for_64; double bound; };
  for (const Case& c : {Case{"q8_0", GgmlType::Q8_0, 0.01}, Case{"q4_K", GgmlType::Q4_0, 0.12}}) {
    SCOPED_TRACE(c.type);
    const fs::path out = dir / (std::string("stories-") + c.type + ".gguf");
    const CommandResult r = run_kiln("quantize " + shell_quote(model.string()) + " " + shell_quote(out.string()) + " " + c.type);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto q = gguf::File::open(out.string());
    ASSERT_EQ(q->tensors().size(), source->tensors().size());
    EXPECT_EQ(q->get_string("general.architecture"), "llama");
    EXPECT_EQ(q->get("tokenizer.ggml.tokens").as_array().size(), 512u);
    int converted = 0;
    for (const auto& t : source->tensors()) {
      const gguf::TensorInfo* qt = q->find_tensor(t.name);
      ASSERT_TRUE(qt) << t.name;
      EXPECT_EQ(qt->shape, t.shape);
      if (t.shape.size() == 1) {
        EXPECT_EQ(qt->type, GgmlType::F32) << t.name << " (vectors stay float)";
        continue;
      }
      const GgmlType want = t.shape[0] == 64 ? c.for_64 : GgmlType::F16;
      EXPECT_EQ(type_name(qt->type), type_name(want)) << t.name;
      converted += qt->type == c.for_64;
      EXPECT_LT(relative_rmse(dequantize_tensor(*qt), dequantize_tensor(t)), c.bound) << t.name;
    }
    EXPECT_EQ(converted, 2 + 5 * 6);  // token_embd, output, and 6 matrices of rows of 64 per layer
  }
  const CommandResult bad = run_kiln("quantize " + shell_quote(model.string()) + " " + shell_quote((dir / "x.gguf").string()) + " q9_9");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("cannot quantize into 'q9_9'"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::testing
