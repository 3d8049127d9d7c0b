// The panel loop of the int16 kernels (group_gemv.cpp's int8 codes): many activation rows rounded
// to int16 (activations16.h) against 16 weight rows at a time, on AVX2. (int4_gemv.cpp's 4-bit
// codes were tried through it too: 16-64 rows ran no faster than their own loop, which shares each
// decoded code among 2 weight rows x 4 activation rows, 45-50 GMAC/s either way; so they keep it.)
//
// Why: the one-row loops read a weight row along K, so every (weight row, activation row) pair
// ends in a sum across a vector's lanes and every group in a scaling of its own; past a few rows
// (a wide decode step, a jump-forward draft, a prompt) that bookkeeping, not the multiplies, bounds
// them (about 40 GMAC/s on a 2-core Zen 3 where vpmaddwd alone could do 190). Here a panel holds
// 16 weight rows' codes in pairs, [K / 2][16], so one vector (widened to int16) holds 8 weight
// rows' codes at one pair of K positions. Each activation row's pair is broadcast to it, one
// vpmaddwd gives 8 weight rows' pair sums, a group's integer sums stay in registers, and its
// scaling is one multiply-add for 8 weight rows. The panel is laid out once a call and reread by
// every 4 activation rows (from the first- or second-level cache: 2 bytes a weight, 20 KB at
// K = 640, 140 KB at 8960).
//
// A row's result is the same in every call that takes this loop (rows are independent, and their
// sums run in one order), but not bit for bit the one-row loops' (their float sums run in another).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "activations16.h"
#include "group_scales.h"
#include "row_count.h"
#include "weight_prefetch.h"

namespace radixserve::panel {

constexpr int64_t kCols = 16;  // weight rows a panel holds
constexpr int kRows = 4;       // activation rows a pass: 8 sums in registers, 2 codes, 1 broadcast

// Weight rows w[0..count) (the rest zeros) of K int8 codes -> a panel: panel[kp * 16 + c] row c's
// codes 2kp, 2kp + 1 (16 bits). Rows c and c + 8 share a vector (one a half), so one 8 x 8
// transpose of 16-bit pairs within the halves writes 16 rows' pair kp as one 32-byte store.
inline void lay_out_panel(const int8_t* w, int64_t k, int64_t count, int16_t* panel) {
  const auto row = [&](int64_t c, int64_t i) {
    return c < count ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c * k + i)) : _mm_setzero_si128();
  };
  for (int64_t i = 0; i < k; i += 16) {
    __m256i r[8], t[8], u[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) r[c] = _mm256_inserti128_si256(_mm256_castsi128_si256(row(c, i)), row(c + 8, i), 1);
#pragma GCC unroll 8
    for (int c = 0; c < 8; c += 2) {
      t[c] = _mm256_unpacklo_epi16(r[c], r[c + 1]);      // pairs 0-3 of rows c, c + 1 (each half)
      t[c + 1] = _mm256_unpackhi_epi16(r[c], r[c + 1]);  // pairs 4-7
    }
#pragma GCC unroll 8
    for (int q = 0; q < 8; q += 4) {  // rows q..q+3
      u[q] = _mm256_unpacklo_epi32(t[q], t[q + 2]);          // pairs 0, 1
      u[q + 1] = _mm256_unpackhi_epi32(t[q], t[q + 2]);      // pairs 2, 3
      u[q + 2] = _mm256_unpacklo_epi32(t[q + 1], t[q + 3]);  // pairs 4, 5
      u[q + 3] = _mm256_unpackhi_epi32(t[q + 1], t[q + 3]);  // pairs 6, 7
    }
    int16_t* at = panel + (i / 2) * kCols;
#pragma GCC unroll 8
    for (int h = 0; h < 4; ++h) {  // u[h]: pairs 2h, 2h + 1 of rows 0-3; u[h + 4] of rows 4-7
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + (2 * h) * kCols), _mm256_unpacklo_epi64(u[h], u[h + 4]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + (2 * h + 1) * kCols), _mm256_unpackhi_epi64(u[h], u[h + 4]));
    }
  }
}

