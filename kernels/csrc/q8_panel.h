// The panel loops of the int8-activation kernels on AVX2 (`--int8-activations`): int4_q8_gemv.cpp's
// Q4_K codes (below) and group_q8_gemv.cpp's Q6_K codes (namespace codes, at the end): many
// activation rows rounded to int8 against 16 weight rows at a time, for the products of a prompt
// and of wide decode steps.
//
// Why: the few-row loop reads one weight row along K, so each (weight row, activation row) pair
// keeps its own integer and float sums, and past a few rows that bookkeeping and its spills bound
// it: about 50 GMAC/s on a 2-core Zen 3 at 64-512 rows, no faster than dequantized slices through
// torch's float32 GEMM, where u8 x s8 products could do several times that. Here a panel holds 16
// weight rows' codes side by side: one 32-byte vector is 8 weight rows' 4 codes at one "k-quad"
// (4 positions of a group), so one broadcast of an activation row's 4 bytes and one u8 x s8
// multiply-add give 8 weight rows' sums at once. A group's 8 quads sum in 16 bits (at most
// 8 x 2 x 15 x 127 = 30480), a 16-bit multiply-add by the weight rows' scale codes turns them into
// 32 bits, a super-block's 8 groups sum there, and floats come once a super-block (its steps
// times the activations' scale). The lows' part, sum_g low_g * sum(x in g), is added in floats
// from the unrounded activations' group sums, as in the few-row loop.
//
// The quads are the few-row loop's own (int4_blocks.h): a tile register's masked bytes hold, in
// each 32-bit lane, 4 codes of one group (8v, 8v + 4, 8v + 1, 8v + 5), its shifted ones 4 more
// (8v + 2, 8v + 6, 8v + 3, 8v + 7); int4_q8_gemv.cpp's Q8Activations lays the activations out in
// that order, so the panel reads them as they are. The panel is laid out once a call per 16 weight
// rows (a byte a code: 24 KB at K = 1536, 140 KB at 8960) and reread by every 2 activation rows
// from the first- or second-level cache. Measured (2-core Zen 3, 2 threads, 1536x8960 and
// 8960x1536): 70 GMAC/s at 16 rows, 110-160 at 64-512, against 40-50 and 50-57 for the few-row
// loop and 45-75 for dequantized slices through torch's float32 GEMM. 3 or 4 activation rows a
// pass ran no faster than 2.
//
// A row's result is the same in every call that takes this loop (rows are independent and their
// sums run in one order), not bit for bit the few-row loop's (its float sums run in another).
#pragma once

// Whether these loops are built: AVX2 without AVX-512 (AVX-512's int8-activation loops take 8 rows
// a call and have none). The kernels that call them ask this, not the flags again.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define RADIXSERVE_Q8_PANEL 1
#else
#define RADIXSERVE_Q8_PANEL 0
#endif

#if RADIXSERVE_Q8_PANEL
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "activations16.h"  // CacheLineAllocator
#include "group_scales.h"
#include "int4_blocks.h"
#include "row_count.h"
#include "six_bit_codes.h"
#include "weight_prefetch.h"

namespace radixserve::q8panel {

constexpr int64_t kCols = 16;  // weight rows a panel holds
constexpr int kRows = 2;       // activation rows a pass: 4 sums in 16 bits, 4 in 32, 2 codes, 1 broadcast

// --- what both kinds share ---

// One panel's scale codes [groups][16], each in both 16-bit halves of a 32-bit lane (the 16-bit
// multiply-add's other operand), and steps [supers][16]; zeros past count.
struct PanelScales {
  std::vector<int32_t> codes;
  std::vector<float> steps;

  PanelScales(int64_t groups, int64_t span) : codes(groups * kCols), steps(groups / span * kCols) {}

