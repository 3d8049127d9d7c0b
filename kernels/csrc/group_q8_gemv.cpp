// Few-row products of a GGUF's Q6_K codes (int8 codes, each group of 16 scaled by an int8 code
// times a float32 step per super-block of 256: group_scales.h's factored form) with the activations
// rounded to int8 per super-block (activations8.h), summed in integers: `--int8-activations`, on
// CPUs with AVX2. runtime/cpu/block_weights.py's Int8Blocks calls it where its scales are so.
//
// Why: group_gemv.cpp's int16 loop spends, per 16 codes and activation row, a sign extension of
// the codes, a 16-bit multiply-add, an add, and per group a conversion and a float multiply-add:
// 14 instructions for 32 codes, which bound one decode row (the Q6_K layers and the output layer
// were 29% of a one-stream step of Qwen2.5-Coder-1.5B on a 2-core Zen 3). Here, per 32 codes: the
// codes offset to unsigned (+32, so 0..63), one u8 x s8 product summed in pairs to 16 bits, one
// 16-bit multiply-add by the two groups' scale codes into 32 bits, an add: the groups' scales
// are integers, so a super-block's sums stay integers and meet the floats (its step times the
// activations' scale) once. The offset is taken back once a super-block: 32 x sum over its
// groups of scale code x the group's sum of int8 activations (formed once per call).
//
// Bounds: a pair is at most 2 x 63 x 127 = 16002 (no 16-bit saturation); a 32-bit lane sums 16
// pairs times scale codes of at most 128: under 2^31.
//
// Rows are independent: a row's result never depends on which other rows share the call. On AVX2,
// a call of q8_panel.h's rows_from() rows or more (8) takes the panel loop there (q8panel::codes),
// whose float sums run in another order: a row's bits are the same in every call of one loop.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "activations16.h"
#include "activations8.h"
#include "expert_rows.h"
#include "group_scales.h"
#include "q8_panel.h"
#include "row_count.h"
#include "six_bit_codes.h"
#include "vector_sum.h"
#include "weight_prefetch.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RADIXSERVE_GROUP_Q8 1
#else
#define RADIXSERVE_GROUP_Q8 0
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#define RADIXSERVE_UNROLL _Pragma("GCC unroll 8")

namespace {

using radixserve::kSuperBlock;
constexpr int64_t kGroup = 16;                       // Q6_K's
constexpr int64_t kSpan = kSuperBlock / kGroup;      // groups a super-block (and a scale step) covers
constexpr int64_t kBlockBytes = int64_t{64} << 10;   // weight rows taken a block at a time

// One call's activations, rounded once and read by every weight row.
struct Q8Rows {
  Q8Rows(int64_t rows, int64_t width)
      : k(width), supers(width / kSuperBlock), q(rows * width), scale(rows * supers), sums(rows * (width / kGroup)) {}

