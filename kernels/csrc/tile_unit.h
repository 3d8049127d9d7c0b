// Products of a few bf16 activation rows (a batch of decode streams: up to 16) with quantized
// weights in AMX's tile unit (Sapphire Rapids and later): the frame int4_amx.cpp and q6_amx.cpp
// share, each giving a Format that decodes its codes.
//
// Why: the few-row loops (int4_gemv.cpp, q6_gemv.cpp) cost a bf16 dot product per 32 weights per
// activation row, so 16 rows took about six one-row products, and the dequantized slices of the
// wide path no less. Here each weight is decoded once per call, whatever the rows, into bf16 (its
// scale times its code, rounded once: the wide path's numbers), and the tile unit multiplies a
// block of 16 weight rows by 32 codes against all of the call's activation rows at once.
//
// The tile product C[16 weight rows, M] += A[16, 32] . B[32, M] sums pairs: B's row p holds, for
// each activation row, the two activations that A's elements 2p and 2p + 1 multiply. A row of A is
// a "chunk" of a weight row: 32 of its codes in whatever order its format unpacks them cheaply
// (Format::k_of says which code of the row each element is), and B is x gathered once per call
// into that order. A row's chunks cover its K codes once, so summing them is its whole product.
//
// Order: K is cut into tiles of at most 16 chunks (512 codes); tile by tile, each block of 16
// weight rows of a group of 32 decodes the tile's chunks into A and multiplies them, its sums
// parked in memory between tiles (32 KB, in the second-level cache). So a tile's B (16 KB at 16
// rows) stays in the first-level cache while the blocks read it: a tile product waits 8.7 ns on it
// from there, 20 from the second level (block by block over all of K, B outgrew the first level
// from K = 1536).
//
// Numerics: bf16 weights times bf16 activations, float32 sums. A row's result does not depend on
// the other rows of the call.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define RADIXSERVE_TILE_UNIT 1
#else
#define RADIXSERVE_TILE_UNIT 0
#endif