  // scale codes c [n, groups], steps st [n, groups / span]; weight rows j0.. 16 groups at a time by
  // a 16 x 16 byte transpose (lane by lane, a visible share of a 16-row call in perf; Q6_K has a
  // scale per 16 codes), the rest one by one.
  void load(const int8_t* c, const float* st, int64_t j0, int64_t count, int64_t groups, int64_t span) {
    const int64_t supers = groups / span;
    int64_t g0 = 0;
    for (; g0 + 16 <= groups; g0 += 16) {
      __m128i r[16];
#pragma GCC unroll 16
      for (int64_t row = 0; row < kCols; ++row)
        r[row] = row < count ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + (j0 + row) * groups + g0))
                             : _mm_setzero_si128();
      transpose_bytes(r);  // r[i]: group g0 + i's 16 rows
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const __m256i x = _mm256_cvtepi8_epi16(r[i]);  // rows 0..15 sign-extended to 16 bits
        const __m256i lo = _mm256_unpacklo_epi16(x, x), hi = _mm256_unpackhi_epi16(x, x);  // rows 0-3, 8-11 | 4-7, 12-15
        int32_t* at = codes.data() + (g0 + i) * kCols;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
      }
    }
    for (int64_t g = g0; g < groups; ++g)
      for (int64_t r = 0; r < kCols; ++r) {
        const int32_t code = r < count ? c[(j0 + r) * groups + g] : 0;
        codes[g * kCols + r] = (code & 0xFFFF) | (code << 16);
      }
    for (int64_t s = 0; s < supers; ++s)
      for (int64_t r = 0; r < kCols; ++r) steps[s * kCols + r] = r < count ? st[(j0 + r) * supers + s] : 0.f;
  }

 private:
  // 16 rows of 16 bytes transposed in place: afterwards r[i]'s byte j is what r[j]'s byte i was.
  // Each stage interleaves twice as many rows in twice as wide elements.
  static void transpose_bytes(__m128i (&r)[16]) {
    __m128i a[16], b[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {  // a[2i + h]: 16-bit element j = rows 2i, 2i + 1 at byte 8h + j
      a[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
      a[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)  // b[4i + m]: 32-bit element j = rows 4i..4i + 3 at byte 4m + j
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        b[4 * i + 2 * h] = _mm_unpacklo_epi16(a[4 * i + h], a[4 * i + 2 + h]);
        b[4 * i + 2 * h + 1] = _mm_unpackhi_epi16(a[4 * i + h], a[4 * i + 2 + h]);
      }
#pragma GCC unroll 2
    for (int o = 0; o < 2; ++o)  // a[8o + p]: 64-bit element j = rows 8o..8o + 7 at byte 2p + j
#pragma GCC unroll 4
      for (int m = 0; m < 4; ++m) {
        a[8 * o + 2 * m] = _mm_unpacklo_epi32(b[8 * o + m], b[8 * o + 4 + m]);
        a[8 * o + 2 * m + 1] = _mm_unpackhi_epi32(b[8 * o + m], b[8 * o + 4 + m]);
      }
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {  // r[j]: rows 0..15 at byte j
      r[2 * p] = _mm_unpacklo_epi64(a[p], a[8 + p]);
      r[2 * p + 1] = _mm_unpackhi_epi64(a[p], a[8 + p]);
    }
  }
};

// The integer core: M activation rows (xq, rows k apart; xscale [M, supers]) against a panel of
// groups of Quads quads (panel[(g * Quads + q) * 16 + c]), Span groups a super-block; adds each
// row's float sums into facc. offset(g, q): where quad q of group g lies in an activation row;
// start(m, g): the 16-bit sums a group starts from. Not inlined: inlined into the loop over panels,
// GCC allocated its registers worse (53 against 67 GMAC/s on one thread, Q4_K 8960 x 1536, 256 rows).
template <int M, int Quads, int Span, typename Offset, typename Start>
__attribute__((noinline)) void sum_panel(const uint32_t* panel, const PanelScales& ps, int64_t groups, int64_t k, const int8_t* xq,
                      const float* xscale, Offset offset, Start start, __m256 (&facc)[M][2]) {
  const int64_t supers = groups / Span;
  for (int64_t s = 0; s < supers; ++s) {
    __m256i wide[M][2];
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) wide[m][0] = wide[m][1] = _mm256_setzero_si256();
    for (int64_t g = s * Span; g < (s + 1) * Span; ++g) {
      __m256i narrow[M][2];
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) narrow[m][0] = narrow[m][1] = start(m, g);
      const uint32_t* pg = panel + g * Quads * kCols;
#pragma GCC unroll 8
      for (int q = 0; q < Quads; ++q) {
        const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + q * kCols));
        const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + q * kCols + 8));
        const int64_t at = offset(g, q);
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) {
          int32_t four;
          std::memcpy(&four, xq + m * k + at, sizeof(four));
          const __m256i xv = _mm256_set1_epi32(four);
          narrow[m][0] = _mm256_add_epi16(narrow[m][0], _mm256_maddubs_epi16(w0, xv));
          narrow[m][1] = _mm256_add_epi16(narrow[m][1], _mm256_maddubs_epi16(w1, xv));
          // one running sum each: GCC otherwise regroups the unrolled adds into a tree whose
          // products spill to the stack (half the loop's time)
          asm("" : "+x"(narrow[m][0]), "+x"(narrow[m][1]));
        }
      }
      const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ps.codes.data() + g * kCols));
      const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ps.codes.data() + g * kCols + 8));
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) {
        wide[m][0] = _mm256_add_epi32(wide[m][0], _mm256_madd_epi16(narrow[m][0], c0));
        wide[m][1] = _mm256_add_epi32(wide[m][1], _mm256_madd_epi16(narrow[m][1], c1));
      }
    }
    const __m256 st0 = _mm256_loadu_ps(ps.steps.data() + s * kCols), st1 = _mm256_loadu_ps(ps.steps.data() + s * kCols + 8);
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) {
      const __m256 xs = _mm256_set1_ps(xscale[m * supers + s]);
      facc[m][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide[m][0]), _mm256_mul_ps(st0, xs), facc[m][0]);
      facc[m][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide[m][1]), _mm256_mul_ps(st1, xs), facc[m][1]);
    }
  }
}

