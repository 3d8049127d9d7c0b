// Software prefetch of a few-row kernel's weight stream (int4_gemv.cpp, q6_gemv.cpp).
//
// The kernels stream a weight's codes once per call, a quad of rows at a time, and reread the
// call's activations for every quad. Where a row's activations outgrow the first-level cache (a
// down projection's 18944 of them are 37 KB in bf16, 75 KB in float32), their rereads from the
// second level take the miss slots the hardware prefetcher's stream needs: one 3584 x 18944 layer
// read 16-18 GB/s where a 3584-wide one reads 26-30. Asking for the stream kPrefetchBytes ahead
// restores it: 20-25 GB/s (2 threads, Zen 4).
#pragma once
#include <cstdint>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace radixserve {

constexpr int64_t kPrefetchBytes = 4096;  // measured: 2 and 4 KB ahead alike, 8 KB worse

// Whether a call's activations (all its rows, in the kernel's own dtype) spill out of the first
// level, where the 4- and 6-bit kernels' streams need the help. Where they fit it cost: a 37888 x
// 3584 int4 layer fell from 30 to 22 GB/s with it. (The int8 kernel, a byte a weight, gains at
// every width and prefetches always.)
constexpr int64_t kSpillBytes = int64_t{16} << 10;
inline bool activations_spill(int64_t bytes) { return bytes > kSpillBytes; }

// The `Lines` cache lines kPrefetchBytes past `at` (the codes a kernel reads next lie there: a
// quad's rows together, quads one after another).
template <int Lines>
inline void prefetch_ahead(const uint8_t* at) {
#if defined(__AVX512F__)
  const char* ahead = reinterpret_cast<const char*>(at) + kPrefetchBytes;
#pragma GCC unroll 8
  for (int line = 0; line < Lines; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
#else
  (void)at;
#endif
}

}  // namespace radixserve
