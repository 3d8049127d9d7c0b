// Few-row products with 6-bit group codes and bf16 activations: a GGUF's Q6_K tensors (and Q5_0's,
// whose codes fit too) streamed at 6 bits a weight instead of the int8 group kernel's 8
// (group_gemv.cpp). A one-row decode step only streams the weights; Q4_K_M files keep their output
// layer and half their down projections in Q6_K, a third of a 1B model's bytes.
//
// Weights: signed codes c in [-32, 31] with per-group scales (16 or 32 codes a group, in one of
// group_scales.h's forms), w = scale * c, in q6_blocks.h's layout (u = c + 32 in blocks of 128
// codes, rows in quads).
//
// The bf16 trick of int4_gemv.cpp: 0x4300 | u is the bf16 number 128 + u (u < 128), so a code is a
// number with two shifts and two bitwise selects, and one dot-product instruction multiplies 32
// codes by 32 activations, summing pairs in float32. Per row,
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

#include "expert_rows.h"
#include "group_scales.h"
#include "q6_blocks.h"
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

using namespace radixserve::q6;  // the layout: kBlock, kBlockBytes, kQuad, block_at, code_at

constexpr int64_t kMaxRows = 8;
constexpr float kOffset = 160.f;      // 128 (the bf16 trick) + 32 (the stored codes' bias)

// codes int8 [N, K] in [-32, 31] -> q6_blocks.h's layout, [N, K * 3 / 4] uint8.
at::Tensor repack_q6(const at::Tensor& codes) {
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.scalar_type() == at::kChar &&
                  codes.size(1) % kBlock == 0 && codes.size(0) % kQuad == 0,
              "repack_q6: codes are contiguous int8 [N, K], N a multiple of 4, K of 128");
  const int64_t n = codes.size(0), k = codes.size(1), blocks = k / kBlock;
  at::Tensor out = at::empty({n, blocks * kBlockBytes}, codes.options().dtype(at::kByte));
  const int8_t* in = codes.data_ptr<int8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  std::atomic<bool> in_range{true};
  at::parallel_for(0, n, std::max<int64_t>(1, (int64_t{1} << 16) / k), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      for (int64_t b = 0; b < blocks; ++b) {
        const int8_t* c = in + row * k + b * kBlock;
        uint8_t* block = const_cast<uint8_t*>(block_at(o, k, row, b));
        for (int j = 0; j < 32; ++j) {
          uint16_t word = 0;
          uint8_t crumbs = 0;
          for (int t = 0; t < 4; ++t) {
            const int v = c[t * 32 + code_at(j)] + 32;
            if (v < 0 || v > 63) in_range = false;
            word |= static_cast<uint16_t>((v & 15) << (4 * t));
            crumbs |= static_cast<uint8_t>(((v >> 4) & 3) << (2 * t));
          }
          std::memcpy(block + 2 * j, &word, 2);
          block[64 + j] = crumbs;
        }
      }
  });
  TORCH_CHECK(in_range.load(), "repack_q6: codes must lie in [-32, 31]");
  return out;
}