// out[m * n + c] = facc's row m, weight row c < count, rounded once to O.
template <int M, typename O>
inline void store_rows(const __m256 (&facc)[M][2], O* out, int64_t n, int64_t count) {
  alignas(32) float row[kCols];
  for (int m = 0; m < M; ++m) {
    _mm256_store_ps(row, facc[m][0]);
    _mm256_store_ps(row + 8, facc[m][1]);
    for (int64_t c = 0; c < count; ++c) out[m * n + c] = static_cast<O>(row[c]);
  }
}

// Panels [begin, end) of n weight rows against `rows` activation rows: prepare(j0, count) lays out
// a panel, then pass(M, m0, j0, count) runs M = 1..kRows activation rows from m0 against it. The
// weights are row_bytes a row from w (both kinds keep a panel's rows in one run of memory); the
// next panel's are asked for while this one's passes run, a share a pass, so that laying it out
// finds them in the second-level cache: laying out waited on memory for most of its time (one
// thread of a 2-core Zen 3 reads the weights far below the memory's rate).
template <typename Prepare, typename Pass>
inline void over_panels(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t begin, int64_t end, int64_t rows,
                        Prepare prepare, Pass pass) {
  const int64_t passes = (rows + kRows - 1) / kRows;
  for (int64_t b = begin; b < end; ++b) {
    const int64_t j0 = b * kCols, count = std::min(kCols, n - j0);
    prepare(j0, count);
    const uint8_t* next = w + (j0 + kCols) * row_bytes;
    const int64_t next_bytes = b + 1 < end ? std::min(kCols, n - j0 - kCols) * row_bytes : 0;
    for (int64_t m0 = 0, i = 0; m0 < rows; m0 += kRows, ++i) {
      prefetch_part(next, next_bytes, i, passes);
      with_row_count<kRows>(std::min<int64_t>(kRows, rows - m0), [&](auto m) { pass(m, m0, j0, count); });
    }
  }
}

// Eight registers' 32-bit lanes transposed in place: afterwards r[i]'s lane c is what r[c]'s lane
// i was (both lay-outs below turn 8 weight rows' runs of 8 quads into 8 quads' runs of 8 rows).
inline void transpose_lanes(__m256i (&r)[8]) {
  __m256i t[8], u[8];
#pragma GCC unroll 8
  for (int c = 0; c < 8; c += 2) {
    t[c] = _mm256_unpacklo_epi32(r[c], r[c + 1]);
    t[c + 1] = _mm256_unpackhi_epi32(r[c], r[c + 1]);
  }
#pragma GCC unroll 8
  for (int q = 0; q < 8; q += 4) {
    u[q] = _mm256_unpacklo_epi64(t[q], t[q + 2]);
    u[q + 1] = _mm256_unpackhi_epi64(t[q], t[q + 2]);
    u[q + 2] = _mm256_unpacklo_epi64(t[q + 1], t[q + 3]);
    u[q + 3] = _mm256_unpackhi_epi64(t[q + 1], t[q + 3]);
  }
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    r[q] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x20);
    r[q + 4] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x31);
  }
}

