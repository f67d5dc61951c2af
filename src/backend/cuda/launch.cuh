#pragma once
// Kernel launches that chain onto the previous kernel of the stream (programmatic dependent
// launch, sm_90): the next kernel's blocks are scheduled while the previous one drains, and
// wait in wait_for_previous_kernels() (common.cuh) for its results. In a decode step of a
// few hundred short kernels this hides most of the gap between one kernel's end and the
// next one's start. Only kernels that call wait_for_previous_kernels() before touching data
// written by earlier kernels may be launched this way. KILN_CUDA_PDL=0 turns it off
// (ordinary launches), for measurements.
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/env_switch.h"
#include "backend/cuda/occupancy.h"

namespace kiln::cuda {

inline bool chained_launches_enabled() {
  static const bool enabled = !env_is("KILN_CUDA_PDL", "0");
  return enabled;
}

template <typename... Params, typename... Args>
cudaError_t launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                           Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  if (launch_report_enabled()) report_launch(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (chained_launches_enabled()) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// launch_chained() with the grid cut into thread block clusters of `cluster` blocks (sm_90;
// sizes above 8 need cudaFuncAttributeNonPortableClusterSizeAllowed set on the kernel).
template <typename... Params, typename... Args>
cudaError_t launch_chained_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block,
                                       size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  if (launch_report_enabled()) report_launch(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes);
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = cluster.x;
  attributes[0].val.clusterDim.y = cluster.y;
  attributes[0].val.clusterDim.z = cluster.z;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = chained_launches_enabled() ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kiln::cuda
