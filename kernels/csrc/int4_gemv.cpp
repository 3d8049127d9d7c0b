// One-row products with 4-bit group-quantized weights: `--quantization int4`'s layers and output
// layer, and a GGUF's Q4_K tensors served as shipped (runtime/cpu/int4_linear.py packs the codes
// and calls this for one-row products; torch's `_weight_int4pack_mm_for_cpu` serves 2-4 rows,
// where it is faster). A one-stream decode step only streams the weights, and unpacking 4-bit
// codes costs more instructions a byte than reading them: this layout needs no shuffles to
// unpack, only shifts and bit masks, and is read in one forward stream. On the 2-core Zen 4 the
// default model's int4 output layer (262144 x 640) takes 3.2 ms here against 4.8 with torch's
// kernel, and a whole one-row step 9.6 ms against 11.7 (docs/cpu.md, "Speculative decoding and int4
// weights").
//
// Weights: codes q in [0, 15], w[n, k] = scales[n, g] * q[n, k] + lows[n, g] with g = k / 32, in
// int4_blocks.h's layout: tiles of 16 groups (4 registers of 32 16-bit words; rows in quads)
// where shifting a register right by 4t and masking each word's low nibble gives two codes of
// each of the tile's 16 groups, one to a 16-bit lane. Scales and lows float16 (an eighth of a byte
// a weight each; torch's int4 kernel keeps them in bf16, 3 fewer bits), or, where float16 would
// round them (a GGUF's Q4_K scales are d * a 6-bit scale: up to 17 bits), int8 codes times a
// float32 step per super-block (group_scales.h: a byte a group), or float32.
//
// The float trick: the 16-bit pattern 0x4300 | q is the bf16 number 128 + q (128's exponent makes
// the mantissa's last bit worth 1), and moved into a 32-bit lane's top half it is the float32
// 128 + q. So a masked code is a number without any conversion. Each group's sum is then
// sum((128 + q) x) = sum(q x) + 128 sum(x), and per row
//   w . x = sum_g scale_g sum((128 + q) x) + sum_g (low_g - 128 scale_g) sum_g(x),
// with the activations' group sums formed once per call. Products are exact and sums in float32;
// the 128s cost about 4 bits of float32's 24, far below the activations' own rounding. A tile's
// 16 group sums build up in 16 lanes and meet their scales once, in one multiply-add.
// - bf16 activations on CPUs with bf16 dot products (AVX512_BF16: Zen 4, Sapphire Rapids): one
//   instruction multiplies 2 codes of each of 16 groups by their activations and sums each pair.
// - Otherwise (float32 activations, or AVX-512 without bf16): a 32-bit lane holds a group's two
//   codes, the even one shifted up, the odd one already there; activations are laid out once to match.
// - AVX2 with FMA (no AVX-512): the float32 loop in 256-bit halves of the same registers (8 groups
//   a half; a small tile's 4 load alone). Its shifts and masks bound it (about 7 GB/s of codes, one
//   row, 2 threads of an AVX2 EPYC, against 0.2 for the portable loop): still 4x fewer bytes than
//   the float32 weights the callers served there before.
// Without either a portable loop gives the same results, slowly: there the callers keep the
// dequantized weights (`int4_gemv_fast()`).
//
// Rows are independent: a row's result never depends on which other rows share the call.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "activations16.h"
#include "expert_rows.h"
#include "group_scales.h"
#include "int4_blocks.h"
#include "row_count.h"
#include "vector_sum.h"
#include "weight_prefetch.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define RADIXSERVE_INT4_AVX512 1
#else
#define RADIXSERVE_INT4_AVX512 0
#endif
// AVX2 with FMA (no AVX-512): the float32 loop below in 256-bit halves of the same registers.
#if !RADIXSERVE_INT4_AVX512 && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RADIXSERVE_INT4_AVX2 1
#else
#define RADIXSERVE_INT4_AVX2 0
#endif
#if RADIXSERVE_INT4_AVX512 && defined(__AVX512BF16__)
#define RADIXSERVE_INT4_BF16 1
#else
#define RADIXSERVE_INT4_BF16 0
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

// Full unrolling of the loops over activation and weight rows, so their accumulators live in
// registers (GCC otherwise keeps an array of vectors on the stack and stores it every iteration).
#define RADIXSERVE_UNROLL _Pragma("GCC unroll 8")

namespace {

using namespace radixserve::int4;  // the layout: kGroup, kBlock, kQuad, kMaxRows, block_at
constexpr uint32_t kBase = 0x43000000u;  // float32 128's bits; 0x4300 is bf16 128's
constexpr int64_t kBlockBytes = int64_t{128} << 10;  // codes dot_quads16 takes a block at a time

// The activations of one call, prepared once and read by every weight row, in the tiles' order
// (int4_blocks.h): in a tile of G groups, dot product i (0..15) reads codes 2i and 2i + 1 of
// each group, so its activations are those two of each group, group by group.
struct Activations {
  int64_t k = 0, groups = 0;
  std::vector<float> paired;   // [M, k] float32: per tile and i, the G groups' activation 2i, then their
                               // 2i + 1 (without AVX-512: [M, k] in order, for the portable loop)
  std::vector<uint16_t> bf16;  // [M, k] bf16 bits: per tile and i, each group's activations 2i, 2i + 1
                               // (the small tiles then in bf16_small_tiles' order)
  std::vector<float> sums;     // [M, groups] each group's sum
  std::vector<int16_t, radixserve::CacheLineAllocator<int16_t>> x16;  // rounded to int16 a group at a time (activations16.h), in bf16's order,
                               // rows interleaved `interleave` at a time (x16_at)
  std::vector<float> x16_scales;  // [M, groups] their scales
  int64_t interleave = 1;      // 1 for one row, else 4 (dot_quads16's passes take 4 activation rows)
  bool prefetch = false;       // the weight stream prefetched by hand (weight_prefetch.h)

