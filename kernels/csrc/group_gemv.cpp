// Few-row products with 8-bit group-quantized weights: a GGUF's Q8_0, Q5_0 and Q6_K tensors served
// as shipped (runtime/loading/gguf_int8_groups.py keeps their codes and per-group scales; runtime/cpu/
// block_weights.py calls this). A one-stream decode step only streams the weights, so reading one
// byte a weight instead of bf16's two is the step's speed; the default model's output layer
// alone is 168M weights.
//
// Weights: signed codes int8 [N, K] and scales [N, K / group], w[n, k] = scales[n, k / group] *
// codes[n, k], group 16 or 32 (Q6_K's sub-blocks, Q8_0's and Q5_0's blocks). Scales are float16
// where the format's are (Q8_0, Q5_0: a sixteenth of a byte a weight instead of an eighth, 6% of
// the output layer's bytes); Q6_K's are d * an 8-bit scale, held as int8 codes times a float32
// step per super-block (group_scales.h: 8.6 bits a weight instead of 10 with float32 scales).
// Activations stay as they come (float32 or bf16, taken to float32); each group's sum of code x
// activation is formed in float32 and scaled once. So the product is of the exact shipped weights
// with the exact activations, up to the order of float sums: closer to the checkpoint than bf16
// weights (bf16 keeps 8 significant bits of a Q8_0 weight's up to 18) and than llama.cpp, which
// rounds the activations to 8 bits.
//
// Rows are independent: a row's result depends on the rows sharing the call only through how
// many there are (1, 2, more), which sets how many partial sums a row keeps, so the order of its
// float32 additions; bf16 results round that away. With int16 activations a call of
// radixserve::panel::rows_from() rows or more takes the panel loop (int16_panel.h), whose float
// sums run in another order than the one-row loop's: the same bits in every call of either kind.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "activations16.h"
#include "group_scales.h"
#include "int16_panel.h"
#include "row_count.h"
#include "vector_sum.h"
#include "weight_prefetch.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define RADIXSERVE_GROUP_SIMD 512
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RADIXSERVE_GROUP_SIMD 256
#else
#define RADIXSERVE_GROUP_SIMD 0
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

// Full unrolling of the loops over activation rows and accumulators, so they live in registers.
#define RADIXSERVE_GROUP_UNROLL _Pragma("GCC unroll 8")

namespace {

constexpr int64_t kMaxRows = 8;  // rows read with one pass over the weights (with exact activations)
constexpr int64_t kBlockBytes = int64_t{64} << 10;  // weights dot_rows16 takes a block at a time

#if defined(__AVX2__) && defined(__FMA__)
// A vector's lanes summed: AVX2's in vector_sum.h's fixed order, AVX-512's by its own reduction.
inline float lanes_sum(__m256 v) { return radixserve::reduce_add(v); }
#if RADIXSERVE_GROUP_SIMD == 512
inline float lanes_sum(__m512 v) { return _mm512_reduce_add_ps(v); }
#endif

// A weight row's groups in turn, A at a time into A accumulators (one_group(g, acc[a])), the
// weights prefetched `Lines` cache lines ahead; then each activation row's accumulators summed
// into out[m * n]. V: __m256 (AVX2's loops) or __m512 (AVX-512's).
template <int M, int A, int Lines, typename V, typename OneGroup, typename O>
inline void groups_in_turn(const int8_t* wj, int64_t groups, int64_t group, V (&acc)[A][M], OneGroup&& one_group,
                           O* out, int64_t n) {
  int64_t g = 0;
  for (; g + A <= groups; g += A) {
    radixserve::prefetch_ahead<Lines>(reinterpret_cast<const uint8_t*>(wj + g * group));
    RADIXSERVE_GROUP_UNROLL
    for (int a = 0; a < A; ++a) one_group(g + a, acc[a]);
  }
  for (; g < groups; ++g) one_group(g, acc[0]);
  RADIXSERVE_GROUP_UNROLL
  for (int m = 0; m < M; ++m) {
    V sum = acc[0][m];
    RADIXSERVE_GROUP_UNROLL
    for (int a = 1; a < A; ++a) sum = sum + acc[a][m];  // one vector add, either width
    out[m * n] = static_cast<O>(lanes_sum(sum));
  }
}
#endif

// Weight rows [begin, end) against M float activation rows x [M, k], into out[m * n + j]
// (rounded once, to the activations' dtype O).
template <int M, typename O>
void dot_rows(const int8_t* w, const radixserve::GroupScales& scales, int64_t n, int64_t k, int64_t group,
              int64_t begin, int64_t end, const float* x, O* out) {
  const int64_t groups = k / group;
  std::vector<float> row_scales(groups);
  const float* sj = row_scales.data();
  for (int64_t j = begin; j < end; ++j) {
    const int8_t* wj = w + j * k;
    scales.expand(j, 1, row_scales.data());
#if RADIXSERVE_GROUP_SIMD == 512
    // A accumulators a row, taking the groups in turn: one would make every group wait on the
    // last one's multiply-add (4 cycles for 16 weights). Activation rows go up to four at a time
    // over the weight row (in the first-level cache after the first pass), each row summed in the
    // same order alone or in a batch: A chosen by the call's count (4 at one or two rows, 2 past)
    // gave bf16 results a bit apart in 69 of 300 random batches of 8, as AVX2's loop did before it.
    // (Two rows a pass cost 8-row calls up to 40%; four hold 16 accumulators and 4 partial sums.)
    const auto rows_of = [&](auto count, int64_t m0) {
      constexpr int P = decltype(count)::value;  // activation rows m0.. (1 to 4)
      constexpr int A = 4;
      const float* xp = x + m0 * k;
      __m512 acc[A][P];
      RADIXSERVE_GROUP_UNROLL
      for (int a = 0; a < A; ++a)
        RADIXSERVE_GROUP_UNROLL
        for (int m = 0; m < P; ++m) acc[a][m] = _mm512_setzero_ps();
      const auto one_group = [&](int64_t g, __m512 (&into)[P]) {
        __m512 part[P];
        RADIXSERVE_GROUP_UNROLL
        for (int m = 0; m < P; ++m) part[m] = _mm512_setzero_ps();
        for (int64_t i = g * group; i < (g + 1) * group; i += 16) {
          const __m512 wv =
              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wj + i))));
          RADIXSERVE_GROUP_UNROLL
          for (int m = 0; m < P; ++m) part[m] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xp + m * k + i), part[m]);
        }
        const __m512 scale = _mm512_set1_ps(sj[g]);
        RADIXSERVE_GROUP_UNROLL
        for (int m = 0; m < P; ++m) into[m] = _mm512_fmadd_ps(part[m], scale, into[m]);
      };
      groups_in_turn<P, A, 2>(wj, groups, group, acc, one_group, out + m0 * n + j, n);  // A groups: 128 bytes at most
    };
    for (int64_t m0 = 0; m0 < M; m0 += 4)
      radixserve::with_row_count<4>(std::min<int64_t>(4, M - m0), [&](auto count) { rows_of(count, m0); });
