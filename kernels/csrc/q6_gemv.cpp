// Few-row products with 6-bit group codes and bf16 activations: a GGUF's Q6_K tensors (and Q5_0's,
// whose codes fit too) streamed at 6 bits a weight instead of the int8 group kernel's 8
// (group_gemv.cpp). A one-row decode step only streams the weights; Q4_K_M files keep their output
// layer and half their down projections in Q6_K, a third of a 1B model's bytes.
//
// Weights: signed codes c in [-32, 31] with per-group scales (16 or 32 codes a group, in one of
// group_scales.h's forms), w = scale * c. Stored as u = c + 32 (0..63), in blocks of 128 codes:
// 32 16-bit words of low nibbles, then 32 bytes of high crumbs (96 bytes). Rows come in quads,
// their blocks interleaved (block_at). The blocks hold tiles, as int4_blocks.h's do: a row's
// groups 16 at a time (the last groups % 16 of them 128 / group at a time, one block); a tile of
// G groups of S codes is S / 8 "registers" of 2G words and 2G crumb bytes, word (and crumb byte) p
// of register v holding, in nibble (crumb) t, code 2i + p % 2 of the tile's group p / 2 (i = 4v + t).
//
// The bf16 trick of int4_gemv.cpp: 0x4300 | u is the bf16 number 128 + u (u < 128), so a code is a
// number with two shifts and two bitwise selects, and one dot-product instruction multiplies two
// codes of each of 16 groups by their activations, summing each group's pair in its own float32
// lane: a tile's groups build up a lane each and meet their scales once per tile. Per row,
//   w . x = sum_g scale_g sum((128 + u) x) - 160 sum_g scale_g sum_g(x),
// the group sums of the activations formed once per call. Products are exact and sums float32.
// Only with bf16 activations on CPUs with bf16 dot products (AVX512_BF16: Zen 4, Sapphire
// Rapids); elsewhere the callers keep the int8 codes (`q6_gemv_fast()`).
//
// Rows are independent: a row's result never depends on which other rows share the call.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "group_scales.h"
#include "row_count.h"
#include "weight_prefetch.h"
#include "weight_store.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define RADIXSERVE_Q6_BF16 1
#else
#define RADIXSERVE_Q6_BF16 0
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#define RADIXSERVE_Q6_UNROLL _Pragma("GCC unroll 8")