  // x16's layout. Rows come `interleave` at a time, a group of them in pieces of what one load of
  // the loop takes: 16 words in the full tiles (elements [0, full_words())), 8 in the small ones;
  // so a pass's loads of its four rows are constant offsets from one address (with a row each,
  // four bases and their arithmetic took the general registers, and the loads their own
  // instructions: the loop ran at half its rate). The piece of row m starting at element e (a
  // multiple of its piece) lies at row_pieces(m, piece) + e * interleave.
  int64_t full_words() const { return groups / kTileGroups * kTileGroups * kGroup; }
  int64_t row_pieces(int64_t m, int64_t piece) const {
    return (m / interleave) * interleave * k + (m % interleave) * piece;
  }
  // Where element e (in the tiles' order) of row m lies in x16 (the portable loop's way in).
  int64_t x16_at(int64_t m, int64_t e) const {
    const int64_t piece = e < full_words() ? 16 : 8;
    return row_pieces(m, piece) + (e - e % piece) * interleave + e % piece;
  }
};

// Code c of group g of weight row `row`, for the portable loops.
inline int code_of(const uint8_t* w, int64_t k, int64_t row, int64_t groups, int64_t g, int c) {
  const CodeAt at = code_at(groups, g, c);
  const uint8_t* word = block_at(w, k, row, at.block) + 2 * at.word;
  return ((word[0] | (word[1] << 8)) >> (4 * at.nibble)) & 0x0F;
}

// Where activation c of group g goes in a row of Activations::bf16 (before bf16_small_tiles) ...
inline int64_t bf16_at(int64_t groups, int64_t g, int c) {
  const Tile tile = tile_holding(groups, g);
  return tile.group0 * kGroup + (c / 2) * 2 * tile.groups + 2 * (g - tile.group0) + c % 2;
}

// A row of 16-bit activations (bf16 bits or int16 codes), in order, moved to bf16_at's order: the
// tiles' order moves pairs of activations (32 bits) whole, pair i of a tile's group l to slot i * G + l.
inline void to_tile_order(const uint16_t* row, int64_t groups, uint16_t* out) {
  const uint32_t* pairs = reinterpret_cast<const uint32_t*>(row);
  uint32_t* into = reinterpret_cast<uint32_t*>(out);
  for (int64_t ti = 0, tiles = tile_count(groups); ti < tiles; ++ti) {
    const Tile tile = tile_of(groups, ti);
    const int64_t at = tile.group0 * kGroup / 2;
    for (int64_t i = 0; i < kGroup / 2; ++i)
      for (int64_t l = 0; l < tile.groups; ++l) into[at + i * tile.groups + l] = pairs[at + l * kGroup / 2 + i];
  }
}

// Activations::bf16's small tiles moved from the tiles' order (pairs i = 4v + t at i * 8 words)
// to the order small_tile_bf16 reads them: nibble t's pairs of all four registers side by side,
// pair i at (4t + v) * 8 (a 4 x 4 transpose of 16-byte pieces).
inline void bf16_small_tiles(uint16_t* row, int64_t groups) {
  for (int64_t g = groups / kTileGroups * kTileGroups; g < groups; g += kSmallGroups) {
    uint16_t* tile = row + g * kGroup;
    uint16_t moved[kSmallGroups * kGroup];
    for (int v = 0; v < 4; ++v)
      for (int t = 0; t < 4; ++t) std::memcpy(moved + (4 * t + v) * 8, tile + (4 * v + t) * 8, 16);
    std::memcpy(tile, moved, sizeof(moved));
  }
}

// ... and of Activations::paired.
inline int64_t paired_at(int64_t groups, int64_t g, int c) {
#if RADIXSERVE_INT4_AVX512 || RADIXSERVE_INT4_AVX2
  const Tile tile = tile_holding(groups, g);
  return tile.group0 * kGroup + (c / 2) * 2 * tile.groups + (c % 2) * tile.groups + (g - tile.group0);
#else
  (void)groups;
  return g * kGroup + c;
#endif
}

// Accumulators (__m512 or __m256), zeroed (a vector type's value-initialisation is all zeros).
template <typename V, int M, int R>
inline void zero(V (&acc)[R][M]) {
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = V{};
}

// Scales of R weight rows as floats (read once per tile in the loops), and the per-row constant
// of the 128 trick: rest[r][m] = sum_g (low_g - 128 scale_g) * sum_g(x_m), as a vector whose lanes
// sum to it where the loop has vectors (the loop's accumulators start from it).
template <int M, int R>
struct RowConstants {
  std::vector<float> scale, low;
#if RADIXSERVE_INT4_AVX512
  __m512 rest[R][M];
#else
  float rest[R][M];
#endif
  explicit RowConstants(int64_t groups) : scale(R * groups), low(R * groups) {}

#if RADIXSERVE_INT4_AVX512
  // The loops' accumulators start from the rows' constants.
  void start(__m512 (&acc)[R][M]) const {
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r)
      RADIXSERVE_UNROLL
      for (int m = 0; m < M; ++m) acc[r][m] = rest[r][m];
  }
#endif

  // Both for the float loops (dot_quads: the 128 trick, all of a call's rows).
  void load(const radixserve::GroupScales& scales, const radixserve::GroupScales& lows, int64_t j,
            const Activations& a) {
    expand(scales, lows, j);
    rests(a, false, 0);
  }

  // The scales and lows of weight rows j.. as floats (rows j.. are contiguous).
  void expand(const radixserve::GroupScales& scales, const radixserve::GroupScales& lows, int64_t j) {
    scales.expand(j, R, scale.data());
    lows.expand(j, R, low.data());
  }

  // rest from the expanded scales and lows, for activation rows m0.. `integer`: the constant of
  // dot_tiles16's integer loop, sum_g low_g * sum_g(x) (no 128 trick).
  void rests(const Activations& a, bool integer, int64_t m0) {
    const float shift = integer ? 0.f : 128.f;
    const int64_t groups = a.groups;
#if RADIXSERVE_INT4_AVX512
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r) {
      RADIXSERVE_UNROLL
      for (int m = 0; m < M; ++m) rest[r][m] = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; g += 16) {
        const __mmask16 mask = groups - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (groups - g)) - 1);
        const __m512 sv = _mm512_maskz_loadu_ps(mask, scale.data() + r * groups + g);
        const __m512 lv = _mm512_maskz_loadu_ps(mask, low.data() + r * groups + g);
        const __m512 adjusted = _mm512_fnmadd_ps(_mm512_set1_ps(shift), sv, lv);
        RADIXSERVE_UNROLL
        for (int m = 0; m < M; ++m)
          rest[r][m] = _mm512_fmadd_ps(adjusted, _mm512_maskz_loadu_ps(mask, a.sums.data() + (m0 + m) * groups + g),
                                       rest[r][m]);
      }
    }
#else
    const float* xs[M];
    for (int m = 0; m < M; ++m) xs[m] = a.sums.data() + (m0 + m) * groups;
    int64_t g = 0;
    float sum[R][M] = {};
#if defined(__AVX2__) && defined(__FMA__)
    // In 8 lanes, and all the (weight row, activation row) chains side by side: one chain of
    // scalar multiply-adds a row waited 4 cycles a group, as long as the loop over the row's codes
    // took (a 3584-wide row: half of its time, 2-core Zen 3), and one vector chain at a time a
    // fifth of a 4 x 8-row pass at K = 8960. Each chain's arithmetic is the same at any R and M.
    __m256 lanes[R][M];
    zero(lanes);
    for (; g + 8 <= groups; g += 8)
      RADIXSERVE_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 adjusted = _mm256_fnmadd_ps(_mm256_set1_ps(shift), _mm256_loadu_ps(scale.data() + r * groups + g),
                                                 _mm256_loadu_ps(low.data() + r * groups + g));
        RADIXSERVE_UNROLL
        for (int m = 0; m < M; ++m) lanes[r][m] = _mm256_fmadd_ps(adjusted, _mm256_loadu_ps(xs[m] + g), lanes[r][m]);
      }
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r)
      RADIXSERVE_UNROLL
      for (int m = 0; m < M; ++m) sum[r][m] = radixserve::reduce_add(lanes[r][m]);
#endif
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) {
        const float* s = scale.data() + r * groups;
        const float* l = low.data() + r * groups;
        float total = sum[r][m];
        for (int64_t h = g; h < groups; ++h) total = std::fma(std::fma(-shift, s[h], l[h]), xs[m][h], total);
        rest[r][m] = total;
      }
#endif
  }

  // rest[r][m] as one number
  float rest_of(int r, int m) const {
#if RADIXSERVE_INT4_AVX512
    return _mm512_reduce_add_ps(rest[r][m]);
#else
    return rest[r][m];
#endif
  }
};