// M activation rows (x16 [M, k] rows k apart, xs [M, groups] their scales) against a panel whose
// weight rows have scales ws [groups, 16]: w = scale * code. acc: [M, 16] floats of scratch.
// Writes out[m * n + c] for c < count.
template <int M, typename O>
void pass(const int16_t* panel, int64_t k, int64_t group, const float* ws, const int16_t* x16, const float* xs,
          float* acc, O* out, int64_t n, int64_t count) {
  const int64_t groups = k / group, pairs = group / 2;
  std::fill(acc, acc + M * kCols, 0.f);
  for (int64_t g = 0; g < groups; ++g) {
    __m256i part[M][2];
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) part[m][0] = part[m][1] = _mm256_setzero_si256();
    const int16_t* pg = panel + g * pairs * kCols;
    const int16_t* xg = x16 + g * group;
    for (int64_t p = 0; p < pairs; ++p) {
      // 8 weight rows' code pairs a vector, widened to int16 here (half the panel's bytes, and
      // its lay-out a quarter of the shuffles, against widening once there)
      __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pg + p * kCols)));
      __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pg + p * kCols + 8)));
      asm("" : "+x"(w0), "+x"(w1));  // in registers: GCC otherwise reloads them for every row's multiply
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        int32_t pair;
        std::memcpy(&pair, xg + m * k + 2 * p, sizeof(pair));
        const __m256i xv = _mm256_set1_epi32(pair);
        part[m][0] = _mm256_add_epi32(part[m][0], _mm256_madd_epi16(w0, xv));
        part[m][1] = _mm256_add_epi32(part[m][1], _mm256_madd_epi16(w1, xv));
      }
    }
    // the group's sums scaled into acc, in memory: a group's 8 or 16 pairs of multiply-adds outlast it
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m256 scale = _mm256_set1_ps(xs[m * groups + g]);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        float* am = acc + m * kCols + 8 * h;
        const __m256 both = _mm256_mul_ps(_mm256_loadu_ps(ws + g * kCols + 8 * h), scale);
        _mm256_storeu_ps(am, _mm256_fmadd_ps(_mm256_cvtepi32_ps(part[m][h]), both, _mm256_loadu_ps(am)));
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int64_t c = 0; c < count; ++c) out[m * n + c] = static_cast<O>(acc[m * kCols + c]);
}

// Weight rows [16 * begin, 16 * end) of the int8 codes w [n, k] against all `rows` activation
// rows, a panel at a time; scales in group_scales.h's forms. out[m * n + j].
template <typename O>
void products(const int8_t* w, const GroupScales& scales, int64_t n, int64_t k, int64_t group, int64_t begin,
              int64_t end, const int16_t* x16, const float* xs, int64_t rows, O* out) {
  const int64_t groups = k / group;
  std::vector<int16_t, CacheLineAllocator<int16_t>> panel(k / 2 * kCols);
  std::vector<float> expanded(kCols * groups), ws(groups * kCols), acc(kRows * kCols);
  for (int64_t b = begin; b < end; ++b) {
    const int64_t j0 = b * kCols, count = std::min(kCols, n - j0);
    lay_out_panel(w + j0 * k, k, count, panel.data());
    scales.expand(j0, count, expanded.data());  // [count, groups] -> [groups, 16]
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t c = 0; c < kCols; ++c) ws[g * kCols + c] = c < count ? expanded[c * groups + g] : 0.f;
    // the next panel's codes asked for while this one's passes run, a share a pass (as q8_panel.h)
    const int64_t next_bytes = b + 1 < end ? std::min(kCols, n - j0 - kCols) * k : 0;
    for (int64_t m0 = 0, i = 0; m0 < rows; m0 += kRows, ++i) {
      prefetch_part(w + (j0 + kCols) * k, next_bytes, i, (rows + kRows - 1) / kRows);
      with_row_count<kRows>(std::min<int64_t>(kRows, rows - m0), [&](auto m) {
        pass<decltype(m)::value>(panel.data(), k, group, ws.data(), x16 + m0 * k, xs + m0 * groups, acc.data(),
                                 out + m0 * n + j0, n, count);
      });
    }
  }
}

// The fewest rows a call takes this loop for: 8 (at 8 rows it runs about even with the one-row
// loop, past it ahead: 16-64 rows 1.3-2.5 times its rate, 2-core Zen 3); RADIXSERVE_PANEL_ROWS
// moves it, for measuring.
inline int64_t rows_from() {
  static const int64_t from = [] {
    const char* v = std::getenv("RADIXSERVE_PANEL_ROWS");
    return v ? std::atoll(v) : int64_t{8};
  }();
  return from;
}

}  // namespace radixserve::panel
#endif
