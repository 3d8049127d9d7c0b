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
#include "group_scales.h"
#include "q8_panel.h"
#include "row_count.h"
#include "vector_sum.h"
#include "weight_prefetch.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RADIXSERVE_GROUP_Q8 1
#else
#define RADIXSERVE_GROUP_Q8 0
#endif

#include <algorithm>
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
  int64_t k = 0, supers = 0;
  std::vector<int8_t, radixserve::CacheLineAllocator<int8_t>> q;  // [rows, k]
  std::vector<float> scale;                                       // [rows, supers]
  std::vector<int16_t> sums;                                      // [rows, k / 16]: each group's sum of q
};

template <typename T>
void quantize_rows(const at::Tensor& x, Q8Rows& a, int64_t begin, int64_t end) {
  const int64_t k = a.k;
  const T* xs = x.data_ptr<T>();
  alignas(64) float v[kSuperBlock];
  for (int64_t m = begin; m < end; ++m)
    for (int64_t s = 0; s < a.supers; ++s) {
      int8_t* q = a.q.data() + m * k + s * kSuperBlock;
      radixserve::load_super(x, xs, m, s, v);
      a.scale[m * a.supers + s] = radixserve::round_super_to_int8(v, q);
      for (int64_t g = 0; g < kSpan; ++g) {
        int sum = 0;
        for (int64_t i = 0; i < kGroup; ++i) sum += q[g * kGroup + i];
        a.sums[(m * a.supers + s) * kSpan + g] = static_cast<int16_t>(sum);
      }
    }
}

#if RADIXSERVE_GROUP_Q8
// Weight row j (codes wj [k], scale codes cj [k / 16], steps sj [supers]) against M activation
// rows from m0; into out[(m0 + m) * n].
template <int M, typename O>
inline void row_q8(const int8_t* wj, const int8_t* cj, const float* sj, const Q8Rows& a, int64_t m0, O* out,
                   int64_t n) {
  const int64_t k = a.k;
  const __m256i offset = _mm256_set1_epi8(32);
  __m256 acc[M];
  RADIXSERVE_UNROLL
  for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t s = 0; s < a.supers; ++s) {
    // the stream asked for ahead, as group_gemv.cpp's: in the engine (real 1.5B, one stream,
    // alternated in one process) 83.8 against 89.6 ms a token without it
    radixserve::prefetch_ahead<4>(reinterpret_cast<const uint8_t*>(wj + s * kSuperBlock));
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(cj + s * kSpan));
    __m256i sum[M];
    RADIXSERVE_UNROLL
    for (int m = 0; m < M; ++m) sum[m] = _mm256_setzero_si256();
    RADIXSERVE_UNROLL
    for (int c = 0; c < kSpan / 2; ++c) {  // 32 codes: groups 2c (the low 128 bits) and 2c + 1
      const __m256i w = _mm256_add_epi8(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj + s * kSuperBlock + 32 * c)), offset);
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
template <typename O>
void dot_rows(const int8_t* w, const int8_t* codes, const float* steps, int64_t n, int64_t begin, int64_t end,
              const Q8Rows& a, int64_t rows, O* out) {
#if RADIXSERVE_GROUP_Q8
  const int64_t k = a.k, groups = k / kGroup, block = std::max<int64_t>(1, kBlockBytes / k);
  for (int64_t b0 = begin; b0 < end; b0 += block) {
    const int64_t b1 = std::min(end, b0 + block);
    for (int64_t m0 = 0; m0 < rows; m0 += 4)
      radixserve::with_row_count<4>(std::min<int64_t>(4, rows - m0), [&](auto count) {
        constexpr int M = decltype(count)::value;
        for (int64_t j = b0; j < b1; ++j)
          row_q8<M>(w + j * k, codes + j * groups, steps + j * a.supers, a, m0, out + j, n);
      });
  }
#endif
}

// x [rows, K] @ (scale codes * steps * codes).T -> [rows, N] in x's dtype, x rounded to int8 per 256.
at::Tensor group_gemv_q8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                         const at::Tensor& scale_steps) {
  TORCH_CHECK(RADIXSERVE_GROUP_Q8, "group_gemv_q8: this CPU lacks AVX2 (group_gemv_q8_fast() is false)");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "group_gemv_q8: x is a CPU [rows, K] float32 or bfloat16 tensor");
  TORCH_CHECK(x.size(1) % kSuperBlock == 0, "group_gemv_q8: K is a multiple of 256");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kChar && w.size(1) == x.size(1),
              "group_gemv_q8: codes are contiguous int8 [N, K] with K = x's width");
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, k / kGroup, "group_gemv_q8");
  TORCH_CHECK(sg.type == at::kChar && sg.span == kSpan,
              "group_gemv_q8: scales are int8 codes a group of 16 with a float32 step per 16 groups (Q6_K's)");
  Q8Rows a;
  a.k = k;
  a.supers = k / kSuperBlock;
  a.q.resize(rows * k);
  a.scale.resize(rows * a.supers);
  a.sums.resize(rows * (k / kGroup));
  at::Tensor out = at::empty({rows, n}, x.options());
  const int8_t* wp = w.data_ptr<int8_t>();
  const int8_t* cp = static_cast<const int8_t*>(sg.values);
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / k);  // small layers stay on one thread
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "group_gemv_q8", [&] {
    // on one thread for a few rows (a decode step), spread over the threads for a prompt's
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) { quantize_rows<scalar_t>(x, a, begin, end); });
    scalar_t* op = out.data_ptr<scalar_t>();
#if RADIXSERVE_Q8_PANEL
    if (rows >= radixserve::q8panel::rows_from()) {  // q8_panel.h's panel loop (AVX2)
      namespace panel = radixserve::q8panel;
      std::vector<int32_t> offsets(rows * (k / kGroup));
      at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t m = begin; m < end; ++m) panel::codes::offsets(a.q.data() + m * k, k, offsets.data() + m * (k / kGroup));
      });
      at::parallel_for(0, (n + panel::kCols - 1) / panel::kCols, 1, [&](int64_t begin, int64_t end) {
        panel::codes::products(wp, cp, sg.steps, n, k, begin, end, a.q.data(), a.scale.data(), offsets.data(), rows, op);
      });
      return;
    }
#endif
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
      dot_rows(wp, cp, sg.steps, n, begin, end, a, rows, op);
    });
  });
  return out;
}

bool group_gemv_q8_fast() { return RADIXSERVE_GROUP_Q8 != 0; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("group_gemv_q8(Tensor x, Tensor w, Tensor scales, Tensor scale_steps) -> Tensor", group_gemv_q8);
  m.def("group_gemv_q8_fast() -> bool", group_gemv_q8_fast);
}
