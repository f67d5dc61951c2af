#pragma once
// The grouped q4_0 / q8_0 decode matvec (matvec_grouped.cu): whole groups of 8 blocks per
// lane, read with aligned 16-byte loads. matvec_q8 takes it when matvec_grouped_fits.
#include "backend/cuda/matvec.h"

namespace kiln::cuda {

// q4_0 or q8_0 weights, cols a multiple of 256, weights, rows and the quantized x 16-byte
// aligned, no tuning knobs set (those pick the general kernel).
bool matvec_grouped_fits(const MatvecArgs& args, const Q8Vector& xq);
Status matvec_q8_grouped(const MatvecArgs& args, const Q8Vector& xq, cudaStream_t stream);

}  // namespace kiln::cuda
