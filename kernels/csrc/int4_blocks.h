// The 4-bit block layout the int4 kernels read (int4_gemv.cpp: exact, float activations;
// int4_q8_gemv.cpp: int8 activations), packed by runtime/cpu/int4_linear.py's pack_blocks and
// group_dequant.cpp's repack_int4_nibbles, unpacked by group_dequant.cpp's dequant_int4_blocks.
//
// Codes q in [0, 15], packed [N, K / 2] uint8 in blocks of 64 bytes (128 codes, four groups of
// 32); weight rows come in quads whose blocks are interleaved (block b of rows 4i..4i+3, then
// block b + 1), so a pass over four rows reads one stream.
//
// Tiles: a row's groups are taken 16 at a time (a tile: 512 codes, 4 blocks), the last
// groups % 16 of them 4 at a time (a small tile: 1 block). A tile of G groups is 4 "registers" of
// 2G 16-bit words (one block each in a full tile; 16 bytes each in a small one). Word p of register
// v holds, in nibble t, code 2i + p % 2 of the tile's group p / 2, where i = 4v + t.
//
// Why: shifting a register right by 4t and masking each word's low nibble gives, for every one of
// the tile's groups, the same two codes (2i, 2i + 1); a bf16 dot product then sums each group's
// pair into its own float32 lane, so 16 dot products accumulate 16 whole groups, one per lane,
// and the groups' scales are applied once per tile by one multiply-add (a lane each). With one
// group a register (the layout before), every 32 codes paid a second multiply-add for the scale,
// and the two floating-point pipes, not memory, bounded one stream: 30 GB/s where memory gives
// 50 (2-core Zen 4). The 8-bit path gets the same from the integers: the two bytes of a word, and
// both 16-bit lanes a 32-bit lane sums, belong to one group.
#pragma once

#include <cstdint>

namespace radixserve::int4 {

constexpr int64_t kGroup = 32;
constexpr int64_t kBlock = 128;      // codes a packed block holds: four groups in 64 bytes
constexpr int64_t kQuad = 4;         // weight rows whose blocks are interleaved
constexpr int64_t kMaxRows = 8;      // activation rows one call takes (one pass over the weights)
constexpr int64_t kTileGroups = 16;  // groups of a full tile
constexpr int64_t kSmallGroups = 4;  // groups of a small tile (a row's last groups % 16)

// Where weight row `row`'s block b starts.
inline const uint8_t* block_at(const uint8_t* w, int64_t k, int64_t row, int64_t b) {
  return w + (row / kQuad) * kQuad * (k / 2) + (b * kQuad + row % kQuad) * 64;
}

// A tile of a row: its first group and how many it has (16, or 4 in the small tiles at the end).
struct Tile {
  int64_t group0, groups;
};

inline int64_t tile_count(int64_t groups) {
  return groups / kTileGroups + (groups % kTileGroups) / kSmallGroups;
}

inline Tile tile_of(int64_t groups, int64_t index) {
  const int64_t full = groups / kTileGroups;
  if (index < full) return {index * kTileGroups, kTileGroups};
  return {full * kTileGroups + (index - full) * kSmallGroups, kSmallGroups};
}

// The words of a tile's register that hold codes, as a mask of 32 (a small tile's 2G of them;
// the kernels load the rest as 0).
constexpr uint32_t words_mask(int64_t groups) {
  return groups == kTileGroups ? 0xFFFFFFFFu : (1u << (2 * groups)) - 1;
}

// Register v of row `row`'s tile (2 * tile.groups words).
inline const uint8_t* register_at(const uint8_t* w, int64_t k, int64_t row, const Tile& tile, int v) {
  const int64_t word = v * 2 * tile.groups;  // within the tile
  return block_at(w, k, row, tile.group0 / 4 + word / 32) + (word % 32) * 2;
}

// The tile holding a row's group g.
inline Tile tile_holding(int64_t groups, int64_t g) {
  if (g < groups / kTileGroups * kTileGroups) return {g - g % kTileGroups, kTileGroups};
  return {g - g % kSmallGroups, kSmallGroups};
}

// Where code c (0..31) of a row's group g lies, as (block, word within the block, nibble).
struct CodeAt {
  int64_t block;
  int word, nibble;
};

inline CodeAt code_at(int64_t groups, int64_t g, int c) {
  const Tile tile = tile_holding(groups, g);
  const int i = c / 2, v = i / 4, t = i % 4;
  const int64_t word = v * 2 * tile.groups + 2 * (g - tile.group0) + c % 2;  // within the tile
  return {tile.group0 / 4 + word / 32, static_cast<int>(word % 32), t};
}

}  // namespace radixserve::int4
