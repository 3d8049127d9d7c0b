// Products of a few bf16 activation rows (a batch of decode streams: 2 to 16) with 4-bit group
// weights in int4_blocks.h's layout, on CPUs with AMX (Sapphire Rapids and later).
//
// Why: the exact loops (int4_gemv.cpp) cost a bf16 dot product per 32 weights per activation row,
// so a 16-row product took about six one-row ones (one 17920 x 1536 layer, 2 threads: 7.6 ms
// against 1.0), and the dequantized slices of the wide path no less. Here each weight is
// dequantized once per call, whatever the rows, into bf16 (scale * q + low rounded once, as the
// wide path's slices are), and the tile unit multiplies a 16-row block of those against all the
// activation rows at once: the call costs about what decoding the codes costs, one pass.
//
// The tile product C[16 weight rows, M] += A[16, 32] . B[32, M] sums pairs: B's row p holds, for
// each activation row, the two activations that A's elements 2p and 2p + 1 multiply. A row of A is
// one "chunk" of a weight row: register v of a tile (int4_blocks.h) shifted right by 4t and masked
// gives, in 32-bit lane p, the two codes (2i, 2i + 1), i = 4v + t, of the tile's group p (a small
// tile: of group p % 4, i = 4 (p / 4) + t), so a chunk's 32 weights are 16 activation pairs that
// lie side by side in x: B is x's 32-bit pairs gathered once per call. The chunks of a row cover
// its K codes once, so summing all of them is the row's whole product.
//
// Numerics: bf16 weights times bf16 activations, float32 sums (the wide path's: not the exact
// loops', whose bf16 products of the codes themselves are scaled per group in float32). A row's
// result does not depend on the other rows of the call.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "group_scales.h"
#include "int4_blocks.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define RADIXSERVE_INT4_AMX 1
#else
#define RADIXSERVE_INT4_AMX 0
#endif

namespace {

using namespace radixserve::int4;

constexpr int64_t kAmxRows = 16;   // weight rows a tile product takes (and activation rows, at most)
constexpr int64_t kChunk = 32;     // weights a chunk (a row of A)

#if RADIXSERVE_INT4_AMX
// Linux hands a process the tile registers' state only when asked (arch_prctl), once.
bool tiles_permitted() {
  static const bool permitted = [] {
    constexpr int kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return permitted;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0: C, a block's sums (16 weight rows x M float32); tmm1-2: A (16 x 32 bf16), tmm3-4: B (16
// pairs x M), two each, so that loading the next does not wait for the product reading the last.
void configure(int64_t m) {
  TileConfig config;
  config.rows[0] = kAmxRows, config.colsb[0] = static_cast<uint16_t>(4 * m);
  for (int t = 1; t < 3; ++t) config.rows[t] = kAmxRows, config.colsb[t] = 64;
  for (int t = 3; t < 5; ++t) config.rows[t] = kChunk / 2, config.colsb[t] = static_cast<uint16_t>(4 * m);
  _tile_loadconfig(&config);
}

// A chunk's tile product into C, from A at `a` and B at `b` loaded into tiles A and B (the tile
// intrinsics take register numbers as literals).
#define RADIXSERVE_CHUNK_PRODUCT(A, B, a, b, m) \
  do {                                         \
    _tile_loadd(A, a, 64);                     \
    _tile_loadd(B, b, 4 * (m));                \
    _tile_dpbf16ps(0, A, B);                   \
  } while (0)

// Where the activation pair that lane p of a tile's chunk i multiplies lies in a row of x, counted
// in pairs (the chunk order: a full tile's 16 chunks i = 4v + t, a small tile's 4, t).
inline int64_t pair_of(const Tile& tile, int64_t i, int64_t p) {
  if (tile.groups == kTileGroups) return (tile.group0 + p) * (kGroup / 2) + i;
  return (tile.group0 + p % 4) * (kGroup / 2) + 4 * (p / 4) + i;
}

// B for every chunk of a row, in the rows' order: [K / 32 chunks][16][m] pairs of bf16. A chunk's
// row of A holds its 16 lanes' even codes, then their odd ones (cvtne2ps_pbh's order), so B's row
// p pairs the activations of A's elements 2p and 2p + 1: lanes 2p and 2p + 1's even codes for p < 8,
// their odd codes past.
std::vector<uint16_t> pairs_of(const at::Tensor& x, int64_t groups) {
  const int64_t m = x.size(0), k = x.size(1);
  std::vector<uint16_t> b(k * m);
  const int64_t tiles = tile_count(groups);
  at::parallel_for(0, tiles, 1, [&](int64_t first, int64_t last) {
    for (int64_t ti = first; ti < last; ++ti) {
      const Tile tile = tile_of(groups, ti);
      const int64_t c0 = tile.group0 * kGroup / kChunk, chunks = tile.groups * kGroup / kChunk;
      for (int64_t r = 0; r < m; ++r) {
        const uint16_t* row = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>() + r * x.stride(0));
        for (int64_t i = 0; i < chunks; ++i)
          for (int64_t e = 0; e < kChunk; ++e) {
            const int64_t lane = e % 16, odd = e / 16;
            b[(((c0 + i) * (kChunk / 2) + e / 2) * m + r) * 2 + e % 2] = row[2 * pair_of(tile, i, lane) + odd];
          }
      }
    }
  });
  return b;
}

// A tile's scales (or lows) of weight row `row` as the lanes of its chunks take them: a full tile's
// 16 groups, a lane each; a small tile's 4, lane p group p % 4. The numbers GroupScales::expand gives.
inline __m512 tile_scales(const radixserve::GroupScales& g, int64_t row, const Tile& tile) {
  const int64_t at = row * g.groups + tile.group0;
  if (tile.groups == kTileGroups) {
    if (g.type == at::kFloat) return _mm512_loadu_ps(static_cast<const float*>(g.values) + at);
    if (g.type == at::kHalf)
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const c10::Half*>(g.values) + at)));
    const __m512 codes = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(g.values) + at))));
    const float* step = g.steps + at / g.span;  // spans never cross rows
    if (g.span % kTileGroups == 0) return _mm512_mul_ps(_mm512_set1_ps(step[0]), codes);
    if (g.span == 8)
      return _mm512_mul_ps(_mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(step[0])), _mm256_set1_ps(step[1]), 1), codes);
  }
  alignas(16) float four[kSmallGroups * 4];
  g.expand_part(row, tile.group0, tile.groups, four);
  return tile.groups == kTileGroups ? _mm512_loadu_ps(four) : _mm512_broadcast_f32x4(_mm_load_ps(four));
}