#if RADIXSERVE_INT4_AVX512
// Each accumulator's lanes summed into its output, rounded once to the activations' dtype O.
template <int M, int R, typename O>
inline void finish(const __m512 (&acc)[R][M], int64_t n, int64_t j, O* out) {
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) out[m * n + j + r] = static_cast<O>(_mm512_reduce_add_ps(acc[r][m]));
}

// A tile's groups as a mask of 32-bit lanes.
inline __mmask16 group_mask(const Tile& tile) { return __mmask16((1u << tile.groups) - 1); }

// The tile's sums (a group a lane) times the groups' scales, into the row's accumulators.
template <int M, int R>
inline void scale_tile(const __m512 (&tacc)[R][M], const RowConstants<M, R>& c, int64_t groups, const Tile& tile,
                       __m512 (&acc)[R][M]) {
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m512 sv = _mm512_maskz_loadu_ps(group_mask(tile), c.scale.data() + r * groups + tile.group0);
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_fmadd_ps(tacc[r][m], sv, acc[r][m]);
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// AVX2's halves of a tile (G groups a half: 8 of a full tile's 16, or a small tile's 4, whose
// upper lanes load as 0). Addresses are constant offsets from the half's base in the row quad
// (block_at and register_at per row and register were a signed division and a dozen integer
// instructions each, as many as the vector work): rows j.. share a quad (R divides 4 and j is a
// multiple of R), block b of row j + r lies (4b + r) * 64 bytes past the quad's, and register v
// of a full tile is block v, of a small one 16 bytes v within block 0.
inline const uint8_t* half_base(const uint8_t* w, int64_t k, int64_t j, const Tile& tile, int h) {
  return w + (j / kQuad) * kQuad * (k / 2) + (j % kQuad) * 64 + (tile.group0 / 4) * kQuad * 64 + 32 * h;
}

template <int G>
constexpr int64_t half_register(int v, int r) {
  return G == 8 ? (v * kQuad + r) * 64 : r * 64 + 16 * v;
}

template <int G>
inline __m256i half_words(const void* p) {
  if constexpr (G == 8)
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  else
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <int G>
inline __m256 half_floats(const float* p) {
  if constexpr (G == 8)
    return _mm256_loadu_ps(p);
  else
    return _mm256_zextps128_ps256(_mm_loadu_ps(p));
}

// One pass of R weight rows in AVX2's halves of tiles: `half(G, tile, h, acc)` adds half h of
// a tile (G groups a half: std::integral_constant 8, or 4 for a small tile) to the rows'
// accumulators, whose lanes are then summed with the rows' constants into out[m * n + j + r].
template <int M, int R, bool Prefetch, typename O, typename Half>
inline void pass_in_halves(const uint8_t* w, const RowConstants<M, R>& c, int64_t n, int64_t j, const Activations& a,
                           O* out, Half half) {
  const int64_t k = a.k, groups = a.groups;
  __m256 acc[R][M];
  zero(acc);
  for (int64_t ti = 0, tiles = tile_count(groups); ti < tiles; ++ti) {
    const Tile tile = tile_of(groups, ti);
    if constexpr (Prefetch) radixserve::prefetch_ahead<4 * R>(block_at(w, k, j, tile.group0 / 4));
    if (tile.groups == kTileGroups) {
      half(std::integral_constant<int, 8>{}, tile, 0, acc);
      half(std::integral_constant<int, 8>{}, tile, 1, acc);
    } else {
      half(std::integral_constant<int, 4>{}, tile, 0, acc);
    }
  }
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) out[m * n + j + r] = static_cast<O>(radixserve::reduce_add(acc[r][m]) + c.rest_of(r, m));
}
#endif


#if RADIXSERVE_INT4_AVX2
// AVX2's half of a tile (G groups, G <= 8 lanes of 32 bits: 8 of a full tile's 16, or a small
// tile's 4) for R weight rows: the AVX-512 loop's arithmetic (the 128 trick, even and odd codes
// by shifts and masks, float32 multiply-adds) a group a lane, then the groups' scales once.
template <int M, int R, int G>
inline void half_tile_avx2(const uint8_t* w, const RowConstants<M, R>& c, int64_t j, const Activations& a,
                           const Tile& tile, int h, __m256 (&acc)[R][M]) {
  const int64_t k = a.k, groups = a.groups;
  const __m256i nibble = _mm256_set1_epi32(0x000F0000), base = _mm256_set1_epi32(static_cast<int>(kBase));
  // a small tile's upper 4 lanes load as 0 (codes 128 against activations 0)
  const uint8_t* base_h = half_base(w, k, j, tile, h);
  __m256 tacc[R][M];
  zero(tacc);
  RADIXSERVE_UNROLL
  for (int v = 0; v < 4; ++v) {
    __m256i words[R];
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r) words[r] = half_words<G>(base_h + half_register<G>(v, r));
    RADIXSERVE_UNROLL
    for (int t = 0; t < 4; ++t) {
      const int64_t at = tile.group0 * kGroup + (4 * v + t) * 2 * tile.groups + 8 * h;
      RADIXSERVE_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 even = _mm256_castsi256_ps(
            _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(words[r], 16 - 4 * t), nibble), base));
        const __m256 odd = _mm256_castsi256_ps(
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(words[r], 4 * t), nibble), base));
        RADIXSERVE_UNROLL
        for (int m = 0; m < M; ++m) {
          const float* xt = a.paired.data() + m * k + at;
          tacc[r][m] = _mm256_fmadd_ps(odd, half_floats<G>(xt + tile.groups), _mm256_fmadd_ps(even, half_floats<G>(xt), tacc[r][m]));
        }
      }
    }
  }
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m256 sv = half_floats<G>(c.scale.data() + r * groups + tile.group0 + 8 * h);
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm256_fmadd_ps(tacc[r][m], sv, acc[r][m]);
  }
}
#endif

