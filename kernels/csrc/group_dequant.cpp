// Dequantizing rows of a GGUF's weights as shipped into the activations' dtype, for the wide
// products (prefill) that runtime/cpu/block_linear.py computes a slice of rows at a time with
// torch's GEMM. One pass: read the codes and scales, write the weights; torch ops took five
// (widen, multiply, add, narrow, each a tensor written and read back), which cost more than
// the GEMM on the default model's output layer.
//
// Two layouts, those of the few-row kernels that read the same weights (no second copy):
// - int8 groups (group_gemv.cpp): codes int8 [N, K], scales [N, K / group] in one of
//   group_scales.h's forms; w = scale * code.
// - int4 blocks (int4_gemv.cpp): [N, K / 2] uint8 in int4_blocks.h's tiles, rows in quads;
//   scales and lows [N, K / 32] in one of group_scales.h's forms; w = scale * q + low.
// Every weight is computed in float32 and rounded once to the output dtype, as a float32
// dequantization followed by a cast would be.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "group_scales.h"
#include "int4_blocks.h"
#include "weight_store.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

template <typename O>
void int8_rows(const int8_t* codes, const radixserve::GroupScales& scales, int64_t k, int64_t group, int64_t begin,
               int64_t end, O* out) {
  const int64_t groups = k / group;
  std::vector<float> row_scales(groups);
  for (int64_t n = begin; n < end; ++n) {
    const int8_t* c = codes + n * k;
    O* o = out + n * k;
    scales.expand(n, 1, row_scales.data());
#if defined(__AVX512F__)
    // 16 weights a vector (a group is 16 or 32): the scalar loop ran at ~2 cycles a weight, more
    // than the GEMM that follows at 16 rows
    for (int64_t i = 0; i < k; i += 16) {
      const __m512 code = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i))));
      radixserve::store16(_mm512_mul_ps(_mm512_set1_ps(row_scales[i / group]), code), o + i);
    }
#else
    float w[32];
    for (int64_t g = 0; g < groups; ++g) {
      const float s = row_scales[g];
      const int8_t* cg = c + g * group;
#pragma omp simd
      for (int64_t i = 0; i < group; ++i) w[i] = s * static_cast<float>(cg[i]);
      radixserve::store(w, group, o + g * group);
    }
#endif
  }
}

