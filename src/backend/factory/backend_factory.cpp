#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#if KILN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/env_switch.h"
#endif

namespace kiln {

std::string auto_device(std::string* why) {
#if KILN_HAVE_CUDA
  std::string reason;
  if (!cuda::list_devices(&reason).empty()) return "cuda";
  if (why) *why = reason;
#else
  if (why) *why = "this kiln was built without the CUDA backend";
#endif
  return "cpu";
}

std::unique_ptr<Backend> make_backend(std::string_view device, const BackendOptions& o) {
  std::string name(device);
  if (name == "auto") name = auto_device();
  if (name == "cpu") return std::make_unique<CpuBackend>(o.threads, o.cpu_copy_weights);
  if (name == "cuda") {
#if KILN_HAVE_CUDA
    CudaOptions c;
    c.device = o.cuda_device;
    c.exact = o.exact;
    c.graphs = o.cuda_graphs;
    // KILN_CUDA_GRAPHS=0 turns step graphs off (for measuring what they save).
    if (cuda::env_is("KILN_CUDA_GRAPHS", "0")) c.graphs = false;
    c.progress = o.upload_progress;
    return std::make_unique<CudaBackend>(c);
#else
    fail("device cuda: this kiln was built without the CUDA backend (configure with a CUDA compiler)");
#endif
  }
  fail("unknown device '{}' (known: auto, cpu, cuda)", device);
}

}  // namespace kiln