// The codes of a tile of weight rows j.. (`rows`, a multiple of 4) asked for into the first-level cache: the
// loop visits a block's tile (four runs of 1 KB, a quad's each) and then the next block's, whose
// runs lie K / 2 * 16 bytes on, a stride the hardware's prefetchers do not follow.
inline void prefetch_tile(const uint8_t* w, int64_t k, int64_t j, int64_t rows, const Tile& tile) {
  const int64_t bytes = kQuad * 64 * (tile.groups / 4);
  for (int64_t q = 0; q < rows / kQuad; ++q) {
    const char* at = reinterpret_cast<const char*>(block_at(w, k, j + q * kQuad, tile.group0 / 4));
    for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(at + line, _MM_HINT_T0);
  }
}

// The chunks of one tile of weight rows j.. (`rows` of them, at most 16) into a[chunk][row][32]
// bf16: each weight dequantized once, scale * q + low rounded to bf16.
inline void dequantize_tile(const uint8_t* w, int64_t k, int64_t j, int64_t rows, const Tile& tile,
                            const radixserve::GroupScales& scales, const radixserve::GroupScales& lows, uint16_t* a) {
  const __m512i nibble = _mm512_set1_epi32(0x000F0000), base = _mm512_set1_epi32(0x43000000);
  const bool full = tile.groups == kTileGroups;
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 sv = tile_scales(scales, j + r, tile);
    // codes come as 128 + q (int4_gemv.cpp's float trick): scale (128 + q) + (low - 128 scale)
    const __m512 lv = _mm512_fnmadd_ps(_mm512_set1_ps(128.f), sv, tile_scales(lows, j + r, tile));
    for (int v = 0; v < (full ? 4 : 1); ++v) {
      const __m512i words = _mm512_loadu_si512(block_at(w, k, j + r, tile.group0 / 4 + v));
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const __m512 even = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_slli_epi32(words, 16 - 4 * t), nibble, base, 0xEA));
        const __m512 odd = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_srli_epi32(words, 4 * t), nibble, base, 0xEA));
        const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_fmadd_ps(odd, sv, lv), _mm512_fmadd_ps(even, sv, lv));
        _mm512_storeu_si512(a + ((4 * v + t) * kAmxRows + r) * kChunk, reinterpret_cast<const __m512i&>(both));
      }
    }
  }
}
#endif