#if !defined(__AVX512F__) && defined(__AVX2__)
// AVX2: half h of a tile (G = 8 of a full tile's groups, or a small tile's 4) into w. Register v,
// nibble t gives codes 2(4v + t) and 2(4v + t) + 1 of each group, a group a lane: eight vectors
// (t = 0..3, even and odd) are codes 8v .. 8v + 7 of 8 groups, and one 8 x 8 transpose makes them
// 8 runs of a group's codes, each stored whole (the scalar loop wrote a float at a time).
template <int G>
__attribute__((optimize("fp-contract=off"))) inline void int4_half_avx2(const uint8_t* packed, int64_t k, int64_t n,
                                                                        const radixserve::int4::Tile& tile, int h,
                                                                        const float* row_scales, const float* row_lows,
                                                                        float* w) {
  using namespace radixserve::int4;
  const int64_t g0 = tile.group0 + 8 * h;
  const __m256 sv = G == 8 ? _mm256_loadu_ps(row_scales + g0) : _mm256_zextps128_ps256(_mm_loadu_ps(row_scales + g0));
  const __m256 lv = G == 8 ? _mm256_loadu_ps(row_lows + g0) : _mm256_zextps128_ps256(_mm_loadu_ps(row_lows + g0));
  const __m256i fifteen = _mm256_set1_epi32(15);
  for (int v = 0; v < 4; ++v) {
    const uint8_t* at = register_at(packed, k, n, tile, v) + 32 * h;
    const __m256i words = G == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))
                                 : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    __m256 c[8];  // c[2t + p]: code 8v + 2t + p of each group, as weights s * q + l
    for (int t = 0; t < 4; ++t) {
      const __m256i even = _mm256_and_si256(_mm256_srli_epi32(words, 4 * t), fifteen);
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(words, 16 + 4 * t), fifteen);
      c[2 * t] = _mm256_add_ps(_mm256_mul_ps(sv, _mm256_cvtepi32_ps(even)), lv);
      c[2 * t + 1] = _mm256_add_ps(_mm256_mul_ps(sv, _mm256_cvtepi32_ps(odd)), lv);
    }
    // 8 x 8 transpose: row l becomes group l's codes 8v .. 8v + 7
    const __m256 t0 = _mm256_unpacklo_ps(c[0], c[1]), t1 = _mm256_unpackhi_ps(c[0], c[1]);
    const __m256 t2 = _mm256_unpacklo_ps(c[2], c[3]), t3 = _mm256_unpackhi_ps(c[2], c[3]);
    const __m256 t4 = _mm256_unpacklo_ps(c[4], c[5]), t5 = _mm256_unpackhi_ps(c[4], c[5]);
    const __m256 t6 = _mm256_unpacklo_ps(c[6], c[7]), t7 = _mm256_unpackhi_ps(c[6], c[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    const __m256 rows[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                            _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                            _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                            _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
    for (int l = 0; l < G; ++l) _mm256_storeu_ps(w + (g0 + l) * kGroup + 8 * v, rows[l]);
  }
}
#endif

// Multiply, then add, each rounded (no fused multiply-add): the weights are then bitwise those of a
// float32 dequantization (gguf's, torch's). A tile's register v, nibble t gives codes 2i, 2i + 1
// (i = 4v + t) of each of its groups: pairs of weights, each written to its group's place.
template <typename O>
__attribute__((optimize("fp-contract=off"))) void int4_rows(const uint8_t* packed, const radixserve::GroupScales& scales,
                                                            const radixserve::GroupScales& lows, int64_t k,
                                                            int64_t begin, int64_t end, O* out) {
  using namespace radixserve::int4;
  const int64_t groups = k / kGroup;
  std::vector<float> row_scales(groups), row_lows(groups), w(k);
  for (int64_t n = begin; n < end; ++n) {
    scales.expand(n, 1, row_scales.data());
    lows.expand(n, 1, row_lows.data());
    for (int64_t ti = 0, tiles = tile_count(groups); ti < tiles; ++ti) {
      const Tile tile = tile_of(groups, ti);
#if defined(__AVX512F__)
      // A group's 32 codes lie in one 32-bit lane of each of the tile's registers (words 2l and
      // 2l + 1): code 8v + j is register v's lane l shifted right by 16 (j % 2) + 4 (j / 2). One
      // permute brings registers 2h and 2h + 1's lanes for 16 codes, a variable shift and a mask
      // give the codes (the scalar loop cost 4-5x the old layout's, a fifth of a prefill product).
      __m512i regs[4];
      if (tile.groups == kTileGroups)
        for (int v = 0; v < 4; ++v) regs[v] = _mm512_loadu_si512(register_at(packed, k, n, tile, v));
      else  // a small tile: its 4 registers of 4 lanes are one block
        regs[0] = _mm512_loadu_si512(register_at(packed, k, n, tile, 0));
      const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512i shift = _mm512_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28, 0, 16, 4, 20, 8, 24, 12, 28);
      for (int64_t l = 0; l < tile.groups; ++l) {
        const int64_t g = tile.group0 + l;
        const __m512 sv = _mm512_set1_ps(row_scales[g]), lv = _mm512_set1_ps(row_lows[g]);
        for (int h = 0; h < 2; ++h) {  // codes 16h .. 16h + 15: registers 2h (lanes 0-7), 2h + 1
          __m512i words;
          if (tile.groups == kTileGroups) {
            const __m512i at = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(l)),
                                                _mm512_and_si512(_mm512_slli_epi32(_mm512_srli_epi32(lane, 3), 4),
                                                                 _mm512_set1_epi32(16)));
            words = _mm512_permutex2var_epi32(regs[2 * h], at, regs[2 * h + 1]);
          } else {
            const __m512i at = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(l + 8 * h)),
                                                _mm512_slli_epi32(_mm512_srli_epi32(lane, 3), 2));
            words = _mm512_permutexvar_epi32(at, regs[0]);
          }
          const __m512i codes = _mm512_and_si512(_mm512_srlv_epi32(words, shift), _mm512_set1_epi32(15));
          _mm512_storeu_ps(w.data() + g * kGroup + 16 * h, _mm512_add_ps(_mm512_mul_ps(sv, _mm512_cvtepi32_ps(codes)), lv));
        }
      }
#elif defined(__AVX2__)
      if (tile.groups == kTileGroups) {
        int4_half_avx2<8>(packed, k, n, tile, 0, row_scales.data(), row_lows.data(), w.data());
        int4_half_avx2<8>(packed, k, n, tile, 1, row_scales.data(), row_lows.data(), w.data());
      } else {
        int4_half_avx2<4>(packed, k, n, tile, 0, row_scales.data(), row_lows.data(), w.data());
      }
#else
      for (int v = 0; v < 4; ++v) {
        const uint8_t* bytes = register_at(packed, k, n, tile, v);
        for (int64_t p = 0; p < 2 * tile.groups; ++p) {
          const uint16_t word = static_cast<uint16_t>(bytes[2 * p] | (bytes[2 * p + 1] << 8));
          const int64_t g = tile.group0 + p / 2;
          const float s = row_scales[g], l = row_lows[g];
          float* into = w.data() + g * kGroup + 8 * v + p % 2;  // code 2(4v + t) + p % 2
          for (int t = 0; t < 4; ++t) into[2 * t] = s * static_cast<float>((word >> (4 * t)) & 15) + l;
        }
      }
#endif
    }
    radixserve::store(w.data(), k, out + n * k);
  }
}

