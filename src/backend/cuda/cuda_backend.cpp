// The CUDA backend's memory: device buffers, the one-time weight upload through pinned
// staging, per-step uploads and downloads, and the sync points that flush recorded ops.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/block_trace.h"
#include "backend/cuda/decode_layout.h"
#include "backend/cuda/dequant.h"
#include "backend/cuda/device.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/expert_tiles.h"
#include "backend/cuda/layout_roles.h"
#include "formats/gguf.h"

namespace kiln {

namespace cuda_memory {

constexpr size_t kPinnedBytes = size_t(64) << 20;  // weight chunks and per-step uploads
constexpr size_t kSlack = 256;  // kernels may read aligned 16-byte pieces past the end

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda backend: {}: {}", what, cudaGetErrorString(e));
}

// Zeroes device memory before returning. cudaMemset alone runs on the legacy default stream
// and returns before it is done; the backend's stream does not wait for that stream, so an
// upload or kernel issued next could land first and then be overwritten with zeros.
void zero_now(void* p, size_t bytes, const char* what) {
  check(cudaMemset(p, 0, bytes), what);
  check(cudaStreamSynchronize(cudaStreamLegacy), what);
}

class DeviceBuffer final : public Buffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    const cudaError_t e = cudaMalloc(&data_, bytes + kSlack);
    if (e != cudaSuccess) fail("cuda backend: cannot allocate {} bytes: {}", bytes, cudaGetErrorString(e));
    // Zero-filled, like the CPU backend's buffers: unused cache slots hold zeros.
    zero_now(data_, bytes + kSlack, "cudaMemset");
    size_ = bytes;
    device_ = Device::Cuda;
  }
  ~DeviceBuffer() override { cudaFree(data_); }
};

}  // namespace cuda_memory

using cuda_memory::check;

namespace {
// A set of layout roles from the variable `name` (layout_roles.h), left as it is when the
// variable is unset, and with a warning when it names no role.
void read_layout_roles(const char* name, unsigned* roles) {
  const char* text = std::getenv(name);
  if (!text) return;
  if (const std::optional<unsigned> parsed = cuda::parse_layout_roles(text))
    *roles = *parsed;
  else
    std::fprintf(stderr,
                 "kiln cuda: %s=%s ignored: say none, all, or roles joined by ',' "
                 "(gate_up, down, qkv, o, head, other)\n",
                 name, text);
}
}  // namespace

