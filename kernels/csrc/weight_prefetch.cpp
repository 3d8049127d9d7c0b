// The few-row kernels' prefetch line (weight_prefetch.h) as an op, for warm-up to set once it has
// timed both lines on this machine (runtime/cpu/weight_prefetch.py).
#include <torch/library.h>

#include "weight_prefetch.h"

namespace {

// Sets the activation bytes past which the 4- and 6-bit kernels prefetch their weights (0: at
// every width; negative: the built-in line, kSpillBytes) and returns the line it replaced.
int64_t set_weight_prefetch_line(int64_t bytes) {
  return radixserve::spill_line.exchange(bytes < 0 ? radixserve::kSpillBytes : bytes);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("set_weight_prefetch_line(int bytes) -> int", set_weight_prefetch_line);
}
