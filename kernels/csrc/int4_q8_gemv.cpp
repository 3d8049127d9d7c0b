// Few-row products of a GGUF's Q4_K codes with the activations quantized to int8, summed in
// integers, on CPUs with AVX-512 VNNI (Zen 4, Ice Lake and later) or AVX2 (the loops at the end):
// `--int8-activations`, opt-in because it moves outputs (docs/cpu.md). runtime/cpu/block_weights.py's Int4Blocks calls it for
// bf16 activations where the codes' group scales are factored (a byte a group, a float32 step a
// super-block of 256 weights: every Q4_K).
//
// Why: int4_gemv.cpp's exact bf16 loop spends, per group of 32 weights and activation row, one
// bf16 dot product and one float multiply-add for the group's scale, both on the CPU's two
// floating-point multiply pipes. With 8 rows (16 streams) that bound it: a 37888 x 3584 layer
// took 12 ms at 91 G multiply-adds/s on the 2-core Zen 4; here 8 ms. Here the activations are int8 (per
// super-block of 256, scaled to +-127, as llama.cpp's Q8_K) and per 64 weights and row there
// is one u8 x s8 product summed in pairs to 16 bits and one 16-bit multiply-add by the groups'
// integer scales into 32 bits, on the integer pipes; floats come once per super-block
// (its step times the activations' scale). Rounding the activations to int8 is what llama.cpp
// does for every quantized product on the CPU; outputs differ from the exact loop's by that.
//
// Weights: int4_blocks.h's layout, w = scale_g * q + low_g with scale_g = code_g * step_s
// (group_scales.h's factored form, 8 groups a step). A tile's register unpacks with a mask (each
// word's nibbles 0 and 2 as its two bytes) and a shift and mask (nibbles 1 and 3): the two bytes
// of a word are codes of one group, so every pair the u8 x s8 instruction sums belongs to one
// group, and each 32-bit lane of the 16-bit multiply-add (two words: the group's two 16-bit lanes,
// both with its scale code) sums one group: a tile's 16 groups in 16 lanes, turned into floats
// once a tile. The activations are laid out once per call in the same order. The lows' part,
// sum_g low_g * sum(x in g), is formed in float32 from the unrounded activations, as in int4_gemv.cpp.
//
// Rows are independent: a row's result never depends on which other rows share the call. On AVX2,
// a call of q8_panel.h's rows_from() rows or more (8) takes the panel loop there, whose float sums
// run in another order: a row's bits are the same in every call of one loop, not across the two.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "activations8.h"
#include "expert_rows.h"
#include "group_scales.h"
#include "int4_blocks.h"
#include "q8_panel.h"
#include "row_count.h"
#include "vector_sum.h"
#include "weight_prefetch.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define RADIXSERVE_INT4_Q8 512
#elif defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define RADIXSERVE_INT4_Q8 256
#else
#define RADIXSERVE_INT4_Q8 0
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#define RADIXSERVE_UNROLL _Pragma("GCC unroll 8")

namespace {

using namespace radixserve::int4;  // the layout: kGroup, kBlock, kQuad, kMaxRows, block_at
constexpr int64_t kSuper = 256;              // weights an activation scale and a code step cover
constexpr int64_t kSpan = kSuper / kGroup;   // groups a step covers

// The activations of one call, quantized once and read by every weight row.
struct Q8Activations {
  Q8Activations(int64_t rows, int64_t width)
      : k(width), groups(width / kGroup), supers(width / kSuper), q(rows * width + 64, 0), scale(rows * supers),
        sums(rows * groups) {}