namespace {

constexpr int64_t kBlock = 128;       // codes a block holds
constexpr int64_t kBlockBytes = 96;   // 64 bytes of nibbles, 32 of crumbs
constexpr int64_t kMaxRows = 8;
constexpr float kOffset = 160.f;      // 128 (the bf16 trick) + 32 (the stored codes' bias)

constexpr int64_t kQuad = 4;          // weight rows whose blocks are interleaved

// Where weight row `row`'s block b starts: rows come in quads whose blocks are interleaved (block b
// of rows 4i..4i+3, then block b + 1), so a pass over four rows reads one stream, as in
// int4_gemv.cpp (four separate streams ran at half the memory speed).
inline const uint8_t* block_at(const uint8_t* w, int64_t k, int64_t row, int64_t b) {
  return w + ((row / kQuad) * kQuad * (k / kBlock) + b * kQuad + row % kQuad) * kBlockBytes;
}

constexpr int64_t kTileGroups = 16;

// A tile of a row: its first group and how many it has (16, or 128 / group in the small tiles at
// the end); its blocks start at group0 * group / 128.
struct Tile {
  int64_t group0, groups;
};

inline int64_t tile_count(int64_t groups, int64_t group) {
  return groups / kTileGroups + (groups % kTileGroups) / (kBlock / group);
}

inline Tile tile_of(int64_t groups, int64_t group, int64_t index) {
  const int64_t full = groups / kTileGroups, small = kBlock / group;
  if (index < full) return {index * kTileGroups, kTileGroups};
  return {full * kTileGroups + (index - full) * small, small};
}

inline Tile tile_holding(int64_t groups, int64_t group, int64_t g) {
  if (g < groups / kTileGroups * kTileGroups) return {g - g % kTileGroups, kTileGroups};
  const int64_t small = kBlock / group;
  return {g - g % small, small};
}

// Register v of a row's tile: its words (2G of them) and crumb bytes (2G) start at
// (block, word within the block); the crumbs at byte 64 + that word of the block.
struct RegisterAt {
  int64_t block;
  int64_t word;
};

inline RegisterAt register_of(const Tile& tile, int64_t group, int v) {
  const int64_t word = v * 2 * tile.groups;  // within the tile
  return {tile.group0 * group / kBlock + word / 32, word % 32};
}

// Where activation (code) c of group g goes in a row of the call's activations: per tile and
// dot product i, each group's codes 2i, 2i + 1.
inline int64_t activation_at(int64_t groups, int64_t group, int64_t g, int c) {
  const Tile tile = tile_holding(groups, group, g);
  return tile.group0 * group + (c / 2) * 2 * tile.groups + 2 * (g - tile.group0) + c % 2;
}

// codes int8 [N, K] in [-32, 31] -> the layout above, [N, K * 3 / 4] uint8.
at::Tensor repack_q6(const at::Tensor& codes, int64_t group) {
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.scalar_type() == at::kChar &&
                  codes.size(1) % kBlock == 0 && codes.size(0) % kQuad == 0,
              "repack_q6: codes are contiguous int8 [N, K], N a multiple of 4, K of 128");
  TORCH_CHECK(group == 16 || group == 32, "repack_q6: group is 16 or 32");
  const int64_t n = codes.size(0), k = codes.size(1), blocks = k / kBlock, groups = k / group;
  at::Tensor out = at::empty({n, blocks * kBlockBytes}, codes.options().dtype(at::kByte));
  const int8_t* in = codes.data_ptr<int8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  std::atomic<bool> in_range{true};
  at::parallel_for(0, n, std::max<int64_t>(1, (int64_t{1} << 16) / k), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      for (int64_t ti = 0, tiles = tile_count(groups, group); ti < tiles; ++ti) {
        const Tile tile = tile_of(groups, group, ti);
        for (int v = 0; v < group / 8; ++v) {
          const RegisterAt at = register_of(tile, group, v);
          uint8_t* block = const_cast<uint8_t*>(block_at(o, k, row, at.block));
          for (int64_t p = 0; p < 2 * tile.groups; ++p) {
            uint16_t word = 0;
            uint8_t crumbs = 0;
            for (int t = 0; t < 4; ++t) {  // code 2(4v + t) + p % 2 of group group0 + p / 2
              const int u = in[row * k + (tile.group0 + p / 2) * group + 2 * (4 * v + t) + p % 2] + 32;
              if (u < 0 || u > 63) in_range = false;
              word |= static_cast<uint16_t>((u & 15) << (4 * t));
              crumbs |= static_cast<uint8_t>(((u >> 4) & 3) << (2 * t));
            }
            std::memcpy(block + 2 * (at.word + p), &word, 2);
            block[64 + at.word + p] = crumbs;
          }
        }
      }
  });
  TORCH_CHECK(in_range.load(), "repack_q6: codes must lie in [-32, 31]");
  return out;
}