  int64_t k = 0, supers = 0;
  std::vector<int8_t, radixserve::CacheLineAllocator<int8_t>> q;  // [rows, k]
  std::vector<float> scale;                                       // [rows, supers]
  std::vector<int16_t> sums;                                      // [rows, k / 16]: each group's sum of q
};

// Row m's super-block s, rounded already at its place in a.q: each group's sum of its codes.
inline void group_sums(Q8Rows& a, int64_t m, int64_t s) {
  const int8_t* q = a.q.data() + m * a.k + s * kSuperBlock;
  for (int64_t g = 0; g < kSpan; ++g) {
    int sum = 0;
    for (int64_t i = 0; i < kGroup; ++i) sum += q[g * kGroup + i];
    a.sums[(m * a.supers + s) * kSpan + g] = static_cast<int16_t>(sum);
  }
}

// x's rows [begin, end) rounded per super-block into a: to int8, a's rows [begin, end); or, with
// Halves, to 15 bits in two int8 halves (activations8.h's round_super_to_halves): row m's high
// half is a's row 2m (scaled by 128 steps), its low half row 2m + 1, so the int8 loops sum both
// and the two results add up to row m's.
template <bool Halves, typename T>
void quantize_rows(const at::Tensor& x, Q8Rows& a, int64_t begin, int64_t end) {
  const T* xs = x.data_ptr<T>();
  alignas(64) float v[kSuperBlock];
  for (int64_t m = begin; m < end; ++m)
    for (int64_t s = 0; s < a.supers; ++s) {
      radixserve::load_super(x, xs, m, s, v);
      if constexpr (Halves) {
        const int64_t high = 2 * m, low = 2 * m + 1;
        const float step = radixserve::round_super_to_halves(v, a.q.data() + high * a.k + s * kSuperBlock,
                                                             a.q.data() + low * a.k + s * kSuperBlock);
        a.scale[high * a.supers + s] = 128.f * step;  // exact: a power of two
        a.scale[low * a.supers + s] = step;
        group_sums(a, high, s);
        group_sums(a, low, s);
      } else {
        a.scale[m * a.supers + s] = radixserve::round_super_to_int8(v, a.q.data() + m * a.k + s * kSuperBlock);
        group_sums(a, m, s);
      }
    }
}

using radixserve::six_bits::codes_plus_32;  // six_bit_codes.h: either form of the codes
using radixserve::six_bits::row_bytes;
using radixserve::six_bits::super_bytes;
using radixserve::six_bits::with_form;

#if RADIXSERVE_GROUP_Q8
// Weight row j (codes wj, row_bytes<Six>(k) of them; scale codes cj [k / 16], steps sj [supers])
// against M activation rows from m0; into out[(m0 + m) * n]. Six or not, the same integer sums.
template <int M, bool Six, typename O>
inline void row_q8(const uint8_t* wj, const int8_t* cj, const float* sj, const Q8Rows& a, int64_t m0, O* out,
                   int64_t n) {
  const int64_t k = a.k;
  __m256 acc[M];
  RADIXSERVE_UNROLL
  for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t s = 0; s < a.supers; ++s) {
    // the stream asked for ahead, as group_gemv.cpp's: in the engine (real 1.5B, one stream,
    // alternated in one process) 83.8 against 89.6 ms a token without it
    const uint8_t* super = wj + s * super_bytes<Six>;
    radixserve::prefetch_ahead<super_bytes<Six> / 64>(super);
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(cj + s * kSpan));
    __m256i sum[M];
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) sum[m] = _mm256_setzero_si256();
    RADIXSERVE_UNROLL
    for (int c = 0; c < kSpan / 2; ++c) {  // 32 codes: groups 2c (the low 128 bits) and 2c + 1
      const __m256i w = codes_plus_32<Six>(super, c);
      // scale codes 2c and 2c + 1, each in 8 16-bit lanes
      const __m256i scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
          codes, _mm_set_epi64x(0x0101010101010101LL * (2 * c + 1), 0x0101010101010101LL * (2 * c))));
      RADIXSERVE_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m256i x = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(a.q.data() + (m0 + m) * k + s * kSuperBlock + 32 * c));
        sum[m] = _mm256_add_epi32(sum[m], _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scale));
      }
    }
    // the offset back: 32 x sum_g code_g x (group g's sum of activations)
    const __m256i all = _mm256_cvtepi8_epi16(codes);
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) {
      const __m256i group_sums = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(a.sums.data() + ((m0 + m) * a.supers + s) * kSpan));
      const __m256i back = _mm256_slli_epi32(_mm256_madd_epi16(all, group_sums), 5);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sum[m], back)),
                               _mm256_set1_ps(sj[s] * a.scale[(m0 + m) * a.supers + s]), acc[m]);
    }
  }
  RADIXSERVE_UNROLL
  for (int m = 0; m < M; ++m) out[(m0 + m) * n] = static_cast<O>(radixserve::reduce_add(acc[m]));
}
#endif

