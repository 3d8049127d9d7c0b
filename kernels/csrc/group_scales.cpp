// Factoring per-group scales into int8 codes times one float32 step per span of groups (the
// factored form of group_scales.h), exactly or not at all.
//
// A GGUF k-quant's group scale is d * s, d the super-block's float16 and s a small integer (Q4_K:
// 6-bit scales and mins; Q6_K: signed 8-bit), but the converted checkpoint holds the products as
// float32. Each span's products are integer multiples of their smallest ulp; the greatest common
// divisor of those integers is a step of which every product is a small multiple. Found here at
// load time in one pass (the file format is unchanged), and checked: step * code must give each
// float32 back bit for bit, or the whole tensor keeps its float32 scales.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <tuple>

namespace {

// One span's values as codes and a step; false where no step with codes in [-128, 127] is exact.
bool factor_span(const float* v, int64_t span, int8_t* codes, float* step) {
  uint64_t mant[256];
  int exps[256];
  int low = 1 << 30;
  for (int64_t i = 0; i < span; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, sizeof(bits));
    const int field = (bits >> 23) & 0xFF;
    if (field == 0xFF) return false;  // inf or nan
    const uint32_t m = bits & 0x7FFFFF;
    mant[i] = field ? (m | 0x800000u) : m;  // value = mant * 2^(exp - 150)
    exps[i] = field ? field : 1;
    if (mant[i] != 0) low = std::min(low, exps[i]);
  }
  if (low == (1 << 30)) {  // all zero
    std::memset(codes, 0, span);
    *step = 0.f;
    return true;
  }
  uint64_t divisor = 0;
  for (int64_t i = 0; i < span; ++i) {
    if (mant[i] == 0) continue;
    const int shift = exps[i] - low;
    if (shift > 38) return false;  // a range no 8-bit code spans
    mant[i] <<= shift;
    divisor = std::gcd(divisor, mant[i]);
  }
  float s = static_cast<float>(std::ldexp(static_cast<double>(divisor), low - 150));
  if (static_cast<double>(s) != std::ldexp(static_cast<double>(divisor), low - 150)) return false;
  // A negative step where only it keeps the codes in [-128, 127]: llama.cpp's Q6_K quantizer
  // stores a negative d where a super-block's largest scale is positive, so that scale is
  // d * -128, a positive value 128 steps of |d| away (half the spans of a Qwen2.5 output layer).
  bool flip = false;
  for (int64_t i = 0; i < span; ++i)
    if (!std::signbit(v[i]) && mant[i] / divisor == 128u) flip = true;
  if (flip) s = -s;
  for (int64_t i = 0; i < span; ++i) {
    const uint64_t c = mant[i] / divisor;
    const bool negative = std::signbit(v[i]) != flip;  // the code's sign
    if (c > (negative ? 128u : 127u)) return false;
    const int code = negative ? -static_cast<int>(c) : static_cast<int>(c);
    if (s * static_cast<float>(code) != v[i]) return false;
    codes[i] = static_cast<int8_t>(code);
  }
  *step = s;
  return true;
}

// values float32 [N, G] -> (codes int8 [N, G], steps float32 [N, G / span]) with
// values == steps[:, g / span] * codes exactly; both empty where some span has no such factors.
std::tuple<at::Tensor, at::Tensor> factor_scales(const at::Tensor& values, int64_t span) {
  TORCH_CHECK(values.dim() == 2 && values.is_contiguous() && values.scalar_type() == at::kFloat,
              "factor_scales: values are contiguous float32 [N, groups]");
  TORCH_CHECK(span >= 1 && span <= 256 && values.size(1) % span == 0, "factor_scales: span in 1..256 divides groups");
  const int64_t rows = values.size(0), groups = values.size(1), spans = groups / span;
  at::Tensor codes = at::empty({rows, groups}, values.options().dtype(at::kChar));
  at::Tensor steps = at::empty({rows, spans}, values.options());
  const float* v = values.data_ptr<float>();
  int8_t* c = codes.data_ptr<int8_t>();
  float* s = steps.data_ptr<float>();
  std::atomic<bool> exact{true};
  at::parallel_for(0, rows * spans, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end && exact.load(std::memory_order_relaxed); ++i)
      if (!factor_span(v + i * span, span, c + i * span, s + i)) exact = false;
  });
  if (!exact) return {at::empty({0}, codes.options()), at::empty({0}, steps.options())};
  return {codes, steps};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("factor_scales(Tensor values, int span) -> (Tensor, Tensor)", factor_scales);
}