#if RADIXSERVE_Q6_BF16
// One tile of G groups of S codes (compile-time: a full tile's loads are whole, its addresses
// constant offsets) of R weight rows from j against M bf16 activation rows, into acc.
template <int M, int R, int S, int G>
inline void tile_rows(const uint8_t* w, const float* scale, int64_t k, int64_t j, int64_t group0, const uint16_t* x,
                      __m512 (&acc)[R][M]) {
  const int64_t groups = k / S;
  const __m512i nibble = _mm512_set1_epi16(0x000F), crumb = _mm512_set1_epi16(0x0030),
                base = _mm512_set1_epi16(0x4300);
  // a small tile's unused words load as 0 (code 128), against activations loaded as 0
  constexpr __mmask32 words_in = G == kTileGroups ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << (2 * G)) - 1);
  const Tile tile{group0, G};
  __m512 tacc[R][M];
  RADIXSERVE_Q6_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_Q6_UNROLL
    for (int m = 0; m < M; ++m) tacc[r][m] = _mm512_setzero_ps();
  RADIXSERVE_Q6_UNROLL
  for (int v = 0; v < S / 8; ++v) {
    const RegisterAt at = register_of(tile, S, v);
    __m512i words[R], crumbs[R];
    RADIXSERVE_Q6_UNROLL
    for (int r = 0; r < R; ++r) {
      const uint8_t* block = block_at(w, k, j + r, at.block);
      if constexpr (G == kTileGroups) {
        words[r] = _mm512_loadu_si512(block);
        crumbs[r] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64)));
      } else {
        words[r] = _mm512_maskz_loadu_epi16(words_in, block + 2 * at.word);
        crumbs[r] = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(words_in, block + 64 + at.word));
      }
    }
    RADIXSERVE_Q6_UNROLL
    for (int t = 0; t < 4; ++t) {
      const int64_t xat = group0 * S + (4 * v + t) * 2 * G;
      __m512bh xs[M];
      RADIXSERVE_Q6_UNROLL
      for (int m = 0; m < M; ++m) {
        if constexpr (G == kTileGroups)
          xs[m] = (__m512bh)_mm512_loadu_si512(x + m * k + xat);
        else
          xs[m] = (__m512bh)_mm512_maskz_loadu_epi16(words_in, x + m * k + xat);
      }
      RADIXSERVE_Q6_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512i low = _mm512_ternarylogic_epi32(_mm512_srli_epi16(words[r], 4 * t), nibble, base, 0xEA);
        const __m512i high = t < 2 ? _mm512_slli_epi16(crumbs[r], 4 - 2 * t) : _mm512_srli_epi16(crumbs[r], 2 * t - 4);
        const __m512bh codes = (__m512bh)_mm512_ternarylogic_epi32(high, crumb, low, 0xEA);  // (high & 0x30) | low
        RADIXSERVE_Q6_UNROLL
        for (int m = 0; m < M; ++m) tacc[r][m] = _mm512_dpbf16_ps(tacc[r][m], codes, xs[m]);
      }
    }
  }
  RADIXSERVE_Q6_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m512 sv = _mm512_maskz_loadu_ps(__mmask16((1u << G) - 1), scale + r * groups + group0);
    RADIXSERVE_Q6_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_fmadd_ps(tacc[r][m], sv, acc[r][m]);
  }
}

// R weight rows from j against M bf16 activation rows; out[m * n + j + r] in O.
template <int M, int R, int S, bool Prefetch, typename O>
void dot_rows(const uint8_t* w, const float* scale, const float (&rest)[R][M], int64_t n, int64_t k, int64_t j,
              const uint16_t* x, O* out) {
  const int64_t groups = k / S, full = groups / kTileGroups;
  __m512 acc[R][M];
  RADIXSERVE_Q6_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_Q6_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t ti = 0; ti < full; ++ti) {
    // the tile's S / 8 blocks of R rows
    if constexpr (Prefetch)
      radixserve::prefetch_ahead<R * (S / 8) * kBlockBytes / 64>(block_at(w, k, j, ti * kTileGroups * S / kBlock));
    tile_rows<M, R, S, kTileGroups>(w, scale, k, j, ti * kTileGroups, x, acc);
  }
  for (int64_t g = full * kTileGroups; g < groups; g += kBlock / S)
    tile_rows<M, R, S, kBlock / S>(w, scale, k, j, g, x, acc);
  RADIXSERVE_Q6_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_Q6_UNROLL
    for (int m = 0; m < M; ++m)
      out[m * n + j + r] = static_cast<O>(_mm512_reduce_add_ps(acc[r][m]) + rest[r][m]);
}
#endif

// x [rows, K] bf16 @ (scales * codes).T -> [rows, N] bf16.
at::Tensor q6_gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t group,
                   const std::optional<at::Tensor>& scale_steps) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16,
              "q6_gemv: x is a CPU [rows, K] bfloat16 tensor");
  TORCH_CHECK(x.size(1) % kBlock == 0, "q6_gemv: K is a multiple of 128");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && w.size(1) * 4 == x.size(1) * 3 &&
                  w.size(0) % kQuad == 0,
              "q6_gemv: codes are contiguous uint8 [N, K * 3 / 4] with K = x's width and N a multiple of 4");
  TORCH_CHECK(group == 16 || group == 32, "q6_gemv: group is 16 or 32");
  TORCH_CHECK(x.size(0) <= kMaxRows, "q6_gemv: at most 8 rows a call");
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0), groups = k / group;
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, groups, "q6_gemv");
  at::Tensor out = at::empty({rows, n}, x.options());