// Weight rows [begin, end) in blocks of about kBlockBytes (kept in the second-level cache), each
// block against the activation rows four at a time (those in the first-level cache).
template <bool Six, typename O>
void dot_rows(const uint8_t* w, const int8_t* codes, const float* steps, int64_t n, int64_t begin, int64_t end,
              const Q8Rows& a, int64_t rows, O* out, int64_t first = 0) {  // activation (and output) rows first..
#if RADIXSERVE_GROUP_Q8
  const int64_t k = a.k, groups = k / kGroup, stride = row_bytes<Six>(k),
                block = std::max<int64_t>(1, kBlockBytes / stride);
  for (int64_t b0 = begin; b0 < end; b0 += block) {
    const int64_t b1 = std::min(end, b0 + block);
    for (int64_t m0 = first; m0 < first + rows; m0 += 4)
      radixserve::with_row_count<4>(std::min<int64_t>(4, first + rows - m0), [&](auto count) {
        constexpr int M = decltype(count)::value;
        for (int64_t j = b0; j < b1; ++j)
          row_q8<M, Six>(w + j * stride, codes + j * groups, steps + j * a.supers, a, m0, out + j, n);
      });
  }
#endif
}

// The products of a's `rows` rounded rows with the codes, into out [rows, n]: q8_panel.h's panel
// loop from its rows_from() rows (AVX2), else the few-row loop, over the threads.
template <typename O>
void products(const Q8Rows& a, int64_t rows, const uint8_t* wp, bool six, const radixserve::GroupScales& sg, int64_t n,
              O* out) {
  const int64_t k = a.k;
  const int8_t* cp = static_cast<const int8_t*>(sg.values);
#if RADIXSERVE_Q8_PANEL
  if (rows >= radixserve::q8panel::rows_from()) {
    namespace panel = radixserve::q8panel;
    std::vector<int32_t> offsets(rows * (k / kGroup));
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) panel::codes::offsets(a.q.data() + m * k, k, offsets.data() + m * (k / kGroup));
    });
    at::parallel_for(0, (n + panel::kCols - 1) / panel::kCols, 1, [&](int64_t begin, int64_t end) {
      with_form(six, [&](auto form) {
        constexpr bool Six = decltype(form)::value;
        panel::codes::products<Six>(wp, cp, sg.steps, n, k, begin, end, a.q.data(), a.scale.data(), offsets.data(),
                                    rows, out);
      });
    });
    return;
  }
#endif
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / k);  // small layers stay on one thread
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    with_form(six, [&](auto form) { dot_rows<decltype(form)::value>(wp, cp, sg.steps, n, begin, end, a, rows, out); });
  });
}

// x [rows, K] @ (scale codes * steps * codes).T -> [rows, N] in x's dtype, x rounded to int8 per 256
// (`--int8-activations`), or with `halves` to 15 bits per 256 in two int8 halves (the AVX2
// default's Q6_K layers): 2 rounded rows a row, the few-row loop's from 4 rows the panel loop's
// (2 x 4 = rows_from()), their float32 results added. The codes: int8 [N, K], or six_bit_codes.h's
// uint8 [N, K / 256 * 192] (pack_six_bits), with the same results bit for bit.
at::Tensor group_gemv_q8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                         const at::Tensor& scale_steps, bool halves) {
  TORCH_CHECK(RADIXSERVE_GROUP_Q8, "group_gemv_q8: this CPU lacks AVX2 (group_gemv_q8_fast() is false)");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "group_gemv_q8: x is a CPU [rows, K] float32 or bfloat16 tensor");
  TORCH_CHECK(x.size(1) % kSuperBlock == 0, "group_gemv_q8: K is a multiple of 256");
  const bool six = w.scalar_type() == at::kByte;
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() &&
                  (six ? w.size(1) == row_bytes<true>(x.size(1))
                       : w.scalar_type() == at::kChar && w.size(1) == x.size(1)),
              "group_gemv_q8: codes are contiguous int8 [N, K] with K = x's width, or six bits a code "
              "(uint8 [N, K / 256 * 192])");
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, k / kGroup, "group_gemv_q8");
  TORCH_CHECK(sg.type == at::kChar && sg.span == kSpan,
              "group_gemv_q8: scales are int8 codes a group of 16 with a float32 step per 16 groups (Q6_K's)");
  Q8Rows a(halves ? 2 * rows : rows, k);
  at::Tensor out = at::empty({rows, n}, x.options());
  const uint8_t* wp = static_cast<const uint8_t*>(w.data_ptr());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "group_gemv_q8", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    // on one thread for a few rows (a decode step), spread over the threads for a prompt's
    if (!halves) {
      at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) { quantize_rows<false, scalar_t>(x, a, begin, end); });
      products(a, rows, wp, six, sg, n, op);
      return;
    }
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) { quantize_rows<true, scalar_t>(x, a, begin, end); });
    at::Tensor both = at::empty({2 * rows, n}, x.options().dtype(at::kFloat));  // row m's halves: rows 2m, 2m + 1
    const float* bp = both.data_ptr<float>();
    products(a, 2 * rows, wp, six, sg, n, both.data_ptr<float>());
    at::parallel_for(0, rows * n, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t m = i / n, j = i % n;
        op[i] = static_cast<scalar_t>(bp[2 * m * n + j] + bp[(2 * m + 1) * n + j]);
      }
    });
  });
  return out;
}