  int64_t k = 0, groups = 0, supers = 0;
  std::vector<int8_t> q;       // [M, k] in the tiles' order (q8_at), then 64 bytes the loops may overread
  std::vector<float> scale;    // [M, supers] what an int8 step is worth
  std::vector<float> sums;     // [M, groups] each group's sum of the unrounded activations
  bool prefetch = false;
};

// Where activation c of group g goes in a row of Q8Activations::q: per tile of G groups and
// register v, the masked bytes' 4G (word p's nibbles 0 and 2: codes 8v + p % 2 and 8v + 4 + p % 2
// of group p / 2), then the shifted ones' 4G (nibbles 1 and 3: 8v + 2 + p % 2, 8v + 6 + p % 2).
inline int64_t q8_at(int64_t groups, int64_t g, int c) {
  const Tile tile = tile_holding(groups, g);
  const int i = c / 2, v = i / 4, t = i % 4;
  const int64_t p = 2 * (g - tile.group0) + c % 2;
  return tile.group0 * kGroup + v * 8 * tile.groups + (t % 2) * 4 * tile.groups + 2 * p + t / 2;
}

template <typename T>
void quantize_rows(const at::Tensor& x, Q8Activations& a, int64_t begin, int64_t end) {
  const int64_t k = a.k;
  const T* xs = x.data_ptr<T>();
  alignas(64) float v[kSuper];
  std::vector<int8_t> row(k);  // a row's int8 activations in order, then moved to the tiles' (q8_at)
  for (int64_t m = begin; m < end; ++m) {
    for (int64_t s = 0; s < a.supers; ++s) {
      int8_t* q = row.data() + s * kSuper;
      radixserve::load_super(x, xs, m, s, v);
      a.scale[m * a.supers + s] = radixserve::round_super_to_int8(v, q);
      for (int64_t g = 0; g < kSpan; ++g) {
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < kGroup; ++i) sum += v[g * kGroup + i];
        a.sums[m * a.groups + s * kSpan + g] = sum;
      }
    }
    // byte b of word p's masked (h = 0) or shifted (h = 1) half, in register v: code
    // 2(4v + h + 2b) + p % 2 of group p / 2 (loops, not q8_at per byte: this runs on one thread
    // before the product and cost a third of an 8-row call)
    int8_t* into = a.q.data() + m * k;
    for (int64_t ti = 0, tiles = tile_count(a.groups); ti < tiles; ++ti) {
      const Tile tile = tile_of(a.groups, ti);
      for (int64_t l = 0; l < tile.groups; ++l) {
        const int8_t* src = row.data() + (tile.group0 + l) * kGroup;
        for (int v = 0; v < 4; ++v)
          for (int h = 0; h < 2; ++h) {
            int8_t* dst = into + tile.group0 * kGroup + v * 8 * tile.groups + h * 4 * tile.groups + 4 * l;
            for (int par = 0; par < 2; ++par)
              for (int b = 0; b < 2; ++b) dst[2 * par + b] = src[2 * (4 * v + h + 2 * b) + par];
          }
      }
    }
  }
}

// R weight rows' constants: the lows' part of each activation row's result, and where their
// scale codes and steps are (read a tile at a time in the loop: arrays of them built per pass of
// rows cost as much as the pass).
template <int M, int R>
struct RowsQ8 {
  std::vector<float> low;     // [R, groups]
  std::vector<float> factor;  // [R, supers, M]: a super-block's integer sums are worth step * activation scale
  float rest[R][M];
  const int8_t* codes = nullptr;  // rows j.. [R, groups]

  RowsQ8(int64_t groups, int64_t supers) : low(R * groups), factor(R * supers * M) {}

  // for weight rows j.. and activation rows m0..
  void load(const radixserve::GroupScales& scales, const radixserve::GroupScales& lows, int64_t j,
            const Q8Activations& a, int64_t m0 = 0) {
    const int64_t groups = a.groups;
    codes = static_cast<const int8_t*>(scales.values) + j * groups;
    const float* steps = scales.steps + j * a.supers;  // rows are contiguous
    for (int r = 0; r < R; ++r)
      for (int64_t sb = 0; sb < a.supers; ++sb)
        for (int m = 0; m < M; ++m)
          factor[(r * a.supers + sb) * M + m] = steps[r * a.supers + sb] * a.scale[(m0 + m) * a.supers + sb];
    lows.expand(j, R, low.data());
    // vectors across groups: a scalar chain of multiply-adds per (row, activation row) cost as
    // much as the product itself
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) {
        const float* l = low.data() + r * groups;
        const float* xs = a.sums.data() + (m0 + m) * groups;
#if RADIXSERVE_INT4_Q8 == 512
        __m512 sum = _mm512_setzero_ps();
        for (int64_t g = 0; g < groups; g += 16) {
          const __mmask16 mask = groups - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (groups - g)) - 1);
          sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, l + g), _mm512_maskz_loadu_ps(mask, xs + g), sum);
        }
        rest[r][m] = _mm512_reduce_add_ps(sum);
#elif RADIXSERVE_INT4_Q8 == 256
        __m256 sum = _mm256_setzero_ps();
        int64_t g = 0;
        for (; g + 8 <= groups; g += 8) sum = _mm256_fmadd_ps(_mm256_loadu_ps(l + g), _mm256_loadu_ps(xs + g), sum);
        float tail = 0.f;
        for (; g < groups; ++g) tail = std::fma(l[g], xs[g], tail);
        rest[r][m] = radixserve::reduce_add(sum) + tail;
#else
        float sum = 0.f;
        for (int64_t g = 0; g < groups; ++g) sum = std::fma(l[g], xs[g], sum);
        rest[r][m] = sum;
#endif
      }
  }
};