CudaBackend::CudaBackend(const CudaOptions& options) : options_(options) {
  std::string why;
  const auto devices = cuda::list_devices(&why);
  KILN_CHECK(!devices.empty(), "cuda backend: no CUDA device ({})", why);
  KILN_CHECK(options.device >= 0 && size_t(options.device) < devices.size(),
             "cuda backend: device {} does not exist ({} found)", options.device, devices.size());
  device_sms_ = devices[size_t(options.device)].multiprocessors;
  if (cuda::env_is("KILN_CUDA_FUSED", "0")) options_.fused = false;
  if (cuda::env_is("KILN_CUDA_MIXED_PARTS", "0")) options_.mixed_parts = false;
  if (cuda::env_is("KILN_CUDA_INTERLEAVED", "0")) options_.interleaved_decode = false;
  if (cuda::env_is("KILN_CUDA_EXPERT_TILES", "0")) options_.expert_tiles = false;
  if (cuda::env_is("KILN_CUDA_MOE_FOLD_FRONT", "0")) options_.fold_moe_front = false;
  read_layout_roles("KILN_CUDA_INTERLEAVED_Q4K", &options_.interleaved_q4_k);
  read_layout_roles("KILN_CUDA_INTERLEAVED_Q6K", &options_.interleaved_q6_k);
  if (cuda::env_is("KILN_CUDA_PREFILL_JOIN", "0")) options_.joined_parts = false;
  if (cuda::env_is("KILN_CUDA_STEP_IO", "0")) options_.step_io_in_graph = false;
  if (cuda::env_is("KILN_CUDA_PREFILL_GLU_HALF", "0")) options_.glu_half_input = false;
  if (cuda::env_is("KILN_CUDA_PREFILL_HALF_COPY", "0")) options_.half_copies = false;
  if (const int e = cuda::env_int("KILN_CUDA_HALF_EPILOGUE", -1); e >= 0 && e <= 3) options_.half_epilogues = e;
  if (const int e = cuda::env_int("KILN_CUDA_GLU_EPILOGUE_Q8", -1); e >= 0 && e <= 2) options_.int8_glu_epilogue = e;
  check(cudaSetDevice(options.device), "cudaSetDevice");
  if (const char* path = std::getenv("KILN_CUDA_BLOCK_TRACE_FILE"); path && *path) {
    const int records = cuda::env_int("KILN_CUDA_BLOCK_TRACE_RECORDS", 1 << 22);
    if (cuda::block_trace::enable(size_t(std::max(records, 1))))
      block_trace_path_ = path;
    else
      std::fprintf(stderr, "kiln cuda: no block trace: %s\n",
                   cuda::block_trace::compiled_in() ? "the trace buffer could not be set up"
                                                    : "this build records none (configure with -DKILN_CUDA_BLOCK_TRACE=ON)");
  }
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) fail("cuda backend: cublasCreate failed");
  cublasSetStream(blas_, stream_);
  // A fixed cuBLAS workspace, so that products captured into graphs allocate nothing.
  scratch(blas_workspace_, size_t(32) << 20);
  cublasSetWorkspace(blas_, blas_workspace_.data, blas_workspace_.bytes);
  check(cudaMallocHost(&pinned_, cuda_memory::kPinnedBytes), "cudaMallocHost (staging)");
  pinned_bytes_ = cuda_memory::kPinnedBytes;
  graphs_ = std::make_unique<cuda::StepGraphs>(stream_, options.graphs, options.graph_max_tokens);
  scratch(route_tickets_, size_t(kMoeRouteMaxTokens) * sizeof(unsigned));
  cuda_memory::zero_now(route_tickets_.data, route_tickets_.bytes, "cudaMemset (route tickets)");
  check(cudaMallocHost(&download_pinned_, kMaxPendingDownloads * kMaxAsyncDownloadBytes), "cudaMallocHost (downloads)");
  for (int i = 0; i < kMaxPendingDownloads; ++i) {
    check(cudaEventCreateWithFlags(&downloads_[i].done, cudaEventDisableTiming), "cudaEventCreate");
    downloads_[i].staged = static_cast<uint8_t*>(download_pinned_) + size_t(i) * kMaxAsyncDownloadBytes;
  }
  // Without mapped host memory the copies stay on the stream: slower between steps, the same
  // results.
  if (options_.step_io_in_graph) {
    try {
      step_io_ = std::make_unique<cuda::StepIo>();
    } catch (const Error& e) {
      std::fprintf(stderr, "kiln cuda: per-step copies stay on the stream: %s\n", e.what());
    }
  }
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (!block_trace_path_.empty()) {
    const int64_t written = cuda::block_trace::write_csv(block_trace_path_);
    if (written < 0)
      std::fprintf(stderr, "kiln cuda: cannot write the block trace to %s\n", block_trace_path_.c_str());
    else
      std::fprintf(stderr, "kiln cuda: %lld block records written to %s\n", static_cast<long long>(written),
                   block_trace_path_.c_str());
  }
  graphs_.reset();
  step_io_.reset();
  if (blas_) cublasDestroy(blas_);
  for (const void* p : interleaved_) cuda::unregister_interleaved(p);
  for (void* p : device_allocations_) cudaFree(p);
  if (pinned_) cudaFreeHost(pinned_);
  if (download_pinned_) cudaFreeHost(download_pinned_);
  for (PendingDownload& d : downloads_)
    if (d.done) cudaEventDestroy(d.done);
  if (stream_) cudaStreamDestroy(stream_);
}

