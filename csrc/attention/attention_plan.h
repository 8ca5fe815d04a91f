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

constexpr int64_t kMinTilesPerSplit = 2;  // a split of one 64-key tile would spend more merging than it saves

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

// KV splits per row tile: `requested` if > 0, else enough to give ~2 blocks per SM when the row tiles alone leave
// SMs idle (never below kMinTilesPerSplit KV tiles per split). The count depends on the launch shape and
// max_seq_len only (host values a CUDA graph keeps); each block divides its own KV tiles among the splits.
inline int choose_splits(int64_t requested, int64_t tiles, int64_t num_kv_heads, int64_t max_seq_len,
                         int64_t multiprocessors) {
  const int64_t max_kv_tiles = std::max<int64_t>(1, (max_seq_len + kTileKeys - 1) / kTileKeys);
  int64_t splits = requested;
  if (splits <= 0) {
    const int64_t target_blocks = 2 * multiprocessors, blocks = tiles * num_kv_heads;
    splits = blocks >= target_blocks ? 1 : std::min((target_blocks + blocks - 1) / blocks,
                                                    (max_kv_tiles + kMinTilesPerSplit - 1) / kMinTilesPerSplit);
  }
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
