// The 4-bit block layout the int4 kernels read (int4_gemv.cpp: exact, float activations;
// int4_q8_gemv.cpp: int8 activations), packed by runtime/cpu/int4_linear.py's pack_blocks and
// gguf_blocks.cpp's repack_int4_nibbles.
//
// Codes q in [0, 15], packed [N, K / 2] uint8 in blocks of 128 codes (four groups of 32) = 32
// little-endian 16-bit words: word j of a block holds codes j, 32 + j, 64 + j and 96 + j in its
// nibbles 0..3. Weight rows come in quads whose blocks are interleaved (block b of rows
// 4i..4i+3, then block b + 1), so a pass over four rows reads one stream.
#pragma once

#include <cstdint>

namespace radixserve::int4 {

constexpr int64_t kGroup = 32;
constexpr int64_t kBlock = 128;  // codes a packed block holds: four groups in 64 bytes
constexpr int64_t kQuad = 4;     // weight rows whose blocks are interleaved
constexpr int64_t kMaxRows = 8;  // activation rows one call takes (one pass over the weights)

// Where weight row `row`'s block b starts.
inline const uint8_t* block_at(const uint8_t* w, int64_t k, int64_t row, int64_t b) {
  return w + (row / kQuad) * kQuad * (k / 2) + (b * kQuad + row % kQuad) * 64;
}

}  // namespace radixserve::int4