#if RADIXSERVE_INT4_Q8 == 512
// One tile of G groups (a compile-time 16 or 4: a full tile's loads are whole, its addresses
// constant offsets) of R weight rows from j against M activation rows, into acc.
template <int M, int R, int G>
inline void tile_rows(const uint8_t* w, const RowsQ8<M, R>& c, int64_t j, int64_t group0, const Q8Activations& a,
                      int64_t m0, __m512 (&acc)[R][M]) {
  const int64_t k = a.k, groups = a.groups;
  const __m512i low4 = _mm512_set1_epi16(0x0F0F);
  // words past a small tile's load as 0: codes 0, whatever activations they meet
  constexpr __mmask32 words_in = words_mask(G);
  constexpr __mmask16 lanes = G == kTileGroups ? __mmask16(0xFFFF) : __mmask16((1u << G) - 1);
  const Tile tile{group0, G};
  __m512i sum[R][M], scale[R];
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r) {
    // the tile's scale codes, each in both 16-bit halves of its group's 32-bit lane
    const __m512i code = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(lanes, c.codes + r * groups + group0));
    scale[r] = _mm512_or_si512(_mm512_and_si512(code, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(code, 16));
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) sum[r][m] = _mm512_setzero_si512();
  }
  RADIXSERVE_UNROLL
  for (int v = 0; v < 4; ++v) {
    const int8_t* x = a.q.data() + m0 * k + group0 * kGroup + v * 8 * G;
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r) {
      __m512i words;
      if constexpr (G == kTileGroups)
        words = _mm512_loadu_si512(block_at(w, k, j + r, group0 / 4 + v));
      else
        words = _mm512_maskz_loadu_epi16(words_in, register_at(w, k, j + r, tile, v));
      const __m512i masked = _mm512_and_si512(words, low4);
      const __m512i shifted = _mm512_and_si512(_mm512_srli_epi16(words, 4), low4);
      RADIXSERVE_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m512i pm = _mm512_maddubs_epi16(masked, _mm512_loadu_si512(x + m * k));
        const __m512i ps = _mm512_maddubs_epi16(shifted, _mm512_loadu_si512(x + m * k + 4 * G));
        sum[r][m] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(sum[r][m], pm, scale[r]), ps, scale[r]);
      }
    }
  }
  // a group's integer sum is worth its super-block's step times the activations' scale there: a
  // full tile's lanes 0-7 one super-block's, 8-15 the next's; a small tile's all one's
  const int64_t s0 = group0 / kSpan, s1 = (group0 + G - 1) / kSpan;
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) {
      const float f0 = c.factor[(r * a.supers + s0) * M + m], f1 = c.factor[(r * a.supers + s1) * M + m];
      const __m512 factor = _mm512_insertf32x8(_mm512_set1_ps(f0), _mm256_set1_ps(f1), 1);
      acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][m]), factor, acc[r][m]);
    }
}

// R weight rows from j against M activation rows (m0.., whose constants `c` holds); into
// out[(m0 + m) * n + j + r], rounded once to O.
template <int M, int R, bool Prefetch, typename O>
void dot_rows(const uint8_t* w, const RowsQ8<M, R>& c, int64_t n, int64_t j, const Q8Activations& a, O* out,
              int64_t m0 = 0) {
  const int64_t k = a.k, groups = a.groups, full = groups / kTileGroups;
  __m512 acc[R][M];
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t ti = 0; ti < full; ++ti) {
    if constexpr (Prefetch) radixserve::prefetch_ahead<4 * R>(block_at(w, k, j, ti * kTileGroups / 4));
    tile_rows<M, R, kTileGroups>(w, c, j, ti * kTileGroups, a, m0, acc);
  }
  for (int64_t g = full * kTileGroups; g < groups; g += kSmallGroups)
    tile_rows<M, R, kSmallGroups>(w, c, j, g, a, m0, acc);
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m)
      out[(m0 + m) * n + j + r] = static_cast<O>(_mm512_reduce_add_ps(acc[r][m]) + c.rest[r][m]);
}