// R weight rows from j against M activation rows, in float32; into out[m * n + j + r] (rounded
// once, to the activations' dtype O). Several weight rows at once for few activation rows: each
// row's sum is a chain of dependent multiply-adds, and a single chain waits on its own latency.
template <int M, int R, bool Prefetch, typename O>
void dot_tiles(const uint8_t* w, const RowConstants<M, R>& c, int64_t n, int64_t j, const Activations& a, O* out) {
  [[maybe_unused]] const int64_t k = a.k, groups = a.groups;
#if RADIXSERVE_INT4_AVX512
  // 32-bit lane L of a register: words 2L (code 2i of group L, in its low half) and 2L + 1 (code
  // 2i + 1, high half); nibble t of either moved to bits 16..19 and or-ed with 128's float bits
  const __m512i nibble = _mm512_set1_epi32(0x000F0000), base = _mm512_set1_epi32(kBase);
  __m512 acc[R][M];
  c.start(acc);
  for (int64_t ti = 0, tiles = tile_count(groups); ti < tiles; ++ti) {
    const Tile tile = tile_of(groups, ti);
    if constexpr (Prefetch) radixserve::prefetch_ahead<4 * R>(block_at(w, k, j, tile.group0 / 4));
    const __mmask16 lanes = group_mask(tile);
    __m512 tacc[R][M];
    zero(tacc);
    RADIXSERVE_UNROLL
    for (int v = 0; v < 4; ++v) {
      __m512i words[R];
      RADIXSERVE_UNROLL
      for (int r = 0; r < R; ++r) words[r] = _mm512_maskz_loadu_epi32(lanes, register_at(w, k, j + r, tile, v));
      RADIXSERVE_UNROLL
      for (int t = 0; t < 4; ++t) {
        const int64_t at = tile.group0 * kGroup + (4 * v + t) * 2 * tile.groups;
        RADIXSERVE_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m512 even = _mm512_castsi512_ps(
              _mm512_ternarylogic_epi32(_mm512_slli_epi32(words[r], 16 - 4 * t), nibble, base, 0xEA));
          const __m512 odd = _mm512_castsi512_ps(
              _mm512_ternarylogic_epi32(_mm512_srli_epi32(words[r], 4 * t), nibble, base, 0xEA));
          RADIXSERVE_UNROLL
          for (int m = 0; m < M; ++m) {
            const float* xt = a.paired.data() + m * k + at;
            tacc[r][m] = _mm512_fmadd_ps(odd, _mm512_maskz_loadu_ps(lanes, xt + tile.groups),
                                         _mm512_fmadd_ps(even, _mm512_maskz_loadu_ps(lanes, xt), tacc[r][m]));
          }
        }
      }
    }
    scale_tile<M, R>(tacc, c, groups, tile, acc);
  }
  finish<M, R>(acc, n, j, out);
#elif RADIXSERVE_INT4_AVX2
  pass_in_halves<M, R, Prefetch>(w, c, n, j, a, out, [&](auto g, const Tile& tile, int h, __m256(&acc)[R][M]) {
    half_tile_avx2<M, R, decltype(g)::value>(w, c, j, a, tile, h, acc);
  });
#else
  // Explicit fused multiply-adds: left to the compiler, whether a*b+c is fused can differ between
  // row counts (vectorized across rows or not), and a row's bits would depend on its batch.
  for (int r = 0; r < R; ++r) {
    float acc[M] = {};
    for (int64_t g = 0; g < groups; ++g) {
      float part[M] = {};
      for (int cc = 0; cc < kGroup; ++cc) {
        const float q = 128.f + static_cast<float>(code_of(w, k, j + r, groups, g, cc));
        for (int m = 0; m < M; ++m) part[m] = std::fma(q, a.paired[m * k + g * kGroup + cc], part[m]);
      }
      for (int m = 0; m < M; ++m) acc[m] = std::fma(part[m], c.scale[r * groups + g], acc[m]);
    }
    for (int m = 0; m < M; ++m) out[m * n + j + r] = static_cast<O>(acc[m] + c.rest[r][m]);
  }
#endif
}

#if RADIXSERVE_INT4_BF16
// One full tile (16 groups, 4 blocks) into the rows' accumulators.
template <int M, int R>
inline void tile_bf16(const uint8_t* w, const RowConstants<M, R>& c, int64_t j, int64_t group0, const Activations& a,
                      int64_t m0, __m512 (&acc)[R][M]) {
  const int64_t k = a.k;
  const __m512i nibble = _mm512_set1_epi16(0x000F), base = _mm512_set1_epi16(0x4300);
  const Tile tile{group0, kTileGroups};
  __m512 tacc[R][M];
  zero(tacc);
  RADIXSERVE_UNROLL
  for (int v = 0; v < 4; ++v) {
    __m512i words[R];
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r) words[r] = _mm512_loadu_si512(block_at(w, k, j + r, group0 / 4 + v));
    RADIXSERVE_UNROLL
    for (int t = 0; t < 4; ++t) {
      const int64_t at = group0 * kGroup + (4 * v + t) * 2 * kTileGroups;
      __m512bh xs[M];
      RADIXSERVE_UNROLL
      for (int m = 0; m < M; ++m) xs[m] = (__m512bh)_mm512_loadu_si512(a.bf16.data() + (m0 + m) * k + at);
      RADIXSERVE_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512bh codes =
            (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(words[r], 4 * t), nibble, base, 0xEA);
        RADIXSERVE_UNROLL
        for (int m = 0; m < M; ++m) tacc[r][m] = _mm512_dpbf16_ps(tacc[r][m], codes, xs[m]);
      }
    }
  }
  scale_tile<M, R>(tacc, c, a.groups, tile, acc);
}

// A small tile (4 groups, one 64-byte block) in one register: its four 16-byte "registers" side by
// side, so lane 4v + l holds group l's codes 2i, 2i + 1 (i = 4v + t) in nibble t, and four dot
// products (one a nibble, each against the activations bf16_small_tiles put in that order) sum it,
// where tile_bf16<4> took sixteen at a quarter of the lanes (a 768-wide row, the 30B-A3B shape's
// expert down projections: 1 full tile and 2 small ones, the small ones two thirds of the time).
// Lane 4v + l ends with 8 of group l's codes; the groups' scales, repeated in each quarter, weigh
// them.
template <int M, int R>
inline void small_tile_bf16(const uint8_t* w, const RowConstants<M, R>& c, int64_t j, int64_t group0,
                            const Activations& a, int64_t m0, __m512 (&acc)[R][M]) {
  const int64_t k = a.k;
  const __m512i nibble = _mm512_set1_epi16(0x000F), base = _mm512_set1_epi16(0x4300);
  __m512 tacc[R][M];
  zero(tacc);
  __m512i words[R];
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r) words[r] = _mm512_loadu_si512(block_at(w, k, j + r, group0 / 4));
  RADIXSERVE_UNROLL
  for (int t = 0; t < 4; ++t) {
    __m512bh xs[M];
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m)
      xs[m] = (__m512bh)_mm512_loadu_si512(a.bf16.data() + (m0 + m) * k + group0 * kGroup + t * 32);
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512bh codes = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(words[r], 4 * t), nibble, base, 0xEA);
      RADIXSERVE_UNROLL
      for (int m = 0; m < M; ++m) tacc[r][m] = _mm512_dpbf16_ps(tacc[r][m], codes, xs[m]);
    }
  }
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m512 sv = _mm512_broadcast_f32x4(_mm_loadu_ps(c.scale.data() + r * a.groups + group0));
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_fmadd_ps(tacc[r][m], sv, acc[r][m]);
  }
}