#if RADIXSERVE_Q6_BF16
// R weight rows from j against M bf16 activation rows; out[m * n + j + r] in O.
template <int M, int R, int group, bool Prefetch, typename O>
void dot_rows(const uint8_t* w, const float* scale, const float (&rest)[R][M], int64_t n, int64_t k, int64_t j,
              const uint16_t* x, O* out) {
  const int64_t groups = k / group;
  const __m512i nibble = _mm512_set1_epi16(0x000F), crumb = _mm512_set1_epi16(0x0030),
                base = _mm512_set1_epi16(0x4300);
  __m512 acc[R][M];
  RADIXSERVE_Q6_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_Q6_UNROLL
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < k / kBlock; ++b) {
    if constexpr (Prefetch) radixserve::prefetch_ahead<R * kBlockBytes / 64>(block_at(w, k, j, b));  // weight_prefetch.h
    RADIXSERVE_Q6_UNROLL
    for (int r = 0; r < R; ++r) {
      const uint8_t* block = block_at(w, k, j + r, b);
      const __m512i words = _mm512_loadu_si512(block);  // read once, unpacked four times
      const __m512i crumbs = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64)));
      RADIXSERVE_Q6_UNROLL
      for (int t = 0; t < 4; ++t) {
        const int64_t at = b * kBlock + t * 32;  // the run's first code in the row
        const __m512i low = _mm512_ternarylogic_epi32(_mm512_srli_epi16(words, 4 * t), nibble, base, 0xEA);
        const __m512i high = t < 2 ? _mm512_slli_epi16(crumbs, 4 - 2 * t) : _mm512_srli_epi16(crumbs, 2 * t - 4);
        const __m512bh codes = (__m512bh)_mm512_ternarylogic_epi32(high, crumb, low, 0xEA);  // (high & 0x30) | low
        const float* sc = scale + r * groups + at / group;
        const __m512 sv = group == 16 ? _mm512_broadcast_f32x2(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sc))))
                                      : _mm512_set1_ps(sc[0]);
        RADIXSERVE_Q6_UNROLL
        for (int m = 0; m < M; ++m) {
          const __m512bh xs = (__m512bh)_mm512_loadu_si512(x + m * k + at);
          acc[r][m] = _mm512_fmadd_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), codes, xs), sv, acc[r][m]);
        }
      }
    }
  }
  RADIXSERVE_Q6_UNROLL
  for (int r = 0; r < R; ++r)
    RADIXSERVE_Q6_UNROLL
    for (int m = 0; m < M; ++m)
      out[m * n + j + r] = static_cast<O>(_mm512_reduce_add_ps(acc[r][m]) + rest[r][m]);
}
#endif

#if RADIXSERVE_Q6_BF16
// The activations of one call as dot_rows reads them: bf16 bits in code_at's order, and each
// group's sum (float32), formed once per call. x may be a view of some rows of a larger tensor
// (q6_gemv_experts: an expert's).
struct Q6Activations {
  std::vector<uint16_t> xb;
  std::vector<float> sums;
};

Q6Activations prepare(const at::Tensor& x, int64_t group) {
  const int64_t rows = x.size(0), k = x.size(1), groups = k / group;
  Q6Activations a{std::vector<uint16_t>(rows * k), std::vector<float>(rows * groups, 0.f)};
  std::vector<uint16_t>& xb = a.xb;
  std::vector<float>& sums = a.sums;
  const c10::BFloat16* xs = x.data_ptr<c10::BFloat16>();
  if (x.stride(1) == 1) {  // the decode step's case, with vectors: the scalar loops below took tens of
    // microseconds a call on wide rows
    alignas(64) int16_t order[32];
    for (int p = 0; p < 32; ++p) order[p] = static_cast<int16_t>(code_at(p));
    const __m512i reorder = _mm512_load_si512(order);
    for (int64_t m = 0; m < rows; ++m) {
      const c10::BFloat16* row = xs + m * x.stride(0);
      for (int64_t run = 0; run < k; run += 32) {
        const __m512i halves = _mm512_loadu_si512(row + run);
        _mm512_storeu_si512(xb.data() + m * k + run, _mm512_permutexvar_epi16(reorder, halves));
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
    }
  } else {
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t i = 0; i < k; ++i) {
        const c10::BFloat16 v = xs[m * x.stride(0) + i * x.stride(1)];
        sums[m * groups + i / group] += static_cast<float>(v);
      }
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t i = 0; i < k; ++i) {  // position i of its run holds code code_at(i % 32)
        const int64_t code = i - i % 32 + code_at(static_cast<int>(i % 32));
        xb[m * k + i] = xs[m * x.stride(0) + code * x.stride(1)].x;
      }
  }
  return a;
}

