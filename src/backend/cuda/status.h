#pragma once
// What every CUDA kernel launcher of kiln returns. Launchers never throw: a graph-capturing
// caller decides what a failure means. A refusal (an argument the kernels do not support)
// carries a message that names the argument and the values that are supported; a launch
// failure carries the CUDA error and the kernel's name.
#include <cuda_runtime_api.h>

#include <string>

namespace kiln::cuda {

class Status {
 public:
  Status() = default;  // success

  // An argument the launcher refuses (cudaErrorInvalidValue).
  static Status invalid(std::string message) { return Status(cudaErrorInvalidValue, std::move(message)); }
  // A CUDA runtime error, `where` naming the call or kernel.
  static Status from_cuda(cudaError_t code, const std::string& where);

  bool ok() const { return code_ == cudaSuccess; }
  cudaError_t code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(cudaError_t code, std::string message) : code_(code), message_(std::move(message)) {}
  cudaError_t code_ = cudaSuccess;
  std::string message_;
};

// The status of the kernel launch just made (cudaGetLastError), naming `kernel`.
Status launch_status(const char* kernel);

// Throws kiln::Error with the status' message when it is not ok.
void throw_if_error(const Status& status);

}  // namespace kiln::cuda
