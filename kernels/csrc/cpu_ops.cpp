// Fused CPU kernels for the small work of a step: RMS norms, the residual add between them, q/k
// norm + rotary, and decode attention over the paged KV pool. On one decode row each of these is a
// few hundred floats, and the torch ops they replace cost far more in dispatch than in arithmetic
// (a Gemma 3 layer was 68 op calls, two thirds of a one-row step's time). Each kernel here is one
// call that does the whole piece in float and rounds where the torch ops it replaces round, so a
// model gives the same activations with or without them, up to the order of float sums
// (kernels/cpu_ops.py builds this file and the callers fall back to those torch ops;
// tests/kernels/test_cpu_ops.py compares the two).
//
// Rows are independent: a row's result never depends on which other rows share the call, so a
// request computes the same numbers alone or in a batch.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

// Below this many elements per call a row loop runs on the calling thread: waking the pool
// costs more than the work.
constexpr int64_t kGrainElements = 1 << 15;

int64_t grain_rows(int64_t width) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, width)); }

template <typename T>
inline float inv_rms(const T* x, int64_t n, double eps) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    sum += v * v;
  }
  return 1.f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
}

// One row normalised into out. scaled: Gemma's form, T(x * r * scale) with scale = 1 + w in
// float; else Llama's, T(w * T(x * r)) with w in the activations' dtype.
template <typename T>
inline void norm_row(const T* x, int64_t n, const void* weight, bool scaled, double eps, T* out) {
  const float r = inv_rms(x, n, eps);
  if (scaled) {
    const float* s = static_cast<const float*>(weight);
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<float>(x[i]) * r * s[i]);
  } else {
    const T* w = static_cast<const T*>(weight);
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(static_cast<T>(static_cast<float>(x[i]) * r)));
  }
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu(), name, ": CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, name, ": a [rows, width] tensor with contiguous rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name, ": float32 or bfloat16");
}

void check_weight(const at::Tensor& w, const at::Tensor& x, bool scaled, const char* name) {
  TORCH_CHECK(w.is_contiguous() && w.numel() == x.size(1), name, ": one weight per column");
  TORCH_CHECK(w.scalar_type() == (scaled ? at::kFloat : x.scalar_type()), name,
              ": the scale is float32 (Gemma) or the weight has the activations' dtype");
}

// out = norm(x) * weight, row by row.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool scaled) {
  check_rows(x, "rms_norm");
  check_weight(weight, x, scaled, "rms_norm");
  const int64_t rows = x.size(0), n = x.size(1), stride = x.stride(0);
  at::Tensor out = at::empty({rows, n}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    const void* w = weight.data_ptr();
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) norm_row(src + r * stride, n, w, scaled, eps, dst + r * n);
    });
  });
  return out;
}

// The residual step between two sub-blocks: x + post_norm(y) (Gemma's sandwich norm; without a
// post weight, x + y), then the next sub-block's input norm of that sum. Returns (sum, normed).
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& y,
                                                const c10::optional<at::Tensor>& post, const at::Tensor& weight,
                                                double eps, bool scaled) {
  check_rows(x, "add_rms_norm");
  check_rows(y, "add_rms_norm");
  TORCH_CHECK(x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type(), "add_rms_norm: x and y alike");
  check_weight(weight, x, scaled, "add_rms_norm");
  const bool has_post = post.has_value() && post->defined();
  if (has_post) check_weight(*post, x, scaled, "add_rms_norm (post)");
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor sum = at::empty({rows, n}, x.options());
  at::Tensor out = at::empty({rows, n}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "add_rms_norm", [&] {
    const scalar_t* xs = x.data_ptr<scalar_t>();
    const scalar_t* ys = y.data_ptr<scalar_t>();
    scalar_t* sums = sum.data_ptr<scalar_t>();
    scalar_t* outs = out.data_ptr<scalar_t>();
    const void* w = weight.data_ptr();
    const void* pw = has_post ? post->data_ptr() : nullptr;
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> normed(has_post ? n : 0);
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* xr = xs + r * x.stride(0);
        const scalar_t* yr = ys + r * y.stride(0);
        scalar_t* s = sums + r * n;
        if (has_post) {
          norm_row(yr, n, pw, scaled, eps, normed.data());
          yr = normed.data();
        }
        for (int64_t i = 0; i < n; ++i) s[i] = static_cast<scalar_t>(static_cast<float>(xr[i]) + static_cast<float>(yr[i]));
        norm_row(s, n, w, scaled, eps, outs + r * n);
      }
    });
  });
  return {sum, out};
}

