// What the attention kernels (attention.cuh) and their host code share: the block and tile sizes, the shared
// memory plan and the launch-parameter structs. Torch- and CUDA-free, so that it compiles under nvcc, NVRTC and a
// plain C++ compiler (the driver-API host code in csrc/driver/).
#pragma once

#include "common/fast_divisor.h"
#include "common/host_device.h"
#include "common/int_types.cuh"
#include "common/smem_rows.h"

namespace volta_fp4 {
namespace attention {

// Two block shapes, one kernel (attention.cuh, "Block"): 64 rows with the warps over the rows (prefill), and
// kDecodeRows rows with the warps over the keys of a tile and the head dims of O (decode: a sequence's rows are
// one token's group of heads, or a few tokens' under speculation).
constexpr int kPrefillRows = 64;
constexpr int kDecodeRows = 16;
constexpr int kTileKeys = 64;
constexpr int kWarpRows = 16;
constexpr int kWarps = 4;
constexpr int kThreadsPerBlock = kWarps * 32;
constexpr int kPanelCols = 128;  // head dims per row panel of Q and K
constexpr int kMaxSplits = 64;
constexpr int kCheapMergeSplits = 32;
constexpr int kMinTilesPastCheapMerge = 4;  // split_share: tiles per split where more than kCheapMergeSplits are used
constexpr int kMinTilesToSplit = 3;  // split_share: a row tile with fewer KV tiles is not split

// How a row tile's `tiles` KV tiles are shared among a launch's `splits` (paged_attention_kernel): split z takes tiles
// z·tiles_per_split … up to the end; the first splits_with_tiles splits have some, the rest none. Past
// kCheapMergeSplits splits, only as many as give each split kMinTilesPastCheapMerge tiles: the last split's merge grows
// with the splits (H100, d256 batch 1, forced counts of one kernel: 4096 tokens 19.4 µs at 32 splits against 22.0 at
// 64; 32768 81.4 at 64 against 107.5 at 32; 8192 within 5 % either way). Fewer than kMinTilesToSplit tiles stay in
// one split: the merge costs more than the one tile a second split takes off the chain (H100, d256, 128 tokens = 2
// tiles: batch 1 8.7 µs in one split against 9.6 in two, batch 16 9.2 against 11.9). Decided per row tile from its
// own tiles, because a CUDA graph fixes the launch's split count for its longest context.
struct SplitShare {
  int tiles_per_split;
  int splits_with_tiles;
};
VOLTA_FP4_HOST_DEVICE inline SplitShare split_share(int tiles, int splits) {
  const int past_cheap = tiles / kMinTilesPastCheapMerge;
  const int wanted = tiles < kMinTilesToSplit ? 1 : past_cheap > kCheapMergeSplits ? past_cheap : kCheapMergeSplits;
  const int used = splits < wanted ? splits : wanted;
  const int tiles_per_split = (tiles + used - 1) / used;
  return {tiles_per_split, tiles_per_split > 0 ? (tiles + tiles_per_split - 1) / tiles_per_split : 0};
}

// How a KV tile (kTileKeys keys × HeadDim dims) is shared among the block's threads, in 16-byte vectors.
// Along dims (decode blocks): 8 consecutive lanes read 128 contiguous bytes of one key's row, so a warp's load
//   touches 4 cache lines instead of 32, one per lane, which L1 serves a line at a time. A thread has 4 keys, 16
//   apart, and HeadDim / 64 vectors of each; a quarter warp's 16-byte stores fill 128 contiguous bytes of a row (no
//   bank conflicts).
// Along keys (prefill blocks): lane t has key t % 64 alone, one cache row per thread: the rows of 4 keys spill at
//   head_dim 256 on sm_70.
// Vector j of thread tid: key key(tid) + key_offset(j), dims dim0(tid) + dim_offset(j) … + 7. A thread's first dim is
// below kDimStep, which divides a panel, so a vector's shared-memory offset is a per-thread base plus a constant, and
// its global one the row of its key slot plus a constant.
template <int HeadDim, bool kAlongDims>
struct KvThreadMap {
  static constexpr int kLanesPerRun = 8;  // 8 × 16 bytes: a cache line of one key's row
  static constexpr int kVectors = kTileKeys * (HeadDim / 8) / kThreadsPerBlock;
  static constexpr int kKeys = kAlongDims ? kTileKeys * kLanesPerRun / kThreadsPerBlock : 1;
  static constexpr int kDimVectors = kVectors / kKeys;
  static constexpr int kKeyStep = kTileKeys / kKeys;
  static constexpr int kDimStep = kAlongDims ? kLanesPerRun * 8 : kThreadsPerBlock / kTileKeys * 8;
  static_assert(kPanelCols % kDimStep == 0 && kDimVectors * kKeys == kVectors, "vectors stay inside a panel");
  VOLTA_FP4_HOST_DEVICE static int key(int tid) { return kAlongDims ? tid / kLanesPerRun : tid % kTileKeys; }
  VOLTA_FP4_HOST_DEVICE static int dim0(int tid) {
    return (kAlongDims ? tid % kLanesPerRun : tid / kTileKeys) * 8;
  }
  // Block lookups: a warp's lanes have kWarpKeys distinct keys per key slot, kWarpKeys · kKeys in all (16 along dims),
  // so each of them is looked up once, by lane lookup_lane(lane, k) of the warp; lane tid looks up lookup_key(tid)
  // (lanes past the warp's keys repeat the first ones). Along keys every lane looks up its own key.
  static constexpr int kWarpKeys = kAlongDims ? 32 / kLanesPerRun : 32;
  static_assert(kWarpKeys * kKeys <= 32, "one lookup lane per key of a warp");
  VOLTA_FP4_HOST_DEVICE static int lookup_key(int tid) {
    const int lane = tid % 32;
    return kAlongDims ? key(tid - lane) + lane % kWarpKeys + lane / kWarpKeys % kKeys * kKeyStep : key(tid);
  }
  VOLTA_FP4_HOST_DEVICE static constexpr int lookup_lane(int lane, int k) {
    return kAlongDims ? lane / kLanesPerRun + k * kWarpKeys : lane;
  }
  VOLTA_FP4_HOST_DEVICE static constexpr int key_slot(int j) { return j / kDimVectors; }
  VOLTA_FP4_HOST_DEVICE static constexpr int key_offset(int j) { return key_slot(j) * kKeyStep; }
  VOLTA_FP4_HOST_DEVICE static constexpr int dim_offset(int j) { return j % kDimVectors * kDimStep; }
};

// Shared-memory plan of paged_attention_kernel<·, HeadDim, BlockRows>: Q, K and V in rows of kRowHalves halves (a
// panel of up to 128 head dims and 8 of padding, which starts consecutive rows 4 banks apart), P in rows of
// kPRowHalves (a tile's 64 keys and 8), plus (decode blocks) the fp32 row statistics the warps exchange:
// [kWarps][kWarpRows] each. Rows only as wide as their data: a V100 SM (96 KB) holds three prefill blocks at head_dim
// 64 and two at 128 instead of one (52 KB each with every row 136 halves wide).
template <int HeadDim, int BlockRows>
struct SmemPlan {
  static_assert(HeadDim == 64 || HeadDim == 128 || HeadDim == 256, "head_dim must be 64, 128 or 256");
  static_assert(BlockRows == kPrefillRows || BlockRows == kDecodeRows, "block rows must be 64 or 16");
  static constexpr int kPanels = (HeadDim + kPanelCols - 1) / kPanelCols;
  static constexpr int kRowHalves = (HeadDim < kPanelCols ? HeadDim : kPanelCols) + 8;
  static constexpr int kPRowHalves = kTileKeys + 8;
  static constexpr int kQRows = kPanels * BlockRows;
  static constexpr int kKvRows = kPanels * kTileKeys;  // keys, then values: rows of the tile, like Q
  static constexpr int kPRows = BlockRows;
  static constexpr int kHalvesBytes = ((kQRows + kKvRows) * kRowHalves + kPRows * kPRowHalves) * 2;
  static constexpr int kStatFloats = BlockRows == kDecodeRows ? kWarps * kWarpRows : 0;
  static constexpr int kBytes = kHalvesBytes + kStatFloats * 4;
  static_assert(kBytes <= kVoltaMaxSmemPerBlock, "Volta allows 96 KB of shared memory per block");
};
VOLTA_FP4_HOST_DEVICE constexpr int attention_smem_bytes(int head_dim, int block_rows) {
  return block_rows == kDecodeRows
             ? (head_dim == 64    ? SmemPlan<64, kDecodeRows>::kBytes
                : head_dim == 128 ? SmemPlan<128, kDecodeRows>::kBytes
                                  : SmemPlan<256, kDecodeRows>::kBytes)
             : (head_dim == 64    ? SmemPlan<64, kPrefillRows>::kBytes
                : head_dim == 128 ? SmemPlan<128, kPrefillRows>::kBytes
                                  : SmemPlan<256, kPrefillRows>::kBytes);
}

// Decode blocks per SM at most, by head_dim: the residency they had while the SM80 atom stored values transposed
// (H100: 2 / 2 / 4 at head_dim 256 / 128 / 64, by registers). Read with ldmatrix.trans, its decode blocks need far
// fewer registers (head_dim 256: 158 instead of 254 on sm_90) and three fit where two did; three were 17-28 % slower
// at batch 64 on an H100 (docs/attention.md) and also raise the split count (choose_splits). The launch's shared
// memory request (attention_launch_smem_bytes) holds every GPU to these counts, a V100 included.
VOLTA_FP4_HOST_DEVICE constexpr int decode_max_blocks_per_sm(int head_size) { return head_size == 64 ? 4 : 2; }

// Dynamic shared memory to request for a block that needs plan_bytes so that no more than max_blocks fit on an SM of
// smem_per_sm bytes (each resident block also takes reserved_per_block): just over a (max_blocks + 1)-th of the SM.
VOLTA_FP4_HOST_DEVICE constexpr int smem_request_for_residency(int plan_bytes, int max_blocks, int smem_per_sm,
                                                               int reserved_per_block) {
  return plan_bytes > smem_per_sm / (max_blocks + 1) - reserved_per_block + 1
             ? plan_bytes
             : smem_per_sm / (max_blocks + 1) - reserved_per_block + 1;
}

// Dynamic shared memory a paged_attention_kernel launch requests on an SM of smem_per_sm bytes: decode blocks are
// held to decode_max_blocks_per_sm, prefill blocks ask for their plan. Also exported for the sm_70 resource report.
VOLTA_FP4_HOST_DEVICE constexpr int attention_launch_smem_bytes(int head_size, int block_rows, int smem_per_sm,
                                                                int reserved_per_block) {
  return block_rows == kDecodeRows ? smem_request_for_residency(attention_smem_bytes(head_size, block_rows),
                                                                decode_max_blocks_per_sm(head_size), smem_per_sm,
                                                                reserved_per_block)
                                   : attention_smem_bytes(head_size, block_rows);
}

constexpr int kKvWriteThreads = 128;  // write_kv_cache_kernel: one block per token

struct PagedAttentionParams {
  const uint16_t* query;  // [num_tokens, num_heads, D]
  int64_t q_token_stride, q_head_stride;
  const uint16_t* key_cache;    // &kv_cache[0, 0]
  const uint16_t* value_cache;  // &kv_cache[0, 1]
  int64_t cache_block_stride, cache_slot_stride, cache_head_stride;
  const int* block_table;  // [num_seqs, max_blocks]
  int64_t block_table_stride;
  const int* query_start_loc;  // [num_seqs + 1]
  const int* seq_lens;         // [num_seqs]
  uint16_t* out;               // [num_tokens, num_heads, D]
  int64_t out_token_stride, out_head_stride;
  float* partial_out;  // [splits, num_tokens, num_heads, D] when splits > 1
  float* partial_lse;  // [splits, num_tokens, num_heads], log2 domain
  int* split_counters;  // decode blocks: [row tiles, num_kv_heads] semaphores, all zero between launches
  int num_seqs, num_tokens, num_heads;
  FastDivisor group;       // num_heads / num_kv_heads: row r of a KV head's rows is token r / group, head r % group
  FastDivisor block_size;  // cache slots per block: key j is in block j / block_size, slot j % block_size
  int window;          // sliding window in tokens; 0 = none
  float scale_log2;    // softmax scale · log2(e)
  int splits;  // KV splits per row tile (grid z); each block takes ⌈its KV tiles / splits⌉ of them
};

struct KvCacheWriteParams {
  const uint16_t* key;
  const uint16_t* value;
  int64_t key_token_stride, key_head_stride, value_token_stride, value_head_stride;
  const int64_t* slot_mapping;
  uint16_t* key_cache;
  uint16_t* value_cache;
  int64_t cache_block_stride, cache_slot_stride, cache_head_stride;
  int num_kv_heads, head_size, block_size;
};

}  // namespace attention
}  // namespace volta_fp4
