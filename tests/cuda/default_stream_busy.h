#pragma once
#include <cuda_runtime_api.h>

namespace kiln::testing {

// Queues one thread spinning `cycles` clock cycles on the legacy default stream and returns at
// once; false if the launch failed.
bool keep_default_stream_busy(long long cycles);

}  // namespace kiln::testing