#if RADIXSERVE_Q6_BF16
  // The activations as contiguous bf16 bits, and each group's sum (float32), once per call.
  std::vector<uint16_t> xb(rows * k);
  std::vector<float> sums(rows * groups, 0.f);
  const c10::BFloat16* xs = x.data_ptr<c10::BFloat16>();
  if (x.stride(1) == 1) {  // the decode step's case, with vectors: the scalar loops below took tens of
    // microseconds a call on wide rows
    for (int64_t m = 0; m < rows; ++m) {
      const c10::BFloat16* row = xs + m * x.stride(0);
      for (int64_t run = 0; run < k; run += 32) {
        const __m512i halves = _mm512_loadu_si512(row + run);
        const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(halves, 16));  // bf16 is float32's top half
        const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(halves, _mm512_set1_epi32(int(0xFFFF0000u))));
        if (group == 32) {
          sums[m * groups + run / 32] = _mm512_reduce_add_ps(_mm512_add_ps(even, odd));
        } else {  // 32-bit lanes 0-7 hold the first 16 codes' pairs
          const __m512 pairs = _mm512_add_ps(even, odd);
          sums[m * groups + run / 16] = _mm512_mask_reduce_add_ps(0x00FF, pairs);
          sums[m * groups + run / 16 + 1] = _mm512_mask_reduce_add_ps(0xFF00, pairs);
        }
      }
      // the tiles' order moves pairs of activations (32 bits) whole: pair i of a tile's group l
      // goes to slot i * G + l
      const uint32_t* pairs = reinterpret_cast<const uint32_t*>(row);
      uint32_t* into = reinterpret_cast<uint32_t*>(xb.data() + m * k);
      for (int64_t ti = 0, tiles = tile_count(groups, group); ti < tiles; ++ti) {
        const Tile tile = tile_of(groups, group, ti);
        const int64_t at = tile.group0 * group / 2;
        for (int64_t i = 0; i < group / 2; ++i)
          for (int64_t l = 0; l < tile.groups; ++l) into[at + i * tile.groups + l] = pairs[at + l * group / 2 + i];
      }
    }
  } else {
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t i = 0; i < k; ++i) {
        const c10::BFloat16 v = xs[m * x.stride(0) + i * x.stride(1)];
        sums[m * groups + i / group] += static_cast<float>(v);
        xb[m * k + activation_at(groups, group, i / group, static_cast<int>(i % group))] = v.x;
      }
  }
  const uint8_t* wp = w.data_ptr<uint8_t>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const bool prefetch = radixserve::activations_spill(rows * k * 2);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 13) / k);  // quads
  at::parallel_for(0, n / kQuad, grain, [&](int64_t quad_begin, int64_t quad_end) {
    const int64_t begin = quad_begin * kQuad, end = quad_end * kQuad;
    radixserve::with_row_count(rows, [&](auto count) {
      constexpr int M = decltype(count)::value;
      // the tile's and the row's accumulators of every (weight row, activation row) pair, and each
      // weight row's unpacked registers, within the 32 vector registers
      constexpr int R = M == 1 ? 4 : M <= 3 ? 2 : 1;
      std::vector<float> scale(R * groups);
      const auto run = [&](auto rows_now, int64_t j) {
        constexpr int RN = decltype(rows_now)::value;
        sg.expand(j, RN, scale.data());
        float rest[RN][M];
        for (int r = 0; r < RN; ++r)
          for (int m = 0; m < M; ++m) {
            const float* sr = scale.data() + r * groups;
            const float* xm = sums.data() + m * groups;
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int64_t g = 0; g < groups; ++g) sum += sr[g] * xm[g];
            rest[r][m] = -kOffset * sum;
          }
        // a compile-time group (no division in the loop) and prefetching (the loop without it unchanged)
        const auto dot = [&](auto group_now) {
          constexpr int G = decltype(group_now)::value;
          if (prefetch)
            dot_rows<M, RN, G, true>(wp, scale.data(), rest, n, k, j, xb.data(), op);
          else
            dot_rows<M, RN, G, false>(wp, scale.data(), rest, n, k, j, xb.data(), op);
        };
        if (group == 16)
          dot(std::integral_constant<int, 16>{});
        else
          dot(std::integral_constant<int, 32>{});
      };
      for (int64_t j = begin; j < end; j += R) run(std::integral_constant<int, R>{}, j);  // R divides a quad
    });
  });