std::optional<std::string> CudaBackend::supports(Op op, std::span<const GgmlType> types) const {
  for (GgmlType t : types) {
    const bool weight_op = op == Op::Matmul || op == Op::GetRows || op == Op::MoeFfn;
    if (weight_op) {
      if (!cuda::dequantize_supports(t))
        return fmt::format("cuda {}: {} weights are not supported (no dequantizer on the device)", op_name(op),
                           type_name(t));
      continue;
    }
    const bool cache_op = op == Op::KvStore || op == Op::Attention;
    if (t != GgmlType::F32 && t != GgmlType::I32 && !(cache_op && t == GgmlType::F16))
      return fmt::format("cuda {}: {} data is not supported (f32 activations, f32 or f16 KV caches)", op_name(op),
                         type_name(t));
  }
  return std::nullopt;
}

void* CudaBackend::scratch(Scratch& s, size_t bytes) {
  if (bytes <= s.bytes) return s.data;
  // Grow by half again, so a slowly rising need does not allocate every time.
  const size_t grown = std::max(bytes, s.bytes + s.bytes / 2);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, grown + cuda_memory::kSlack);
  if (e != cudaSuccess) fail("cuda backend: cannot allocate {} bytes of scratch: {}", grown, cudaGetErrorString(e));
  device_allocations_.push_back(p);  // the old region stays alive for graphs that use it
  s.data = p;
  s.bytes = grown;
  return p;
}

std::unique_ptr<Buffer> CudaBackend::allocate(size_t bytes) {
  return std::make_unique<cuda_memory::DeviceBuffer>(std::max<size_t>(bytes, 1));
}