// Weight-row quads [begin, end), R rows at a time: each (row, activation row) pair holds two
// accumulators, the tile's integer one (every product adds to it) and the row's float one (touched
// once a tile, left to spill where the registers run out); fewer rows a pass reread the
// activations more (8 rows one weight row at a time: 16384 x 2048 in 3.4-4.1 ms, two at a time 2.2).
// Past 4 rows each quad meets them four at a time, then the rest, as int4_gemv.cpp's bf16_in_fours
// (2 weight rows against 8 activation rows spilled their sums): the same bits.
template <int M, typename O>
void dot_quads(const uint8_t* w, const radixserve::GroupScales& scales, const radixserve::GroupScales& lows, int64_t n,
               int64_t begin, int64_t end, const Q8Activations& a, O* out) {
  if constexpr (M > 4) {
    constexpr int kTail = M % 4;
    RowsQ8<4, kQuad> four(a.groups, a.supers);
    RowsQ8<kTail == 0 ? 1 : kTail, kQuad> tail(a.groups, a.supers);
    for (int64_t j = begin * kQuad; j < end * kQuad; j += kQuad) {
      for (int64_t m0 = 0; m0 + 4 <= M; m0 += 4) {
        four.load(scales, lows, j, a, m0);
        if (a.prefetch && m0 == 0)  // the quad's first pass streams it, the others read the cache
          dot_rows<4, kQuad, true>(w, four, n, j, a, out, m0);
        else
          dot_rows<4, kQuad, false>(w, four, n, j, a, out, m0);
      }
      if constexpr (kTail != 0) {
        tail.load(scales, lows, j, a, M - kTail);
        dot_rows<kTail, kQuad, false>(w, tail, n, j, a, out, M - kTail);
      }
    }
    return;
  }
  constexpr int R = 4;
  RowsQ8<M, R> c(a.groups, a.supers);
  for (int64_t j = begin * kQuad; j < end * kQuad; j += R) {
    c.load(scales, lows, j, a);
    if (a.prefetch)
      dot_rows<M, R, true>(w, c, n, j, a, out);
    else
      dot_rows<M, R, false>(w, c, n, j, a, out);
  }
}
#endif

#if RADIXSERVE_INT4_Q8 == 256
// AVX2 (no vpdpwssd, 16 registers): a tile's register is taken in two halves of 32 bytes, each
// holding 8 groups, one a 32-bit lane (a full tile's first half is one super-block, its second
// the next). A group's code x activation pairs (at most 2 x 15 x 127 each) are summed over the
// tile's 4 registers in 16 bits, 8 pairs at most, 30480: so a half's two u8 x s8 products per
// register cost two 16-bit adds, and the 16-bit multiply-add by the scale codes and the float
// multiply-add come once per half a tile. Per 64 codes of a weight row and activation row: two
// products and two adds, where the int16 loop (int4_gemv.cpp) spends four multiply-adds, four
// shifts or masks and four adds.

// Register v's half h (32 bytes; a small tile's 16, zero above) of weight row `row`'s tile.
template <int G>
inline __m256i half_words(const uint8_t* w, int64_t k, int64_t row, int64_t group0, int v, int h) {
  if constexpr (G == kTileGroups)
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_at(w, k, row, group0 / 4 + v) + 32 * h));
  else
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
        register_at(w, k, row, Tile{group0, G}, v))));
}

template <int G>
inline __m256i half_activations(const int8_t* x) {
  if constexpr (G == kTileGroups)
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  else
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
}

// One tile of G groups (16, or 4 at a row's end) of R weight rows from j against M activation
// rows (their int8 codes at x, rows k apart), into acc.
template <int M, int R, int G>
inline void tile_rows256(const uint8_t* w, const RowsQ8<M, R>& c, int64_t j, int64_t group0, const int8_t* x,
                         const Q8Activations& a, __m256 (&acc)[R][M]) {
  const int64_t k = a.k, groups = a.groups;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  constexpr int halves = G == kTileGroups ? 2 : 1;
  RADIXSERVE_UNROLL
  for (int h = 0; h < halves; ++h) {
    __m256i sum[R][M];
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r)
      RADIXSERVE_UNROLL
      for (int m = 0; m < M; ++m) sum[r][m] = _mm256_setzero_si256();
    RADIXSERVE_UNROLL
    for (int v = 0; v < 4; ++v) {
      const int8_t* xv = x + group0 * kGroup + v * 8 * G + 32 * h;
      RADIXSERVE_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256i words = half_words<G>(w, k, j + r, group0, v, h);
        const __m256i masked = _mm256_and_si256(words, low4);
        const __m256i shifted = _mm256_and_si256(_mm256_srli_epi16(words, 4), low4);
        RADIXSERVE_UNROLL
        for (int m = 0; m < M; ++m) {
          const __m256i pm = _mm256_maddubs_epi16(masked, half_activations<G>(xv + m * k));
          const __m256i ps = _mm256_maddubs_epi16(shifted, half_activations<G>(xv + m * k + 4 * G));
          sum[r][m] = _mm256_add_epi16(sum[r][m], _mm256_add_epi16(pm, ps));
        }
      }
    }
    // the half's 8 groups (a small tile's 4): scale codes in both 16-bit halves of their lanes,
    // and the super-block's float factor
    const int64_t g0 = group0 + 8 * h, sb = g0 / kSpan;
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r) {
      int64_t eight = 0;
      std::memcpy(&eight, c.codes + r * groups + g0, G == kTileGroups ? 8 : 4);
      const __m256i code = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(eight));
      const __m256i scale = _mm256_or_si256(_mm256_and_si256(code, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(code, 16));
      RADIXSERVE_UNROLL
      for (int m = 0; m < M; ++m)
        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sum[r][m], scale)),
                                    _mm256_set1_ps(c.factor[(r * a.supers + sb) * M + m]), acc[r][m]);
    }
  }
}