// q and k heads side by side ([tokens, heads, head_dim], rows of the fused projection): each head
// RMS-normed in float and multiplied by its own scale (Gemma's q_norm/k_norm, scale [heads,
// head_dim]; none: no norm, as in Llama), rounded, then rotated (rotate-half form) by cos/sin
// ([tokens, rot_dim]). Columns past rot_dim pass through. Returns a new [tokens, heads, head_dim].
at::Tensor qk_norm_rope(const at::Tensor& qk, const c10::optional<at::Tensor>& scale, const at::Tensor& cos,
                        const at::Tensor& sin, double eps) {
  TORCH_CHECK(qk.device().is_cpu() && qk.dim() == 3 && qk.stride(2) == 1 && qk.stride(1) == qk.size(2),
              "qk_norm_rope: a CPU [tokens, heads, head_dim] tensor with contiguous heads");
  TORCH_CHECK(qk.scalar_type() == at::kFloat || qk.scalar_type() == at::kBFloat16, "qk_norm_rope: float32 or bfloat16");
  const int64_t tokens = qk.size(0), heads = qk.size(1), dim = qk.size(2), rot = cos.size(1), half = rot / 2;
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.size(0) == tokens &&
                  rot % 2 == 0 && rot <= dim && cos.scalar_type() == qk.scalar_type() &&
                  sin.scalar_type() == qk.scalar_type(),
              "qk_norm_rope: cos and sin are [tokens, rot_dim] in qk's dtype");
  const bool has_scale = scale.has_value() && scale->defined();
  if (has_scale)
    TORCH_CHECK(scale->is_contiguous() && scale->scalar_type() == at::kFloat && scale->numel() == heads * dim,
                "qk_norm_rope: scale is float32 [heads, head_dim]");
  at::Tensor out = at::empty({tokens, heads, dim}, qk.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, qk.scalar_type(), "qk_norm_rope", [&] {
    const scalar_t* src = qk.data_ptr<scalar_t>();
    const scalar_t* cs = cos.data_ptr<scalar_t>();
    const scalar_t* sn = sin.data_ptr<scalar_t>();
    const float* sc = has_scale ? scale->data_ptr<float>() : nullptr;
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, grain_rows(heads * dim), [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> head(dim);
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* c = cs + t * rot;
        const scalar_t* s = sn + t * rot;
        for (int64_t h = 0; h < heads; ++h) {
          const scalar_t* x = src + t * qk.stride(0) + h * dim;
          scalar_t* o = dst + (t * heads + h) * dim;
          if (has_scale) {
            const float r = inv_rms(x, dim, eps);
            const float* w = sc + h * dim;
            for (int64_t i = 0; i < dim; ++i) head[i] = static_cast<scalar_t>(static_cast<float>(x[i]) * r * w[i]);
          } else {
            for (int64_t i = 0; i < dim; ++i) head[i] = x[i];
          }
          // x * cos, rounded, then -/+ the other half times sin (one rounding), as the torch ops
          for (int64_t i = 0; i < half; ++i) {
            const float a = static_cast<float>(head[i]), b = static_cast<float>(head[i + half]);
            const float ac = static_cast<float>(static_cast<scalar_t>(a * static_cast<float>(c[i])));
            const float bc = static_cast<float>(static_cast<scalar_t>(b * static_cast<float>(c[i + half])));
            o[i] = static_cast<scalar_t>(ac - b * static_cast<float>(s[i]));
            o[i + half] = static_cast<scalar_t>(bc + a * static_cast<float>(s[i + half]));
          }
          for (int64_t i = rot; i < dim; ++i) o[i] = head[i];
        }
      }
    });
  });
  return out;
}

// A float from a bfloat16's bits (what c10::BFloat16 does, spelled so the compiler vectorizes it).
inline float as_float(c10::BFloat16 v) {
  uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline float as_float(float v) { return v; }

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = as_float(src[i]);
}

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void axpy(float a, const float* x, float* acc, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) acc[i] += a * x[i];
}

// Keys per piece of one request's span: a long span is cut into pieces that run on different
// threads (flash-decoding) and are merged by their softmax maxima and sums.
constexpr int64_t kSpanPiece = 1024;