// A mixture of experts' Q6_K products in one call, as int4_q8_gemv.cpp's int4_gemv_q8_experts:
// x [R, K] holds the routed rows grouped by expert (counts[e] rows for w[e], in order), each
// expert's codes in either form group_gemv_q8 takes ([N, K] alike) -> [R, N], each expert's rows
// exactly group_gemv_q8's for them alone (the few-row loop, or the panel from rows_from() rows),
// in one rounding of the activations and one parallel region.
at::Tensor group_gemv_q8_experts(const at::Tensor& x, at::IntArrayRef counts, at::TensorList w, at::TensorList scales,
                                 at::TensorList scale_steps) {
  TORCH_CHECK(RADIXSERVE_Q8_PANEL, "group_gemv_q8_experts: AVX2 builds only (int4_gemv_q8_experts_fast())");
  const int64_t experts = static_cast<int64_t>(w.size());
  TORCH_CHECK(scales.size() == w.size() && scale_steps.size() == w.size(),
              "group_gemv_q8_experts: as many weights, scales and scale steps");
  const std::vector<int64_t> first = radixserve::expert_rows(x, counts, experts, "group_gemv_q8_experts");
  const int64_t rows = x.size(0), k = x.size(1), n = w[0].size(0), groups = k / kGroup;
  std::vector<radixserve::GroupScales> sg;
  for (int64_t e = 0; e < experts; ++e) {
    const bool six = w[e].scalar_type() == at::kByte;
    TORCH_CHECK(w[e].dim() == 2 && w[e].is_contiguous() && w[e].size(0) == n &&
                    (six ? w[e].size(1) == row_bytes<true>(k) : w[e].scalar_type() == at::kChar && w[e].size(1) == k),
                "group_gemv_q8_experts: every expert's codes are contiguous int8 [N, K] or six bits a code "
                "(uint8 [N, K / 256 * 192]), one N");
    sg.push_back(radixserve::GroupScales::of(scales[e], scale_steps[e], n, groups, "group_gemv_q8_experts"));
    TORCH_CHECK(sg.back().type == at::kChar && sg.back().span == kSpan,
                "group_gemv_q8_experts: scales are int8 codes a group of 16 with a float32 step per 16 groups (Q6_K's)");
  }
  Q8Rows a(rows, k);
  at::Tensor out = at::empty({rows, n}, x.options());
#if RADIXSERVE_Q8_PANEL
  namespace panel = radixserve::q8panel;
  constexpr int64_t kRowsAUnit = 16;  // the few-row loop's work unit, in weight rows
  std::vector<int64_t> unit(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t size = counts[e] >= panel::rows_from() ? panel::kCols : kRowsAUnit;
    unit[e + 1] = unit[e] + (n + size - 1) / size;
  }
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "group_gemv_q8_experts", [&] {
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) { quantize_rows<false, scalar_t>(x, a, begin, end); });
    std::vector<int32_t> offsets(rows * groups);
    for (int64_t m = 0; m < rows; ++m) panel::codes::offsets(a.q.data() + m * k, k, offsets.data() + m * groups);
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, unit[experts], 1, [&](int64_t begin, int64_t end) {
      radixserve::for_expert_units(unit, begin, end, [&](int64_t e, int64_t from, int64_t to) {
        const uint8_t* wp = static_cast<const uint8_t*>(w[e].data_ptr());
        const int8_t* cp = static_cast<const int8_t*>(sg[e].values);
        const int64_t m = first[e], count = counts[e];
        with_form(w[e].scalar_type() == at::kByte, [&](auto form) {
          constexpr bool Six = decltype(form)::value;
          if (count >= panel::rows_from())
            panel::codes::products<Six>(wp, cp, sg[e].steps, n, k, from, to, a.q.data() + m * k,
                                        a.scale.data() + m * a.supers, offsets.data() + m * groups, count, op + m * n);
          else
            dot_rows<Six>(wp, cp, sg[e].steps, n, from * kRowsAUnit, std::min(n, to * kRowsAUnit), a, count, op, m);
        });
      });
    });
  });
