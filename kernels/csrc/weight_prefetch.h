// Software prefetch of a few-row kernel's weight stream (int4_gemv.cpp, q6_gemv.cpp).
//
// The kernels stream a weight's codes once per call, a quad of rows at a time, and reread the
// call's activations for every quad. Where a row's activations outgrow the first-level cache (a
// down projection's 18944 of them are 37 KB in bf16, 75 KB in float32), their rereads from the
// second level take the miss slots the hardware prefetcher's stream needs: one 3584 x 18944 layer
// read 16-18 GB/s where a 3584-wide one reads 26-30. Asking for the stream kPrefetchBytes ahead
// restores it: 20-25 GB/s (2 threads, Zen 4).
#pragma once
#include <atomic>
#include <cstdint>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace radixserve {

constexpr int64_t kPrefetchBytes = 4096;  // measured: 2 and 4 KB ahead alike, 8 KB worse

// Whether a call's activations (all its rows, in the kernel's own dtype) take enough of the first
// level that the 4- and 6-bit kernels' streams need the help. Where they are small it cost: a
// 37888 x 3584 int4 layer (7 KB of bf16) fell from 30 to 22 GB/s with it. Past 8 KB it pays: the
// 1B shape's 8192-wide down projections (16 KB) took 7.2 and 4.6 ms a token (Q6, int4) against
// 8.5 and 5.2 with the line at 16 KB, the 1.5B's 8960-wide ones 10.0 and 6.6 against 11.5 and 7.6
// without it (in the engine, alternated). (The int8 kernel, a byte a weight, gains at every width
// and prefetches always.)
constexpr int64_t kSpillBytes = int64_t{8} << 10;

// The line in use: kSpillBytes unless warm-up timed another faster on this machine
// (weight_prefetch.cpp, runtime/cpu/weight_prefetch.py). On a 2-core Xeon with AMX, prefetching
// at every width made one decode step of the 1B shape 52 ms -> 42 ms and the 1.5B's 66 -> 52 (its
// 2048- and 1536-wide layers read memory at 9.7 GB/s a core without it, a plain sum at 15); on
// Zen 4 it cost the narrow layers (above). Only the weights' stream order changes: the sums are the same.
inline std::atomic<int64_t> spill_line{kSpillBytes};
inline bool activations_spill(int64_t bytes) { return bytes > spill_line.load(std::memory_order_relaxed); }

// The `Lines` cache lines kPrefetchBytes past `at` (the codes a kernel reads next lie there: a
// quad's rows together, quads one after another).
template <int Lines>
inline void prefetch_ahead(const uint8_t* at) {
#if defined(__SSE__)
  const char* ahead = reinterpret_cast<const char*>(at) + kPrefetchBytes;
#pragma GCC unroll 8
  for (int line = 0; line < Lines; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
#else
  (void)at;
#endif
}

// Part `part` of `parts` of the `bytes` from `next`, asked for into the second-level cache: the
// panel loops (q8_panel.h, int16_panel.h) ask for the next panel's weights a part before each pass
// over this one, so that laying it out finds them there.
inline void prefetch_part(const void* next, int64_t bytes, int64_t part, int64_t parts) {
#if defined(__SSE__)
  const char* at = static_cast<const char*>(next);
  const int64_t share = (bytes / parts + 64) / 64 * 64;
  for (int64_t i = part * share, stop = bytes < i + share ? bytes : i + share; i < stop; i += 64)
    _mm_prefetch(at + i, _MM_HINT_T1);
#else
  (void)next, (void)bytes, (void)part, (void)parts;
#endif
}

}  // namespace radixserve