// codes [N, K] int8, scales [N, K / group] -> [N, K] in `dtype` (float32 or bfloat16).
at::Tensor dequant_int8_groups(const at::Tensor& codes, const at::Tensor& scales, int64_t group, at::ScalarType dtype,
                               const std::optional<at::Tensor>& scale_steps) {
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.scalar_type() == at::kChar,
              "dequant_int8_groups: codes are contiguous int8 [N, K]");
  TORCH_CHECK((group == 16 || group == 32) && codes.size(1) % group == 0,
              "dequant_int8_groups: the group is 16 or 32 and K a multiple of it");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dequant_int8_groups: float32 or bfloat16 out");
  const int64_t n = codes.size(0), k = codes.size(1);
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, k / group, "dequant_int8_groups");
  at::Tensor out = at::empty({n, k}, codes.options().dtype(dtype));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / k);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "dequant_int8_groups", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
      int8_rows(codes.data_ptr<int8_t>(), sg, k, group, begin, end, op);
    });
  });
  return out;
}

// packed [N, K / 2] (int4_gemv.cpp's layout, N a multiple of 4), scales and lows float16 [N, K / 32]
// -> [N, K] in `dtype`.
at::Tensor dequant_int4_blocks(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& lows,
                               at::ScalarType dtype, const std::optional<at::Tensor>& scale_steps,
                               const std::optional<at::Tensor>& low_steps) {
  TORCH_CHECK(packed.dim() == 2 && packed.is_contiguous() && packed.scalar_type() == at::kByte &&
                  packed.size(0) % 4 == 0 && (packed.size(1) * 2) % 128 == 0,
              "dequant_int4_blocks: codes are contiguous uint8 [N, K / 2], N a multiple of 4, K of 128");
  const int64_t n = packed.size(0), k = packed.size(1) * 2;
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, k / 32, "dequant_int4_blocks");
  const auto lg = radixserve::GroupScales::of(lows, low_steps, n, k / 32, "dequant_int4_blocks lows");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dequant_int4_blocks: float32 or bfloat16 out");
  at::Tensor out = at::empty({n, k}, packed.options().dtype(dtype));
  const uint8_t* bytes = packed.data_ptr<uint8_t>();
  const int64_t grain = std::max<int64_t>(4, (int64_t{1} << 16) / k);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "dequant_int4_blocks", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { int4_rows(bytes, sg, lg, k, begin, end, op); });
  });
  return out;
}

// Stored nibbles [N, K / 2] (byte j of a row: code 2j in its low nibble, 2j + 1 in its high one, as
// runtime/loading/gguf_groups.py writes them) -> int4_gemv.cpp's layout, in one pass. Torch ops took
// five passes through int32 temporaries: 6 of the 9 seconds a 1B model took to load.
at::Tensor repack_int4_nibbles(const at::Tensor& nibbles) {
  TORCH_CHECK(nibbles.dim() == 2 && nibbles.is_contiguous() && nibbles.scalar_type() == at::kByte &&
                  nibbles.size(0) % 4 == 0 && (nibbles.size(1) * 2) % 128 == 0,
              "repack_int4_nibbles: contiguous uint8 [N, K / 2], N a multiple of 4, K of 128");
  using namespace radixserve::int4;
  const int64_t n = nibbles.size(0), half = nibbles.size(1), k = half * 2, groups = k / kGroup;
  at::Tensor out = at::empty({n, half}, nibbles.options());
  const uint8_t* in = nibbles.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, n, std::max<int64_t>(4, (int64_t{1} << 16) / k), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const uint8_t* r = in + row * half;
      for (int64_t ti = 0, tiles = tile_count(groups); ti < tiles; ++ti) {
        const Tile tile = tile_of(groups, ti);
        for (int v = 0; v < 4; ++v) {
          uint8_t* bytes = const_cast<uint8_t*>(register_at(o, k, row, tile, v));
          for (int64_t p = 0; p < 2 * tile.groups; ++p) {
            uint16_t word = 0;
            for (int t = 0; t < 4; ++t) {  // code 2(4v + t) + p % 2 of group group0 + p / 2
              const int64_t code = (tile.group0 + p / 2) * kGroup + 2 * (4 * v + t) + p % 2;
              const uint8_t byte = r[code / 2];
              word |= static_cast<uint16_t>(((code % 2) ? (byte >> 4) : (byte & 15)) << (4 * t));
            }
            bytes[2 * p] = static_cast<uint8_t>(word & 0xFF);
            bytes[2 * p + 1] = static_cast<uint8_t>(word >> 8);
          }
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("repack_int4_nibbles(Tensor nibbles) -> Tensor", repack_int4_nibbles);
  m.def("dequant_int8_groups(Tensor codes, Tensor scales, int group, ScalarType dtype, Tensor? scale_steps=None) -> Tensor",
        dequant_int8_groups);
  m.def("dequant_int4_blocks(Tensor packed, Tensor scales, Tensor lows, ScalarType dtype, Tensor? scale_steps=None, "
        "Tensor? low_steps=None) -> Tensor",
        dequant_int4_blocks);
}