// R weight rows from j against M activation rows from m0; into out[(m0 + m) * n + j + r].
template <int M, int R, bool Prefetch, typename O>
void dot_rows256(const uint8_t* w, const RowsQ8<M, R>& c, int64_t n, int64_t j, int64_t m0, const Q8Activations& a,
                 O* out) {
  const int64_t k = a.k, groups = a.groups, full = groups / kTileGroups;
  const int8_t* x = a.q.data() + m0 * k;
  __m256 acc[R][M];
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_ps();
  for (int64_t ti = 0; ti < full; ++ti) {
    if constexpr (Prefetch) radixserve::prefetch_ahead<4 * R>(block_at(w, k, j, ti * kTileGroups / 4));
    tile_rows256<M, R, kTileGroups>(w, c, j, ti * kTileGroups, x, a, acc);
  }
  for (int64_t g = full * kTileGroups; g < groups; g += kSmallGroups) tile_rows256<M, R, kSmallGroups>(w, c, j, g, x, a, acc);
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) out[(m0 + m) * n + j + r] = static_cast<O>(radixserve::reduce_add(acc[r][m]) + c.rest[r][m]);
}

// Weight-row quads [begin, end) in blocks of about kBlockBytes of codes (kept in the second-level
// cache), each block against the activation rows four at a time (more spill AVX2's registers):
// one row takes four weight rows a pass, two take two, three or four one.
constexpr int64_t kBlockBytes = int64_t{128} << 10;

template <typename O>
void dot_quads256(const uint8_t* w, const radixserve::GroupScales& scales, const radixserve::GroupScales& lows,
                  int64_t n, int64_t begin, int64_t end, const Q8Activations& a, int64_t rows, O* out,
                  int64_t first = 0) {  // activation (and output) rows first..first + rows
  const int64_t block = std::max<int64_t>(1, kBlockBytes / (kQuad * a.k / 2));
  for (int64_t q0 = begin; q0 < end; q0 += block) {
    const int64_t q1 = std::min(end, q0 + block);
    for (int64_t m0 = first; m0 < first + rows; m0 += 4)
      radixserve::with_row_count<4>(std::min<int64_t>(4, first + rows - m0), [&](auto count) {
        constexpr int M = decltype(count)::value;
        constexpr int R = M == 1 ? 4 : M == 2 ? 2 : 1;
        RowsQ8<M, R> c(a.groups, a.supers);
        for (int64_t j = q0 * kQuad; j < q1 * kQuad; j += R) {
          c.load(scales, lows, j, a, m0);
          if (a.prefetch)
            dot_rows256<M, R, true>(w, c, n, j, m0, a, out);
          else
            dot_rows256<M, R, false>(w, c, n, j, m0, a, out);
        }
      });
  }
}

// One activation row (a decode step of one stream): dot_rows256<1, 4>'s arithmetic operation for
// operation (the same bits, so a row's result still does not depend on the call's row count), laid
// out for the one-row case: the activations of half a tile loaded once for the quad's four weight
// rows, and the lows' part (RowsQ8::load's expanded lows and their dot product, a fifth of a
// one-row call on the 1.5B's 17920 x 1536 layer) summed in the same pass, a super-block at a time,
// from the int8 codes and steps, with no per-quad arrays. Factored lows (a Q4_K's) only.

