// Activations rounded to int8 per super-block of 256, as llama.cpp's Q8_K: the `--int8-activations`
// loops (int4_q8_gemv.cpp for Q4_K codes, group_q8_gemv.cpp for Q6_K's) multiply them with the
// weights' codes by u8 x s8 products summed in 16 bits, so a 32-byte register of codes costs one
// multiply where 16-bit activations cost two. Each super-block is scaled so its largest magnitude
// is 127 and rounded to nearest even; a super-block of zeros gets scale 0 and codes 0.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace radixserve {

constexpr int64_t kSuperBlock = 256;  // activations an int8 scale covers (a k-quant's super-block)

// The 256 activations of row m's super-block s as float32 into v.
template <typename T>
inline void load_super(const at::Tensor& x, const T* xs, int64_t m, int64_t s, float* v) {
  const T* src = xs + m * x.stride(0) + s * kSuperBlock * x.stride(1);
  if constexpr (std::is_same_v<T, float>) {
    if (x.stride(1) == 1) {
      std::memcpy(v, src, kSuperBlock * sizeof(float));
      return;
    }
  }
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (x.stride(1) == 1) {  // bf16 is float32's top half
      for (int64_t i = 0; i < kSuperBlock; i += 16)
        _mm512_storeu_ps(v + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                    _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))), 16)));
      return;
    }
  }
#elif defined(__AVX2__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (x.stride(1) == 1) {
      for (int64_t i = 0; i < kSuperBlock; i += 8)
        _mm256_storeu_ps(v + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                    _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))), 16)));
      return;
    }
  }
#endif
  for (int64_t i = 0; i < kSuperBlock; ++i) v[i] = static_cast<float>(src[i * x.stride(1)]);
}

// v [256] float32 (64-byte aligned) -> q [256] int8, returning the scale (v ~= q * scale).
inline float round_super_to_int8(const float* v, int8_t* q) {
  float top = 0.f;
#pragma omp simd reduction(max : top)
  for (int64_t i = 0; i < kSuperBlock; ++i) top = std::max(top, std::abs(v[i]));
  const float inv = top > 0.f ? 127.f / top : 0.f;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  for (int64_t i = 0; i < kSuperBlock; i += 16)  // rounded to nearest even, as nearbyint
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(v + i), _mm512_set1_ps(inv)))));
#elif defined(__AVX2__)
  const __m256 by = _mm256_set1_ps(inv);
  const auto rounded = [&](int64_t i) { return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(v + i), by)); };
  for (int64_t i = 0; i < kSuperBlock; i += 32) {  // the packs interleave 4-byte runs; the permute orders them
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(rounded(i), rounded(i + 8)),
                                             _mm256_packs_epi32(rounded(i + 16), rounded(i + 24)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
#else
  for (int64_t i = 0; i < kSuperBlock; ++i) q[i] = static_cast<int8_t>(std::nearbyint(v[i] * inv));
#endif
  return top / 127.f;
}

}  // namespace radixserve
