// A GGUF tensor's quantized blocks decoded into the layouts its codes are kept in
// (runtime/loading/gguf_groups.py, gguf_int8_groups.py), in one pass over the blocks, written
// into buffers the caller gives (runtime/loading/gguf_blocks.py streams them into the kept
// files). numpy took three minutes for a 7B Q4_K_M file: a dozen passes through temporaries, and
// for the 5-8-bit formats a float32 dequantization divided back by the scales.
//
// - 4-bit (Q4_0, Q4_1, Q4_K): codes as nibbles, two a byte (code 2j of a row in byte j's low
//   nibble, 2j + 1 in its high one); per 32 codes a float32 scale and low: w = scale * q + low.
// - 5-8-bit (Q5_0, Q8_0: 32 codes, the block's float16 d; Q6_K: 16 codes, float32 d times the
//   run's int8 scale): int8 codes, w = scale * code. A group whose scale is 0 keeps codes 0.
// Every scale and low is the product ggml's own dequantization computes, exactly (float32).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

namespace {

// ggml's type ids
constexpr int64_t Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14;

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// 16 bytes of a 32-code run stored low nibbles first (codes j and 16 + j in byte j) -> nibbles
// two a byte in code order: out byte u holds codes 2u, 2u + 1.
inline void runs_of_32(const uint8_t* qs, uint8_t* out) {
  uint8_t codes[32];
  for (int j = 0; j < 16; ++j) {
    codes[j] = qs[j] & 15;
    codes[16 + j] = qs[j] >> 4;
  }
  for (int u = 0; u < 16; ++u) out[u] = codes[2 * u] | static_cast<uint8_t>(codes[2 * u + 1] << 4);
}

// Q4_K: 128 bytes, four chunks of 32 whose low nibbles are one run of 32 codes and high nibbles
// the next. A pair of bytes (b0, b1) of a chunk gives one output byte of each run.
inline void q4_k_codes(const uint8_t* qs, uint8_t* out) {
  for (int c = 0; c < 4; ++c) {
    const uint8_t* q = qs + 32 * c;
    uint8_t* lo = out + 32 * c;
    uint8_t* hi = lo + 16;
#pragma omp simd
    for (int u = 0; u < 16; ++u) {
      const uint8_t b0 = q[2 * u], b1 = q[2 * u + 1];
      lo[u] = (b0 & 15) | static_cast<uint8_t>((b1 & 15) << 4);
      hi[u] = (b0 >> 4) | (b1 & 0xF0);
    }
  }
}

// Q4_K's 12 bytes of 6-bit scales and mins (ggml's get_scale_min_k4)
inline void scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void decode_block(int64_t kind, const uint8_t* b, int64_t i, uint8_t* codes, uint8_t* scales, float* lows) {
  float* fs = reinterpret_cast<float*>(scales);
  int8_t* c8 = reinterpret_cast<int8_t*>(codes);
  switch (kind) {
    case Q4_0: {  // d (f16), 16 bytes; w = d * (q - 8)
      const float d = half_at(b);
      fs[i] = d;
      lows[i] = -8 * d;
      runs_of_32(b + 2, codes + 16 * i);
      break;
    }
    case Q4_1: {  // d, m (f16), 16 bytes; w = d * q + m
      fs[i] = half_at(b);
      lows[i] = half_at(b + 2);
      runs_of_32(b + 4, codes + 16 * i);
      break;
    }
    case Q4_K: {  // d, dmin (f16), 12 bytes of scales and mins, 128 of codes; 8 runs of 32
      const float d = half_at(b), dmin = half_at(b + 2);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        scale_min(j, b + 4, sc, m);
        fs[8 * i + j] = d * static_cast<float>(sc);
        lows[8 * i + j] = -(dmin * static_cast<float>(m));
      }
      q4_k_codes(b + 16, codes + 128 * i);
      break;
    }
    case Q8_0: {  // d (f16), 32 int8 codes
      std::memcpy(scales + 2 * i, b, 2);
      const bool zero = half_at(b) == 0.0f;
      for (int j = 0; j < 32; ++j) c8[32 * i + j] = zero ? 0 : static_cast<int8_t>(b[2 + j]);
      break;
    }
    case Q5_0: {  // d (f16), 32 high bits, 16 bytes of low nibbles; q = 5-bit value - 16
      std::memcpy(scales + 2 * i, b, 2);
      const bool zero = half_at(b) == 0.0f;
      uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      const uint8_t* qs = b + 6;
      int8_t* out = c8 + 32 * i;
      for (int j = 0; j < 16; ++j) {
        const int lo = (qs[j] & 15) | (((qh >> j) & 1) << 4);
        const int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        out[j] = zero ? 0 : static_cast<int8_t>(lo - 16);
        out[16 + j] = zero ? 0 : static_cast<int8_t>(hi - 16);
      }
      break;
    }
    case Q6_K: {  // ql[128], qh[64], 16 int8 scales, d (f16); 16 runs of 16; q = 6-bit value - 32
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = half_at(b + 208);
      for (int g = 0; g < 16; ++g) fs[16 * i + g] = d * static_cast<float>(sc[g]);
      int8_t* out = c8 + 256 * i;
      for (int half = 0; half < 2; ++half) {
        const uint8_t* l = ql + 64 * half;
        const uint8_t* h = qh + 32 * half;
        int8_t* y = out + 128 * half;
        for (int u = 0; u < 32; ++u) {
          y[u] = static_cast<int8_t>(((l[u] & 15) | (((h[u] >> 0) & 3) << 4)) - 32);
          y[u + 32] = static_cast<int8_t>(((l[u + 32] & 15) | (((h[u] >> 2) & 3) << 4)) - 32);
          y[u + 64] = static_cast<int8_t>(((l[u] >> 4) | (((h[u] >> 4) & 3) << 4)) - 32);
          y[u + 96] = static_cast<int8_t>(((l[u + 32] >> 4) | (((h[u] >> 6) & 3) << 4)) - 32);
        }
      }
      for (int g = 0; g < 16; ++g)
        if (fs[16 * i + g] == 0.0f) std::memset(out + 16 * g, 0, 16);
      break;
    }
    default:
      TORCH_CHECK(false, "decode_gguf_blocks: ggml type ", kind, " is not kept as codes");
  }
}

