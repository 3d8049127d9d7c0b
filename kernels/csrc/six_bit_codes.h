// Q6_K's codes at 6 bits a weight, in the layout the int8-activation loops read on AVX2
// (group_q8_gemv.cpp's few-row loop, q8_panel.h's panel): `--int8-activations` streams 0.75 bytes
// a code there instead of a byte. A one-stream step only streams the weights, and Q4_K_M files keep
// their output layer and some down and value projections in Q6_K: 1.5 of the 7.6 billion weights
// of a 7B shape, half the bytes of a 1B shape's step (its tied output layer).
//
// A row's codes c in [-32, 31] are stored as u = c + 32 (0..63), a super-block of 256 codes in
// 192 bytes, the layout of llama.cpp's own Q6_K blocks without their scales: 128 bytes of low
// nibbles, then 64 bytes of high crumbs. Code 128h + 32t + l (half h < 2, run t < 4, l < 32) keeps
// its low four bits in nibble t / 2 of byte 64h + 32(t % 2) + l, and its top two in bits 2t, 2t + 1
// of byte 128 + 32h + l. So a run of 32 codes is two 32-byte loads, two shifts, two masks and an
// or, bytes in order (run()), and the loops take it where they took 32 int8 codes plus 32.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace radixserve::six_bits {

constexpr int64_t kSuper = 256;        // codes a super-block
constexpr int64_t kSuperBytes = 192;   // its bytes: 128 of nibbles, 64 of crumbs

// A super-block's bytes and a row's in either form the loops read: int8 codes (Six false), a byte
// a code, or this layout (Six true).
template <bool Six>
constexpr int64_t super_bytes = Six ? kSuperBytes : kSuper;
template <bool Six>
inline int64_t row_bytes(int64_t k) { return k / kSuper * super_bytes<Six>; }

// f(std::bool_constant<six>{}): a loop built for the form a call's codes come in.
template <typename F>
inline decltype(auto) with_form(bool six, F&& f) {
  return six ? f(std::true_type{}) : f(std::false_type{});
}

// Code i of a row (i < k), as u = c + 32.
inline int code_at(const uint8_t* row, int64_t i) {
  const uint8_t* super = row + i / kSuper * kSuperBytes;
  const int64_t h = i % kSuper / 128, t = i % 128 / 32, l = i % 32;
  const int low = (super[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 15;
  const int high = (super[128 + 32 * h + l] >> (2 * t)) & 3;
  return low | high << 4;
}

// Code i of a row set to u (0..63); the row's bytes start zeroed.
inline void set_code(uint8_t* row, int64_t i, int u) {
  uint8_t* super = row + i / kSuper * kSuperBytes;
  const int64_t h = i % kSuper / 128, t = i % 128 / 32, l = i % 32;
  super[64 * h + 32 * (t % 2) + l] |= static_cast<uint8_t>((u & 15) << (4 * (t / 2)));
  super[128 + 32 * h + l] |= static_cast<uint8_t>(((u >> 4) & 3) << (2 * t));
}

#if defined(__AVX2__)
// Run c (< 8) of a super-block's codes, codes 32c..32c + 31, as 32 bytes u = c + 32 in order. The
// shifts are 16-bit ones (AVX2 has no 8-bit shift); the masks drop what crosses from the
// neighbouring byte.
inline __m256i run(const uint8_t* super, int c) {
  const int h = c / 4, t = c % 4;
  const __m256i nibbles = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 64 * h + 32 * (t % 2)));
  const __m256i crumbs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 128 + 32 * h));
  const __m256i low = _mm256_and_si256(t < 2 ? nibbles : _mm256_srli_epi16(nibbles, 4), _mm256_set1_epi8(15));
  const __m256i high = t == 0   ? _mm256_slli_epi16(crumbs, 4)
                       : t == 1 ? _mm256_slli_epi16(crumbs, 2)
                       : t == 2 ? crumbs
                                : _mm256_srli_epi16(crumbs, 2);
  return _mm256_or_si256(low, _mm256_and_si256(high, _mm256_set1_epi8(0x30)));
}

// Run c of a super-block's codes (from `super`) plus 32, as 32 unsigned bytes, in either form.
template <bool Six>
inline __m256i codes_plus_32(const uint8_t* super, int c) {
  if constexpr (Six) return run(super, c);
  else return _mm256_add_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 32 * c)), _mm256_set1_epi8(32));
}
#endif

}  // namespace radixserve::six_bits
