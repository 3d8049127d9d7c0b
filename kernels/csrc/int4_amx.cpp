// Products of a few bf16 activation rows (a batch of decode streams: TILE_FROM = 9 to 16 rows) with 4-bit group
// weights in int4_blocks.h's layout, in AMX's tile unit (tile_unit.h: why, and the loop).
//
// A chunk: register v of a tile (int4_blocks.h) shifted right by 4t and masked gives, in 32-bit
// lane p, the two codes (2i, 2i + 1), i = 4v + t, of the tile's group p (a small tile's: of group
// p % 4, i = 4 (p / 4) + t). Moved into float32 with int4_gemv.cpp's trick (128 + q), times the
// group's scale plus its low, and packed to bf16 by cvtne2ps_pbh: the 16 lanes' even codes, then
// their odd ones. So the layout serves as it is, with no repack.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>

#include "group_scales.h"
#include "int4_blocks.h"
#include "tile_unit.h"

namespace {

using namespace radixserve::int4;
using radixserve::tiles::KTile;
using radixserve::tiles::kBlockRows;
using radixserve::tiles::kChunk;

#if RADIXSERVE_TILE_UNIT
// A tile's scales (or lows) of weight row `row` as its chunks' lanes take them: a full tile's 16
// groups, a lane each; a small tile's 4, lane p group p % 4. The numbers GroupScales::expand gives.
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
  alignas(16) float values[kTileGroups];
  g.expand_part(row, tile.group0, tile.groups, values);
  return tile.groups == kTileGroups ? _mm512_loadu_ps(values) : _mm512_broadcast_f32x4(_mm_load_ps(values));
}

// The int4 layout as tile_unit.h's products read it: its tiles are K's tiles (16 chunks a full
// tile, 4 a small one; chunk i = 4v + t).
struct Int4Format {
  const uint8_t* w;
  int64_t k, groups;
  radixserve::GroupScales scales, lows;

  int64_t tiles() const { return tile_count(groups); }
  KTile tile(int64_t ti) const {
    const Tile t = tile_of(groups, ti);
    return {t.group0 * kGroup, t.groups * kGroup / kChunk};
  }
  // Element e of chunk i: lane e % 16's even code (e < 16) or odd one.
  int64_t k_of(int64_t ti, int64_t i, int e) const {
    const Tile t = tile_of(groups, ti);
    const int64_t p = e % 16;
    const int64_t pair = t.groups == kTileGroups ? (t.group0 + p) * (kGroup / 2) + i
                                                 : (t.group0 + p % 4) * (kGroup / 2) + 4 * (p / 4) + i;
    return 2 * pair + e / 16;
  }
  void prefetch(int64_t j, int64_t rows, int64_t ti) const {
    const Tile t = tile_of(groups, ti);
    radixserve::tiles::prefetch_quads(rows, kQuad * 64 * (t.groups / 4),
                                      [&](int64_t r) { return block_at(w, k, j + r, t.group0 / 4); });
  }
  void dequantize(int64_t j, int64_t rows, int64_t ti, uint16_t* a) const {
    const Tile tile = tile_of(groups, ti);
    const __m512i nibble = _mm512_set1_epi32(0x000F0000), base = _mm512_set1_epi32(0x43000000);
    const bool full = tile.groups == kTileGroups;
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 sv = tile_scales(scales, j + r, tile);
      // codes come as 128 + q: scale (128 + q) + (low - 128 scale)
      const __m512 lv = _mm512_fnmadd_ps(_mm512_set1_ps(128.f), sv, tile_scales(lows, j + r, tile));
      for (int v = 0; v < (full ? 4 : 1); ++v) {
        const __m512i words = _mm512_loadu_si512(block_at(w, k, j + r, tile.group0 / 4 + v));
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const __m512 even = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_slli_epi32(words, 16 - 4 * t), nibble, base, 0xEA));
          const __m512 odd = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_srli_epi32(words, 4 * t), nibble, base, 0xEA));
          const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_fmadd_ps(odd, sv, lv), _mm512_fmadd_ps(even, sv, lv));
          _mm512_storeu_si512(a + ((4 * v + t) * kBlockRows + r) * kChunk, reinterpret_cast<const __m512i&>(both));
        }
      }
    }
  }
};
#endif

// x [M, K] bf16 (1 <= M <= 16) @ (scales * q + lows).T -> [M, N] bf16, the weights rounded to bf16.
at::Tensor int4_amx(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const at::Tensor& lows,
                    const std::optional<at::Tensor>& scale_steps, const std::optional<at::Tensor>& low_steps) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1 &&
                  x.size(0) >= 1 && x.size(0) <= kBlockRows,
              "int4_amx: x is a CPU [rows, K] bfloat16 tensor of 1 to 16 rows, each contiguous");
  TORCH_CHECK(x.size(1) % kBlock == 0, "int4_amx: K is a multiple of 128");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && w.size(1) * 2 == x.size(1) &&
                  w.size(0) % kQuad == 0,
              "int4_amx: codes are contiguous uint8 [N, K / 2] with K = x's width and N a multiple of 4");
#if RADIXSERVE_TILE_UNIT
  TORCH_CHECK(radixserve::tiles::permitted(), "int4_amx: the kernel refused the tile registers (arch_prctl)");
  const int64_t k = x.size(1), n = w.size(0), groups = k / kGroup;
  const Int4Format f{w.data_ptr<uint8_t>(), k, groups,
                     radixserve::GroupScales::of(scales, scale_steps, n, groups, "int4_amx"),
                     radixserve::GroupScales::of(lows, low_steps, n, groups, "int4_amx lows")};
  return radixserve::tiles::products(x, n, f);
#else
  (void)scales, (void)lows, (void)scale_steps, (void)low_steps;
  TORCH_CHECK(false, "int4_amx: this build has no AMX (int4_amx_fast() is false)");
#endif
}

// Whether int4_amx (and q6_amx) run here: built with AMX and the tile registers granted.
bool int4_amx_fast() {
#if RADIXSERVE_TILE_UNIT
  return radixserve::tiles::permitted();
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