#if defined(__AVX2__) && defined(__FMA__)
// Eight keys' scores against one query head, side by side (dim a multiple of 8): a lone dot
// product is one chain of dim / 8 dependent multiply-adds, and waiting on their latency was most of
// a one-row decode step's attention (75 us a layer for 100 keys, 12 heads of 128, on one Zen 3
// core). Every lane's sum runs the same tree, so a key's score does not depend on its neighbours.
inline __m256 dot8(const float* q, const float* const* k, int64_t dim) {
  __m256 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[i] + d), a[i]);
  }
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
#endif

template <typename T>
inline void prefetch_row(const T* row, int64_t dim) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t at = 0; at < dim * static_cast<int64_t>(sizeof(T)); at += 64) __builtin_prefetch(bytes + at);
}

// Key j's row in float: the cache's own row where it is float, else converted into `into`.
template <typename T>
inline const float* key_row(const T* ks, int64_t slot, int64_t kv_heads, int64_t kh, int64_t dim, float* into) {
  const T* row = ks + (slot * kv_heads + kh) * dim;
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    to_float(row, into, dim);
    return into;
  }
}

// One query head's share of a unit of attention work: unit keys [from, to), the keys of one piece
// of its own span, and where its max score, sum of exp and exp-weighted sum of values go.
struct QueryPiece {
  int64_t from, to;
  float* top;
  float* total;
  float* acc;
};

// The pieces of several query heads of one KV head over keys slots[0:span]: the heads sharing the
// KV head (GQA) and, for a run of one request's new tokens (a jump-forward or n-gram draft, a short
// turn: each a row of its own), the same piece of each token's span, which differ by a key a
// token. Each K and V row is loaded and converted once for all of them; a draft of 4 tokens once
// read its request's KV 5 times, and attention was a quarter of a jump-forward step (8 streams,
// default model, Xeon with AMX). Each head's result is what it gets alone, bit for bit: a key's
// score does not depend on the keys beside it (dot8), and the max, the sum of exp and the values'
// sum run over its own keys in the same order. So a token's attention is the same in a draft's
// run as in a decode step.
template <typename T>
void attend_unit(const float* qf, int64_t queries, int64_t dim, const T* ks, const T* vs, const int64_t* slots,
                 int64_t span, int64_t kv_heads, int64_t kh, float scale, const QueryPiece* out) {
  std::vector<float> row(8 * dim), scores(queries * span);
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (dim % 8 == 0)
    for (; j < span; j += 8) {  // the last block repeats its last key where fewer than 8 are left
      const float* k[8];
      for (int i = 0; i < 8; ++i) {
        k[i] = key_row(ks, slots[std::min(j + i, span - 1)], kv_heads, kh, dim, row.data() + i * dim);
        // the next block's rows: slots are pages of the pool, anywhere in it, where the hardware's
        // stream prefetcher does not follow (4000 keys on scattered slots, one thread: 2.9 against 1.7 ms)
        if (j + 8 + i < span) prefetch_row(ks + (slots[j + 8 + i] * kv_heads + kh) * dim, dim);
      }
      const __m256 by = _mm256_set1_ps(scale);
      for (int64_t q = 0; q < queries; ++q) {
        alignas(32) float eight[8];
        _mm256_store_ps(eight, _mm256_mul_ps(dot8(qf + q * dim, k, dim), by));
        std::memcpy(scores.data() + q * span + j, eight, std::min<int64_t>(8, span - j) * sizeof(float));
      }
    }
#endif
  for (; j < span; ++j) {
    const float* k = key_row(ks, slots[j], kv_heads, kh, dim, row.data());  // once for every query head
    for (int64_t q = 0; q < queries; ++q) scores[q * span + j] = dot(qf + q * dim, k, dim) * scale;
  }
  int64_t lo = span, hi = 0;
  for (int64_t q = 0; q < queries; ++q) {
    const QueryPiece& p = out[q];
    float* sq = scores.data() + q * span;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = p.from; j < p.to; ++j) m = std::max(m, sq[j]);
    float sum = 0.f;
    for (int64_t j = p.from; j < p.to; ++j) {
      sq[j] = std::exp(sq[j] - m);
      sum += sq[j];
    }
    *p.top = m;
    *p.total = sum;
    std::fill(p.acc, p.acc + dim, 0.f);
    lo = std::min(lo, p.from);
    hi = std::max(hi, p.to);
  }
  for (int64_t j = lo; j < hi; ++j) {
    if (j + 4 < hi) prefetch_row(vs + (slots[j + 4] * kv_heads + kh) * dim, dim);
    const float* v = key_row(vs, slots[j], kv_heads, kh, dim, row.data());
    for (int64_t q = 0; q < queries; ++q)
      if (out[q].from <= j && j < out[q].to) axpy(scores[q * span + j], v, out[q].acc, dim);
  }
}