// The same with bf16 activations and the CPU's bf16 dot products: 0x4300 | q is bf16 128 + q, and
// one instruction multiplies two codes of each of the tile's groups by their activations, summing
// each group's pair into its own float32 lane: 16 of them (4 registers, 4 nibbles) sum the tile.
// (activation rows m0.. of the call, into their rows of out; `c` holds their rests)
template <int M, int R, bool Prefetch, typename O>
void dot_tiles_bf16(const uint8_t* w, const RowConstants<M, R>& c, int64_t n, int64_t j, const Activations& a,
                    O* out, int64_t m0 = 0) {
  const int64_t k = a.k, groups = a.groups, full = groups / kTileGroups;
  __m512 acc[R][M];
  c.start(acc);
  for (int64_t ti = 0; ti < full; ++ti) {
    if constexpr (Prefetch) radixserve::prefetch_ahead<4 * R>(block_at(w, k, j, ti * kTileGroups / 4));
    tile_bf16<M, R>(w, c, j, ti * kTileGroups, a, m0, acc);
  }
  for (int64_t g = full * kTileGroups; g < groups; g += kSmallGroups) small_tile_bf16<M, R>(w, c, j, g, a, m0, acc);
  finish<M, R>(acc, n, j, out + m0 * n);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// The integer sums of dot_tiles16's half of a tile (G groups, G <= 8 lanes of 32 bits: 8 of a full
// tile's 16, or a small tile's 4, whose upper lanes load as 0) for R weight rows from j against M
// activation rows from m0: a group a lane, before its scales.
template <int M, int R, int G, int P>
inline void half_sums16(const uint8_t* w, int64_t j, const Activations& a, int64_t m0, const Tile& tile, int h,
                        __m256i (&tacc)[R][M]) {
  const int64_t k = a.k;
  constexpr int64_t TG = G == 8 ? kTileGroups : kSmallGroups;  // the tile's groups
  const uint8_t* base_h = half_base(w, k, j, tile, h);
  // rows m0.. (m0 a multiple of P, the interleave): Activations::x16_at
  const int16_t* xt = a.x16.data() + m0 * k + (tile.group0 * kGroup + 16 * h) * P;
  const __m256i nibble = _mm256_set1_epi16(0x000F);
  zero(tacc);
  RADIXSERVE_UNROLL
  for (int v = 0; v < 4; ++v) {
    __m256i words[R];
    RADIXSERVE_UNROLL
    for (int r = 0; r < R; ++r) words[r] = half_words<G>(base_h + half_register<G>(v, r));
    RADIXSERVE_UNROLL
    for (int t = 0; t < 4; ++t) {
      RADIXSERVE_UNROLL
      for (int r = 0; r < R; ++r) {
        // (the top nibble needs no mask: a shift by 12 leaves only it)
        const __m256i codes = t == 3 ? _mm256_srli_epi16(words[r], 12)
                                     : _mm256_and_si256(_mm256_srli_epi16(words[r], 4 * t), nibble);
        RADIXSERVE_UNROLL
        for (int m = 0; m < M; ++m)
          tacc[r][m] = _mm256_add_epi32(tacc[r][m], _mm256_madd_epi16(codes, half_words<G>(xt + (4 * v + t) * 2 * TG * P + m * 2 * G)));
      }
      // Each accumulator in a register here: left free, GCC reassociates the 16 integer sums into
      // a tree whose partial sums spill to the stack (50-150 stores a half tile)
      RADIXSERVE_UNROLL
      for (int r = 0; r < R; ++r)
        RADIXSERVE_UNROLL
        for (int m = 0; m < M; ++m) __asm__("" : "+x"(tacc[r][m]));
    }
  }
}

// dot_tiles16's half of a tile for R weight rows, into the rows' accumulators.
template <int M, int R, int G, int P>
inline void half_tile16(const uint8_t* w, const RowConstants<M, R>& c, int64_t j, const Activations& a, int64_t m0,
                        const Tile& tile, int h, __m256 (&acc)[R][M]) {
  const int64_t groups = a.groups;
  __m256i tacc[R][M];
  half_sums16<M, R, G, P>(w, j, a, m0, tile, h, tacc);
  const int64_t g0 = tile.group0 + 8 * h;
  RADIXSERVE_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m256 sv = half_floats<G>(c.scale.data() + r * groups + g0);
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m)
      acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tacc[r][m]),
                                  _mm256_mul_ps(sv, half_floats<G>(a.x16_scales.data() + (m0 + m) * groups + g0)), acc[r][m]);
  }
}
#endif

// R weight rows from j against M activation rows rounded to int16 (the default on CPUs without
// AVX-512, unless --exact-activations; activations16.h): the tiles' words shifted right by 4t and
// masked are two codes of each group in 16-bit lanes, one vpmaddwd multiplies them by the
// activations in the same order (Activations::x16, bf16's) and sums each group's pair into its own
// 32-bit lane, exactly; 16 of them (4 registers, 4 nibbles) sum a group's 32 codes, which then
// meet the weights' scale times the activations' once. No 128 trick: integers need no float
// bits, so w . x = sum_g scale_g xscale_g sum(q x16) + sum_g low_g sum_g(x), the second in float32
// over the exact activations. Four instructions for 16 codes and a row against the float loop's
// eight (its shifts, masks, ors and two multiply-adds).
template <int M, int R, bool Prefetch, int P, typename O>
void dot_tiles16(const uint8_t* w, const RowConstants<M, R>& c, int64_t n, int64_t j, const Activations& a, int64_t m0,
                 O* out) {
  [[maybe_unused]] const int64_t k = a.k, groups = a.groups;
#if defined(__AVX2__) && defined(__FMA__)
  pass_in_halves<M, R, Prefetch>(w, c, n, j, a, out, [&](auto g, const Tile& tile, int h, __m256(&acc)[R][M]) {
    half_tile16<M, R, decltype(g)::value, P>(w, c, j, a, m0, tile, h, acc);
  });
#else
  for (int r = 0; r < R; ++r) {
    float acc[M] = {};
    for (int64_t g = 0; g < groups; ++g) {
      int32_t part[M] = {};
      for (int cc = 0; cc < kGroup; ++cc) {
        const int32_t q = code_of(w, k, j + r, groups, g, cc);
        for (int m = 0; m < M; ++m) part[m] += q * a.x16[a.x16_at(m0 + m, bf16_at(groups, g, cc))];
      }
      for (int m = 0; m < M; ++m)
        acc[m] = std::fma(static_cast<float>(part[m]), c.scale[r * groups + g] * a.x16_scales[(m0 + m) * groups + g], acc[m]);
    }
    for (int m = 0; m < M; ++m) out[m * n + j + r] = static_cast<O>(acc[m] + c.rest_of(r, m));
  }
#endif
}

#if RADIXSERVE_INT4_BF16
// More than 4 bf16 activation rows: each weight quad against them four at a time (then the rest),
// where one pass of 2 weight rows against all of them kept 16 sums and 8 rows' activations in
// registers and spilled: one core, a 16384 x 2048 layer at 8 rows, 48 G multiply-adds a second
// against 65 at 4 rows. The quad's codes come from the first-level cache after the first pass and
// are decoded again (a shift and a mask a register, against 16 dot products a pass). A row's
// arithmetic is the loop's at any row count: the same bits.
template <int M, typename O>
void bf16_in_fours(const uint8_t* w, const radixserve::GroupScales& scales, const radixserve::GroupScales& lows,
                   int64_t n, int64_t begin, int64_t end, const Activations& a, O* out) {
  constexpr int kTail = M % 4;
  RowConstants<4, kQuad> four(a.groups);
  RowConstants<kTail == 0 ? 1 : kTail, kQuad> tail(a.groups);
  for (int64_t j = begin * kQuad; j < end * kQuad; j += kQuad) {
    four.expand(scales, lows, j);
    for (int64_t m0 = 0; m0 + 4 <= M; m0 += 4) {
      four.rests(a, false, m0);
      if (a.prefetch && m0 == 0)  // the quad's first pass streams it, the others read the cache
        dot_tiles_bf16<4, kQuad, true>(w, four, n, j, a, out, m0);
      else
        dot_tiles_bf16<4, kQuad, false>(w, four, n, j, a, out, m0);
    }
    if constexpr (kTail != 0) {
      tail.expand(scales, lows, j);
      tail.rests(a, false, M - kTail);
      dot_tiles_bf16<kTail, kQuad, false>(w, tail, n, j, a, out, M - kTail);
    }
  }
}
#endif