// Weight-row quads [quad_begin, quad_end) of one weight against `rows` prepared activation rows,
// into out [rows, n].
void products(const uint8_t* wp, const radixserve::GroupScales& sg, int64_t n, int64_t k, int64_t group,
              int64_t quad_begin, int64_t quad_end, const Q6Activations& a, int64_t rows, bool prefetch,
              c10::BFloat16* op) {
  const int64_t begin = quad_begin * kQuad, end = quad_end * kQuad, groups = k / group;
  radixserve::with_row_count(rows, [&](auto count) {
    constexpr int M = decltype(count)::value;
    constexpr int R = M <= 4 ? 4 : 2;
    std::vector<float> scale(R * groups);
    const auto run = [&](auto rows_now, int64_t j) {
      constexpr int RN = decltype(rows_now)::value;
      sg.expand(j, RN, scale.data());
      float rest[RN][M];
      for (int r = 0; r < RN; ++r)
        for (int m = 0; m < M; ++m) {
          const float* sr = scale.data() + r * groups;
          const float* xm = a.sums.data() + m * groups;
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t g = 0; g < groups; ++g) sum += sr[g] * xm[g];
          rest[r][m] = -kOffset * sum;
        }
      // a compile-time group (no division in the loop) and prefetching (the loop without it unchanged)
      const auto dot = [&](auto group_now) {
        constexpr int G = decltype(group_now)::value;
        if (prefetch)
          dot_rows<M, RN, G, true>(wp, scale.data(), rest, n, k, j, a.xb.data(), op);
        else
          dot_rows<M, RN, G, false>(wp, scale.data(), rest, n, k, j, a.xb.data(), op);
      };
      if (group == 16)
        dot(std::integral_constant<int, 16>{});
      else
        dot(std::integral_constant<int, 32>{});
    };
    for (int64_t j = begin; j < end; j += R) run(std::integral_constant<int, R>{}, j);  // R divides a quad
  });
}
#endif

void check(const at::Tensor& x, const at::Tensor& w, int64_t group, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16,
              what, ": x is a CPU [rows, K] bfloat16 tensor");
  TORCH_CHECK(x.size(1) % kBlock == 0, what, ": K is a multiple of 128");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && w.size(1) * 4 == x.size(1) * 3 &&
                  w.size(0) % kQuad == 0,
              what, ": codes are contiguous uint8 [N, K * 3 / 4] with K = x's width and N a multiple of 4");
  TORCH_CHECK(group == 16 || group == 32, what, ": group is 16 or 32");
  TORCH_CHECK(x.size(0) <= kMaxRows, what, ": at most 8 rows a call");
}

// x [rows, K] bf16 @ (scales * codes).T -> [rows, N] bf16.
at::Tensor q6_gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t group,
                   const std::optional<at::Tensor>& scale_steps) {
  check(x, w, group, "q6_gemv");
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0), groups = k / group;
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, groups, "q6_gemv");
  at::Tensor out = at::empty({rows, n}, x.options());
#if RADIXSERVE_Q6_BF16
  const Q6Activations a = prepare(x, group);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const bool prefetch = radixserve::activations_spill(rows * k * 2);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 13) / k);  // quads
  at::parallel_for(0, n / kQuad, grain, [&](int64_t quad_begin, int64_t quad_end) {
    products(wp, sg, n, k, group, quad_begin, quad_end, a, rows, prefetch, op);
  });
#else
  TORCH_CHECK(false, "q6_gemv: this build has no bf16 dot products (q6_gemv_fast() is false)");
#endif
  return out;
}

// A mixture of experts' products in one call, as int4_gemv_experts for q6_gemv: x [R, K] bf16 holds
// the routed rows grouped by expert (counts[e] rows for expert e, in order: expert_rows.h), w[e]
// etc. each expert's weight as q6_gemv takes it ([N, K] alike, one group); -> [R, N] bf16, each
// expert's rows exactly what q6_gemv gives for them alone. One parallel region, each thread a share
// of every expert's quads (expert_rows.h for_every_expert; a Q4_K_M mixture keeps some layers' down projections in Q6_K).
at::Tensor q6_gemv_experts(const at::Tensor& x, at::IntArrayRef counts, at::TensorList w, at::TensorList scales,
                           int64_t group, at::TensorList scale_steps) {
  const int64_t experts = static_cast<int64_t>(w.size());
  TORCH_CHECK(scales.size() == w.size() && (scale_steps.empty() || scale_steps.size() == w.size()),
              "q6_gemv_experts: as many weights and scales (and steps, where given)");
  const std::vector<int64_t> first = radixserve::expert_rows(x, counts, experts, "q6_gemv_experts");
  const int64_t k = x.size(1), n = w[0].size(0), groups = k / std::max<int64_t>(group, 1);
  std::vector<radixserve::GroupScales> sg;
  for (int64_t e = 0; e < experts; ++e) {
    check(x.narrow(0, first[e], counts[e]), w[e], group, "q6_gemv_experts");
    TORCH_CHECK(w[e].size(0) == n, "q6_gemv_experts: every expert's codes are [N, K * 3 / 4] with one N");
    sg.push_back(radixserve::GroupScales::of(
        scales[e], scale_steps.empty() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(scale_steps[e]), n,
        groups, "q6_gemv_experts"));
  }
  at::Tensor out = at::empty({x.size(0), n}, x.options());
#if RADIXSERVE_Q6_BF16
  std::vector<Q6Activations> a;
  for (int64_t e = 0; e < experts; ++e) a.push_back(prepare(x.narrow(0, first[e], counts[e]), group));
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 13) / k);
  radixserve::for_every_expert(n / kQuad, experts, grain, [&](int64_t e, int64_t from, int64_t to) {
    products(w[e].data_ptr<uint8_t>(), sg[e], n, k, group, from, to, a[e], counts[e],
             radixserve::activations_spill(counts[e] * k * 2), op + first[e] * n);
  });
