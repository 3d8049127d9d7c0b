// Few-row products with 8-bit group-quantized weights: a GGUF's Q8_0, Q5_0 and Q6_K tensors served
// as shipped (runtime/gguf_groups.py keeps their codes and per-group scales; runtime/cpu/
// gguf_linear.py calls this). A one-stream decode step only streams the weights, so reading one
// byte a weight instead of bf16's two is the step's speed; the default model's output layer
// alone is 168M weights.
//
// Weights: codes u8 [N, K] holding q + 128 (q the signed code, |q| <= 128) and float32 scales
// [N, K / group], w[n, k] = scales[n, k / group] * q[n, k], group 16 or 32 (Q6_K's sub-blocks,
// Q8_0's and Q5_0's blocks), K a multiple of 64.
// Activations: each row is rounded to int8 in runs of 32 with one float scale a run (llama.cpp's
// Q8_0 activations, which is what llama.cpp multiplies these formats with), so the products are
// integer dot products: AVX-512 VNNI's vpdpbusd does 64 multiply-adds an instruction, where
// converting codes to float first leaves the kernel compute-bound below the memory's speed.
// Every product of a group is exact in int32; the groups' sums are scaled and added in float.
//
// Rows are independent: a row's result never depends on which other rows share the call.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define RADIXSERVE_VNNI 1
#else
#define RADIXSERVE_VNNI 0
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kChunk = 64;   // weights per vpdpbusd
constexpr int64_t kXGroup = 32;  // activations per int8 scale
constexpr int64_t kMaxRows = 8;  // rows read with one pass over the weights

// One activation row rounded to int8 in runs of kXGroup: codes xq, the runs' scales xs, and per
// 4 codes (one int32 lane of vpdpbusd) -128 times their sum, which takes the weights' +128 back out.
template <typename T>
void quantize_row(const T* x, int64_t k, int8_t* xq, float* xs, int32_t* offset) {
  for (int64_t g = 0; g < k / kXGroup; ++g) {
    float top = 0.f;
    for (int64_t i = 0; i < kXGroup; ++i) top = std::max(top, std::fabs(static_cast<float>(x[g * kXGroup + i])));
    const float scale = top / 127.f, inv = top > 0.f ? 127.f / top : 0.f;
    xs[g] = scale;
    for (int64_t i = 0; i < kXGroup; ++i)
      xq[g * kXGroup + i] = static_cast<int8_t>(std::nearbyint(static_cast<float>(x[g * kXGroup + i]) * inv));
  }
  for (int64_t l = 0; l < k / 4; ++l)
    offset[l] = -128 * (xq[4 * l] + xq[4 * l + 1] + xq[4 * l + 2] + xq[4 * l + 3]);
}

// Weight rows [begin, end) against `rows` quantized activation rows, into out[m * n + j].
void dot_rows_portable(const uint8_t* w, const float* scales, int64_t n, int64_t k, int64_t group, int64_t begin,
                       int64_t end, int64_t rows, const int8_t* xq, const float* xs, float* out) {
  const int64_t groups = k / group;
  for (int64_t j = begin; j < end; ++j) {
    const uint8_t* wj = w + j * k;
    for (int64_t m = 0; m < rows; ++m) {
      const int8_t* xm = xq + m * k;
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t sum = 0;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) sum += (static_cast<int32_t>(wj[i]) - 128) * xm[i];
        acc += static_cast<float>(sum) * scales[j * groups + g] * xs[m * (k / kXGroup) + g * group / kXGroup];
      }
      out[m * n + j] = acc;
    }
  }
}