// Weight-row quads [begin, end), R rows at a time: each (row, activation row) pair holds two
// accumulators, the tile's (in registers: every dot product adds to it) and the row's (touched once
// a tile, so left to spill where the registers run out). A pass rereads the activations, so fewer
// rows a pass cost more than the spills: 8 activation rows on one weight row at a time ran a
// 2048 x 8192 layer in 2.4 ms, two at a time in 1.6 (2 threads, Zen 4).
template <int M, typename O>
void dot_quads(const uint8_t* w, const radixserve::GroupScales& scales, const radixserve::GroupScales& lows, int64_t n,
               int64_t begin, int64_t end, const Activations& a, bool bf16, O* out) {
  // (AVX2's 16 registers hold a tile's R M accumulators and R rows' words at fewer rows a pass)
  constexpr int R = RADIXSERVE_INT4_AVX2 ? (M == 1 ? 4 : M == 2 ? 2 : 1) : (M <= 4 ? 4 : 2);
#if RADIXSERVE_INT4_BF16
  if constexpr (M > 4) {
    if (bf16) return bf16_in_fours<M>(w, scales, lows, n, begin, end, a, out);
  }
#endif
  RowConstants<M, R> c(a.groups);
  for (int64_t j = begin * kQuad; j < end * kQuad; j += R) {
    c.load(scales, lows, j, a);
#if RADIXSERVE_INT4_BF16
    if (bf16) {
      if (a.prefetch)  // a template argument: the loop without it is the very same code
        dot_tiles_bf16<M, R, true>(w, c, n, j, a, out);
      else
        dot_tiles_bf16<M, R, false>(w, c, n, j, a, out);
      continue;
    }
#endif
    if (a.prefetch)
      dot_tiles<M, R, true>(w, c, n, j, a, out);
    else
      dot_tiles<M, R, false>(w, c, n, j, a, out);
  }
}

// The same with the activations rounded to int16 (dot_tiles16), any number of rows. One row: four
// weight rows a pass, streaming the codes. More: a weight quad at a time, two of its rows against
// four activation rows a pass (then the rest, 1-3). The quad (4 rows of K / 2 bytes: 3 KB at
// K = 1536, 18 KB at 8960) streams from memory on its first pass and from the first-level cache
// after, and each pass decodes its codes once for 8 (weight row, activation row) sums held in
// registers: the decoding, not the multiplies, bounds these loops, so the more activation rows
// share it the better (one core of the Zen 3 EPYC, all in cache: 2 weight rows x 4 activation rows
// about 3.5 multiply-adds a ns, 4 x 2 2.5, 4 x 1 2.0). The float loop's way past 2 rows, one weight
// row against all the activation rows, reread every activation for every weight row.
// (`c` holds the scales and lows of rows j.. already: RowConstants::expand)
template <int P, int M, int R, typename O>
inline void pass16(RowConstants<M, R>& c, const uint8_t* w, int64_t n, int64_t j, const Activations& a, int64_t m0,
                   O* out) {
  c.rests(a, true, m0);
  if (a.prefetch)
    dot_tiles16<M, R, true, P>(w, c, n, j, a, m0, out + m0 * n);
  else
    dot_tiles16<M, R, false, P>(w, c, n, j, a, m0, out + m0 * n);
}

// AVX2 builds only: an AVX-512 build's RowConstants::rests sums the lows' part in 16 lanes, so
// there this loop's bits would differ from pass16's (and int16 activations are not the default there).
#if RADIXSERVE_INT4_AVX2
// One activation row rounded to int16 (a decode step of one stream): pass16<1>'s arithmetic over a
// quad, operation for operation (the same bits, so a row's result still does not depend on the
// call's row count), without RowConstants' per-quad arrays: each half tile's scales made from their
// int8 codes and steps where the loop needs them, and the lows' part (RowConstants::rests) summed
// in the same pass, a chunk of 8 groups at a time. Factored scales and lows (a Q4_K's) only.

// Four rows' scales (or lows) of groups [g0, g0 + G) as floats: codes times their step (what
// GroupScales::expand gives), a small tile's upper lanes 0.
template <int G>
inline __m256 factored(const int8_t* codes, const float* steps, int64_t groups, int64_t supers, int r, int64_t g0) {
  if constexpr (G == 8) {
    return radixserve::codes_times_step(codes + r * groups + g0, steps[r * supers + g0 / 8]);
  } else {
    int32_t four = 0;
    std::memcpy(&four, codes + r * groups + g0, 4);
    return _mm256_zextps128_ps256(_mm_mul_ps(_mm_set1_ps(steps[r * supers + g0 / 8]),
                                             _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four)))));
  }
}

template <bool Prefetch, typename O>
void one_row16(const uint8_t* w, const radixserve::GroupScales& scales, const radixserve::GroupScales& lows,
               int64_t begin, int64_t end, const Activations& a, O* out) {
  const int64_t k = a.k, groups = a.groups, supers = groups / 8;
  for (int64_t j = begin * kQuad; j < end * kQuad; j += kQuad) {
    const int8_t* sc = static_cast<const int8_t*>(scales.values) + j * groups;
    const float* ss = scales.steps + j * supers;
    const int8_t* lc = static_cast<const int8_t*>(lows.values) + j * groups;
    const float* ls = lows.steps + j * supers;
    __m256 acc[kQuad][1], lanes[kQuad];
    zero(acc);
    for (int r = 0; r < kQuad; ++r) lanes[r] = _mm256_setzero_ps();
    // RowConstants::rests' chain for groups [g, g + 8): low - 0 * scale, times the group sums
    const auto lows_chunk = [&](int64_t g) {
      const __m256 xs = _mm256_loadu_ps(a.sums.data() + g);
      RADIXSERVE_UNROLL
      for (int r = 0; r < kQuad; ++r) {
        const __m256 adjusted = _mm256_fnmadd_ps(_mm256_set1_ps(0.f), factored<8>(sc, ss, groups, supers, r, g),
                                                 factored<8>(lc, ls, groups, supers, r, g));
        lanes[r] = _mm256_fmadd_ps(adjusted, xs, lanes[r]);
      }
    };
    // half_tile16<1, 4, G, 1>, the scales from their codes
    const auto half = [&](auto gc, const Tile& tile, int h) {
      constexpr int G = decltype(gc)::value;
      __m256i tacc[kQuad][1];
      half_sums16<1, kQuad, G, 1>(w, j, a, 0, tile, h, tacc);
      const int64_t g0 = tile.group0 + 8 * h;
      const __m256 xscale = half_floats<G>(a.x16_scales.data() + g0);
      RADIXSERVE_UNROLL
      for (int r = 0; r < kQuad; ++r)
        acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tacc[r][0]),
                                    _mm256_mul_ps(factored<G>(sc, ss, groups, supers, r, g0), xscale), acc[r][0]);
    };
    const int64_t full = groups / kTileGroups;
    for (int64_t ti = 0, tiles = tile_count(groups); ti < tiles; ++ti) {
      const Tile tile = tile_of(groups, ti);
      if constexpr (Prefetch) radixserve::prefetch_ahead<4 * kQuad>(block_at(w, k, j, tile.group0 / 4));
      if (tile.groups == kTileGroups) {
        for (int h = 0; h < 2; ++h) {
          half(std::integral_constant<int, 8>{}, tile, h);
          lows_chunk(tile.group0 + 8 * h);
        }
      } else {
        half(std::integral_constant<int, 4>{}, tile, 0);
      }
    }
    for (int64_t g = full * kTileGroups; g < groups; g += 8) lows_chunk(g);
    RADIXSERVE_UNROLL
    for (int r = 0; r < kQuad; ++r)
      out[j + r] = static_cast<O>(radixserve::reduce_add(acc[r][0]) + radixserve::reduce_add(lanes[r]));
  }
}
#endif

