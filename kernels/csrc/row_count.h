// The activation-row count of a few-row kernel call as a compile-time constant: the kernels keep
// one accumulator per row in registers, so each count from 1 to Max (8 unless asked) is its own
// instantiation. with_row_count(rows, f) calls f(std::integral_constant<int, rows>{}); no rows,
// nothing to do.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <type_traits>

namespace radixserve {

template <int Max = 8, int M = 1, typename F>
void with_row_count(int64_t rows, F&& f) {
  if (rows <= 0) return;
  if constexpr (M <= Max) {
    if (rows == M) return f(std::integral_constant<int, M>{});
    return with_row_count<Max, M + 1>(rows, f);
  } else {
    TORCH_CHECK(false, "a few-row kernel takes 1 to ", Max, " rows, not ", rows);
  }
}

}  // namespace radixserve
