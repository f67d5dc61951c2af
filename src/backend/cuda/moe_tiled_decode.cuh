#pragma once
// The MoE decode products over experts in the row-tile layout (expert_tiles.h), launched by
// moe_ffn_matvec (moe_matvec.cu) in place of its staged kernels for the matrices that are.
#include <cuda_runtime_api.h>

#include "backend/cuda/moe.h"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/status.h"

namespace kiln::cuda::detail {

// gate / up + GLU of every (token, slot) pair into h, and, where hq.qs is set, h's int8 copy
// (blocks of 32 rows: n_ff % 32 == 0, as the layout requires). x's int8 copy in xq. Reads the
// ids after its wait (the kernel before may have written them) and lets the next kernel start
// at once. With a folded front (a.front of moe.h) it ranks the slots from its sums after the
// wait and normalizes and quantizes x itself (xq unused).
Status launch_tiled_gate_up(const MoeFfnArgs& a, const Q8Rows& xq, float* h, const Q8Rows& hq, cudaStream_t stream);

// down of every token, its slots weighted and summed, into a.out (and a.residual): h's int8
// copy in hq. Reads the ids before its wait (they were written two kernels back), with its
// first weights (with a folded front, a.front of moe.h, ranks the slots from its sums there).
Status launch_tiled_down(const MoeFfnArgs& a, const Q8Rows& hq, cudaStream_t stream);

// Whether these kernels take a.front (moe.h's moe_folded_front_fits).
bool folded_front_fits(const MoeFfnArgs& a);

}  // namespace kiln::cuda::detail
