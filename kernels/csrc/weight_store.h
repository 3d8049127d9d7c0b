// Dequantized weights stored in the output dtype (float32 or bf16), shared by the kernels that
// dequantize rows for wide products (group_dequant.cpp, q6_gemv.cpp), so every layout rounds to
// bf16 the same way: round to nearest even on the float32 bits, as torch's cast does.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace radixserve {

// A run of float32 weights stored in the output dtype: bf16 by round-to-nearest-even on the bits
// (weights are finite), in a loop the compiler vectorizes; c10::BFloat16's conversion does not.
template <typename O>
inline void store(const float* w, int64_t count, O* out) {
  if constexpr (std::is_same_v<O, c10::BFloat16>) {
    uint16_t* o = reinterpret_cast<uint16_t*>(out);
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) {
      uint32_t bits;
      std::memcpy(&bits, w + i, sizeof(bits));
      o[i] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<O>(w[i]);
  }
}

#if defined(__AVX512F__)
// 16 float32 weights into the output dtype: bf16 by the same round-to-nearest-even on the bits as
// `store` (so the same bits), narrowed with one instruction.
template <typename O>
inline void store16(__m512 w, O* out) {
  if constexpr (std::is_same_v<O, c10::BFloat16>) {
    const __m512i bits = _mm512_castps_si512(w);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(rounded));
  } else {
    _mm512_storeu_ps(reinterpret_cast<float*>(out), w);
  }
}
#endif

}  // namespace radixserve