// blocks: uint8 [n_blocks, block bytes]; codes, scales, lows: the caller's contiguous buffers of
// the sizes runtime/loading/gguf_blocks.py computes (lows empty for the 5-8-bit formats).
void decode_gguf_blocks(int64_t kind, const at::Tensor& blocks, const at::Tensor& codes, const at::Tensor& scales,
                        const at::Tensor& lows) {
  TORCH_CHECK(blocks.dim() == 2 && blocks.is_contiguous() && blocks.scalar_type() == at::kByte,
              "decode_gguf_blocks: contiguous uint8 [n_blocks, block bytes]");
  TORCH_CHECK(codes.is_contiguous() && scales.is_contiguous() && lows.is_contiguous(),
              "decode_gguf_blocks: contiguous outputs");
  const int64_t n = blocks.size(0), bytes = blocks.size(1);
  const int64_t expected = kind == Q4_0 ? 18 : kind == Q4_1 ? 20 : kind == Q5_0 ? 22 : kind == Q8_0 ? 34
                         : kind == Q4_K ? 144 : kind == Q6_K ? 210 : 0;
  TORCH_CHECK(expected != 0, "decode_gguf_blocks: ggml type ", kind, " is not kept as codes");
  TORCH_CHECK(bytes == expected, "decode_gguf_blocks: ggml type ", kind, " has blocks of ", expected, " bytes, not ", bytes);
  const bool four = kind == Q4_0 || kind == Q4_1 || kind == Q4_K;
  const int64_t weights = (kind == Q4_K || kind == Q6_K) ? 256 : 32;
  const int64_t runs = kind == Q6_K ? 16 : weights / 32;
  const int64_t scale_bytes = (kind == Q8_0 || kind == Q5_0) ? 2 : 4;
  TORCH_CHECK(codes.nbytes() == static_cast<size_t>(n * weights / (four ? 2 : 1)) &&
                  scales.nbytes() == static_cast<size_t>(n * runs * scale_bytes) &&
                  lows.nbytes() == static_cast<size_t>(four ? n * runs * 4 : 0),
              "decode_gguf_blocks: output sizes do not match ", n, " blocks of ggml type ", kind);
  const uint8_t* in = blocks.data_ptr<uint8_t>();
  uint8_t* c = static_cast<uint8_t*>(codes.data_ptr());
  uint8_t* s = static_cast<uint8_t*>(scales.data_ptr());
  float* l = four ? static_cast<float*>(lows.data_ptr()) : nullptr;
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) decode_block(kind, in + i * bytes, i, c, s, l);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixserve_cpu, m) {
  m.def("decode_gguf_blocks(int kind, Tensor blocks, Tensor(a!) codes, Tensor(b!) scales, Tensor(c!) lows) -> ()",
        decode_gguf_blocks);
}
