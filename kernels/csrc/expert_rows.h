// What the experts' one-call kernels share (int4_gemv.cpp's int4_gemv_experts, q6_gemv.cpp's
// q6_gemv_experts, int4_q8_gemv.cpp's int4_gemv_q8_experts, group_q8_gemv.cpp's group_gemv_q8_experts):
// x's rows grouped by expert, counts[e] rows for expert e in order (as StackedExperts.forward_loop
// lays them out), and each expert's work split into units (weight-row quads, blocks or panels) that
// one parallel region spreads over the threads.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace radixserve {

// Checks x [sum(counts), K] (float32 or bfloat16, K a multiple of 256) and `experts` counts, each at
// least 1; returns where each expert's rows start, experts + 1 entries.
inline std::vector<int64_t> expert_rows(const at::Tensor& x, at::IntArrayRef counts, int64_t experts, const char* what) {
  TORCH_CHECK(experts > 0 && static_cast<int64_t>(counts.size()) == experts, what,
              ": as many counts as weights, scales and steps (at least one)");
  std::vector<int64_t> first(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e) {
    TORCH_CHECK(counts[e] > 0, what, ": every count is at least 1");
    first[e + 1] = first[e] + counts[e];
  }
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.size(0) == first[experts] &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              what, ": x is a CPU [sum(counts), K] float32 or bfloat16 tensor");
  TORCH_CHECK(x.size(1) % 256 == 0, what, ": K is a multiple of 256");
  return first;
}

// Units [begin, end) of all experts' work (expert e's are [unit[e], unit[e + 1])): work(e, from, to)
// for each expert's share, in its own unit numbers.
template <typename Work>
inline void for_expert_units(const std::vector<int64_t>& unit, int64_t begin, int64_t end, const Work& work) {
  const int64_t experts = static_cast<int64_t>(unit.size()) - 1;
  for (int64_t e = std::upper_bound(unit.begin(), unit.end(), begin) - unit.begin() - 1; e < experts && unit[e] < end;
       ++e)
    work(e, std::max(begin, unit[e]) - unit[e], std::min(end, unit[e + 1]) - unit[e]);
}

// Every expert's units [0, units) (one N for all) spread over the threads alike: each thread's
// chunk of units is taken for every expert in turn, work(e, from, to). The threads then share each
// expert's work evenly whatever the routing: split by experts instead, a skewed batch (16 streams of
// the 30B-A3B shape put 16 rows on a few experts and one on many) left one thread most of the rows.
// grain: units a chunk for one expert's work; a chunk does every expert's.
template <typename Work>
inline void for_every_expert(int64_t units, int64_t experts, int64_t grain, const Work& work) {
  at::parallel_for(0, units, std::max<int64_t>(1, grain / experts), [&](int64_t begin, int64_t end) {
    for (int64_t e = 0; e < experts; ++e) work(e, begin, end);
  });
}

}  // namespace radixserve
