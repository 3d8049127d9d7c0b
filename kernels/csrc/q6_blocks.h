// The 6-bit block layout the six-bit kernels read (q6_gemv.cpp: exact products, bf16 dot products;
// q6_amx.cpp: AMX's tile unit), written by q6_gemv.cpp's repack_q6.
//
// Signed codes c in [-32, 31] stored as u = c + 32 (0..63), in blocks of 128 codes: 32 16-bit
// words of low nibbles (word j: the j-th code of each run of 32, in nibbles 0..3), then 32 bytes of
// high crumbs (byte j: the same codes' top two bits in bits 0-1, 2-3, 4-5, 6-7): 96 bytes a block;
// a run's codes in the order code_at gives. Rows come in quads, their blocks interleaved (block_at).
#pragma once

#include <cstdint>

namespace radixserve::q6 {

constexpr int64_t kBlock = 128;       // codes a block holds
constexpr int64_t kBlockBytes = 96;   // 64 bytes of nibbles, 32 of crumbs
constexpr int64_t kQuad = 4;          // weight rows whose blocks are interleaved

// Where weight row `row`'s block b starts: rows come in quads whose blocks are interleaved (block b
// of rows 4i..4i+3, then block b + 1), so a pass over four rows reads one stream, as in
// int4_gemv.cpp (four separate streams ran at half the memory speed).
inline const uint8_t* block_at(const uint8_t* w, int64_t k, int64_t row, int64_t b) {
  return w + ((row / kQuad) * kQuad * (k / kBlock) + b * kQuad + row % kQuad) * kBlockBytes;
}

// Within each run of 32 codes, vector position p holds code code_at(p): dot-product lane l = p / 2
// takes codes from the first 16 (even l) or the last 16 (odd l), so a 16-code group's scale
// vector is two floats broadcast in pairs (one instruction). The activations are reordered alike.
constexpr int code_at(int p) { return ((p / 2) % 2) * 16 + 2 * (p / 4) + p % 2; }

}  // namespace radixserve::q6
