#include "backend/backend.h"

#include <cstring>

namespace kiln {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::GetRows: return "get_rows";
    case Op::RmsNorm: return "rmsnorm";
    case Op::AddRmsNorm: return "add_rmsnorm";
    case Op::Matmul: return "matmul";
    case Op::Rope: return "rope";
    case Op::KvStore: return "kv_store";
    case Op::Attention: return "attention";
    case Op::Glu: return "glu";
    case Op::Softmax: return "softmax";
    case Op::Add: return "add";
    case Op::Scale: return "scale";
    case Op::SoftCap: return "softcap";
    case Op::MoeRoute: return "moe_route";
    case Op::MoeFfn: return "moe_ffn";
    case Op::Argmax: return "argmax";
    case Op::CausalConvSilu: return "causal_conv_silu";
    case Op::GatedDeltaRule: return "gated_delta_rule";
    case Op::RmsNormGated: return "rmsnorm_gated";
    case Op::SigmoidMul: return "sigmoid_mul";
  }
  return "unknown op";
}

Tensor Buffer::view(GgmlType dtype, std::initializer_list<int64_t> shape, size_t offset, std::string_view name) const {
  Tensor t = Tensor::contiguous(dtype, shape, static_cast<uint8_t*>(data_) + offset, device_, name);
  KILN_CHECK(offset + t.bytes() <= size_, "buffer view {} {} at offset {}: beyond the buffer's {} bytes", name,
             t.describe(), offset, size_);
  return t;
}

std::optional<std::string> Backend::supports(Op op, std::span<const GgmlType>) const {
  return fmt::format("backend {} does not implement {}", name(), op_name(op));
}

std::vector<Tensor> Backend::weights_side_by_side(std::span<const gguf::TensorInfo* const> infos) {
  std::vector<Tensor> out;
  out.reserve(infos.size());
  for (const gguf::TensorInfo* info : infos) out.push_back(weight(*info));
  return out;
}

uint64_t Backend::download_async(const Tensor& src, size_t bytes) {
  KILN_CHECK(bytes <= kMaxAsyncDownloadBytes, "download_async: {} bytes of {} (at most {})", bytes, src.name,
             kMaxAsyncDownloadBytes);
  KILN_CHECK(host_copies_.size() < size_t(kMaxPendingDownloads), "download_async: {} downloads already pending",
             host_copies_.size());
  HostCopy copy{next_ticket_++, std::vector<uint8_t>(bytes)};
  download(src, copy.bytes.data(), bytes);
  host_copies_.push_back(std::move(copy));
  return host_copies_.back().ticket;
}

void Backend::finish_download(uint64_t ticket, void* host, size_t bytes) {
  for (auto it = host_copies_.begin(); it != host_copies_.end(); ++it) {
    if (it->ticket != ticket) continue;
    KILN_CHECK(bytes <= it->bytes.size(), "finish_download: {} bytes asked, {} downloaded", bytes, it->bytes.size());
    std::memcpy(host, it->bytes.data(), bytes);
    host_copies_.erase(it);
    return;
  }
  fail("finish_download: ticket {} is not pending", ticket);
}

void Backend::unsupported(Op op) const { fail("backend {}: op {} is not implemented", name(), op_name(op)); }

void Backend::get_rows(const Tensor&, const Tensor&, Tensor&) { unsupported(Op::GetRows); }
void Backend::rmsnorm(const Tensor&, const Tensor&, float, Tensor&) { unsupported(Op::RmsNorm); }
void Backend::add_rmsnorm(const Tensor&, Tensor&, const Tensor&, float, Tensor&) { unsupported(Op::AddRmsNorm); }
void Backend::matmul(const Tensor&, const Tensor&, const Tensor&, Tensor&) { unsupported(Op::Matmul); }
void Backend::rope(Tensor&, const Tensor&, const RopeParams&) { unsupported(Op::Rope); }
void Backend::kv_store(const Tensor&, const Tensor&, KvLayer&, const Tensor&) { unsupported(Op::KvStore); }
void Backend::attention(const Tensor&, const KvLayer&, const BatchIndex&, const AttentionParams&, Tensor&) {
  unsupported(Op::Attention);
}
void Backend::glu(const Tensor&, const Tensor&, const GluParams&, Tensor&) { unsupported(Op::Glu); }
void Backend::softmax(const Tensor&, Tensor&) { unsupported(Op::Softmax); }
void Backend::add(const Tensor&, const Tensor&, Tensor&) { unsupported(Op::Add); }
void Backend::scale(const Tensor&, float, Tensor&) { unsupported(Op::Scale); }
void Backend::softcap(const Tensor&, float, Tensor&) { unsupported(Op::SoftCap); }
void Backend::moe_route(const Tensor&, const MoeRouteParams&, Tensor&, Tensor&) { unsupported(Op::MoeRoute); }
void Backend::moe_ffn(const Tensor&, const ExpertWeights&, const Tensor&, const Tensor&, const GluParams&, Tensor&) {
  unsupported(Op::MoeFfn);
}
void Backend::argmax(const Tensor&, Tensor&) { unsupported(Op::Argmax); }
void Backend::causal_conv_silu(const Tensor&, const Tensor&, Tensor&, const BatchIndex&, Tensor&) {
  unsupported(Op::CausalConvSilu);
}
void Backend::gated_delta_rule(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Tensor&, Tensor&, const BatchIndex&, const DeltaRuleParams&,
                               Tensor&) {
  unsupported(Op::GatedDeltaRule);
}
void Backend::rmsnorm_gated(const Tensor&, const Tensor&, const Tensor&, float, Tensor&) {
  unsupported(Op::RmsNormGated);
}
void Backend::sigmoid_mul(const Tensor&, const Tensor&, Tensor&) { unsupported(Op::SigmoidMul); }

}  // namespace kiln