// x [M, K] bf16 (1 <= M <= 16) @ (scales * q + lows).T -> [M, N] bf16, the weights rounded to bf16.
at::Tensor int4_amx(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const at::Tensor& lows,
                    const std::optional<at::Tensor>& scale_steps, const std::optional<at::Tensor>& low_steps) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1 &&
                  x.size(0) >= 1 && x.size(0) <= kAmxRows,
              "int4_amx: x is a CPU [rows, K] bfloat16 tensor of 1 to 16 rows, each contiguous");
  TORCH_CHECK(x.size(1) % kBlock == 0, "int4_amx: K is a multiple of 128");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && w.size(1) * 2 == x.size(1) &&
                  w.size(0) % kQuad == 0,
              "int4_amx: codes are contiguous uint8 [N, K / 2] with K = x's width and N a multiple of 4");
#if RADIXSERVE_INT4_AMX
  TORCH_CHECK(tiles_permitted(), "int4_amx: the kernel refused the tile registers (arch_prctl)");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0), groups = k / kGroup;
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, groups, "int4_amx");
  const auto lg = radixserve::GroupScales::of(lows, low_steps, n, groups, "int4_amx lows");
  const std::vector<uint16_t> b = pairs_of(x, groups);
  at::Tensor out = at::empty({m, n}, x.options());
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t blocks = (n + kAmxRows - 1) / kAmxRows;
  // Tile by tile of K, and in each every block of 16 weight rows of this thread's share: a tile's B
  // (16 KB at 16 rows) stays in the first-level cache while its blocks read it. Block by block,
  // each block read all of B, from the second level past 48 KB (K = 1536), and the tile unit waited
  // on it: 20 ns a product against 8.7 from the first level.
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    configure(m);
    std::vector<uint16_t> a(kTileGroups * kAmxRows * kChunk, 0);  // a tile's chunks (rows past N: sums never read)
    std::vector<float> c((last - first) * kAmxRows * m);          // the blocks' sums between tiles
    for (int64_t ti = 0, tiles = tile_count(groups); ti < tiles; ++ti) {
      const Tile tile = tile_of(groups, ti);
      const int64_t c0 = tile.group0 * kGroup / kChunk, chunks = tile.groups * kGroup / kChunk;
      for (int64_t blk = first; blk < last; ++blk) {
        const int64_t j = blk * kAmxRows, rows = std::min(kAmxRows, n - j);
        float* sums = c.data() + (blk - first) * kAmxRows * m;
        if (blk + 1 < last) prefetch_tile(wp, k, j + kAmxRows, std::min(kAmxRows, n - j - kAmxRows), tile);
        dequantize_tile(wp, k, j, rows, tile, sg, lg, a.data());
        if (ti == 0) {
          _tile_zero(0);
        } else {
          _tile_loadd(0, sums, 4 * m);
        }
        for (int64_t i = 0; i < chunks; i += 2) {
          const uint16_t* ai = a.data() + i * kAmxRows * kChunk;
          const uint16_t* bi = b.data() + (c0 + i) * kChunk * m;
          RADIXSERVE_CHUNK_PRODUCT(1, 3, ai, bi, m);
          RADIXSERVE_CHUNK_PRODUCT(2, 4, ai + kAmxRows * kChunk, bi + kChunk * m, m);
        }
        _tile_stored(0, sums, 4 * m);
      }
    }
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t j = blk * kAmxRows, rows = std::min(kAmxRows, n - j);
      const float* sums = c.data() + (blk - first) * kAmxRows * m;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < m; ++i) op[i * n + j + r] = static_cast<at::BFloat16>(sums[r * m + i]);
    }
    _tile_release();
  });
  return out;
#else
  (void)scales, (void)lows, (void)scale_steps, (void)low_steps;
  TORCH_CHECK(false, "int4_amx: this build has no AMX (int4_amx_fast() is false)");
#endif
}

// Whether int4_amx runs here: built with AMX and the tile registers granted.
bool int4_amx_fast() {
#if RADIXSERVE_INT4_AMX
  return tiles_permitted();
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("int4_amx(Tensor x, Tensor w, Tensor scales, Tensor lows, Tensor? scale_steps=None, Tensor? low_steps=None) -> Tensor",
        int4_amx);
  m.def("int4_amx_fast() -> bool", int4_amx_fast);
}
