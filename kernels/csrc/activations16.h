// Activations rounded to 16-bit integers a group at a time, for the integer loops of the few-row
// kernels (group_gemv.cpp, int4_gemv.cpp) on CPUs without AVX-512.
//
// Why: on AVX2 the exact loops turn every code into a float32 and multiply-add it (three or more
// instructions for 8 weights, more for 4-bit codes' shifts and masks), which bounds one decode
// row below the memory's speed: a 2-core Zen 3 EPYC ran the int8 kernel at 14 GB/s a core and
// the int4 one at 4-7 GB/s over both. With the activations as int16, one 16-bit multiply-add
// (vpmaddwd) multiplies 16 codes and sums them in pairs into 32-bit integers, exactly; the group's
// integer sum meets the two scales (the weights' and the activations') once.
//
// Precision: each group of G activations is scaled so its largest magnitude is 32767 and rounded
// to nearest, an error of at most 1/65534 of that magnitude: about 250 times finer than the
// bf16 activations the AVX-512 bf16 loops take (8 significant bits), coarser than float32 (24).
// The integer sums are exact (|code| <= 128, four products a lane before they are added: under
// 2^24, so their float32 conversion is exact too).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>

namespace radixserve {

// An allocator of 64-byte aligned storage, for the rounded activations: the integer loops load
// them 32 bytes at a time, and malloc's 16-byte alignment split every other load across two
// cache lines (a fifth of the loop's rate, one core of a Zen 3 EPYC).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t count) { return static_cast<T*>(::operator new(count * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
};

constexpr float kInt16Top = 32767.f;

// x [count] float32 in groups of `group` -> codes [count] int16 and scales [count / group], with
// x ~= codes * scale. A group of zeros gets scale 0 and codes 0.
inline void round_to_int16(const float* x, int64_t count, int64_t group, int16_t* codes, float* scales) {
  for (int64_t g = 0; g < count / group; ++g) {
    const float* xg = x + g * group;
    float top = 0.f;
    for (int64_t i = 0; i < group; ++i) top = std::max(top, std::fabs(xg[i]));
    const float inverse = top > 0.f ? kInt16Top / top : 0.f;
    scales[g] = top / kInt16Top;
    for (int64_t i = 0; i < group; ++i) {
      const float v = std::nearbyint(xg[i] * inverse);  // |v| <= 32767 but for float rounding
      codes[g * group + i] = static_cast<int16_t>(std::clamp(v, -kInt16Top, kInt16Top));
    }
  }
}

}  // namespace radixserve