// --- Q4_K's codes in int4_blocks.h's layout (int4_q8_gemv.cpp) ---

using int4::kGroup;             // 32
constexpr int64_t kQuads = 8;   // k-quads a group: 4 registers x (masked, shifted)
constexpr int64_t kSpan = 8;    // groups a super-block (a scale step, an activation scale)

// Where quad q (2v + masked/shifted) of group g lies in a row of int4_q8_gemv.cpp's Q8Activations.
inline int64_t quad_at(int64_t groups, int64_t g, int64_t q) {
  const int4::Tile tile = int4::tile_holding(groups, g);
  return tile.group0 * kGroup + (q / 2) * 8 * tile.groups + (q % 2) * 4 * tile.groups + 4 * (g - tile.group0);
}

// Weight rows j0.. (count of them, the rest zeros) of int4_blocks.h's layout -> a panel:
// panel[(g * 8 + q) * 16 + c] weight row c's quad q of group g (4 codes, a byte each).
//
// Full tiles 8 weight rows at a time: a register half of each row holds one 32-bit lane per group
// (groups 8h..8h + 7), its masked nibbles quad 2v and its shifted ones quad 2v + 1, so the 8 rows'
// halves, transposed as 8 x 8 lanes, are the panel's 8 groups' two quads for those rows, 32 bytes
// each. Lane by lane, this layout was two thirds of a 16-row call's time (37888 x 3584 on two
// threads, 2-core Zen 3: 34 ms, of which ~21 laying out). A row's small tiles (groups % 16) keep
// the lane-by-lane copy.
inline void lay_out_panel(const uint8_t* w, int64_t k, int64_t j0, int64_t count, uint32_t* panel) {
  using namespace int4;
  const int64_t groups = k / kGroup, full_tiles = groups / kTileGroups;
  if (count < kCols) std::memset(panel, 0, groups * kQuads * kCols * sizeof(uint32_t));
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t c0 = 0; c0 < count; c0 += 8)
    for (int64_t ti = 0; ti < full_tiles; ++ti)
      for (int v = 0; v < 4; ++v)
        for (int h = 0; h < 2; ++h) {
          __m256i masked[8], shifted[8];
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) {
            const __m256i words =
                c0 + c < count
                    ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_at(w, k, j0 + c0 + c, ti * 4 + v) + 32 * h))
                    : _mm256_setzero_si256();
            masked[c] = _mm256_and_si256(words, low4);
            shifted[c] = _mm256_and_si256(_mm256_srli_epi16(words, 4), low4);
          }
          transpose_lanes(masked);
          transpose_lanes(shifted);
          uint32_t* at = panel + ((ti * kTileGroups + 8 * h) * kQuads + 2 * v) * kCols + c0;
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i) {
            _mm256_store_si256(reinterpret_cast<__m256i*>(at + i * kQuads * kCols), masked[i]);
            _mm256_store_si256(reinterpret_cast<__m256i*>(at + i * kQuads * kCols + kCols), shifted[i]);
          }
        }
  alignas(32) uint32_t lanes[2][8];
  for (int64_t c = 0; c < count; ++c)
    for (int64_t ti = full_tiles, tiles = tile_count(groups); ti < tiles; ++ti) {
      const Tile tile = tile_of(groups, ti);  // a small tile's register: its 4 groups
      for (int v = 0; v < 4; ++v) {
        const __m256i words =
            _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(register_at(w, k, j0 + c, tile, v))));
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), _mm256_and_si256(words, low4));
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), _mm256_and_si256(_mm256_srli_epi16(words, 4), low4));
        for (int64_t i = 0; i < kSmallGroups; ++i) {
          const int64_t g = tile.group0 + i;
          panel[(g * kQuads + 2 * v) * kCols + c] = lanes[0][i];
          panel[(g * kQuads + 2 * v + 1) * kCols + c] = lanes[1][i];
        }
      }
    }
}