namespace radixserve::tiles {

constexpr int64_t kBlockRows = 16;  // weight rows a tile product takes (and activation rows, at most)
constexpr int64_t kChunk = 32;      // codes a chunk (a row of A)
constexpr int64_t kTileChunks = 16;  // chunks a tile of K has, at most
constexpr int64_t kGroupBlocks = 32;  // blocks of weight rows taken tile by tile together (their sums: 32 KB at 16 rows)

// A tile of K: its first code and how many chunks it has.
struct KTile {
  int64_t k0, chunks;
};

#if RADIXSERVE_TILE_UNIT
// Linux hands a process the tile registers' state only when asked (arch_prctl), once.
inline bool permitted() {
  static const bool granted = [] {
    constexpr int kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0: C, a block's sums (16 weight rows x M float32); tmm1-2: A (16 x 32 bf16), tmm3-4: B (16
// pairs x M), two each, so that loading the next does not wait for the product reading the last.
inline void configure(int64_t m) {
  TileConfig config;
  config.rows[0] = kBlockRows, config.colsb[0] = static_cast<uint16_t>(4 * m);
  for (int t = 1; t < 3; ++t) config.rows[t] = kBlockRows, config.colsb[t] = 64;
  for (int t = 3; t < 5; ++t) config.rows[t] = kChunk / 2, config.colsb[t] = static_cast<uint16_t>(4 * m);
  _tile_loadconfig(&config);
}

// A chunk's tile product into C, from A at `a` and B at `b` loaded into tiles A and B (the tile
// intrinsics take register numbers as literals).
#define RADIXSERVE_CHUNK_PRODUCT(A, B, a, b, m) \
  do {                                         \
    _tile_loadd(A, a, 64);                     \
    _tile_loadd(B, b, 4 * (m));                \
    _tile_dpbf16ps(0, A, B);                   \
  } while (0)

// B for every chunk, in the chunks' order: [K / 32 chunks][16 pairs][m][2] bf16.
template <typename Format>
std::vector<uint16_t> pairs_of(const at::Tensor& x, const Format& f) {
  const int64_t m = x.size(0), k = x.size(1);
  std::vector<uint16_t> b(k * m);
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  at::parallel_for(0, f.tiles(), 1, [&](int64_t first, int64_t last) {
    int64_t where[kTileChunks * kChunk];
    for (int64_t ti = first; ti < last; ++ti) {
      const KTile tile = f.tile(ti);
      for (int64_t i = 0; i < tile.chunks; ++i)
        for (int e = 0; e < kChunk; ++e) where[i * kChunk + e] = f.k_of(ti, i, e);
      uint16_t* into = b.data() + tile.k0 * m;  // chunk c's B at c * 32 * m
      for (int64_t r = 0; r < m; ++r) {
        const uint16_t* row = xs + r * x.stride(0);
        for (int64_t e = 0; e < tile.chunks * kChunk; ++e) into[(e / 2 * m + r) * 2 + e % 2] = row[where[e]];
      }
    }
  });
  return b;
}

// x [M, K] bf16 @ W.T -> [M, N] bf16, W's rows decoded by `f` (Format: tiles(), tile(ti),
// k_of(ti, chunk, element), prefetch(j, rows, ti), dequantize(j, rows, ti, a) into a[chunk][row][32]).
template <typename Format>
at::Tensor products(const at::Tensor& x, int64_t n, const Format& f) {
  const int64_t m = x.size(0);
  const std::vector<uint16_t> b = pairs_of(x, f);
  at::Tensor out = at::empty({m, n}, x.options());
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    configure(m);
    std::vector<uint16_t> a(kTileChunks * kBlockRows * kChunk, 0);  // a tile's chunks (rows past N: sums never read)
    std::vector<float> c(kGroupBlocks * kBlockRows * m);             // a group of blocks' sums between tiles
    for (int64_t g0 = first; g0 < last; g0 += kGroupBlocks) {
      const int64_t g1 = std::min(last, g0 + kGroupBlocks);
      for (int64_t ti = 0, tiles = f.tiles(); ti < tiles; ++ti) {
        const KTile tile = f.tile(ti);
        const uint16_t* bt = b.data() + tile.k0 * m;
        for (int64_t blk = g0; blk < g1; ++blk) {
          const int64_t j = blk * kBlockRows, rows = std::min(kBlockRows, n - j);
          float* sums = c.data() + (blk - g0) * kBlockRows * m;
          if (blk + 1 < g1) f.prefetch(j + kBlockRows, std::min(kBlockRows, n - j - kBlockRows), ti);
          f.dequantize(j, rows, ti, a.data());
          if (ti == 0) {
            _tile_zero(0);
          } else {
            _tile_loadd(0, sums, 4 * m);
          }
          for (int64_t i = 0; i < tile.chunks; i += 2) {  // every format's tiles have an even count
            const uint16_t* ai = a.data() + i * kBlockRows * kChunk;
            const uint16_t* bi = bt + i * kChunk * m;
            RADIXSERVE_CHUNK_PRODUCT(1, 3, ai, bi, m);
            RADIXSERVE_CHUNK_PRODUCT(2, 4, ai + kBlockRows * kChunk, bi + kChunk * m, m);
          }
          _tile_stored(0, sums, 4 * m);
        }
      }
      // the sums [16 weight rows][m] out as m rows of 16 outputs: a gather and a conversion each
      // (element by element, the conversions took 5% of a call)
      const __m512i across = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32(static_cast<int>(m)));
      for (int64_t blk = g0; blk < g1; ++blk) {
        const int64_t j = blk * kBlockRows, rows = std::min(kBlockRows, n - j);
        const float* sums = c.data() + (blk - g0) * kBlockRows * m;
        const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
        for (int64_t i = 0; i < m; ++i) {
          const __m512 row = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keep, across, sums + i, 4);
          _mm256_mask_storeu_epi16(op + i * n + j, keep, reinterpret_cast<const __m256i&>(static_cast<const __m256bh&>(_mm512_cvtneps_pbh(row))));
        }
      }
    }
    _tile_release();
  });
  return out;
}

// A weight's rows [j, j + rows) (quads of rows, `bytes` from each quad's `at`) asked for into the
// first-level cache: the loop visits a block's tile and then the next block's, K / 2 * 16 bytes
// on (int4), a stride the hardware's prefetchers do not follow.
template <typename At>
inline void prefetch_quads(int64_t rows, int64_t bytes, At at) {
  for (int64_t q = 0; q < rows / 4; ++q) {
    const char* p = reinterpret_cast<const char*>(at(4 * q));
    for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
  }
}
#endif

}  // namespace radixserve::tiles
