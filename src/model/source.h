#pragma once
// Where a model comes from: a GGUF file, or a Hugging Face checkpoint directory
// (config.json + *.safetensors). Both are seen through one interface, in GGUF's vocabulary,
// so hyper-parameters, architectures and weight tables are written once:
//   - metadata under GGUF key names (`llama.block_count`, ...): a GGUF file's own keys, or
//     config.json translated (model/hf_config.cpp);
//   - tensors under GGUF tensor names (`blk.3.attn_q.weight`) and in GGUF's layout: a GGUF
//     file's own tensors, or checkpoint tensors renamed and, where the layouts differ,
//     transformed once at load (model/hf_tensors.cpp).
//
//   std::unique_ptr<ModelSource> source = open_model_source(path);  // file or directory
//   auto model = Model::load(*source, backend);   // the source must outlive the model
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "formats/gguf.h"

namespace kiln {

enum class SourceFormat : uint8_t {
  Gguf,          // written by llama.cpp's converter (or kiln's quantizer)
  HfCheckpoint,  // as transformers saves it
};

class ModelSource {
 public:
  virtual ~ModelSource() = default;

  virtual SourceFormat format() const = 0;
  // The file or directory, for messages.
  virtual const std::string& path() const = 0;

  // Metadata under GGUF key names; null when absent.
  virtual const gguf::Value* find(std::string_view key) const = 0;
  // Tensor names (GGUF vocabulary), each once.
  virtual std::vector<std::string> tensor_names() const = 0;
  // Shape of a tensor, innermost first (GGUF order); null when absent.
  virtual const std::vector<int64_t>* tensor_shape(std::string_view name) const = 0;
  // Puts tensor `name` on the backend: a view of the mapped file where its layout is
  // already the one kiln uses, else a weight the backend owns, made here once. Throws when
  // the tensor is absent.
  virtual Tensor load_tensor(std::string_view name, Backend& backend) const = 0;
  // Several tensors that one input is multiplied with (q/k/v, gate/up), placed side by side
  // where the source and the backend can (Backend::weights_side_by_side); else one by one.
  virtual std::vector<Tensor> load_side_by_side(std::span<const std::string> names, Backend& backend) const;
  // What the source itself calls tensor `name` (e.g. a checkpoint's HF name), for errors
  // about a missing tensor; "" when it is the same.
  virtual std::string native_name(std::string_view /*name*/) const { return {}; }
  // The GGUF file behind the source, or null (for what only GGUF files hold: the embedded
  // tokenizer and chat template, per-tensor quantization types).
  virtual const gguf::File* gguf_file() const { return nullptr; }

  // Typed lookups with GGUF's semantics: a missing key gives the fallback (or a clear
  // error, without one); a mistyped key is an error naming it.
  const gguf::Value& get(std::string_view key) const;
  int64_t get_int(std::string_view key) const { return get(key).as_int(key); }
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string_view get_string(std::string_view key, std::string_view fallback) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  bool has_tensor(std::string_view name) const { return tensor_shape(name) != nullptr; }
  // `general.architecture` (kiln's architecture name), or "" when absent.
  std::string_view architecture() const { return get_string("general.architecture", ""); }
};

// A GGUF file seen as a source: borrowed (it must outlive the source) or owned.
class GgufSource final : public ModelSource {
 public:
  explicit GgufSource(const gguf::File& file) : file_(file) {}
  explicit GgufSource(std::unique_ptr<gguf::File> file) : owned_(std::move(file)), file_(*owned_) {}

  SourceFormat format() const override { return SourceFormat::Gguf; }
  const std::string& path() const override { return file_.paths().front(); }
  const gguf::Value* find(std::string_view key) const override { return file_.find(key); }
  std::vector<std::string> tensor_names() const override;
  const std::vector<int64_t>* tensor_shape(std::string_view name) const override;
  Tensor load_tensor(std::string_view name, Backend& backend) const override;
  std::vector<Tensor> load_side_by_side(std::span<const std::string> names, Backend& backend) const override;
  const gguf::File* gguf_file() const override { return &file_; }

 private:
  std::unique_ptr<gguf::File> owned_;
  const gguf::File& file_;
};

// Whether `path` names a Hugging Face checkpoint: a directory, a .safetensors file or a
// model.safetensors.index.json.
bool is_hf_checkpoint_path(const std::string& path);

// Opens a GGUF file or a Hugging Face checkpoint (see is_hf_checkpoint_path).
std::unique_ptr<ModelSource> open_model_source(const std::string& path);

}  // namespace kiln