#if RADIXSERVE_VNNI
template <int M>
void dot_rows_vnni(const uint8_t* w, const float* scales, int64_t n, int64_t k, int64_t group, int64_t begin,
                   int64_t end, const int8_t* xq, const int32_t* offset, const float* xs_lanes, float* out) {
  const int64_t groups = k / group, chunks = k / kChunk, per_chunk = kChunk / group;
  // lane l of a chunk's int32 sums covers weights 4l..4l+3, all in weight group 4l / group
  alignas(64) int32_t lane_group[16];
  for (int l = 0; l < 16; ++l) lane_group[l] = static_cast<int32_t>(4 * l / group);
  const __m512i spread = _mm512_load_si512(lane_group);
  const __mmask16 scale_mask = static_cast<__mmask16>((1u << per_chunk) - 1);
  for (int64_t j = begin; j < end; ++j) {
    const uint8_t* wj = w + j * k;
    const float* sj = scales + j * groups;
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512i wv = _mm512_loadu_si512(wj + c * kChunk);
      const __m512 sv = _mm512_permutexvar_ps(spread, _mm512_maskz_loadu_ps(scale_mask, sj + c * per_chunk));
      for (int m = 0; m < M; ++m) {
        const __m512i sums = _mm512_dpbusd_epi32(_mm512_loadu_si512(offset + m * (k / 4) + c * 16), wv,
                                                 _mm512_loadu_si512(xq + m * k + c * kChunk));
        const __m512 scale = _mm512_mul_ps(sv, _mm512_loadu_ps(xs_lanes + (m * chunks + c) * 16));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) out[m * n + j] = _mm512_reduce_add_ps(acc[m]);
  }
}
#endif

void check(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t group) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "group_gemv: x is a contiguous CPU [rows, K] float32 or bfloat16 tensor");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && w.size(1) == x.size(1),
              "group_gemv: codes are contiguous uint8 [N, K] with K = x's width");
  TORCH_CHECK(group == 16 || group == 32, "group_gemv: group is 16 or 32");
  TORCH_CHECK(w.size(1) % kChunk == 0, "group_gemv: K is a multiple of 64");
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kFloat && scales.dim() == 2 &&
                  scales.size(0) == w.size(0) && scales.size(1) == w.size(1) / group,
              "group_gemv: scales are float32 [N, K / group]");
  TORCH_CHECK(x.size(0) <= kMaxRows, "group_gemv: at most 8 rows a call");
}

// x [rows, K] @ dequant(w, scales).T -> [rows, N] in x's dtype.
at::Tensor group_gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t group) {
  check(x, w, scales, group);
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0), chunks = k / kChunk;
  std::vector<int8_t> xq(rows * k);
  std::vector<float> xs(rows * (k / kXGroup));
  std::vector<int32_t> offset(rows * (k / 4));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "group_gemv", [&] {
    for (int64_t m = 0; m < rows; ++m)
      quantize_row(x.data_ptr<scalar_t>() + m * k, k, xq.data() + m * k, xs.data() + m * (k / kXGroup),
                   offset.data() + m * (k / 4));
  });
  at::Tensor out = at::empty({rows, n}, x.options().dtype(at::kFloat));
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / k);  // small layers stay on one thread
#if RADIXSERVE_VNNI
  // the activation scale of every int32 lane: lanes 0-7 of a chunk are its first run of 32, 8-15 its second
  std::vector<float> xs_lanes(rows * chunks * 16);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t l = 0; l < 16; ++l)
        xs_lanes[(m * chunks + c) * 16 + l] = xs[m * (k / kXGroup) + (c * kChunk + 4 * l) / kXGroup];
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    switch (rows) {
#define RADIXSERVE_ROWS(M) \
  case M:                  \
    return dot_rows_vnni<M>(wp, sp, n, k, group, begin, end, xq.data(), offset.data(), xs_lanes.data(), op);
      RADIXSERVE_ROWS(1) RADIXSERVE_ROWS(2) RADIXSERVE_ROWS(3) RADIXSERVE_ROWS(4)
      RADIXSERVE_ROWS(5) RADIXSERVE_ROWS(6) RADIXSERVE_ROWS(7) RADIXSERVE_ROWS(8)
#undef RADIXSERVE_ROWS
    }
  });
#else
  (void)chunks;
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    dot_rows_portable(wp, sp, n, k, group, begin, end, rows, xq.data(), xs.data(), op);
  });
#endif
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// Whether group_gemv runs the VNNI kernel on this build (else a portable loop, right but slow:
// the callers then leave such weights dequantized).
bool group_gemv_fast() { return RADIXSERVE_VNNI != 0; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("group_gemv(Tensor x, Tensor w, Tensor scales, int group) -> Tensor", group_gemv);
  m.def("group_gemv_fast() -> bool", group_gemv_fast);
}
