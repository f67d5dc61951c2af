#include "backend/cuda/status.h"

#include "core/error.h"

namespace kiln::cuda {

Status Status::from_cuda(cudaError_t code, const std::string& where) {
  if (code == cudaSuccess) return Status();
  return Status(code, where + ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")");
}

Status launch_status(const char* kernel) { return Status::from_cuda(cudaGetLastError(), kernel); }

void throw_if_error(const Status& status) {
  if (!status.ok()) fail("cuda: {}", status.message());
}

}  // namespace kiln::cuda
