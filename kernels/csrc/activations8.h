// Activations rounded to int8 per super-block of 256, as llama.cpp's Q8_K: the `--int8-activations`
// loops (int4_q8_gemv.cpp for Q4_K codes, group_q8_gemv.cpp for Q6_K's) multiply them with the
// weights' codes by u8 x s8 products summed in 16 bits, so a 32-byte register of codes costs one
// multiply where 16-bit activations cost two. Each super-block is scaled so its largest magnitude
// is 127 and rounded to nearest even; a super-block of zeros gets scale 0 and codes 0.
//
// round_super_to_halves is the same rounding at 15 bits (largest magnitude 16383) with each code c
// split into two int8 codes, c = 128 * hi + lo (hi = c >> 7 in [-128, 127], lo = c & 127): the
// products of the AVX2 default's Q6_K layers (group_gemv_q8's `halves`) sum each half in the int8
// loops and add the two results, for an error far below the 8-bit rounding's.
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

// The largest magnitude of a super-block's 256 activations.
inline float super_top(const float* v) {
  float top = 0.f;
#pragma omp simd reduction(max : top)
  for (int64_t i = 0; i < kSuperBlock; ++i) top = std::max(top, std::abs(v[i]));
  return top;
}

#if defined(__AVX2__)
// 32 int32 lanes (four registers, each within int8's range) -> 32 int8 in order at q: the packs
// interleave 4-byte runs; the permute orders them.
inline void store_int8(__m256i a, __m256i b, __m256i c, __m256i d, int8_t* q) {
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#endif

// v [256] float32 (64-byte aligned) -> q [256] int8, returning the scale (v ~= q * scale).
inline float round_super_to_int8(const float* v, int8_t* q) {
  const float top = super_top(v);
  const float inv = top > 0.f ? 127.f / top : 0.f;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  for (int64_t i = 0; i < kSuperBlock; i += 16)  // rounded to nearest even, as nearbyint
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(v + i), _mm512_set1_ps(inv)))));
#elif defined(__AVX2__)
  const __m256 by = _mm256_set1_ps(inv);
  const auto rounded = [&](int64_t i) { return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(v + i), by)); };
  for (int64_t i = 0; i < kSuperBlock; i += 32) store_int8(rounded(i), rounded(i + 8), rounded(i + 16), rounded(i + 24), q + i);
#else
  for (int64_t i = 0; i < kSuperBlock; ++i) q[i] = static_cast<int8_t>(std::nearbyint(v[i] * inv));
#endif
  return top / 127.f;
}

// v [256] float32 (64-byte aligned) -> c = v / scale rounded to nearest even (|c| <= 16383) as its
// two halves hi [256] and lo [256] (c = 128 * hi + lo), returning the scale (v ~= c * scale).
inline float round_super_to_halves(const float* v, int8_t* hi, int8_t* lo) {
  const float top = super_top(v);
  const float inv = top > 0.f ? 16383.f / top : 0.f;
#if defined(__AVX2__)
  const __m256 by = _mm256_set1_ps(inv);
  const __m256i low7 = _mm256_set1_epi32(127);
  for (int64_t i = 0; i < kSuperBlock; i += 32) {
    __m256i c[4];
    for (int r = 0; r < 4; ++r) c[r] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(v + i + 8 * r), by));
    store_int8(_mm256_srai_epi32(c[0], 7), _mm256_srai_epi32(c[1], 7), _mm256_srai_epi32(c[2], 7),
               _mm256_srai_epi32(c[3], 7), hi + i);
    store_int8(_mm256_and_si256(c[0], low7), _mm256_and_si256(c[1], low7), _mm256_and_si256(c[2], low7),
               _mm256_and_si256(c[3], low7), lo + i);
  }
#else
  for (int64_t i = 0; i < kSuperBlock; ++i) {
    const int c = static_cast<int>(std::nearbyint(v[i] * inv));
    hi[i] = static_cast<int8_t>(c >> 7);  // arithmetic: the floor of c / 128
    lo[i] = static_cast<int8_t>(c & 127);
  }
#endif
  return top / 16383.f;
}

}  // namespace radixserve