#elif RADIXSERVE_GROUP_SIMD == 256
    // As above, in AVX2's 16 registers: A groups in flight and a group's products in two chains
    // (even and odd vectors of 8). One chain a row waited 4 cycles on each multiply-add: the
    // default model's output layer (262144 x 640) read 10-12 GB/s on a 2-core AVX2 EPYC, where a
    // read streams 29; so, 21-23 GB/s (a standalone build of both, alternated; 4 weight rows a
    // pass instead of one, as the int4 kernel does, read 15-18: one stream a thread suits the
    // prefetchers better). AVX2's registers hold that for two activation rows, so more rows go
    // two at a time over the weight row (in the first-level cache after the first two), each row
    // summed in the same order alone or in a batch: A and the chains chosen by the call's count
    // (4 groups at one row, 1 group and one chain past 4) gave bf16 results a bit apart in 65 of
    // 300 random batches of 8.
    const auto rows_of = [&](auto count, int64_t m0) {
      constexpr int P = decltype(count)::value;  // activation rows m0.. (1 or 2)
      constexpr int A = 4;
      const float* xp = x + m0 * k;
      __m256 acc[A][P];
      RADIXSERVE_GROUP_UNROLL
      for (int a = 0; a < A; ++a)
        RADIXSERVE_GROUP_UNROLL
        for (int m = 0; m < P; ++m) acc[a][m] = _mm256_setzero_ps();
      const auto codes = [&](int64_t i) {
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wj + i))));
      };
      const auto one_group = [&](int64_t g, __m256 (&into)[P]) {
        __m256 even[P], odd[P];  // group 16 or 32: 2 or 4 vectors of 8, taken in pairs
        RADIXSERVE_GROUP_UNROLL
        for (int m = 0; m < P; ++m) {
          even[m] = _mm256_setzero_ps();
          odd[m] = _mm256_setzero_ps();
        }
        for (int64_t i = g * group; i < (g + 1) * group; i += 16) {
          const __m256 w0 = codes(i), w1 = codes(i + 8);
          RADIXSERVE_GROUP_UNROLL
          for (int m = 0; m < P; ++m) {
            even[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp + m * k + i), even[m]);
            odd[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp + m * k + i + 8), odd[m]);
          }
        }
        const __m256 scale = _mm256_set1_ps(sj[g]);
        RADIXSERVE_GROUP_UNROLL
        for (int m = 0; m < P; ++m) into[m] = _mm256_fmadd_ps(_mm256_add_ps(even[m], odd[m]), scale, into[m]);
      };
      groups_in_turn<P, A, A * 32 / 64 + 1>(wj, groups, group, acc, one_group, out + m0 * n + j, n);
    };
    int64_t m0 = 0;
    for (; m0 + 2 <= M; m0 += 2) rows_of(std::integral_constant<int, 2>{}, m0);
    if (m0 < M) rows_of(std::integral_constant<int, 1>{}, m0);
