// Per-group scales (or lows) as the group kernels read them (group_gemv.cpp, int4_gemv.cpp,
// group_dequant.cpp), in one of three forms:
// - float16 [N, G]: where the format's own numbers are float16 (Q8_0, Q5_0, Q4_0, Q4_1);
// - float32 [N, G]: where float16 would round them;
// - factored: int8 codes [N, G] times one float32 step per span of groups [N, G / span]. A GGUF's
//   k-quants store each group's scale as a small integer times the super-block's float16 d (Q4_K:
//   6-bit scales and mins, Q6_K: 8-bit scales), so factored they cost a byte a group, not four:
//   the Q4_K weight streams 4.75 bits instead of 6 and the Q6_K one 8.6 instead of 10, with the
//   same float32 numbers (group_scales.cpp finds the factors and checks they are exact).
// Kernels expand a row's scales to float32 once per row (a few hundred numbers against the
// row's thousands of codes) and read floats in their loops, whatever the form.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <optional>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace radixserve {

#if defined(__AVX2__)
// Eight int8 codes as floats times their step: a factored scale's values, as expand() gives them
// (the kernels that read codes and steps directly make them with this too).
inline __m256 codes_times_step(const int8_t* codes, float step) {
  return _mm256_mul_ps(_mm256_set1_ps(step),
                       _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)))));
}
#endif

struct GroupScales {
  at::ScalarType type = at::kFloat;
  const void* values = nullptr;
  const float* steps = nullptr;  // factored only
  int64_t groups = 0;            // per row
  int64_t span = 1;              // groups per step (factored only)

  // `values` [rows, groups] (float16, float32, or int8 with `steps` [rows, groups / span] float32).
  static GroupScales of(const at::Tensor& values, const std::optional<at::Tensor>& steps, int64_t rows,
                        int64_t groups, const char* what) {
    TORCH_CHECK(values.is_contiguous() && values.dim() == 2 && values.size(0) == rows && values.size(1) == groups,
                what, ": scales are contiguous [N, groups] = [", rows, ", ", groups, "]");
    GroupScales s;
    s.type = values.scalar_type();
    s.groups = groups;
    if (s.type == at::kChar) {
      TORCH_CHECK(steps.has_value() && steps->is_contiguous() && steps->scalar_type() == at::kFloat &&
                      steps->dim() == 2 && steps->size(0) == rows && steps->size(1) > 0 &&
                      groups % steps->size(1) == 0,
                  what, ": int8 scale codes need float32 steps [N, groups / span]");
      s.span = groups / steps->size(1);
      s.steps = steps->data_ptr<float>();
      s.values = values.data_ptr<int8_t>();
    } else {
      TORCH_CHECK(s.type == at::kHalf || s.type == at::kFloat, what, ": scales are float16, float32 or int8 codes");
      TORCH_CHECK(!steps.has_value(), what, ": steps go with int8 scale codes only");
      s.values = values.data_ptr();
    }
    return s;
  }

  // Groups [g0, g0 + width) of one row as float32 into dst [width] (the numbers expand gives; the
  // tile kernels take a tile's groups at a time).
  void expand_part(int64_t row, int64_t g0, int64_t width, float* dst) const { expand_run(row * groups + g0, width, dst); }

  // Rows [row, row + count) as float32 into dst [count * groups].
  void expand(int64_t row, int64_t count, float* dst) const { expand_run(row * groups, count * groups, dst); }

  // The `total` values from flat index `at` (rows one after another) as float32 into dst.
  void expand_run(int64_t at, int64_t total, float* dst) const {
    if (type == at::kFloat) {
      std::memcpy(dst, static_cast<const float*>(values) + at, total * sizeof(float));
    } else if (type == at::kHalf) {
      const c10::Half* src = static_cast<const c10::Half*>(values) + at;
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= total; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
#elif defined(__F16C__)
      // AVX2 CPUs convert 8 a vector (the scalar loop took 2-3 ms of a 262144-row layer's 12)
      for (; i + 8 <= total; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
      for (; i < total; ++i) dst[i] = static_cast<float>(src[i]);
    } else if (at % span != 0 || total % span != 0) {  // part of a span (a small tile's groups)
      const int8_t* codes = static_cast<const int8_t*>(values);
      for (int64_t i = at; i < at + total; ++i) dst[i - at] = steps[i / span] * static_cast<float>(codes[i]);
    } else {
      const int8_t* codes = static_cast<const int8_t*>(values) + at;
      const float* step = steps + at / span;  // spans never cross rows: one flat run
      int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
      // 16 codes a vector, their steps broadcast (span 16) or two of them (span 8): the scalar loop
      // cost as much as reading the row's codes
      if (span == 8 || span == 16)
        for (; i + 16 <= total; i += 16) {
          const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i))));
          const __m512 s = span == 16 ? _mm512_set1_ps(step[i / 16])
                                      : _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(step[i / 8])),
                                                           _mm256_set1_ps(step[i / 8 + 1]), 1);
          _mm512_storeu_ps(dst + i, _mm512_mul_ps(s, c));
        }
#elif defined(__AVX2__)
      // a step at a time, its span 8 codes a vector: `step[i / span]` per vector was a 64-bit
      // division each 8 groups, which cost the int16 loops' one-row calls a tenth of their time
      if (span % 8 == 0)
        for (int64_t s = 0; i + span <= total; ++s)
          for (const int64_t stop = i + span; i < stop; i += 8) _mm256_storeu_ps(dst + i, codes_times_step(codes + i, step[s]));
#endif
      for (; i < total; i += span) {
        const float s = step[i / span];
#pragma omp simd
        for (int64_t j = 0; j < span; ++j) dst[i + j] = s * static_cast<float>(codes[i + j]);
      }
    }
  }
};

}  // namespace radixserve