// Tokens of one request taken together by attend_unit, at most: bounds a unit's scores.
constexpr int64_t kMaxRun = 16;

// One new token per query row attending to its KV: row b reads slots
// slot_table[rows[b], start:seq_lens[b]] (start = seq_len - window for a sliding window, else 0)
// straight from the pool, no gathered copy. Scores, softmax and the weighted sum in float; the
// query heads sharing a KV head (GQA) are done together, so each K and V row is converted once,
// and so are adjacent rows of one request (the same slot-table row: a draft's tokens).
// A row's span is cut into pieces of kSpanPiece keys from its start (flash-decoding), merged in
// order, so its result does not depend on the thread count or on the other rows. Work is cut
// into (run of rows, piece, KV head) and spread over the threads. q: [B, H, D]; caches:
// [S, KVH, D]; returns [B, H, D].
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& slot_table, const at::Tensor& rows, const at::Tensor& seq_lens,
                            int64_t window, double scale) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 3 && q.stride(2) == 1, "decode_attention: q is a CPU [B, H, D]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3 &&
                  k_cache.sizes() == v_cache.sizes() && k_cache.scalar_type() == q.scalar_type() &&
                  v_cache.scalar_type() == q.scalar_type() && k_cache.size(2) == q.size(2),
              "decode_attention: contiguous [S, KVH, D] caches in q's dtype");
  TORCH_CHECK(slot_table.dim() == 2 && slot_table.stride(1) == 1 && slot_table.scalar_type() == at::kLong,
              "decode_attention: slot_table is int64 [R, C]");
  TORCH_CHECK(rows.is_contiguous() && rows.scalar_type() == at::kLong && rows.numel() == q.size(0),
              "decode_attention: rows is int64 [B]");
  TORCH_CHECK(seq_lens.is_contiguous() && seq_lens.scalar_type() == at::kInt && seq_lens.numel() == q.size(0),
              "decode_attention: seq_lens is int32 [B]");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2), kv_heads = k_cache.size(1);
  TORCH_CHECK(heads % kv_heads == 0, "decode_attention: query heads are a multiple of KV heads");
  const int64_t group = heads / kv_heads;
  const int64_t* table = slot_table.data_ptr<int64_t>();
  const int64_t table_stride = slot_table.stride(0);
  const int64_t* row_of = rows.data_ptr<int64_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  // Each row's pieces: piece k holds keys [start + k * kSpanPiece, ...) of its span, at least one.
  std::vector<int64_t> row_start(batch), first_piece(batch + 1), piece_count;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens[b], start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
    row_start[b] = start;
    first_piece[b] = static_cast<int64_t>(piece_count.size());
    const int64_t n = std::max<int64_t>(1, (len - start + kSpanPiece - 1) / kSpanPiece);
    for (int64_t k = 0; k < n; ++k)
      piece_count.push_back(std::max<int64_t>(0, std::min(kSpanPiece, len - start - k * kSpanPiece)));
  }
  first_piece[batch] = static_cast<int64_t>(piece_count.size());
  // Runs of adjacent rows of one request, halved while there are fewer than the threads to share
  // them (one stream's draft would otherwise run on one thread).
  std::vector<std::pair<int64_t, int64_t>> runs;  // [first row, end)
  for (int64_t b = 0; b < batch; ++b)
    if (!runs.empty() && row_of[b] == row_of[runs.back().first] && b - runs.back().first < kMaxRun)
      runs.back().second = b + 1;
    else
      runs.push_back({b, b + 1});
  const int64_t threads = at::get_num_threads();
  while (static_cast<int64_t>(runs.size()) * kv_heads < threads) {
    auto longest = std::max_element(runs.begin(), runs.end(), [](const auto& x, const auto& y) {
      return x.second - x.first < y.second - y.first;
    });
    if (longest->second - longest->first < 2) break;
    const int64_t mid = longest->first + (longest->second - longest->first) / 2, end = longest->second;
    longest->second = mid;
    runs.insert(longest + 1, {mid, end});
  }
  // Units: (run, piece index k) for every k some row of the run has.
  std::vector<std::pair<int64_t, int64_t>> units;  // (run, k)
  for (int64_t r = 0; r < static_cast<int64_t>(runs.size()); ++r) {
    int64_t most = 0;
    for (int64_t b = runs[r].first; b < runs[r].second; ++b) most = std::max(most, first_piece[b + 1] - first_piece[b]);
    for (int64_t k = 0; k < most; ++k) units.push_back({r, k});
  }
  const int64_t pieces = first_piece[batch], tasks = static_cast<int64_t>(units.size()) * kv_heads;
  std::vector<float> tops(pieces * heads), totals(pieces * heads), accs(pieces * heads * dim);
  at::Tensor out = at::empty({batch, heads, dim}, q.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "decode_attention", [&] {
    const scalar_t* qs = q.data_ptr<scalar_t>();
    const scalar_t* ks = k_cache.data_ptr<scalar_t>();
    const scalar_t* vs = v_cache.data_ptr<scalar_t>();
    scalar_t* os = out.data_ptr<scalar_t>();
    // A short step (one request, a few hundred keys) stays on this thread.
    at::parallel_for(0, tasks, tasks > 1 ? 1 : 2, [&](int64_t begin, int64_t end) {
      std::vector<float> qf(kMaxRun * group * dim);
      std::vector<QueryPiece> parts(kMaxRun * group);
      for (int64_t task = begin; task < end; ++task) {
        const auto [r, k] = units[task / kv_heads];
        const int64_t kh = task % kv_heads;
        const auto [b0, b1] = runs[r];
        // The unit's keys: from the first row's piece start to the furthest piece end.
        int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
        for (int64_t b = b0; b < b1; ++b)
          if (k < first_piece[b + 1] - first_piece[b]) {
            const int64_t from = row_start[b] + k * kSpanPiece;
            lo = std::min(lo, from);
            hi = std::max(hi, from + piece_count[first_piece[b] + k]);
          }
        int64_t queries = 0;
        for (int64_t b = b0; b < b1; ++b) {
          if (k >= first_piece[b + 1] - first_piece[b]) continue;
          const int64_t piece = first_piece[b] + k, from = row_start[b] + k * kSpanPiece - lo;
          for (int64_t g = 0; g < group; ++g, ++queries) {
            to_float(qs + b * q.stride(0) + (kh * group + g) * q.stride(1), qf.data() + queries * dim, dim);
            const int64_t at = piece * heads + kh * group + g;
            parts[queries] = {from, from + piece_count[piece], tops.data() + at, totals.data() + at,
                              accs.data() + at * dim};
          }
        }
        attend_unit(qf.data(), queries, dim, ks, vs, table + row_of[b0] * table_stride + lo, std::max<int64_t>(0, hi - lo),
                    kv_heads, kh, static_cast<float>(scale), parts.data());
      }
    });
    // Merge each row's pieces, in order.
    at::parallel_for(0, batch * heads, 64, [&](int64_t begin, int64_t end) {
      std::vector<float> acc(dim);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / heads, h = task % heads;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t p = first_piece[b]; p < first_piece[b + 1]; ++p)
          if (piece_count[p] > 0) m = std::max(m, tops[p * heads + h]);
        std::fill(acc.begin(), acc.end(), 0.f);
        float sum = 0.f;
        for (int64_t p = first_piece[b]; p < first_piece[b + 1]; ++p) {
          if (piece_count[p] == 0) continue;
          const float w = std::exp(tops[p * heads + h] - m);
          sum += w * totals[p * heads + h];
          axpy(w, accs.data() + (p * heads + h) * dim, acc.data(), dim);
        }
        scalar_t* oh = os + (b * heads + h) * dim;
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        for (int64_t i = 0; i < dim; ++i) oh[i] = static_cast<scalar_t>(acc[i] * inv);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(radixserve_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, bool scaled) -> Tensor", rms_norm);
  m.def("add_rms_norm(Tensor x, Tensor y, Tensor? post, Tensor weight, float eps, bool scaled) -> (Tensor, Tensor)",
        add_rms_norm);
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slot_table, Tensor rows, Tensor seq_lens, "
        "int window, float scale) -> Tensor", decode_attention);
  m.def("qk_norm_rope(Tensor qk, Tensor? scale, Tensor cos, Tensor sin, float eps) -> Tensor", qk_norm_rope);
}