#endif
  return out;
}

// codes int8 [N, K] in [-32, 31], K a multiple of 256 -> six_bit_codes.h's layout, uint8 [N, K / 256 * 192].
at::Tensor pack_six_bits(const at::Tensor& codes) {
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.scalar_type() == at::kChar &&
                  codes.size(1) % kSuperBlock == 0,
              "pack_six_bits: codes are contiguous int8 [N, K], K a multiple of 256");
  const int64_t n = codes.size(0), k = codes.size(1), stride = row_bytes<true>(k);
  at::Tensor out = at::zeros({n, stride}, codes.options().dtype(at::kByte));
  const int8_t* in = codes.data_ptr<int8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  std::atomic<bool> in_range{true};
  at::parallel_for(0, n, std::max<int64_t>(1, (int64_t{1} << 16) / k), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      for (int64_t i = 0; i < k; ++i) {
        const int u = in[row * k + i] + 32;
        if (u < 0 || u > 63) in_range = false;
        radixserve::six_bits::set_code(o + row * stride, i, u & 63);
      }
  });
  TORCH_CHECK(in_range.load(), "pack_six_bits: codes must lie in [-32, 31]");
  return out;
}

// pack_six_bits' layout [N, K / 256 * 192] -> the int8 codes [N, K] (for dequantized rows).
at::Tensor unpack_six_bits(const at::Tensor& packed, int64_t k) {
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && k % kSuperBlock == 0 &&
                  packed.size(1) == row_bytes<true>(k),
              "unpack_six_bits: packed is uint8 [N, K / 256 * 192], K a multiple of 256");
  const at::Tensor rows = packed.contiguous();
  const int64_t n = rows.size(0), stride = row_bytes<true>(k);
  at::Tensor out = at::empty({n, k}, rows.options().dtype(at::kChar));
  const uint8_t* in = rows.data_ptr<uint8_t>();
  int8_t* o = out.data_ptr<int8_t>();
  at::parallel_for(0, n, std::max<int64_t>(1, (int64_t{1} << 16) / k), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      for (int64_t i = 0; i < k; ++i)
        o[row * k + i] = static_cast<int8_t>(radixserve::six_bits::code_at(in + row * stride, i) - 32);
  });
  return out;
}

bool group_gemv_q8_fast() { return RADIXSERVE_GROUP_Q8 != 0; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("group_gemv_q8(Tensor x, Tensor w, Tensor scales, Tensor scale_steps, bool halves=False) -> Tensor",
        group_gemv_q8);
  m.def("group_gemv_q8_fast() -> bool", group_gemv_q8_fast);
  m.def("group_gemv_q8_experts(Tensor x, int[] counts, Tensor[] w, Tensor[] scales, Tensor[] scale_steps) -> Tensor",
        group_gemv_q8_experts);
  m.def("pack_six_bits(Tensor codes) -> Tensor", pack_six_bits);
  m.def("unpack_six_bits(Tensor packed, int k) -> Tensor", unpack_six_bits);
}