#else
  TORCH_CHECK(false, "q6_gemv_experts: this build has no bf16 dot products (q6_gemv_fast() is false)");
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
      std::vector<float> scale(groups);
#if RADIXSERVE_Q6_BF16
      alignas(64) int16_t where[32];  // code i sits at position where[i]
      for (int p = 0; p < 32; ++p) where[code_at(p)] = static_cast<int16_t>(p);
      const __m512i positions = _mm512_load_si512(where);
#endif
      for (int64_t row = begin; row < end; ++row) {
        sg.expand(row, 1, scale.data());
        for (int64_t b = 0; b < k / kBlock; ++b) {
          const uint8_t* block = block_at(wp, k, row, b);
#if RADIXSERVE_Q6_BF16
          const __m512i words = _mm512_loadu_si512(block);
          const __m512i crumbs = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64)));
          for (int t = 0; t < 4; ++t) {
            const __m512i u = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(words, 4 * t), _mm512_set1_epi16(0x000F)),
                _mm512_and_si512(t < 2 ? _mm512_slli_epi16(crumbs, 4 - 2 * t) : _mm512_srli_epi16(crumbs, 2 * t - 4),
                                 _mm512_set1_epi16(0x0030)));
            const int64_t at = b * kBlock + t * 32;
            const __m512i ordered = _mm512_permutexvar_epi16(positions, u);  // lane i: code i
            for (int half = 0; half < 2; ++half) {  // codes at .. at + 15, then at + 16 .. at + 31
              const __m512i wide = _mm512_cvtepu16_epi32(half ? _mm512_extracti64x4_epi64(ordered, 1)
                                                              : _mm512_castsi512_si256(ordered));
              const __m512 code = _mm512_cvtepi32_ps(_mm512_sub_epi32(wide, _mm512_set1_epi32(32)));
              const __m512 v = _mm512_mul_ps(_mm512_set1_ps(scale[(at + 16 * half) / group]), code);
              radixserve::store16(v, op + row * k + at + 16 * half);
            }
          }
#else
          for (int t = 0; t < 4; ++t)
            for (int j = 0; j < 32; ++j) {
              const uint16_t word = static_cast<uint16_t>(block[2 * j] | (block[2 * j + 1] << 8));
              const int u = ((word >> (4 * t)) & 15) | (((block[64 + j] >> (2 * t)) & 3) << 4);
              const int64_t at = b * kBlock + t * 32 + code_at(j);
              const float v = scale[at / group] * static_cast<float>(u - 32);
              radixserve::store(&v, 1, op + row * k + at);
            }
#endif
        }
      }
    });
  });
  return out;
}

// Whether q6_gemv runs on this build (AVX-512 with bf16 dot products).
bool q6_gemv_fast() { return RADIXSERVE_Q6_BF16 != 0; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("repack_q6(Tensor codes) -> Tensor", repack_q6);
  m.def("q6_gemv(Tensor x, Tensor w, Tensor scales, int group, Tensor? scale_steps=None) -> Tensor", q6_gemv);
  m.def("dequant_q6_rows(Tensor w, Tensor scales, int group, ScalarType dtype, Tensor? scale_steps=None) -> Tensor",
        dequant_q6_rows);
  m.def("q6_gemv_experts(Tensor x, int[] counts, Tensor[] w, Tensor[] scales, int group, Tensor[] scale_steps) -> Tensor",
        q6_gemv_experts);
  m.def("q6_gemv_fast() -> bool", q6_gemv_fast);
}