template <typename O>
void dot_quads16(const uint8_t* w, const radixserve::GroupScales& scales, const radixserve::GroupScales& lows,
                 int64_t n, int64_t begin, int64_t end, const Activations& a, int64_t rows, O* out) {
  if (rows == 1) {
#if RADIXSERVE_INT4_AVX2
    if (scales.type == at::kChar && scales.span == 8 && lows.type == at::kChar && lows.span == 8) {
      if (a.prefetch)
        one_row16<true>(w, scales, lows, begin, end, a, out);
      else
        one_row16<false>(w, scales, lows, begin, end, a, out);
      return;
    }
#endif
    RowConstants<1, kQuad> one(a.groups);
    for (int64_t j = begin * kQuad; j < end * kQuad; j += kQuad) {
      one.expand(scales, lows, j);
      pass16<1>(one, w, n, j, a, 0, out);
    }
    return;
  }
  std::tuple<RowConstants<1, 2>, RowConstants<2, 2>, RowConstants<3, 2>, RowConstants<4, 2>> constants{
      a.groups, a.groups, a.groups, a.groups};  // by the pass's activation rows, 1-4
  // The quads in blocks of about kBlockBytes of codes, each block against the activation rows four
  // at a time: a block stays in the second-level cache while the passes of each four rows read it,
  // and those rows' activations in the first (12 KB at K = 1536). Quad by quad, every pass brought
  // all the rows' activations through the first-level cache again: 16 rows at K = 1536, 48 KB.
  const int64_t block = std::max<int64_t>(1, kBlockBytes / (kQuad * a.k / 2));
  for (int64_t q0 = begin; q0 < end; q0 += block) {
    const int64_t q1 = std::min(end, q0 + block);
    for (int64_t m0 = 0; m0 < rows; m0 += 4)
      radixserve::with_row_count<4>(std::min<int64_t>(4, rows - m0), [&](auto count) {
        auto& c = std::get<decltype(count)::value - 1>(constants);
        for (int64_t r0 = q0 * kQuad; r0 < q1 * kQuad; r0 += 2) {
          c.expand(scales, lows, r0);
          pass16<4>(c, w, n, r0, a, m0, out);
        }
      });
  }
}

void check(const at::Tensor& x, const at::Tensor& w, bool int16_activations) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "int4_gemv: x is a CPU [rows, K] float32 or bfloat16 tensor");
  TORCH_CHECK(x.size(1) % kBlock == 0, "int4_gemv: K is a multiple of 128");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && w.size(1) * 2 == x.size(1) &&
                  w.size(0) % kQuad == 0,
              "int4_gemv: codes are contiguous uint8 [N, K / 2] with K = x's width and N a multiple of 4");
  TORCH_CHECK(int16_activations || x.size(0) <= kMaxRows, "int4_gemv: at most 8 rows a call (any with int16 activations)");
}

// A bf16 activation's bits (only called on bf16 ones; the float dtypes' instantiations never run it).
template <typename T>
uint16_t bf16_bits(T v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    return v.x;
  else
    return 0;
}

// x's rows prepared as the loops read them (Activations), in the way `bf16` or `int16_activations`
// says; x may be a view of some rows of a larger tensor (int4_gemv_experts: an expert's).
Activations prepare(const at::Tensor& x, bool bf16, bool int16_activations) {
  const int64_t rows = x.size(0), k = x.size(1);
  Activations a;
  a.k = k;
  a.groups = k / kGroup;
  a.sums.assign(rows * a.groups, 0.f);
  a.paired.resize(bf16 || int16_activations ? 0 : rows * k);
  a.bf16.resize(bf16 ? rows * k : 0);
  a.prefetch = radixserve::activations_spill(rows * k * (bf16 ? 2 : 4));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "int4_gemv", [&] {
    const scalar_t* xs = x.data_ptr<scalar_t>();
    if (int16_activations) {
      // each row rounded a group at a time, then its codes moved to the tiles' order (bf16's)
      a.interleave = rows == 1 ? 1 : 4;
      a.x16.resize((rows + a.interleave - 1) / a.interleave * a.interleave * k);
      a.x16_scales.resize(rows * a.groups);
      // (rows in parallel: a prompt's hundreds of rows took longer here than in the products)
      at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 14) / k), [&](int64_t first, int64_t last) {
        std::vector<float> row(k);
        std::vector<int16_t> codes(k), tiled(k);
        for (int64_t m = first; m < last; ++m) {
          for (int64_t i = 0; i < k; ++i) row[i] = static_cast<float>(xs[m * x.stride(0) + i * x.stride(1)]);
          for (int64_t g = 0; g < a.groups; ++g) {
            float sum = 0.f;
            for (int64_t i = g * kGroup; i < (g + 1) * kGroup; ++i) sum += row[i];
            a.sums[m * a.groups + g] = sum;
          }
          radixserve::round_to_int16(row.data(), k, kGroup, codes.data(), a.x16_scales.data() + m * a.groups);
          if (a.interleave == 1) {  // one row: the tiles' order as it is
            to_tile_order(reinterpret_cast<const uint16_t*>(codes.data()), a.groups,
                          reinterpret_cast<uint16_t*>(a.x16.data() + m * k));
            continue;
          }
          to_tile_order(reinterpret_cast<const uint16_t*>(codes.data()), a.groups, reinterpret_cast<uint16_t*>(tiled.data()));
          // piece by piece (x16_at per element cost divisions: ~10 us a 2048-wide row)
          const int64_t full = a.full_words(), P = a.interleave;
          int16_t* const wide = a.x16.data() + a.row_pieces(m, 16);
          int16_t* const narrow = a.x16.data() + a.row_pieces(m, 8);
          for (int64_t e = 0; e < full; e += 16) std::memcpy(wide + e * P, &tiled[e], 32);
          for (int64_t e = full; e < k; e += 8) std::memcpy(narrow + e * P, &tiled[e], 16);
        }
      });
      a.prefetch = radixserve::activations_spill(rows * k * 2);
      return;
    }
#if RADIXSERVE_INT4_BF16
    if (bf16 && x.stride(1) == 1) {  // the decode step's case, vectorized: the scalar loop below
      // took 60 us a call for one 18944-wide row and 460 for eight, a few percent of a step
      for (int64_t m = 0; m < rows; ++m) {
        const uint16_t* row = reinterpret_cast<const uint16_t*>(xs + m * x.stride(0));
        for (int64_t g = 0; g < a.groups; ++g) {
          const __m512i halves = _mm512_loadu_si512(row + g * kGroup);  // bf16 is float32's top half
          const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(halves, 16));
          const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(halves, _mm512_set1_epi32(int(0xFFFF0000u))));
          a.sums[m * a.groups + g] = _mm512_reduce_add_ps(_mm512_add_ps(even, odd));
        }
        to_tile_order(row, a.groups, a.bf16.data() + m * k);
        bf16_small_tiles(a.bf16.data() + m * k, a.groups);
      }
      return;
    }