// Weight rows [16 * begin, 16 * end) against all `rows` activation rows (xq [rows, k] in
// Q8Activations' order, xscale [rows, supers], xsum [rows, groups] of the unrounded activations;
// quads[g * 8 + q] = quad_at(groups, g, q)), a panel at a time. The lows' part,
// sum_g low_g * sum(x in g), is added in floats. out[m * n + j].
template <typename O>
void products(const uint8_t* w, const GroupScales& scales, const GroupScales& lows, int64_t n, int64_t k,
              int64_t begin, int64_t end, const int8_t* xq, const float* xscale, const float* xsum,
              const int64_t* quads, int64_t rows, O* out) {
  const int64_t groups = k / kGroup, supers = groups / kSpan;
  std::vector<uint32_t, CacheLineAllocator<uint32_t>> panel(groups * kQuads * kCols);
  PanelScales ps(groups, kSpan);
  std::vector<float> expanded(groups * kCols), low(groups * kCols);  // lows [count, groups] -> [groups][16]
  const auto offset = [&](int64_t g, int q) { return quads[g * kQuads + q]; };
  const auto start = [](int, int64_t) { return _mm256_setzero_si256(); };
  over_panels(w, k / 2, n, begin, end, rows, [&](int64_t j0, int64_t count) {
    lay_out_panel(w, k, j0, count, panel.data());
    ps.load(static_cast<const int8_t*>(scales.values), scales.steps, j0, count, groups, kSpan);
    lows.expand(j0, count, expanded.data());
    for (int64_t c0 = 0; c0 < kCols; c0 += 8)  // 8 rows x 8 groups at a time (groups: a multiple of kSpan)
      for (int64_t g0 = 0; g0 < groups; g0 += 8) {
        __m256i r[8];
#pragma GCC unroll 8
        for (int64_t c = 0; c < 8; ++c)
          r[c] = c0 + c < count ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(expanded.data() + (c0 + c) * groups + g0))
                                : _mm256_setzero_si256();
        transpose_lanes(r);
#pragma GCC unroll 8
        for (int64_t i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(low.data() + (g0 + i) * kCols + c0), r[i]);
      }
  }, [&](auto rows_now, int64_t m0, int64_t j0, int64_t count) {
    constexpr int M = decltype(rows_now)::value;
    __m256 facc[M][2];
    for (int m = 0; m < M; ++m) facc[m][0] = facc[m][1] = _mm256_setzero_ps();
    sum_panel<M, kQuads, kSpan>(panel.data(), ps, groups, k, xq + m0 * k, xscale + m0 * supers, offset, start, facc);
    for (int64_t g = 0; g < groups; ++g) {
      const __m256 l0 = _mm256_loadu_ps(low.data() + g * kCols), l1 = _mm256_loadu_ps(low.data() + g * kCols + 8);
      for (int m = 0; m < M; ++m) {
        const __m256 xs = _mm256_set1_ps(xsum[(m0 + m) * groups + g]);
        facc[m][0] = _mm256_fmadd_ps(l0, xs, facc[m][0]);
        facc[m][1] = _mm256_fmadd_ps(l1, xs, facc[m][1]);
      }
    }
    store_rows<M>(facc, out + m0 * n + j0, n, count);
  });
}

// --- Q6_K's int8 codes (group_q8_gemv.cpp) ---
//
// Plain [N, K] codes in [-32, 31], groups of 16 (4 quads), 16 groups a super-block. The codes are
// offset to unsigned (+32) in the panel; a group's 4 quads sum in 16 bits with wrapping adds from
// the activation row's own -32 x (sum of its activations at the quads' positions 0, 1 | 2, 3):
// the true sum, at most 4 x 2 x 32 x 127 = 32512, fits 16 bits, so the wrapped arithmetic gives
// it exactly.
namespace codes {

constexpr int64_t kGroup = 16;
constexpr int64_t kQuads = 4;   // quads a group
constexpr int64_t kSpan = 16;   // groups a super-block

// Rows j0.. (count; the rest zeros, whose sums are never written) of codes w -> panel[kq * 16 + c]:
// row c's codes 4kq..4kq + 3 plus 32, as 4 bytes. 8 rows x 8 quads at a time by an 8 x 8
// transpose of 32-bit lanes. The codes: int8 [n, k] (Six false), or six_bit_codes.h's layout,
// six_bits::row_bytes<true>(k) a row (Six true): the same panel.
template <bool Six>
inline void lay_out_panel(const uint8_t* w, int64_t k, int64_t j0, int64_t count, uint32_t* panel) {
  const int64_t stride = six_bits::row_bytes<Six>(k);
  // a super-block's run (the loop below unrolls it, so the six-bit unpacking's shifts are fixed)
  const auto codes_plus_32 = [&](int64_t row, int64_t s, int run) {
    return six_bits::codes_plus_32<Six>(w + (j0 + row) * stride + s * six_bits::super_bytes<Six>, run);
  };
  for (int64_t half = 0; half < 2; ++half)
    for (int64_t s = 0; s < k / 256; ++s)
#pragma GCC unroll 8
      for (int run = 0; run < 8; ++run) {
        __m256i r[8];
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          const int64_t row = 8 * half + c;
          r[c] = row < count ? codes_plus_32(row, s, run) : _mm256_setzero_si256();
        }
        transpose_lanes(r);
        uint32_t* at = panel + (s * 256 + 32 * run) / 4 * kCols + 8 * half;
#pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + q * kCols), r[q]);
      }
}