#else
  TORCH_CHECK(false, "q6_gemv: this build has no bf16 dot products (q6_gemv_fast() is false)");
#endif
  return out;
}

// packed [N, K * 3 / 4] (whole quads), scales [N, K / group] -> [N, K] in `dtype`, each weight scale * code
// rounded once (bitwise the float32 dequantization, cast).
at::Tensor dequant_q6_rows(const at::Tensor& w, const at::Tensor& scales, int64_t group, at::ScalarType dtype,
                           const std::optional<at::Tensor>& scale_steps) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && (w.size(1) * 4) % (3 * kBlock) == 0 &&
                  w.size(0) % kQuad == 0,
              "dequant_q6_rows: codes are contiguous uint8 [N, K * 3 / 4], N a multiple of 4 (whole quads), K of 128");
  TORCH_CHECK(group == 16 || group == 32, "dequant_q6_rows: group is 16 or 32");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dequant_q6_rows: float32 or bfloat16 out");
  const int64_t n = w.size(0), k = w.size(1) * 4 / 3, groups = k / group;
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, groups, "dequant_q6_rows");
  at::Tensor out = at::empty({n, k}, w.options().dtype(dtype));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "dequant_q6_rows", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n / kQuad, std::max<int64_t>(1, (int64_t{1} << 14) / k), [&](int64_t quad_begin, int64_t quad_end) {
      const int64_t begin = quad_begin * kQuad, end = quad_end * kQuad;
      std::vector<float> scale(groups), v(k);
      for (int64_t row = begin; row < end; ++row) {
        sg.expand(row, 1, scale.data());
        for (int64_t ti = 0, tiles = tile_count(groups, group); ti < tiles; ++ti) {
          const Tile tile = tile_of(groups, group, ti);
          for (int r = 0; r < group / 8; ++r) {
            const RegisterAt at = register_of(tile, group, r);
            const uint8_t* block = block_at(wp, k, row, at.block);
            for (int64_t p = 0; p < 2 * tile.groups; ++p) {
              const int64_t word_at = at.word + p;
              const uint16_t word = static_cast<uint16_t>(block[2 * word_at] | (block[2 * word_at + 1] << 8));
              const uint8_t crumbs = block[64 + word_at];
              const int64_t g = tile.group0 + p / 2;
              float* into = v.data() + g * group + 8 * r + p % 2;  // code 2(4r + t) + p % 2
              for (int t = 0; t < 4; ++t) {
                const int u = ((word >> (4 * t)) & 15) | (((crumbs >> (2 * t)) & 3) << 4);
                into[2 * t] = scale[g] * static_cast<float>(u - 32);
              }
            }
          }
        }
        radixserve::store(v.data(), k, op + row * k);
      }
    });
  });
  return out;
}

// Whether q6_gemv runs on this build (AVX-512 with bf16 dot products).
bool q6_gemv_fast() { return RADIXSERVE_Q6_BF16 != 0; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("repack_q6(Tensor codes, int group=16) -> Tensor", repack_q6);
  m.def("q6_gemv(Tensor x, Tensor w, Tensor scales, int group, Tensor? scale_steps=None) -> Tensor", q6_gemv);
  m.def("dequant_q6_rows(Tensor w, Tensor scales, int group, ScalarType dtype, Tensor? scale_steps=None) -> Tensor",
        dequant_q6_rows);
  m.def("q6_gemv_fast() -> bool", q6_gemv_fast);
}