#endif
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t i = 0; i < k; ++i) {
        const scalar_t v = xs[m * x.stride(0) + i * x.stride(1)];
        a.sums[m * a.groups + i / kGroup] += static_cast<float>(v);
        const int64_t g = i / kGroup;
        const int c = static_cast<int>(i % kGroup);
        if (bf16)
          a.bf16[m * k + bf16_at(a.groups, g, c)] = bf16_bits(v);
        else
          a.paired[m * k + paired_at(a.groups, g, c)] = static_cast<float>(v);
      }
    if (bf16)
      for (int64_t m = 0; m < rows; ++m) bf16_small_tiles(a.bf16.data() + m * k, a.groups);
  });
  return a;
}

// Weight-row quads [begin, end) of one weight against `rows` prepared activation rows, into out
// [rows, n]: the loop int4_gemv's flags choose.
template <typename O>
void products(const uint8_t* w, const radixserve::GroupScales& sg, const radixserve::GroupScales& lg, int64_t n,
              int64_t begin, int64_t end, const Activations& a, int64_t rows, bool bf16, bool int16_activations, O* out) {
  if (int16_activations) return dot_quads16(w, sg, lg, n, begin, end, a, rows, out);
  radixserve::with_row_count(rows, [&](auto count) {
    constexpr int M = decltype(count)::value;
    dot_quads<M>(w, sg, lg, n, begin, end, a, bf16, out);
  });
}

// Whether the bf16 loop serves x (else the float one, or int16's where asked).
bool bf16_loop(const at::Tensor& x, bool int16_activations) {
#if RADIXSERVE_INT4_BF16
  return !int16_activations && x.scalar_type() == at::kBFloat16;
#else
  (void)x, (void)int16_activations;
  return false;
#endif
}

// x [rows, K] @ (scales * q + lows).T -> [rows, N] in x's dtype; scales and lows [N, K / 32] in one
// of group_scales.h's forms (int8 codes with their steps).
at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const at::Tensor& lows,
                     const std::optional<at::Tensor>& scale_steps, const std::optional<at::Tensor>& low_steps,
                     bool int16_activations) {
  check(x, w, int16_activations);
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, k / kGroup, "int4_gemv");
  const auto lg = radixserve::GroupScales::of(lows, low_steps, n, k / kGroup, "int4_gemv lows");
  const bool bf16 = bf16_loop(x, int16_activations);
  const Activations a = prepare(x, bf16, int16_activations);
  at::Tensor out = at::empty({rows, n}, x.options());
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t grain = std::max<int64_t>(4, (int64_t{1} << 15) / k);  // quads; small layers stay on one thread
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "int4_gemv", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n / kQuad, grain, [&](int64_t begin, int64_t end) {
      products(wp, sg, lg, n, begin, end, a, rows, bf16, int16_activations, op);
    });
  });
  return out;
}

// A mixture of experts' products in one call, as int4_gemv_q8_experts for int4_gemv: x [R, K] holds
// the routed rows grouped by expert (counts[e] rows for expert e, in order: expert_rows.h), w[e]
// etc. each expert's weight as int4_gemv takes it ([N, K] alike); -> [R, N], each expert's rows
// exactly what int4_gemv gives for them alone (the same loop for the same row count; the threads
// split the work elsewhere, but every sum is one thread's). One parallel region, each thread a share
// of every expert's quads (expert_rows.h for_every_expert), where a call an expert took a thread wake-up and the Python around it (the
// 30B-A3B shape's decode step: 8 experts a layer, two calls each).
at::Tensor int4_gemv_experts(const at::Tensor& x, at::IntArrayRef counts, at::TensorList w, at::TensorList scales,
                             at::TensorList lows, at::TensorList scale_steps, at::TensorList low_steps,
                             bool int16_activations) {
  const int64_t experts = static_cast<int64_t>(w.size());
  TORCH_CHECK(scales.size() == w.size() && lows.size() == w.size() &&
                  (scale_steps.empty() || scale_steps.size() == w.size()) &&
                  (low_steps.empty() || low_steps.size() == w.size()),
              "int4_gemv_experts: as many weights, scales and lows (and steps, where given)");
  const std::vector<int64_t> first = radixserve::expert_rows(x, counts, experts, "int4_gemv_experts");
  const int64_t k = x.size(1), n = w[0].size(0);
  const bool bf16 = bf16_loop(x, int16_activations);
  std::vector<radixserve::GroupScales> sg, lg;
  std::vector<Activations> a;
  for (int64_t e = 0; e < experts; ++e) {
    const at::Tensor rows = x.narrow(0, first[e], counts[e]);
    check(rows, w[e], int16_activations);
    TORCH_CHECK(w[e].size(0) == n, "int4_gemv_experts: every expert's codes are [N, K / 2] with one N");
    const auto step = [&](at::TensorList steps) { return steps.empty() ? std::optional<at::Tensor>() : steps[e]; };
    sg.push_back(radixserve::GroupScales::of(scales[e], step(scale_steps), n, k / kGroup, "int4_gemv_experts"));
    lg.push_back(radixserve::GroupScales::of(lows[e], step(low_steps), n, k / kGroup, "int4_gemv_experts lows"));
    a.push_back(prepare(rows, bf16, int16_activations));
  }
  at::Tensor out = at::empty({x.size(0), n}, x.options());
  const int64_t grain = std::max<int64_t>(4, (int64_t{1} << 15) / k);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "int4_gemv_experts", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    radixserve::for_every_expert(n / kQuad, experts, grain, [&](int64_t e, int64_t from, int64_t to) {
      products(w[e].data_ptr<uint8_t>(), sg[e], lg[e], n, from, to, a[e], counts[e], bf16, int16_activations,
               op + first[e] * n);
    });
  });
  return out;
}

// Whether int4_gemv runs vector loops on this build, AVX-512 or AVX2 (else the portable one,
// right but slow).
bool int4_gemv_fast() { return RADIXSERVE_INT4_AVX512 != 0 || RADIXSERVE_INT4_AVX2 != 0; }

// Whether callers round the activations to int16 by default here (dot_tiles16): on AVX2 without
// AVX-512, where the float loop's instructions, not memory, bound one row.
bool int4_gemv_int16_default() { return RADIXSERVE_INT4_AVX2 != 0; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("int4_gemv(Tensor x, Tensor w, Tensor scales, Tensor lows, Tensor? scale_steps=None, Tensor? low_steps=None, "
        "bool int16_activations=False) -> Tensor",
        int4_gemv);
  m.def("int4_gemv_experts(Tensor x, int[] counts, Tensor[] w, Tensor[] scales, Tensor[] lows, Tensor[] scale_steps, "
        "Tensor[] low_steps, bool int16_activations=False) -> Tensor",
        int4_gemv_experts);
  m.def("int4_gemv_fast() -> bool", int4_gemv_fast);
  m.def("int4_gemv_int16_default() -> bool", int4_gemv_int16_default);
}