// An activation row's offsets to take back, a group at a time: -32 x the sums of its activations
// at quad positions 0, 1 (low 16 bits) and 2, 3 (high), as one 32-bit word (each half negated on
// its own: the word a group's 16-bit sums start from).
inline void offsets(const int8_t* q, int64_t k, int32_t* out) {
  for (int64_t g = 0; g < k / kGroup; ++g) {
    int32_t even = 0, odd = 0;
    for (int64_t i = 0; i < kGroup; i += 4) {
      even += q[g * kGroup + i] + q[g * kGroup + i + 1];
      odd += q[g * kGroup + i + 2] + q[g * kGroup + i + 3];
    }
    out[g] = static_cast<int32_t>((static_cast<uint32_t>(-32 * even) & 0xFFFFu) | (static_cast<uint32_t>(-32 * odd) << 16));
  }
}

// Weight rows [16 * begin, 16 * end) of codes w (as lay_out_panel<Six> reads them; scale codes
// [n, groups], steps [n, supers]) against all `rows` activation rows (xq [rows, k] in order, xscale
// [rows, supers], xoff [rows, groups] from offsets()), a panel at a time. out[m * n + j].
template <bool Six, typename O>
void products(const uint8_t* w, const int8_t* scale_codes, const float* steps, int64_t n, int64_t k, int64_t begin,
              int64_t end, const int8_t* xq, const float* xscale, const int32_t* xoff, int64_t rows, O* out) {
  const int64_t groups = k / kGroup, supers = groups / kSpan;
  std::vector<uint32_t, CacheLineAllocator<uint32_t>> panel(k / 4 * kCols);
  PanelScales ps(groups, kSpan);
  const auto offset = [](int64_t g, int q) { return g * kGroup + 4 * q; };
  over_panels(w, six_bits::row_bytes<Six>(k), n, begin, end, rows, [&](int64_t j0, int64_t count) {
    lay_out_panel<Six>(w, k, j0, count, panel.data());
    ps.load(scale_codes, steps, j0, count, groups, kSpan);
  }, [&](auto rows_now, int64_t m0, int64_t j0, int64_t count) {
    constexpr int M = decltype(rows_now)::value;
    const int32_t* own = xoff + m0 * groups;
    const auto start = [&](int m, int64_t g) { return _mm256_set1_epi32(own[m * groups + g]); };
    __m256 facc[M][2];
    for (int m = 0; m < M; ++m) facc[m][0] = facc[m][1] = _mm256_setzero_ps();
    sum_panel<M, kQuads, kSpan>(panel.data(), ps, groups, k, xq + m0 * k, xscale + m0 * supers, offset, start, facc);
    store_rows<M>(facc, out + m0 * n + j0, n, count);
  });
}

}  // namespace codes

// The fewest rows a call takes these loops for (RADIXSERVE_Q8_PANEL_ROWS moves it, for measuring).
inline int64_t rows_from() {
  static const int64_t from = [] {
    const char* v = std::getenv("RADIXSERVE_Q8_PANEL_ROWS");
    return v ? std::atoll(v) : int64_t{8};
  }();
  return from;
}

}  // namespace radixserve::q8panel
#endif