#else
    for (int m = 0; m < M; ++m) {
      const float* xm = x + m * k;
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        float part = 0.f;
#pragma omp simd reduction(+ : part)
        for (int64_t i = g * group; i < (g + 1) * group; ++i) part += static_cast<float>(wj[i]) * xm[i];
        acc += part * sj[g];
      }
      out[m * n + j] = static_cast<O>(acc);
    }
#endif
  }
}

// One weight row against M activation rows rounded to int16 a group at a time (activations16.h):
// x16 [M, k] codes (rows k apart), both [M, groups] the weights' scale times the activations'. A
// group's products are summed in 32-bit integers (one vpmaddwd multiplies 16 codes by 16
// activations and adds them in pairs), then scaled once, in float32. Half the bytes of
// activations to reread for every weight row, and about half the instructions a weight.
template <int M, typename O>
inline void row16(const int8_t* wj, int64_t k, int64_t group, const int16_t* x16, const float* both, O* out, int64_t n) {
  const int64_t groups = k / group;
#if defined(__AVX2__) && defined(__FMA__)
  // two float accumulators a row at any row count (the groups taken in turn): a row's bits are
  // the same alone and in a batch; a group's integer work covers one multiply-add's latency
  constexpr int A = 2;
  __m256 acc[A][M];
  RADIXSERVE_GROUP_UNROLL
  for (int a = 0; a < A; ++a)
    RADIXSERVE_GROUP_UNROLL
    for (int m = 0; m < M; ++m) acc[a][m] = _mm256_setzero_ps();
  const auto one_group = [&](int64_t g, __m256 (&into)[M]) {
    __m256i sum[M];
    RADIXSERVE_GROUP_UNROLL
    for (int m = 0; m < M; ++m) sum[m] = _mm256_setzero_si256();
    for (int64_t i = g * group; i < (g + 1) * group; i += 16) {
      const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wj + i)));
      RADIXSERVE_GROUP_UNROLL
      for (int m = 0; m < M; ++m)
        sum[m] = _mm256_add_epi32(sum[m], _mm256_madd_epi16(
            wv, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x16 + m * k + i))));
    }
    RADIXSERVE_GROUP_UNROLL
    for (int m = 0; m < M; ++m)
      into[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m]), _mm256_broadcast_ss(both + m * groups + g), into[m]);
  };
  groups_in_turn<M, A, A * 32 / 64 + 1>(wj, groups, group, acc, one_group, out, n);
#else
  for (int m = 0; m < M; ++m) {
    const int16_t* xm = x16 + m * k;
    float acc = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      int32_t part = 0;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) part += int32_t{wj[i]} * int32_t{xm[i]};
      acc = std::fma(static_cast<float>(part), both[m * groups + g], acc);
    }
    out[m * n] = static_cast<O>(acc);
  }
#endif
}

// Weight rows [begin, end) against `rows` activation rows rounded to int16 (x16 [rows, k], xs
// [rows, groups] their scales), into out[m * n + j]: the weight rows in blocks of about
// kBlockBytes (kept in the second-level cache), each block against the activation rows four at a
// time (those in the first-level cache: 12 KB at K = 1536). All the activation rows at once took
// 3 registers a row, which AVX2's 16 ran out of past 4 rows (spills; and past 8 rows there was no
// kernel: 16 decode rows went to dequantized slices and a float GEMM, 2-4 times slower); a weight
// row at a time against all the rows brought them all through the first-level cache again for
// every weight row.
template <typename O>
void dot_rows16(const int8_t* w, const radixserve::GroupScales& scales, int64_t n, int64_t k, int64_t group,
                int64_t begin, int64_t end, const int16_t* x16, const float* xs, int64_t rows, O* out) {
  const int64_t groups = k / group, block = std::max<int64_t>(1, kBlockBytes / k);
  std::vector<float> row_scales(block * groups), both(4 * groups);  // both: weights' scale x activations'
  for (int64_t b0 = begin; b0 < end; b0 += block) {
    const int64_t b1 = std::min(end, b0 + block);
    scales.expand(b0, b1 - b0, row_scales.data());
    for (int64_t m0 = 0; m0 < rows; m0 += 4)
      radixserve::with_row_count<4>(std::min<int64_t>(4, rows - m0), [&](auto count) {
        constexpr int M = decltype(count)::value;
        for (int64_t j = b0; j < b1; ++j) {
          const float* sj = row_scales.data() + (j - b0) * groups;
          for (int m = 0; m < M; ++m)
            for (int64_t g = 0; g < groups; ++g) both[m * groups + g] = sj[g] * xs[(m0 + m) * groups + g];
          row16<M>(w + j * k, k, group, x16 + m0 * k, both.data(), out + m0 * n + j, n);
        }
      });
  }
}