// Four rows' (from `codes`, `steps`) codes of half a tile (8 groups; a small tile's 4) into acc.
// tile_rows256's integer loop in another order (each row's four registers in turn, against all the
// half's activations in registers): the same sums, exactly. Sharing tile_rows256's loop, with its
// activations loaded a register at a time for all rows, was measured slower for one row (one
// thread: 17920 x 1536 0.75 -> 0.87 ms, 1536 x 8960 0.38 -> 0.42), so the loop is written twice.
template <int G>
inline void one_row_half(const uint8_t* w, int64_t k, int64_t j, int64_t group0, int h, const int8_t* x,
                         const int8_t* codes, const float* steps, float x_scale, int64_t groups, int64_t supers,
                         __m256 (&acc)[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const int8_t* xv = x + group0 * kGroup + 32 * h;
  __m256i masked_x[4], shifted_x[4];
  RADIXSERVE_UNROLL
  for (int v = 0; v < 4; ++v) {
    masked_x[v] = half_activations<G>(xv + v * 8 * G);
    shifted_x[v] = half_activations<G>(xv + v * 8 * G + 4 * G);
  }
  const int64_t g0 = group0 + 8 * h, sb = g0 / kSpan;
  RADIXSERVE_UNROLL
  for (int r = 0; r < 4; ++r) {
    __m256i sum = _mm256_setzero_si256();
    RADIXSERVE_UNROLL
    for (int v = 0; v < 4; ++v) {
      const __m256i words = half_words<G>(w, k, j + r, group0, v, h);
      const __m256i pm = _mm256_maddubs_epi16(_mm256_and_si256(words, low4), masked_x[v]);
      const __m256i ps = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(words, 4), low4), shifted_x[v]);
      sum = _mm256_add_epi16(sum, _mm256_add_epi16(pm, ps));
    }
    int64_t eight = 0;
    std::memcpy(&eight, codes + r * groups + g0, G == kTileGroups ? 8 : 4);
    const __m256i code = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(eight));
    const __m256i scale = _mm256_or_si256(_mm256_and_si256(code, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(code, 16));
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sum, scale)),
                             _mm256_set1_ps(steps[r * supers + sb] * x_scale), acc[r]);
  }
}

// Four rows' lows times the activations' group sums over groups [g, g + 8), into rest (in
// RowsQ8::load's order: the low, code times step, then one multiply-add a chunk of 8 groups).
inline void one_row_lows(const int8_t* low_codes, const float* low_steps, int64_t groups, int64_t supers, int64_t g,
                         const float* x_sums, __m256 (&rest)[4]) {
  const __m256 xs = _mm256_loadu_ps(x_sums + g);
  RADIXSERVE_UNROLL
  for (int r = 0; r < 4; ++r) {
    rest[r] = _mm256_fmadd_ps(radixserve::codes_times_step(low_codes + r * groups + g, low_steps[r * supers + g / kSpan]),
                              xs, rest[r]);
  }
}

// Quads [begin, end) against activation row m of `a`.
template <typename O>
void one_row256(const uint8_t* w, const radixserve::GroupScales& scales, const radixserve::GroupScales& lows,
                int64_t begin, int64_t end, const Q8Activations& a, O* out, int64_t m = 0) {
  const int64_t k = a.k, groups = a.groups, supers = a.supers, full = groups / kTileGroups;
  const int8_t* x = a.q.data() + m * k;
  const float* x_scale = a.scale.data() + m * supers;
  const float* x_sums = a.sums.data() + m * groups;
  for (int64_t j = begin * kQuad; j < end * kQuad; j += kQuad) {
    const int8_t* codes = static_cast<const int8_t*>(scales.values) + j * groups;
    const float* steps = scales.steps + j * supers;
    const int8_t* low_codes = static_cast<const int8_t*>(lows.values) + j * groups;
    const float* low_steps = lows.steps + j * supers;
    __m256 acc[4], rest[4];
    RADIXSERVE_UNROLL
    for (int r = 0; r < 4; ++r) acc[r] = rest[r] = _mm256_setzero_ps();
    for (int64_t ti = 0; ti < full; ++ti) {
      radixserve::prefetch_ahead<4 * kQuad>(block_at(w, k, j, ti * kTileGroups / 4));
      RADIXSERVE_UNROLL
      for (int h = 0; h < 2; ++h) {
        one_row_half<kTileGroups>(w, k, j, ti * kTileGroups, h, x, codes, steps, x_scale[2 * ti + h], groups, supers, acc);
        one_row_lows(low_codes, low_steps, groups, supers, ti * kTileGroups + 8 * h, x_sums, rest);
      }
    }
    for (int64_t g = full * kTileGroups; g < groups; g += kSmallGroups)
      one_row_half<kSmallGroups>(w, k, j, g, 0, x, codes, steps, x_scale[g / kSpan], groups, supers, acc);
    for (int64_t g = full * kTileGroups; g < groups; g += kSpan)
      one_row_lows(low_codes, low_steps, groups, supers, g, x_sums, rest);
    RADIXSERVE_UNROLL
    for (int r = 0; r < 4; ++r)
      out[j + r] = static_cast<O>(radixserve::reduce_add(acc[r]) + (radixserve::reduce_add(rest[r]) + 0.f));
  }
}
#endif

