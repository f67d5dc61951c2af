#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "formats/gguf.h"

namespace kiln {

namespace cpu_memory {

// Host memory aligned for SIMD loads, zero-filled so that unused cache slots hold zeros.
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (!data_) fail("cpu backend: cannot allocate {} bytes", bytes);
    std::memset(data_, 0, rounded);
    size_ = bytes;
    device_ = Device::Cpu;
  }
  ~HostBuffer() override { std::free(data_); }
};

}  // namespace cpu_memory

CpuBackend::CpuBackend(int n_threads, bool copy_weights) : pool_(n_threads), copy_weights_(copy_weights) {}

std::optional<std::string> CpuBackend::supports(Op op, std::span<const GgmlType> types) const {
  // Weights of any type with a dequantizer; KV caches in f32 or f16; other data in f32.
  if (op == Op::Matmul || op == Op::GetRows || op == Op::MoeFfn) return std::nullopt;
  const bool cache_op = op == Op::KvStore || op == Op::Attention;
  for (GgmlType t : types)
    if (t != GgmlType::F32 && t != GgmlType::I32 && !(cache_op && t == GgmlType::F16))
      return fmt::format("cpu {}: {} data is not supported (f32 only; f16 KV caches)", op_name(op), type_name(t));
  return std::nullopt;
}

std::unique_ptr<Buffer> CpuBackend::allocate(size_t bytes) { return std::make_unique<cpu_memory::HostBuffer>(bytes); }

Tensor CpuBackend::weight(const gguf::TensorInfo& info) {
  KILN_CHECK(!info.shape.empty() && info.shape.size() <= size_t(Tensor::kMaxDims),
             "tensor {}: {} dimensions (1..4 supported)", info.name, info.shape.size());
  Tensor t;
  switch (info.shape.size()) {
    case 1: t = Tensor::contiguous(info.type, {info.shape[0]}, nullptr); break;
    case 2: t = Tensor::contiguous(info.type, {info.shape[0], info.shape[1]}, nullptr); break;
    case 3: t = Tensor::contiguous(info.type, {info.shape[0], info.shape[1], info.shape[2]}, nullptr); break;
    default:
      t = Tensor::contiguous(info.type, {info.shape[0], info.shape[1], info.shape[2], info.shape[3]}, nullptr);
  }
  KILN_CHECK(t.bytes() == info.bytes, "tensor {}: {} bytes in the file, {} expected for {}", info.name, info.bytes,
             t.bytes(), t.describe());
  t.data = const_cast<uint8_t*>(info.data);  // read only: weights are never written
  // Small tensors (norms, biases) stay mapped: they are read once per layer, not streamed.
  if (copy_weights_ && info.bytes >= kCopyMinBytes)
    t.data = const_cast<uint8_t*>(weight_copies_.copy(info.data, info.bytes));
  t.name = info.name;
  return t;
}

Tensor CpuBackend::owned_weight(const Tensor& src, std::string_view name) {
  KILN_CHECK(src.is_contiguous(), "owned_weight {}: source must be contiguous", name);
  owned_.push_back(allocate(src.bytes()));
  std::memcpy(owned_.back()->data(), src.data, src.bytes());
  Tensor t = src;
  t.data = owned_.back()->data();
  t.name = name;
  t.device = Device::Cpu;
  return t;
}

void CpuBackend::upload(const void* host, const Tensor& dst, size_t bytes) { std::memcpy(dst.data, host, bytes); }
void CpuBackend::download(const Tensor& src, void* host, size_t bytes) { std::memcpy(host, src.data, bytes); }

void CpuBackend::get_rows(const Tensor& table, const Tensor& ids, Tensor& out) { cpu::get_rows(table, ids, out, pool_); }
void CpuBackend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) { cpu::rmsnorm(x, w, eps, out, pool_); }
void CpuBackend::add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& w, float eps, Tensor& out) {
  cpu::add_rmsnorm(x, residual, w, eps, out, pool_);
}
void CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  cpu::linear(x, w, bias, out, pool_);
}
void CpuBackend::rope(Tensor& x, const Tensor& positions, const RopeParams& p) { cpu::rope(x, positions, p, pool_); }
void CpuBackend::kv_store(const Tensor& k, const Tensor& v, KvLayer& cache, const Tensor& slots) {
  cpu::kv_store(k, v, cache, slots);
}
void CpuBackend::attention(const Tensor& q, const KvLayer& cache, const BatchIndex& batch, const AttentionParams& p,
                           Tensor& out) {
  cpu::attention(q, cache, batch, p, out, pool_);
}
void CpuBackend::glu(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor& out) {
  cpu::glu(gate, up, p, out, pool_);
}
void CpuBackend::softmax(const Tensor& x, Tensor& out) { cpu::softmax(x, out); }
void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) { cpu::add(a, b, out); }
void CpuBackend::scale(const Tensor& x, float factor, Tensor& out) { cpu::scale(x, factor, out); }
void CpuBackend::softcap(const Tensor& x, float cap, Tensor& out) { cpu::softcap(x, cap, out); }
void CpuBackend::moe_route(const Tensor& logits, const MoeRouteParams& p, Tensor& ids, Tensor& weights) {
  cpu::moe_route(logits, p, ids, weights);
}
void CpuBackend::moe_ffn(const Tensor& x, const ExpertWeights& experts, const Tensor& ids, const Tensor& weights,
                         const GluParams& act, Tensor& out) {
  cpu::moe_ffn(x, experts, ids, weights, act, out, moe_scratch_, pool_);
}
void CpuBackend::argmax(const Tensor& x, Tensor& out) { cpu::argmax(x, out); }

}  // namespace kiln