void CudaBackend::stage_upload(const void* host, void* dst, size_t bytes) {
  // Whole-staging-buffer chunks: copy into pinned memory, then an async copy; the next
  // chunk waits for the previous transfer (one buffer, so one sync per chunk).
  const auto* src = static_cast<const uint8_t*>(host);
  auto* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  while (done < bytes) {
    const size_t n = std::min(pinned_bytes_, bytes - done);
    std::memcpy(pinned_, src + done, n);
    check(cudaMemcpyAsync(out + done, pinned_, n, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (weights)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (weights)");
    done += n;
    weight_bytes_ += n;
    if (options_.progress) options_.progress(weight_bytes_);
  }
}

namespace cuda_memory {

Tensor shaped_like(const gguf::TensorInfo& info) {
  KILN_CHECK(!info.shape.empty() && info.shape.size() <= size_t(Tensor::kMaxDims),
             "tensor {}: {} dimensions (1..4 supported)", info.name, info.shape.size());
  int64_t ne[4] = {1, 1, 1, 1};
  for (size_t i = 0; i < info.shape.size(); ++i) ne[i] = info.shape[i];
  switch (info.shape.size()) {
    case 1: return Tensor::contiguous(info.type, {ne[0]}, nullptr);
    case 2: return Tensor::contiguous(info.type, {ne[0], ne[1]}, nullptr);
    case 3: return Tensor::contiguous(info.type, {ne[0], ne[1], ne[2]}, nullptr);
    default: return Tensor::contiguous(info.type, {ne[0], ne[1], ne[2], ne[3]}, nullptr);
  }
}

// The device tensor for a file's weight, its data not yet placed: shape, type and name, and
// a check that the file's byte count is what the shape needs.
Tensor weight_like(const gguf::TensorInfo& info) {
  Tensor t = shaped_like(info);
  KILN_CHECK(t.bytes() == info.bytes, "tensor {}: {} bytes in the file, {} expected for {}", info.name, info.bytes,
             t.bytes(), t.describe());
  t.name = info.name;
  t.device = Device::Cuda;
  return t;
}

}  // namespace cuda_memory

Tensor CudaBackend::weight(const gguf::TensorInfo& info) {
  Tensor t = cuda_memory::weight_like(info);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, info.bytes + cuda_memory::kSlack);
  if (e != cudaSuccess)
    fail("cuda backend: cannot allocate {} bytes for weight {}: {} ({} bytes of weights so far)", info.bytes,
         info.name, cudaGetErrorString(e), weight_bytes_);
  device_allocations_.push_back(p);
  stage_upload(info.data, p, info.bytes);
  t.data = p;
  if (can_interleave(t)) interleave(t);
  if (can_tile_experts(t)) tile_experts(t);
  return t;
}

bool CudaBackend::can_tile_experts(const Tensor& weight) const {
  // ffn_gate_exps / ffn_up_exps / ffn_down_exps: [n_expert][rows][cols], each expert whole tiles.
  return options_.expert_tiles && !options_.exact && weight.name.find("_exps") != std::string::npos &&
         weight.ne[3] == 1 && weight.is_contiguous() && cuda::expert_tiles_fit(weight.dtype, weight.ne[1], weight.ne[0]);
}

void CudaBackend::tile_experts(const Tensor& weight) {
  if (const cuda::Status s =
          cuda::tile_experts_in_place(weight.dtype, weight.data, weight.ne[2], weight.ne[1], weight.ne[0], stream_);
      !s.ok())
    fail("cuda backend: the row-tile layout of {}: {}", weight.name, s.message());
  tiled_experts_.push_back(weight.data);
}

bool CudaBackend::has_expert_tiles(const Tensor& w) const {
  return std::find(tiled_experts_.begin(), tiled_experts_.end(), w.data) != tiled_experts_.end();
}

bool CudaBackend::can_interleave(const Tensor& weight) const {
  const unsigned role = cuda::layout_role(weight.name);
  return options_.interleaved_decode && (weight.dtype != GgmlType::Q4_K || (options_.interleaved_q4_k & role)) &&
         (weight.dtype != GgmlType::Q6_K || (options_.interleaved_q6_k & role)) &&
         weight.ne[0] >= options_.interleaved_min_cols && weight.ne[2] == 1 && weight.ne[3] == 1 &&
         cuda::interleavable(weight.dtype, weight.ne[1], weight.ne[0]);
}

void CudaBackend::interleave(const Tensor& weight) {
  if (const cuda::Status s = cuda::interleave_in_place(weight.dtype, weight.data, weight.ne[1], weight.ne[0], stream_);
      !s.ok())
    fail("cuda backend: the interleaved layout of {}: {}", weight.name, s.message());
  cuda::register_interleaved(weight.data, weight.bytes());
  interleaved_.push_back(weight.data);
}

// One allocation for weights that are multiplied with one input: each starts where the one
// before it ends (rounded up to 256 bytes, which rows of f16 / bf16 and of the block formats
// at the usual widths already are), so a product over several can read them as one matrix.
// The slack past the end is shared; reads past one weight's end land in the next.
std::vector<Tensor> CudaBackend::weights_side_by_side(std::span<const gguf::TensorInfo* const> infos) {
  std::vector<Tensor> out;
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const gguf::TensorInfo* info : infos) {
    out.push_back(cuda_memory::weight_like(*info));
    offsets.push_back(total);
    total += (info->bytes + 255) / 256 * 256;
  }
  if (out.empty()) return out;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, total + cuda_memory::kSlack);
  if (e != cudaSuccess)
    fail("cuda backend: cannot allocate {} bytes for weights {} and {} more side by side: {} ({} bytes of weights "
         "so far)", total, infos[0]->name, infos.size() - 1, cudaGetErrorString(e), weight_bytes_);
  device_allocations_.push_back(p);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].data = static_cast<uint8_t*>(p) + offsets[i];
    stage_upload(infos[i]->data, out[i].data, infos[i]->bytes);
  }
  // Weights loaded side by side are multiplied in one launch, which reads one layout: all of
  // them take the interleaved one, or none (Q4_K_M's q4_K q / k with a q6_K v keep the blocks,
  // read by the two-format kernel).
  bool all_interleave = true;
  for (const Tensor& t : out) all_interleave = all_interleave && can_interleave(t) && t.dtype == out[0].dtype;
  if (all_interleave)
    for (const Tensor& t : out) interleave(t);
  return out;
}