// x [rows, K] @ (scales * q + lows).T -> [rows, N] in x's dtype, x rounded to int8 per 256.
at::Tensor int4_gemv_q8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                        const at::Tensor& scale_steps, const at::Tensor& lows,
                        const std::optional<at::Tensor>& low_steps) {
  TORCH_CHECK(RADIXSERVE_INT4_Q8, "int4_gemv_q8: this CPU lacks AVX2 (int4_gemv_q8_fast() is false)");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "int4_gemv_q8: x is a CPU [rows, K] float32 or bfloat16 tensor");
  TORCH_CHECK(x.size(1) % kSuper == 0, "int4_gemv_q8: K is a multiple of 256");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && w.size(1) * 2 == x.size(1) &&
                  w.size(0) % kQuad == 0,
              "int4_gemv_q8: codes are contiguous uint8 [N, K / 2] with K = x's width and N a multiple of 4");
  TORCH_CHECK(RADIXSERVE_INT4_Q8 == 256 || x.size(0) <= kMaxRows, "int4_gemv_q8: at most 8 rows a call (any on AVX2)");
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, k / kGroup, "int4_gemv_q8");
  TORCH_CHECK(sg.type == at::kChar && sg.span == kSpan,
              "int4_gemv_q8: scales are int8 codes with a float32 step per 8 groups (a k-quant's)");
  const auto lg = radixserve::GroupScales::of(lows, low_steps, n, k / kGroup, "int4_gemv_q8 lows");
  Q8Activations a(rows, k);
  // AVX2: always (one stream of the real 1.5B, alternated in one process: 77.2 against 83.8 ms a
  // token with the 1536-wide layers' stream left to the hardware); AVX-512: where the activations
  // spill (weight_prefetch.h)
  a.prefetch = RADIXSERVE_INT4_Q8 == 256 || radixserve::activations_spill(rows * k);
  at::Tensor out = at::empty({rows, n}, x.options());
#if RADIXSERVE_INT4_Q8
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t grain = std::max<int64_t>(4, (int64_t{1} << 15) / k);  // quads; small layers stay on one thread
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "int4_gemv_q8", [&] {
    // on one thread for a few rows (a decode step), spread over the threads for a prompt's
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) { quantize_rows<scalar_t>(x, a, begin, end); });
    scalar_t* op = out.data_ptr<scalar_t>();
#if RADIXSERVE_Q8_PANEL
    if (rows >= radixserve::q8panel::rows_from()) {
      namespace panel = radixserve::q8panel;
      std::vector<int64_t> quads(a.groups * panel::kQuads);
      for (int64_t g = 0; g < a.groups; ++g)
        for (int64_t q = 0; q < panel::kQuads; ++q) quads[g * panel::kQuads + q] = panel::quad_at(a.groups, g, q);
      at::parallel_for(0, (n + panel::kCols - 1) / panel::kCols, 1, [&](int64_t begin, int64_t end) {
        panel::products(wp, sg, lg, n, k, begin, end, a.q.data(), a.scale.data(), a.sums.data(), quads.data(), rows, op);
      });
      return;
    }
#endif
#if RADIXSERVE_INT4_Q8 == 256
    if (rows == 1 && lg.type == at::kChar && lg.span == kSpan) {
      at::parallel_for(0, n / kQuad, grain, [&](int64_t begin, int64_t end) { one_row256(wp, sg, lg, begin, end, a, op); });
      return;
    }
#endif
    at::parallel_for(0, n / kQuad, grain, [&](int64_t begin, int64_t end) {
#if RADIXSERVE_INT4_Q8 == 512
      radixserve::with_row_count(rows, [&](auto count) {
        constexpr int M = decltype(count)::value;
        dot_quads<M>(wp, sg, lg, n, begin, end, a, op);
      });
#else
      dot_quads256(wp, sg, lg, n, begin, end, a, rows, op);
#endif
    });
  });
#endif
  return out;
}

