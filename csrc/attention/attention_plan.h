// The attention ops' host-side decisions, apart from the host code that makes the launches
// (csrc/driver/attention_driver.cpp, the kernel image through the CUDA driver API) so that tests compile them alone:
// the block shape, the grid's row tiles, the split-KV count, and the name of every kernel the ops launch (the kernel
// table the wheel build compiles: tools/sm70_check.py lists the same). Torch- and CUDA-free.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_shape.h"

namespace volta_fp4 {
namespace attention {

inline bool supported_head_size(int64_t head_size) { return head_size == 64 || head_size == 128 || head_size == 256; }

// Decode blocks (kDecodeRows) when the batch has at most 2 · kDecodeRows rows (tokens × group) per sequence on
// average: plain decode at any GQA group ≤ 32 and speculative verification of a few tokens (K = 3 at Qwen3.8's 6:1
// is 24 rows: two decode blocks each read the sequence's keys, expected to beat one 64-row block that leaves two
// warps idle and holds all of O in the others). A host value, so a CUDA graph keeps the shape it was captured with
// (eager runs of the same batch shape choose the same).
inline int choose_block_rows(int64_t num_tokens, int64_t group, int64_t num_seqs) {
  return num_tokens * group <= 2 * kDecodeRows * num_seqs ? kDecodeRows : kPrefillRows;
}

// tile_base(num_seqs) with query_start_loc[num_seqs] ≤ num_tokens (attention.cuh, "Work split"): the grid's row
// tiles from host values only.
inline int64_t row_tiles(int64_t num_tokens, int64_t group, int64_t num_seqs, int64_t block_rows) {
  return num_tokens * group / block_rows + num_seqs;
}

// Row tiles that hold rows, from host values: each sequence's share of the tokens (rounded up) times the group, in
// block_rows tiles. Decode: one tile per sequence (row_tiles above also counts the tiles a sequence might straddle,
// 1.4-1.5× as many at GQA 6:1 and 8:1, blocks that exit at once).
inline int64_t busy_row_tiles(int64_t num_tokens, int64_t group, int64_t num_seqs, int64_t block_rows) {
  const int64_t seqs = std::max<int64_t>(1, num_seqs);  // the ops return before planning an empty batch
  const int64_t rows_per_seq = (num_tokens + seqs - 1) / seqs * group;
  return std::min(row_tiles(num_tokens, group, num_seqs, block_rows),
                  seqs * ((rows_per_seq + block_rows - 1) / block_rows));
}

// KV splits per row tile: `requested` if > 0, else as many as the kernel's resident block slots (`slots`: SMs ×
// blocks per SM) hold in one wave beside the busy blocks, down to one KV tile per split (the combine reads all
// splits in one round, so from 3 tiles on, a split of one tile costs less than the tile it takes off the chain;
// split_share keeps shorter row tiles in one split). One wave:
// a partial second wave costs more than the split saves. The slots, not a fixed blocks-per-SM, because head_dim 64
// fits twice the blocks of 128 and 256 (H200 sweep, 2026-12-03: the fastest forced count filled 2 blocks per SM at
// head_dim 128/256 and 4 at 64, every batch 4-64). The count depends on the launch shape and max_seq_len only (host
// values a CUDA graph keeps); each block divides its own KV tiles among the splits, and uses more than
// kCheapMergeSplits of them only where each gets 4 tiles (paged_attention_kernel), so that the count can be chosen
// for the longest context without slowing the shorter ones a graph replays.
inline int choose_splits(int64_t requested, int64_t busy_tiles, int64_t num_kv_heads, int64_t max_seq_len,
                         int64_t slots) {
  const int64_t max_kv_tiles = std::max<int64_t>(1, (max_seq_len + kTileKeys - 1) / kTileKeys);
  const int64_t splits = requested > 0 ? requested : slots / std::max<int64_t>(1, busy_tiles * num_kv_heads);
  return int(std::max<int64_t>(1, std::min<int64_t>({splits, max_kv_tiles, kMaxSplits})));
}

// ─── Kernel names (the NVRTC name expressions of the instantiations the ops launch) ──────────────────────────
inline std::string paged_attention_kernel_name(bool sm70_atom, int head_size, int block_rows) {
  return std::string("volta_fp4::attention::paged_attention_kernel<") +
         (sm70_atom ? "volta_fp4::Sm70Mma" : "volta_fp4::Sm80Mma") + ", " + std::to_string(head_size) + ", " +
         std::to_string(block_rows) + ">";
}
inline std::string combine_splits_kernel_name(int head_size) {
  return "volta_fp4::attention::combine_splits_kernel<" + std::to_string(head_size) + ">";
}
inline std::string write_kv_cache_kernel_name() { return "volta_fp4::attention::write_kv_cache_kernel"; }

inline std::vector<std::string> launched_kernel_names() {
  std::vector<std::string> names;
  for (const bool sm70 : {true, false})
    for (const int d : {64, 128, 256})
      for (const int rows : {kPrefillRows, kDecodeRows}) names.push_back(paged_attention_kernel_name(sm70, d, rows));
  for (const int d : {64, 128, 256}) names.push_back(combine_splits_kernel_name(d));
  names.push_back(write_kv_cache_kernel_name());
  return names;
}

}  // namespace attention
}  // namespace volta_fp4