unsigned* CudaBackend::moe_h_tickets(int64_t count) {
  const size_t bytes = size_t(count) * sizeof(unsigned);
  const void* before = moe_h_tickets_.data;
  void* p = scratch(moe_h_tickets_, bytes);
  if (p != before) cuda_memory::zero_now(p, moe_h_tickets_.bytes, "cudaMemset (moe h tickets)");
  return static_cast<unsigned*>(p);
}

Tensor CudaBackend::owned_weight(const Tensor& src, std::string_view name) {
  KILN_CHECK(src.is_contiguous(), "owned_weight {}: source must be contiguous", name);
  KILN_CHECK(src.device == Device::Cpu, "owned_weight {}: source must be host data", name);
  void* p = nullptr;
  check(cudaMalloc(&p, src.bytes() + cuda_memory::kSlack), "cudaMalloc (owned weight)");
  device_allocations_.push_back(p);
  stage_upload(src.data, p, src.bytes());
  Tensor t = src;
  t.data = p;
  t.name = name;
  t.device = Device::Cuda;
  return t;
}

void CudaBackend::flush_graph() {
  graphs_->flush();
  if (step_io_) step_io_->close(stream_);
}

void CudaBackend::upload(const void* host, const Tensor& dst, size_t bytes) {
  KILN_CHECK(dst.device == Device::Cuda, "cuda upload: {} is not device memory", dst.name);
  flush_pending();
  quantized_input_ = {};
  for (RopeTable& t : rope_tables_) t.current = false;
  // A pass's own uploads: staged in the step slot and copied by a kernel of its graph, in
  // order with the ops around it.
  if (uint8_t* staged = step_io_ && bytes <= cuda::StepIo::kMaxUploadBytes ? step_io_->reserve(bytes) : nullptr) {
    std::memcpy(staged, host, bytes);
    void* to = dst.data;
    cuda::SignatureHash sig;
    sig.bytes("upload", 6);
    sig.pod(staged), sig.pod(to), sig.pod(bytes);
    record(sig, 1, [=](cudaStream_t s) { return cuda::upload_step_bytes(staged, to, bytes, s); }, "upload");
    return;
  }
  flush_graph();  // ops recorded before this upload must see the old contents
  if (bytes > pinned_bytes_ / 2) {
    // On the backend's stream: a plain cudaMemcpy from pageable memory may return before its
    // transfer is done, and the backend's stream would not wait for it.
    check(cudaMemcpyAsync(dst.data, host, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (upload)");
    return;
  }
  // Other small uploads go through a ring in the pinned buffer; synchronize() resets it once
  // the copies are known to be done.
  if (pinned_used_ + bytes > pinned_bytes_) {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    pinned_used_ = 0;
  }
  auto* staged = static_cast<uint8_t*>(pinned_) + pinned_used_;
  std::memcpy(staged, host, bytes);
  pinned_used_ += (bytes + 255) / 256 * 256;
  check(cudaMemcpyAsync(dst.data, staged, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
}

void CudaBackend::download(const Tensor& src, void* host, size_t bytes) {
  KILN_CHECK(src.device == Device::Cuda, "cuda download: {} is not device memory", src.name);
  flush_pending();
  flush_graph();
  check(cudaMemcpyAsync(host, src.data, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (download)");
  pinned_used_ = 0;
}

uint64_t CudaBackend::download_async(const Tensor& src, size_t bytes) {
  KILN_CHECK(src.device == Device::Cuda, "cuda download_async: {} is not device memory", src.name);
  KILN_CHECK(bytes <= kMaxAsyncDownloadBytes, "cuda download_async: {} bytes of {} (at most {})", bytes, src.name,
             kMaxAsyncDownloadBytes);
  const uint64_t ticket = next_download_++;
  PendingDownload& d = downloads_[ticket % kMaxPendingDownloads];
  KILN_CHECK(d.ticket == 0, "cuda download_async: {} downloads already pending", int(kMaxPendingDownloads));
  // The pass's last op writes the bytes into the step slot, where finish_download finds them
  // (or in d.staged, where they move if the slot is reused first): the held argmax whose
  // output this is, or else a copy kernel.
  const bool from_argmax = pending_argmax_ && pending_argmax_->out == src.data &&
                           bytes == size_t(pending_argmax_->rows) * sizeof(int32_t);
  if (!from_argmax) flush_pending();
  uint8_t* at = step_io_ ? step_io_->reserve(bytes) : nullptr;
  if (at && from_argmax) {
    record_held_argmax(reinterpret_cast<int32_t*>(at));
  } else if (at) {
    const void* from = src.data;
    cuda::SignatureHash sig;
    sig.bytes("download", 8);
    sig.pod(from), sig.pod(at), sig.pod(bytes);
    record(sig, 1, [=](cudaStream_t s) { return cuda::download_step_bytes(from, at, bytes, s); }, "download");
  }
  if (at) {
    step_io_->hold_download(ticket, at, bytes, d.staged);
    flush_graph();
  } else {
    flush_pending();
    flush_graph();
    check(cudaMemcpyAsync(d.staged, src.data, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)");
  }
  check(cudaEventRecord(d.done, stream_), "cudaEventRecord (download)");
  d.ticket = ticket;
  d.bytes = bytes;
  return ticket;
}

void CudaBackend::finish_download(uint64_t ticket, void* host, size_t bytes) {
  PendingDownload& d = downloads_[ticket % kMaxPendingDownloads];
  KILN_CHECK(ticket != 0 && d.ticket == ticket, "cuda finish_download: ticket {} is not pending", ticket);
  KILN_CHECK(bytes <= d.bytes, "cuda finish_download: {} bytes asked, {} downloaded", bytes, d.bytes);
  check(cudaEventSynchronize(d.done), "cudaEventSynchronize (download)");
  if (!step_io_ || !step_io_->take(ticket, host, bytes)) std::memcpy(host, d.staged, bytes);
  d.ticket = 0;
}

void CudaBackend::synchronize() {
  flush_pending();
  flush_graph();
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  pinned_used_ = 0;
}

void CudaBackend::defer_add(const Tensor& out, Tensor& residual) {
  flush_pending();
  pending_add_ = PendingAdd{out, residual};
  quantized_input_ = {};  // an int8 copy of the residual would go stale
}

void CudaBackend::flush_pending() {
  record_half_source_for(nullptr, 0, 0, 0, GgmlType::F32);  // a held norm or attention, as it was
  if (pending_argmax_) record_held_argmax(nullptr);
  // A held front reads the held product's output: it goes after it (the product's record()
  // would otherwise flush the front first).
  std::optional<PendingFront> front = std::move(pending_front_);
  pending_front_.reset();
  flush_pending_products();
  flush_pending_head_norms();
  if (front) record_front(*front);
  if (!pending_add_) return;
  PendingAdd p = std::move(*pending_add_);
  pending_add_.reset();
  add(p.residual, p.out, p.residual);
}

void CudaBackend::record(const cuda::SignatureHash& sig, int64_t tokens, cuda::StepGraphs::Launch launch,
                         const char* op) {
  flush_pending();
  quantized_input_ = {};
  ++recorded_ops_;
  graphs_->add(sig, tokens, std::move(launch), op);
}

}  // namespace kiln
