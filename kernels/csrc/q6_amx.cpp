// Products of a few bf16 activation rows (a batch of decode streams: TILE_FROM = 9 to 16 rows) with 6-bit group
// codes in q6_blocks.h's layout (a GGUF's Q6_K, Q5_0), in AMX's tile unit (tile_unit.h: why, and
// the loop). A Q4_K_M file keeps its output layer and half its down projections in Q6_K: a third of
// the 1.5B's weights.
//
// A chunk is a run of 32 codes of a block (128 codes in 96 bytes): its 16-bit lane j, unpacked as
// q6_gemv.cpp unpacks it (the bf16 number 128 + u, u = c + 32), holds the run's code code_at(j);
// split into float32 lanes (even j, odd j), times the group's scale minus 160 scales, and packed to
// bf16 by cvtne2ps_pbh: the even lanes' codes, then the odd ones'. A tile of K is four blocks.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>

#include "group_scales.h"
#include "q6_blocks.h"
#include "tile_unit.h"

namespace {

using namespace radixserve::q6;  // the layout: kBlock, kBlockBytes, kQuad, block_at, code_at
using radixserve::tiles::KTile;
using radixserve::tiles::kBlockRows;
using radixserve::tiles::kChunk;

constexpr int64_t kTileBlocks = 4;  // blocks a tile of K (16 chunks)

#if RADIXSERVE_TILE_UNIT
struct Q6Format {
  const uint8_t* w;
  int64_t k, group;
  radixserve::GroupScales scales;

  int64_t tiles() const { return (k + kTileBlocks * kBlock - 1) / (kTileBlocks * kBlock); }
  KTile tile(int64_t ti) const {
    const int64_t k0 = ti * kTileBlocks * kBlock;
    return {k0, std::min(kTileBlocks * kBlock, k - k0) / kChunk};
  }
  // Element e of chunk i (block i / 4, run i % 4): lane e's code (e < 16: 16-bit lane 2e), else
  // lane e - 16's odd one (16-bit lane 2(e - 16) + 1).
  int64_t k_of(int64_t ti, int64_t i, int e) const {
    const int lane = e < 16 ? 2 * e : 2 * (e - 16) + 1;
    return ti * kTileBlocks * kBlock + i * kChunk + code_at(lane);
  }
  void prefetch(int64_t j, int64_t rows, int64_t ti) const {
    const int64_t blocks = tile(ti).chunks / 4;
    radixserve::tiles::prefetch_quads(rows, kQuad * kBlockBytes * blocks,
                                      [&](int64_t r) { return block_at(w, k, j + r, ti * kTileBlocks); });
  }
  void dequantize(int64_t j, int64_t rows, int64_t ti, uint16_t* a) const {
    const int64_t blocks = tile(ti).chunks / 4, g0 = ti * kTileBlocks * kBlock / group;
    const __m512i nibble = _mm512_set1_epi16(0x000F), crumb = _mm512_set1_epi16(0x0030),
                  base = _mm512_set1_epi16(0x4300), high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    alignas(64) float s[kTileBlocks * kBlock / 16];
    for (int64_t r = 0; r < rows; ++r) {
      scales.expand_part(j + r, g0, blocks * kBlock / group, s);
      for (int64_t bi = 0; bi < blocks; ++bi) {
        const uint8_t* block = block_at(w, k, j + r, ti * kTileBlocks + bi);
        const __m512i words = _mm512_loadu_si512(block);
        const __m512i crumbs = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64)));
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const __m512i low = _mm512_ternarylogic_epi32(_mm512_srli_epi16(words, 4 * t), nibble, base, 0xEA);
          const __m512i high = t < 2 ? _mm512_slli_epi16(crumbs, 4 - 2 * t) : _mm512_srli_epi16(crumbs, 2 * t - 4);
          const __m512i codes = _mm512_ternarylogic_epi32(high, crumb, low, 0xEA);  // bf16 128 + u
          // lane q of either half: the run's code at 16 (q % 2) + 2 (q / 2) (+ 1), of group q % 2 at 16
          const float* sc = s + (bi * kBlock + t * kChunk) / group;
          const __m512 sv = group == 16 ? _mm512_broadcast_f32x2(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sc))))
                                        : _mm512_set1_ps(sc[0]);
          const __m512 lv = _mm512_mul_ps(_mm512_set1_ps(-160.f), sv);  // scale (128 + u) - 160 scale
          const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(codes, 16));
          const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(codes, high_half));
          const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_fmadd_ps(odd, sv, lv), _mm512_fmadd_ps(even, sv, lv));
          _mm512_storeu_si512(a + ((4 * bi + t) * kBlockRows + r) * kChunk, reinterpret_cast<const __m512i&>(both));
        }
      }
    }
  }
};
#endif

// x [M, K] bf16 (1 <= M <= 16) @ (scales * c).T -> [M, N] bf16, the weights rounded to bf16;
// w, scales, group, scale_steps as q6_gemv takes them.
at::Tensor q6_amx(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t group,
                  const std::optional<at::Tensor>& scale_steps) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1 &&
                  x.size(0) >= 1 && x.size(0) <= kBlockRows,
              "q6_amx: x is a CPU [rows, K] bfloat16 tensor of 1 to 16 rows, each contiguous");
  TORCH_CHECK(group == 16 || group == 32, "q6_amx: groups of 16 or 32 codes");
  TORCH_CHECK(x.size(1) % kBlock == 0, "q6_amx: K is a multiple of 128");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte &&
                  w.size(1) == x.size(1) / kBlock * kBlockBytes && w.size(0) % kQuad == 0,
              "q6_amx: codes are contiguous uint8 [N, K * 3 / 4] with K = x's width and N a multiple of 4");
#if RADIXSERVE_TILE_UNIT
  TORCH_CHECK(radixserve::tiles::permitted(), "q6_amx: the kernel refused the tile registers (arch_prctl)");
  const int64_t k = x.size(1), n = w.size(0);
  const Q6Format f{w.data_ptr<uint8_t>(), k, group, radixserve::GroupScales::of(scales, scale_steps, n, k / group, "q6_amx")};
  return radixserve::tiles::products(x, n, f);
#else
  (void)scales, (void)scale_steps;
  TORCH_CHECK(false, "q6_amx: this build has no AMX (int4_amx_fast() is false)");
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("q6_amx(Tensor x, Tensor w, Tensor scales, int group, Tensor? scale_steps=None) -> Tensor", q6_amx);
}
