// The sum of an AVX float vector's 8 lanes, for the few-row kernels' AVX2 loops (group_gemv.cpp,
// group_q8_gemv.cpp, int4_gemv.cpp, int4_q8_gemv.cpp): one fixed order (the two halves, then
// pairs, then the last two), so a row's sum rounds the same way in every loop that ends with it.
#pragma once

#if defined(__AVX__)
#include <immintrin.h>

namespace radixserve {

inline float reduce_add(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
}

}  // namespace radixserve
#endif