void check(const at::Tensor& x, const at::Tensor& w, int64_t group, bool int16_activations) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "group_gemv: x is a CPU [rows, K] float32 or bfloat16 tensor");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kChar && w.size(1) == x.size(1),
              "group_gemv: codes are contiguous int8 [N, K] with K = x's width");
  TORCH_CHECK(group == 16 || group == 32, "group_gemv: group is 16 or 32");
  TORCH_CHECK(w.size(1) % group == 0, "group_gemv: K is a multiple of the group");
  TORCH_CHECK(int16_activations || x.size(0) <= kMaxRows, "group_gemv: at most 8 rows a call (any with int16 activations)");
}

// x [rows, K] @ (scales * codes).T -> [rows, N] in x's dtype; scales [N, K / group] in one of
// group_scales.h's forms (int8 codes with their steps).
at::Tensor group_gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t group,
                      const std::optional<at::Tensor>& scale_steps, bool int16_activations) {
  check(x, w, group, int16_activations);
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  const auto sg = radixserve::GroupScales::of(scales, scale_steps, n, k / group, "group_gemv");
  // A few KB, converted once and read by every weight row; no tensor ops around the kernel (a
  // decode step makes ~45 of these calls, where a dispatch costs as much as a small layer's work).
  std::vector<float> xf(rows * k);
  at::Tensor out = at::empty({rows, n}, x.options());
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* xp = xf.data();
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / k);  // small layers stay on one thread
  const auto run = [&](auto* op) {
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
      radixserve::with_row_count(rows, [&](auto count) {
        constexpr int M = decltype(count)::value;
        dot_rows<M>(wp, sg, n, k, group, begin, end, xp, op);
      });
    });
  };
  const auto run16 = [&](auto* op, const int16_t* x16, const float* xs) {
#if defined(__AVX2__) && defined(__FMA__)
    if (rows >= radixserve::panel::rows_from()) {
      using radixserve::panel::kCols;
      at::parallel_for(0, (n + kCols - 1) / kCols, 1, [&](int64_t begin, int64_t end) {
        radixserve::panel::products(wp, sg, n, k, group, begin, end, x16, xs, rows, op);
      });
      return;
    }
#endif
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
      dot_rows16(wp, sg, n, k, group, begin, end, x16, xs, rows, op);
    });
  };
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "group_gemv", [&] {
    const scalar_t* xs = x.data_ptr<scalar_t>();
    const int64_t step = x.stride(1);
    for (int64_t m = 0; m < rows; ++m) {
      const scalar_t* row = xs + m * x.stride(0);
      float* dst = xf.data() + m * k;
      if (step == 1)  // the decode step's case: a loop the compiler vectorizes
        for (int64_t i = 0; i < k; ++i) dst[i] = static_cast<float>(row[i]);
      else
        for (int64_t i = 0; i < k; ++i) dst[i] = static_cast<float>(row[i * step]);
    }
    if (int16_activations) {
      std::vector<int16_t, radixserve::CacheLineAllocator<int16_t>> x16(rows * k);
      std::vector<float> xs(rows * (k / group));
      radixserve::round_to_int16(xf.data(), rows * k, group, x16.data(), xs.data());
      run16(out.data_ptr<scalar_t>(), x16.data(), xs.data());
      return;
    }
    run(out.data_ptr<scalar_t>());
  });
  return out;
}

// Whether group_gemv runs a vector loop on this build (AVX-512, or AVX2 with FMA), which streams
// one decode row's weights at memory speed; the portable loop is right but several times slower
// than the dequantized weights, so the default leaves such weights dequantized there.
bool group_gemv_fast() { return RADIXSERVE_GROUP_SIMD != 0; }

// The fewest rows a call with int16 activations takes the panel loop for (0: this build has none).
int64_t group_gemv_panel_rows() {
#if defined(__AVX2__) && defined(__FMA__)
  return radixserve::panel::rows_from();
#else
  return 0;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("group_gemv(Tensor x, Tensor w, Tensor scales, int group, Tensor? scale_steps=None, bool int16_activations=False) -> Tensor",
        group_gemv);
  m.def("group_gemv_fast() -> bool", group_gemv_fast);
  m.def("group_gemv_panel_rows() -> int", group_gemv_panel_rows);
}
