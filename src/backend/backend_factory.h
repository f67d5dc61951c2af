#pragma once
// Choosing a backend by name: "cpu", "cuda", or "auto" (the GPU when one is usable, else the
// CPU). The implementation (backend/factory/backend_factory.cpp) is compiled into each front
// end that links kiln_all, not into kiln_lib, so that the CPU-only library never depends on
// the CUDA backend; with KILN_HAVE_CUDA off, "cuda" is refused with a message.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "backend/backend.h"

namespace kiln {

struct BackendOptions {
  int threads = 0;            // cpu: 0 = one per core
  bool cpu_copy_weights = false;  // cpu: weights copied into huge-page memory (CpuBackend)
  bool exact = false;         // cuda: f32 everywhere, logits follow the CPU
  bool cuda_graphs = true;    // cuda: replay decode steps as CUDA graphs
  int cuda_device = 0;
  std::function<void(size_t uploaded_bytes)> upload_progress;  // cuda: weight upload
};

// Throws for an unknown name, or for "cuda" where no GPU (or no CUDA build) is available.
std::unique_ptr<Backend> make_backend(std::string_view device, const BackendOptions& options = {});

// What "auto" resolves to here ("cuda" or "cpu"); `why` gets the reason the GPU is not used.
std::string auto_device(std::string* why = nullptr);

}  // namespace kiln
