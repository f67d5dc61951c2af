// Decode attention kernels for head size 256 (see attention_kernel.cuh).
#include "backend/cuda/attention_kernel.cuh"

namespace kiln::cuda::detail {
template Status launch_head_dim<256>(const DecodeAttentionArgs&, const DecodeAttentionPlan&, float*, cudaStream_t);
}  // namespace kiln::cuda::detail