// A mixture of experts' products in one call: x [R, K] holds the routed rows grouped by expert
// (expert e's counts[e] rows after the experts before it, as StackedExperts.forward_loop lays them
// out), w[e] etc. each expert's weight as int4_gemv_q8 takes it ([N, K] alike, lows factored);
// -> [R, N], each expert's rows exactly what int4_gemv_q8 gives for them alone (the same loop for
// the same row count: one row, a few, or the panel). One rounding of the activations and one
// parallel region spreading every expert's work over the threads, where a call an expert took a
// thread wake-up, a rounding and the Python around it (the 30B-A3B shape's 8 experts a token and
// layer: 10.5 ms a token of kernels and 2.5 of Python for 130 MB of codes, one stream). AVX2
// builds (int4_gemv_q8_experts_fast()).
at::Tensor int4_gemv_q8_experts(const at::Tensor& x, at::IntArrayRef counts, at::TensorList w, at::TensorList scales,
                                at::TensorList scale_steps, at::TensorList lows, at::TensorList low_steps) {
  TORCH_CHECK(RADIXSERVE_INT4_Q8 == 256, "int4_gemv_q8_experts: AVX2 builds only (int4_gemv_q8_experts_fast())");
  const int64_t experts = static_cast<int64_t>(w.size());
  TORCH_CHECK(scales.size() == w.size() && scale_steps.size() == w.size() && lows.size() == w.size() &&
                  low_steps.size() == w.size(),
              "int4_gemv_q8_experts: as many weights, scales, scale steps, lows and low steps");
  const std::vector<int64_t> first = radixserve::expert_rows(x, counts, experts, "int4_gemv_q8_experts");
  const int64_t rows = x.size(0), k = x.size(1), n = w[0].size(0);
  std::vector<radixserve::GroupScales> sg, lg;
  for (int64_t e = 0; e < experts; ++e) {
    TORCH_CHECK(w[e].dim() == 2 && w[e].is_contiguous() && w[e].scalar_type() == at::kByte && w[e].size(0) == n &&
                    w[e].size(1) * 2 == k && n % kQuad == 0,
                "int4_gemv_q8_experts: every expert's codes are contiguous uint8 [N, K / 2], one N a multiple of 4");
    sg.push_back(radixserve::GroupScales::of(scales[e], scale_steps[e], n, k / kGroup, "int4_gemv_q8_experts"));
    lg.push_back(radixserve::GroupScales::of(lows[e], low_steps[e], n, k / kGroup, "int4_gemv_q8_experts lows"));
    TORCH_CHECK(sg.back().type == at::kChar && sg.back().span == kSpan && lg.back().type == at::kChar &&
                    lg.back().span == kSpan,
                "int4_gemv_q8_experts: scales and lows are int8 codes with a float32 step per 8 groups (a k-quant's)");
  }
  Q8Activations a(rows, k);
  a.prefetch = true;  // as int4_gemv_q8's on AVX2
  at::Tensor out = at::empty({rows, n}, x.options());
#if RADIXSERVE_INT4_Q8 == 256
  namespace panel = radixserve::q8panel;
  // each expert's work in units its loop splits by (weight-row quads; the panel's 16 rows), and
  // where its rows and units start
  std::vector<int64_t> unit(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e) {
    unit[e + 1] = unit[e] + (counts[e] >= panel::rows_from() ? (n + panel::kCols - 1) / panel::kCols : n / kQuad);
  }
  std::vector<int64_t> quads(a.groups * panel::kQuads);
  for (int64_t g = 0; g < a.groups; ++g)
    for (int64_t q = 0; q < panel::kQuads; ++q) quads[g * panel::kQuads + q] = panel::quad_at(a.groups, g, q);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "int4_gemv_q8_experts", [&] {
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) { quantize_rows<scalar_t>(x, a, begin, end); });
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, unit[experts], 1, [&](int64_t begin, int64_t end) {
      radixserve::for_expert_units(unit, begin, end, [&](int64_t e, int64_t from, int64_t to) {
        const uint8_t* wp = w[e].data_ptr<uint8_t>();
        const int64_t m = first[e], count = counts[e];
        if (count >= panel::rows_from())
          panel::products(wp, sg[e], lg[e], n, k, from, to, a.q.data() + m * k, a.scale.data() + m * a.supers,
                          a.sums.data() + m * a.groups, quads.data(), count, op + m * n);
        else if (count == 1)
          one_row256(wp, sg[e], lg[e], from, to, a, op + m * n, m);
        else
          dot_quads256(wp, sg[e], lg[e], n, from, to, a, count, op, m);
      });
    });
  });
#endif
  return out;
}

bool int4_gemv_q8_experts_fast() { return RADIXSERVE_INT4_Q8 == 256; }

bool int4_gemv_q8_fast() { return RADIXSERVE_INT4_Q8 != 0; }

// The fewest rows a call takes the panel loop for (q8_panel.h), 0 where it is not built (AVX-512's
// loop takes 8 rows a call).
int64_t int4_gemv_q8_panel_rows() {
#if RADIXSERVE_Q8_PANEL
  return radixserve::q8panel::rows_from();
#else
  return 0;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("int4_gemv_q8(Tensor x, Tensor w, Tensor scales, Tensor scale_steps, Tensor lows, Tensor? low_steps=None) -> Tensor",
        int4_gemv_q8);
  m.def("int4_gemv_q8_fast() -> bool", int4_gemv_q8_fast);
  m.def("int4_gemv_q8_experts(Tensor x, int[] counts, Tensor[] w, Tensor[] scales, Tensor[] scale_steps, "
        "Tensor[] lows, Tensor[] low_steps) -> Tensor", int4_gemv_q8_experts);
  m.def("int4_gemv_q8_experts_fast() -> bool", int4_gemv_q8_experts_fast);
  m.def("int4_gemv_q8_panel_rows() -> int", int4_gemv_q8_panel_rows);
}
