// Paged attention for Volta and newer, over vLLM's paged KV cache: one kernel for prefill, chunked prefill,
// prefix-cache hits, mixed batches and decode, plus the KV-cache write and the split-KV combine.
// Kernel code only (no torch or host headers): compiled by NVRTC into the kernel image (tools/sm70_check.py) and for
// the sm_70 check (tests/test_attention_sm70_compile.py). The matrix products use the MMA atoms of weight_gemm.cuh.
//
// ─── Data layouts ──────────────────────────────────────────────────────────────────────────────────────────
// KV cache (the backend's get_kv_cache_shape): fp16 [num_blocks, 2, block_size, num_kv_heads, head_size],
//   [:, 0] keys and [:, 1] values; any strides with a contiguous last dimension. Token j of sequence s lives in
//   block block_table[s][j / block_size], slot j % block_size. slot_mapping[t] = block · block_size + slot for
//   new token t, or -1 for a token that is not stored (padding).
// Batch (vLLM's metadata): query [num_tokens, num_heads, head_size] fp16, the tokens of sequence s are rows
//   query_start_loc[s] … query_start_loc[s+1]-1 and are the *last* q_len of its seq_lens[s] tokens, so query i
//   sits at position context + i with context = seq_len − q_len (cached prefix or earlier chunks). Key j is
//   visible to the query at position `pos` iff j ≤ pos and, with a sliding window W, pos − j < W.
// GQA: the `group` = num_heads / num_kv_heads query heads of one KV head share its keys, so a block works on the
//   rows (token, head in group) of one KV head, flattened as token · group + g: keys are read once per group,
//   and a decode step of a 6:1 GQA model fills 6 rows instead of 1.
//
// ─── Work split ────────────────────────────────────────────────────────────────────────────────────────────
// Grid (row tiles, num_kv_heads, splits). Sequence s owns row tiles tile_base(s) … tile_base(s+1)−1 with tile_base(s) =
// ⌊query_start_loc[s] · group / R⌋ + s (R = the block's rows), which bounds the grid by num_tokens·group/R + num_seqs
// without reading the batch on the host; a block finds its sequence by counting the sequences whose first tile is at
// or before it, and a block past its sequence's rows exits. Split z walks its share of the KV tiles the rows can see:
// that share is computed here from the block's own key range (split_share: ⌈tiles / splits⌉, one split below 3
// tiles, past 32 splits only with ≥ 4 tiles each), so the host fixes only the split count, and a launch captured in a
// CUDA graph stays correct for any sequence lengths it is replayed with. With one split the block writes fp16 output;
// with several it writes O/l and log2-sum-exp in fp32 (decode and small batches with long contexts, where row tiles
// alone cannot fill the GPU), merged by the row tile's last split to finish in decode blocks (merge_splits) and by
// combine_splits_kernel after prefill blocks. Tokens past query_start_loc[num_seqs] (vLLM's padding of a captured
// batch) belong to no sequence: nothing is written for them.
//
// ─── Block (4 warps, R = 64 or 16 rows, 64-key tiles) ───────────────────────────────────────────────────────
// Per KV tile: keys → smem; S = Q·Kᵀ (fp32); mask; online softmax in fp32 in registers (row max and rescale, exp2
// with the scale folded in); P → smem as fp16; values → smem like keys, a row per key (the B of P·V in k-major form:
// m8n8k4's row-major B fragment on the SM70 atom, transposed by ldmatrix on the SM80 atom); O += P·V.
// Prefill blocks (R = 64): warp w owns rows 16w … 16w+15, all 64 keys of S and all head dims of O, so softmax
//   statistics never leave the warp.
// Decode blocks (R = 16, the host's choice for batches of few rows per sequence: one token's heads of a GQA group, or
//   a few tokens' under speculation; attention_plan.h): a 64-row block would leave 3 of 4 warps without rows and hold
//   all of O (128 fp32 registers per lane at head_dim 256) in one warp, so the tile's K and V loads could not stay in
//   flight. Here all warps share the 16 rows: warp w computes S for keys 16w … 16w+15 of the tile, the row maxima are
//   exchanged through shared memory (one more barrier per tile, every warp then applies the same maximum, so the
//   partial row sums add up at the end), and warp w accumulates O for head dims w·D/4 … (w+1)·D/4 − 1 over all 64 keys.
//   O is a quarter of the prefill block's per lane, which leaves the registers to stage a tile's K and V per thread
//   (at head_dim 256 all values, half the keys): the values load while S is computed, the next keys while P·V is.
// Shared memory is laid out in rows of a panel's head dims (at most 128) or a tile's 64 keys (P), each padded by 8
// halves, the strides the atoms read (SmemPlan): Q, K and V store head dims ≥ 128 as a second panel of rows. K and V
// share one buffer (they are not live together), which keeps head_dim 256 at 77 KB (prefill blocks; decode blocks
// 45 KB), inside Volta's 96 KB per block.
#pragma once

#include "attention/attention_shape.h"
#include "common/fp16.cuh"
#include "common/last_arrival.cuh"
#include "common/mma_atoms.cuh"

namespace volta_fp4 {
namespace attention {

// Where the two rows of a lane live in an atom's 16 × 16 accumulator: element i belongs to the lane's row slot
// (i >> 1) & 1 (both atoms: rows r and r+2 on SM70, r and r+8 on SM80), and the lanes that hold the other
// columns of the same rows differ from it in the lane bits kPeerMask0 and kPeerMask1 (see acc_coord).
template <class Mma>
struct AccRows;
template <>
struct AccRows<Sm70Mma> {
  static constexpr int kPeerMask0 = 2, kPeerMask1 = 8;
};
template <>
struct AccRows<Sm80Mma> {
  static constexpr int kPeerMask0 = 1, kPeerMask1 = 2;
};
__device__ __forceinline__ int row_slot(int i) { return (i >> 1) & 1; }

template <class Mma>
__device__ __forceinline__ float row_reduce_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, AccRows<Mma>::kPeerMask0));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, AccRows<Mma>::kPeerMask1));
}
template <class Mma>
__device__ __forceinline__ float row_reduce_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, AccRows<Mma>::kPeerMask0);
  return v + __shfl_xor_sync(0xffffffffu, v, AccRows<Mma>::kPeerMask1);
}

// Decode blocks: each warp's statistic of its two rows (already reduced over the warp) → the maximum or the sum over
// the four warps, in warp order, so every warp gets the same value. row_stats: [kWarps][kWarpRows] in shared memory;
// its previous contents must have been read before the barrier the caller last passed.
template <bool kMax>
__device__ __forceinline__ void combine_over_warps(float (&value)[2], float* row_stats, int warp,
                                                   const int (&row_in_warp)[2]) {
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) row_stats[warp * kWarpRows + row_in_warp[slot]] = value[slot];
  __syncthreads();
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    value[slot] = row_stats[row_in_warp[slot]];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      const float other = row_stats[w * kWarpRows + row_in_warp[slot]];
      value[slot] = kMax ? fmaxf(value[slot], other) : value[slot] + other;
    }
  }
}

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000); }

// A split's weight in a merge of splits (merge_splits, combine_splits_kernel): 2^(lse − max lse) over the splits, 0
// for a split in which the row saw no key (lse −inf).
__device__ __forceinline__ float merge_weight(float lse, float max_lse) {
  return lse == negative_infinity() ? 0.f : exp2f(lse - max_lse);
}

// The first row tile of sequence seq, from its first token query_start_loc[seq].
template <int BlockRows>
__device__ __forceinline__ int tile_base(const PagedAttentionParams& p, int seq, int first_token) {
  return int(int64_t(first_token) * p.group.divisor / BlockRows) + seq;
}

// Row `row` of a KV head's rows of a sequence whose first token is q_begin: its token, and its query head in `head`.
__device__ __forceinline__ int row_token(const PagedAttentionParams& p, int q_begin, int kv_head, int row, int& head) {
  int head_in_group;
  const int token = q_begin + fast_divmod(p.group, row, head_in_group);
  head = kv_head * int(p.group.divisor) + head_in_group;
  return token;
}

// Offset (in halves) of head dim `col` of tile row `row` in a Q/K tile stored as panels of 128 dims, in rows of
// RowHalves halves.
template <int Rows, int RowHalves>
__device__ __forceinline__ int panel_offset(int row, int col) {
  return ((col / kPanelCols) * Rows + row) * RowHalves + col % kPanelCols;
}

// Where a thread's vectors of the current KV tile are in the cache: per key slot its row (halves from the cache's
// start, head included) and whether the key is visible, from block numbers requested a phase earlier. Keys before
// key_begin are invisible to every row of the block, and vLLM may have freed their blocks (sliding window): zeros
// instead of whatever the block table points at keep P·V free of NaN. Keys past seq_len have no block.
template <class Map>
struct KvSource {
  int block;  // of the key this lane looks up (Map::lookup_key)
  int64_t row[Map::kKeys];
  bool visible[Map::kKeys];

  __device__ __forceinline__ static bool key_visible(int key, int key_begin, int seq_len) {
    return key >= key_begin && key < seq_len;
  }
  // One block-table load per lane, a phase before set_rows needs it.
  __device__ __forceinline__ void request_blocks(const PagedAttentionParams& p, const int* blocks, int key0,
                                                 int key_begin, int seq_len) {
    const int key = key0 + Map::lookup_key(threadIdx.x);
    block = key_visible(key, key_begin, seq_len) ? blocks[fast_quotient(p.block_size, key)] : 0;
  }
  // The lookup lane turns its key into a cache row; each key slot takes its row from that lane (all lanes call this:
  // the shuffles need the whole warp).
  __device__ __forceinline__ void set_rows(const PagedAttentionParams& p, int key0, int key_begin, int seq_len,
                                           int64_t head_offset) {
    int slot;
    fast_divmod(p.block_size, key0 + Map::lookup_key(threadIdx.x), slot);
    const int64_t lookup_row =
        int64_t(block) * p.cache_block_stride + int64_t(slot) * p.cache_slot_stride + head_offset;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int k = 0; k < Map::kKeys; ++k) {
      const int key = key0 + Map::key(threadIdx.x) + k * Map::kKeyStep;
      visible[k] = key_visible(key, key_begin, seq_len);
      const int64_t key_row = Map::kKeys == 1 ? lookup_row
                                              : __shfl_sync(0xffffffffu, lookup_row, Map::lookup_lane(lane, k));
      row[k] = key_row + Map::dim0(threadIdx.x);
    }
  }
  // Vector j: its key slot by selects, not an index, so that a j the compiler does not know (rolled loops of prefill
  // blocks) keeps the rows in registers.
  __device__ __forceinline__ uint4 load(const uint16_t* cache, int j) const {
    const int k = Map::key_slot(j);
    int64_t key_row = row[0];
    bool key_shown = visible[0];
#pragma unroll
    for (int i = 1; i < Map::kKeys; ++i)
      if (k == i) key_row = row[i], key_shown = visible[i];
    return key_shown ? *reinterpret_cast<const uint4*>(cache + key_row + Map::dim_offset(j))
                     : make_uint4(0, 0, 0, 0);
  }
};

// Decode blocks with several splits: the last split of a row tile to finish (arrived_last) merges them all, so a
// decode call is one launch and splits without tiles cost next to nothing (the combine launch and empty splits were
// ~4 µs of the 10.8 µs one-key call under a CUDA graph's split count on an H100, docs/attention.md). A decode tile has
// at most 16 rows, so one block reads its partials (in L2, just written) in about one round trip per 16 splits and row
// pair, weighted by merge_weight over the splits with tiles. Splits are added in split order whichever block arrives
// last, so the output does not depend on timing (a CUDA graph replay equals an eager call bit for bit). `scratch`: the
// block's K/V buffer, free once every warp has passed arrived_last.
template <int HeadDim, int BlockRows>
__device__ __forceinline__ void merge_splits(const PagedAttentionParams& p, float* scratch, int q_begin, int kv_head,
                                             int row0, int rows, int splits) {
  constexpr int kThreadsPerRow = kThreadsPerBlock / BlockRows;  // lse phase: consecutive lanes share a row
  constexpr int kLsePerThread = kMaxSplits / kThreadsPerRow;
  constexpr int kQuads = HeadDim / 4;                            // output phase: 4 dims per thread and row
  constexpr int kRowStreams = kThreadsPerBlock / kQuads;
  constexpr int kMergeGroup = 16;
  static_assert(32 % kThreadsPerRow == 0 && kThreadsPerBlock % kQuads == 0, "rows and dims divide the block");
  float* weight = scratch;                                  // [BlockRows][kMaxSplits]
  float* inverse_total = scratch + BlockRows * kMaxSplits;  // [BlockRows]
  const int tid = threadIdx.x;
  const int64_t split_stride = int64_t(p.num_tokens) * p.num_heads;
  {
    const int r = tid / kThreadsPerRow, part = tid % kThreadsPerRow;
    const bool valid = row0 + r < rows;
    int head = 0;
    const int token = valid ? row_token(p, q_begin, kv_head, row0 + r, head) : 0;
    const float* row_lse = p.partial_lse + int64_t(token) * p.num_heads + head;
    float lse[kLsePerThread];  // splits part, part + kThreadsPerRow, …: all requested in one round
    float max_lse = negative_infinity();
#pragma unroll
    for (int i = 0; i < kLsePerThread; ++i) {
      const int s = part + i * kThreadsPerRow;
      lse[i] = valid && s < splits ? row_lse[s * split_stride] : negative_infinity();
      max_lse = fmaxf(max_lse, lse[i]);
    }
#pragma unroll
    for (int offset = kThreadsPerRow / 2; offset > 0; offset >>= 1)
      max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kLsePerThread; ++i) {
      const int s = part + i * kThreadsPerRow;
      const float w = merge_weight(lse[i], max_lse);
      if (s < splits) weight[r * kMaxSplits + s] = w;
      total += w;
    }
#pragma unroll
    for (int offset = kThreadsPerRow / 2; offset > 0; offset >>= 1)
      total += __shfl_xor_sync(0xffffffffu, total, offset);
    if (part == 0) inverse_total[r] = total > 0.f ? 1.f / total : 0.f;
  }
  __syncthreads();
  const int dim = (tid % kQuads) * 4;
  for (int r = tid / kQuads; r < BlockRows && row0 + r < rows; r += kRowStreams) {
    int head;
    const int token = row_token(p, q_begin, kv_head, row0 + r, head);
    const float* partial = p.partial_out + (int64_t(token) * p.num_heads + head) * HeadDim + dim;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    // kMergeGroup splits' loads in flight together, the last group's past `splits` predicated off (a rolled
    // remainder would wait for each load in turn)
    for (int s0 = 0; s0 < splits; s0 += kMergeGroup) {
      float4 v[kMergeGroup];
#pragma unroll
      for (int i = 0; i < kMergeGroup; ++i)
        v[i] = s0 + i < splits ? *reinterpret_cast<const float4*>(partial + (s0 + i) * split_stride * HeadDim)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int i = 0; i < kMergeGroup; ++i) {
        const float w = s0 + i < splits ? weight[r * kMaxSplits + s0 + i] : 0.f;
        sum.x += w * v[i].x;
        sum.y += w * v[i].y;
        sum.z += w * v[i].z;
        sum.w += w * v[i].w;
      }
    }
    const float inverse = inverse_total[r];
    *reinterpret_cast<uint2*>(p.out + token * p.out_token_stride + head * p.out_head_stride + dim) =
        make_uint2(float2_to_half2_rn(sum.x * inverse, sum.y * inverse),
                   float2_to_half2_rn(sum.z * inverse, sum.w * inverse));
  }
}

template <class Mma, int HeadDim, int BlockRows>
__global__ void __launch_bounds__(kThreadsPerBlock) paged_attention_kernel(const PagedAttentionParams p) {
  using Plan = SmemPlan<HeadDim, BlockRows>;
  constexpr bool kDecode = BlockRows == kDecodeRows;  // warps over keys and head dims instead of rows
  constexpr int kChunks = HeadDim / 8;  // 16-byte vectors per row
  constexpr int kStrips = HeadDim / 16;
  constexpr int kKeyStrips = kTileKeys / 16;
  constexpr int kWarpStrips = kDecode ? kStrips / kWarps : kStrips;     // O: 16-dim strips of a warp
  constexpr int kWarpKeyStrips = kDecode ? kKeyStrips / kWarps : kKeyStrips;  // S: 16-key strips of a warp
  static_assert(!kDecode || (kWarpStrips >= 1 && kWarpKeyStrips == 1), "decode blocks: one key strip per warp");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* q_smem = reinterpret_cast<uint16_t*>(smem_raw);
  constexpr int kRowHalves = Plan::kRowHalves, kPRowHalves = Plan::kPRowHalves;
  uint16_t* kv_smem = q_smem + Plan::kQRows * kRowHalves;
  uint16_t* p_smem = kv_smem + Plan::kKvRows * kRowHalves;
  float* row_stats = reinterpret_cast<float*>(smem_raw + Plan::kHalvesBytes);  // decode: [warp][row]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kv_head = blockIdx.y, split = blockIdx.z;

  // The block's sequence: the last one whose first row tile is at or before this block. tile_base increases with the
  // sequence, so that is the count of such sequences minus one, counted by all threads at once: one round of loads
  // per 128 sequences (a binary search is a chain of log2(num_seqs) dependent loads before any other work). Each
  // thread reads its sequence's query range and length in the same round, and the one whose sequence it is publishes
  // them (the count's barrier makes them visible), so the lengths cost no second round trip after the count.
  __shared__ int found[3];  // query_start_loc[seq], query_start_loc[seq + 1], seq_lens[seq]
  int seq = -1;
  for (int s0 = 0; s0 < p.num_seqs; s0 += kThreadsPerBlock) {
    const int s = s0 + tid;
    bool at_or_before = false;
    if (s < p.num_seqs) {
      const int begin = p.query_start_loc[s], end = p.query_start_loc[s + 1], length = p.seq_lens[s];
      at_or_before = tile_base<BlockRows>(p, s, begin) <= int(blockIdx.x);
      if (at_or_before && (s + 1 == p.num_seqs || tile_base<BlockRows>(p, s + 1, end) > int(blockIdx.x)))
        found[0] = begin, found[1] = end, found[2] = length;
    }
    seq += __syncthreads_count(at_or_before);
  }
  const int q_begin = found[0];
  const int q_len = found[1] - q_begin;
  const int rows = q_len * int(p.group.divisor);
  const int row0 = (int(blockIdx.x) - tile_base<BlockRows>(p, seq, q_begin)) * BlockRows;
  if (row0 >= rows) return;
  const int seq_len = found[2];
  const int context = seq_len - q_len;
  const int* blocks = p.block_table + int64_t(seq) * p.block_table_stride;

  // Keys any row of this block can see, as KV tiles; this split takes its share of them (split_share).
  const int first_pos = context + fast_quotient(p.group, row0);
  const int last_pos = context + fast_quotient(p.group, min(row0 + BlockRows, rows) - 1);
  const int key_begin = p.window > 0 ? max(0, first_pos - p.window + 1) : 0;
  const int tiles_begin = key_begin / kTileKeys, tiles_end = (last_pos + kTileKeys) / kTileKeys;
  const SplitShare share = split_share(max(tiles_end - tiles_begin, 0), p.splits);
  const int tiles_per_split = share.tiles_per_split, splits_with_tiles = share.splits_with_tiles;
  const int tile_first = tiles_begin + split * tiles_per_split;
  const int tile_end = min(tiles_end, tile_first + tiles_per_split);
  // A split can have no KV tiles: short contexts under a split count chosen for long ones, as in a CUDA graph. In a
  // decode block it leaves at once (its row tile's last split merges only the splits with tiles, merge_splits); in a
  // prefill block it writes empty partials, since combine_splits_kernel reads every split.
  if (kDecode && tile_first >= tile_end) return;
  // fp16 output straight from this block: one split, or a decode block's only split with tiles (nothing to merge).
  const bool writes_output = p.splits == 1 || (kDecode && splits_with_tiles == 1);

  // Q tile → smem (rows past the sequence are zero). A thread's vectors are requested kQInFlight at a time before any
  // is stored: stored one by one, each load waited behind the previous store, a chain of 4 round trips at head_dim 256
  // before the first keys.
  constexpr int kQVectorsPerThread = BlockRows * kChunks / kThreadsPerBlock;
  constexpr int kQInFlight = kQVectorsPerThread < 4 ? kQVectorsPerThread : 4;
  static_assert(kQVectorsPerThread % kQInFlight == 0, "Q vectors come in groups of kQInFlight");
  const bool has_tiles = tile_first < tile_end;
  auto q_vector = [&](int v) {  // vector v of the tile: row v / kChunks, dims (v % kChunks)·8 …
    const int row = row0 + v / kChunks;
    int head;
    const int token = row_token(p, q_begin, kv_head, row, head);
    return row < rows ? *reinterpret_cast<const uint4*>(p.query + token * p.q_token_stride +
                                                        head * p.q_head_stride + (v % kChunks) * 8)
                      : make_uint4(0, 0, 0, 0);
  };
  // This lane's two rows: validity and query position. The warp's first row, its first key strip of S and its first
  // 16-dim strip of O (decode blocks: all warps have the block's rows).
  const int warp_row0 = kDecode ? 0 : warp * kWarpRows;
  const int key_strip0 = kDecode ? warp : 0, dim_strip0 = kDecode ? warp * kWarpStrips : 0;
  bool row_valid[2];
  int row_pos[2], row_in_warp[2];
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    int col;
    Mma::acc_coord(lane, 2 * slot, row_in_warp[slot], col);
    const int row = row0 + warp_row0 + row_in_warp[slot];
    row_valid[slot] = row < rows;
    row_pos[slot] = context + fast_quotient(p.group, row);
  }
  const bool warp_has_rows = row0 + warp_row0 < rows;

  float o[kWarpStrips][8];
#pragma unroll
  for (int n = 0; n < kWarpStrips; ++n)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[n][i] = 0.f;
  float row_max[2] = {negative_infinity(), negative_infinity()};
  float row_sum[2] = {0.f, 0.f};  // this lane's share; summed over the row's lanes at the end

  const uint16_t* q_warp = q_smem + warp_row0 * kRowHalves;
  uint16_t* p_warp = p_smem + warp_row0 * kPRowHalves;
  const int64_t head_offset = int64_t(kv_head) * p.cache_head_stride;

  // Volta has no asynchronous copy, so KV tiles are staged through registers: the first kStagedValues of a thread's
  // vectors of a tile's values are loaded while S is computed, the first kStagedKeys of the next tile's keys during
  // P·V, the rest when stored, kInFlight at a time. Each group of loads the store waits for is one memory round trip
  // that nothing overlaps, and decode blocks at short contexts are chains of such round trips. Decode blocks stage
  // all values, and all keys but at head_dim 256, whose O accumulators are live during P·V (16 staged keys there
  // spilled on sm_70); the 8 others then come in one group. Prefill blocks at head_dim 256 stage none: their O
  // accumulators hold the registers, and staging even one vector measured slower on the H200.
  // Which vectors a thread has: KvThreadMap, for keys and values alike (one set of cache rows serves both). Decode
  // blocks read along dims; prefill blocks along keys: at head_dim 256 on sm_70 the rows of 4 keys per thread spill
  // (255 registers). A thread's block numbers of a tile are one round of loads, read with the previous tile's
  // values, a phase before the tile's keys need them (each lookup is a dependent global load before the vector's
  // own).
  using KvMap = KvThreadMap<HeadDim, kDecode>;
  constexpr int kVectorsPerThread = KvMap::kVectors;
  constexpr int kStagedKeys = kDecode ? (HeadDim == 256 ? 8 : kVectorsPerThread) : HeadDim == 256 ? 0 : 4;
  constexpr int kStagedValues = kDecode ? kVectorsPerThread : kStagedKeys;
  // Loads in flight per group of unstaged vectors, up to 8, for both block kinds: each group is one round trip that
  // nothing overlaps. Prefill blocks at head_dim 256 stage nothing, so their 16 vectors of K and of V per tile were 8
  // + 8 round trips at 2 per group (H100, S = 4096: 2.34 → 2.11 ms at 8; 16 measured no better). A group's registers
  // are live only while the tile is stored, when S is not, so 8 fit beside O (sm_70: 233 registers at 2 and at 8).
  constexpr int kUnstaged = kVectorsPerThread - kStagedKeys;
  constexpr int kInFlight = kUnstaged < 1 ? 1 : kUnstaged < 8 ? kUnstaged : 8;
  static_assert(kUnstaged % kInFlight == 0 &&
                    (kVectorsPerThread - kStagedValues) % kInFlight == 0,
                "unstaged vectors come in groups of kInFlight");
  KvSource<KvMap> kv_source;
  uint4 staged[kStagedValues > 0 ? kStagedValues : 1];  // kStagedValues ≥ kStagedKeys
  // The first tile's block numbers are requested before Q, so that the two round trips overlap.
  if (has_tiles) {
    kv_source.request_blocks(p, blocks, tile_first * kTileKeys, key_begin, seq_len);
#pragma unroll 1
    for (int v0 = 0; v0 < kQVectorsPerThread; v0 += kQInFlight) {
      uint4 loaded[kQInFlight];
#pragma unroll
      for (int i = 0; i < kQInFlight; ++i) loaded[i] = q_vector(tid + (v0 + i) * kThreadsPerBlock);
#pragma unroll
      for (int i = 0; i < kQInFlight; ++i) {
        const int v = tid + (v0 + i) * kThreadsPerBlock;
        const int offset = panel_offset<BlockRows, kRowHalves>(v / kChunks, (v % kChunks) * 8);
        *reinterpret_cast<uint4*>(q_smem + offset) = loaded[i];
      }
    }
    kv_source.set_rows(p, tile_first * kTileKeys, key_begin, seq_len, head_offset);
#pragma unroll
    for (int j = 0; j < kStagedKeys; ++j) staged[j] = kv_source.load(p.key_cache, j);
  }
  // Shared memory: keys and values alike as rows of the tile (P·V reads values as a k-major B: load_b_k_major),
  // stored 16 bytes at a time; along dims, a quarter warp's 8 stores are 128 contiguous bytes of one key's row.
  uint16_t* const kv_smem_thread = kv_smem + panel_offset<kTileKeys, kRowHalves>(KvMap::key(tid), KvMap::dim0(tid));
  auto store_vector = [&](int j, const uint4& value) {
    const int offset = panel_offset<kTileKeys, kRowHalves>(KvMap::key_offset(j), KvMap::dim_offset(j));
    *reinterpret_cast<uint4*>(kv_smem_thread + offset) = value;
  };
  // A tile's vectors (keys or values) → smem. The first kInFlight past the staged ones are requested before the
  // staged ones are stored (a store waits for its staged load), so that those round trips overlap; the rest follow
  // kInFlight at a time. Called with constant arguments, so the counts fold and `staged` stays in registers.
  auto store_tile = [&](bool values) {
    const int staged_count = values ? kStagedValues : kStagedKeys;
    const uint16_t* cache = values ? p.value_cache : p.key_cache;
#pragma unroll 1  // one group in flight: unrolled, the compiler hoists the next group's loads and spills on Volta
    for (int j0 = staged_count; j0 < kVectorsPerThread; j0 += kInFlight) {
      uint4 loaded[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) loaded[i] = kv_source.load(cache, j0 + i);
      if (j0 == staged_count) {
#pragma unroll
        for (int j = 0; j < staged_count; ++j) store_vector(j, staged[j]);
      }
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) store_vector(j0 + i, loaded[i]);
    }
    if (staged_count == kVectorsPerThread) {
#pragma unroll
      for (int j = 0; j < staged_count; ++j) store_vector(j, staged[j]);
    }
  };

  for (int tile = tile_first; tile < tile_end; ++tile) {
    const int key0 = tile * kTileKeys;
    __syncthreads();  // the previous tile's values have been read (and, on the first tile, Q is stored)
    store_tile(false);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kStagedValues; ++j) staged[j] = kv_source.load(p.value_cache, j);
    if (tile + 1 < tile_end) kv_source.request_blocks(p, blocks, key0 + kTileKeys, key_begin, seq_len);
    if (warp_has_rows) {
      float s[kWarpKeyStrips][8];
#pragma unroll
      for (int n = 0; n < kWarpKeyStrips; ++n)
#pragma unroll
        for (int i = 0; i < 8; ++i) s[n][i] = 0.f;
      // k outside, strips inside: the Q fragment is shared by the strips. Prefill blocks keep the k loop partly
      // rolled, so that the registers stay with the accumulators instead of prefetched fragments (head_dim 256 on
      // Volta); decode blocks (one strip, a quarter of O) unroll it, which makes every fragment address a constant.
#pragma unroll(kDecode ? HeadDim / Mma::kK : 2)
      for (int k = 0; k < HeadDim; k += Mma::kK) {
        const int panel = k / kPanelCols;
#pragma unroll
        for (int n = 0; n < kWarpKeyStrips; ++n) {
          typename Mma::template Frags<kWarpRows> f;
          Mma::template load<kWarpRows, kRowHalves>(f, q_warp + panel * BlockRows * kRowHalves,
                                                    kv_smem + (panel * kTileKeys + (key_strip0 + n) * 16) * kRowHalves,
                                                    k % kPanelCols, lane);
          Mma::template mma<kWarpRows>(s[n], f);
        }
      }
      // Mask, then the online softmax update (log2 domain).
      float tile_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
      for (int n = 0; n < kWarpKeyStrips; ++n)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          int row, col;
          Mma::acc_coord(lane, i, row, col);
          const int slot = row_slot(i), key = key0 + (key_strip0 + n) * 16 + col, pos = row_pos[slot];
          const bool visible = row_valid[slot] && key <= pos && (p.window <= 0 || pos - key < p.window);
          s[n][i] = visible ? s[n][i] * p.scale_log2 : negative_infinity();
          tile_max[slot] = fmaxf(tile_max[slot], s[n][i]);
        }
#pragma unroll
      for (int slot = 0; slot < 2; ++slot) tile_max[slot] = row_reduce_max<Mma>(tile_max[slot]);
      // The other warps' keys (all warps have rows in decode blocks, so the barrier inside is reached by all).
      if constexpr (kDecode) combine_over_warps<true>(tile_max, row_stats, warp, row_in_warp);
      float reference[2];
#pragma unroll
      for (int slot = 0; slot < 2; ++slot) {
        const float new_max = fmaxf(row_max[slot], tile_max[slot]);
        // A row that has seen no visible key keeps max −inf; subtracting 0 instead keeps exp2 at 0, not NaN.
        reference[slot] = new_max == negative_infinity() ? 0.f : new_max;
        const float rescale = exp2f(row_max[slot] - reference[slot]);
        row_max[slot] = new_max;
        row_sum[slot] *= rescale;
#pragma unroll
        for (int n = 0; n < kWarpStrips; ++n)
#pragma unroll
          for (int i = 0; i < 8; ++i)
            if (row_slot(i) == slot) o[n][i] *= rescale;
      }
#pragma unroll
      for (int n = 0; n < kWarpKeyStrips; ++n)
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
          int row, col;
          Mma::acc_coord(lane, i, row, col);
          const int slot = row_slot(i);
          const float p0 = exp2f(s[n][i] - reference[slot]), p1 = exp2f(s[n][i + 1] - reference[slot]);
          row_sum[slot] += p0 + p1;
          *reinterpret_cast<uint32_t*>(p_warp + row * kPRowHalves + (key_strip0 + n) * 16 + col) =
              float2_to_half2_rn(p0, p1);
        }
    }
    __syncthreads();  // every warp is done with the keys

    store_tile(true);
    __syncthreads();
    if (tile + 1 < tile_end) {
      kv_source.set_rows(p, key0 + kTileKeys, key_begin, seq_len, head_offset);
#pragma unroll
      for (int j = 0; j < kStagedKeys; ++j) staged[j] = kv_source.load(p.key_cache, j);
    }

    if (warp_has_rows) {
#pragma unroll(kDecode ? kTileKeys / Mma::kK : 2)
      for (int k = 0; k < kTileKeys; k += Mma::kK)
#pragma unroll
        for (int n = 0; n < kWarpStrips; ++n) {
          typename Mma::template Frags<kWarpRows> f;
          const int dim0 = (dim_strip0 + n) * 16;  // V as stored: key rows, the strip's 16 dims in panel dim0 / 128
          Mma::template load_a<kWarpRows, kPRowHalves>(f, p_warp, k, lane);
          Mma::template load_b_k_major<kWarpRows, kRowHalves>(f, kv_smem + panel_offset<kTileKeys, kRowHalves>(0, dim0),
                                                              k, lane);
          Mma::template mma<kWarpRows, true>(o[n], f);
        }
    }
  }

  float total[2];
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) total[slot] = row_reduce_sum<Mma>(row_sum[slot]);
  // Decode blocks: each warp summed its own keys (the tile loop's last reads of row_stats are behind a barrier).
  if constexpr (kDecode) combine_over_warps<false>(total, row_stats, warp, row_in_warp);
  float inverse_sum[2], lse[2];
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    inverse_sum[slot] = total[slot] > 0.f ? 1.f / total[slot] : 0.f;
    lse[slot] = total[slot] > 0.f ? row_max[slot] + log2f(total[slot]) : negative_infinity();
  }
  if (!warp_has_rows) return;  // decode blocks: every warp has the rows, so all threads reach the merge below
  // Where this lane's two rows go, computed once: their row of out or their (split, token, head) index of the
  // partials.
  int64_t out_row[2];
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    int head;
    const int token = row_token(p, q_begin, kv_head, row0 + warp_row0 + row_in_warp[slot], head);
    out_row[slot] = writes_output ? token * p.out_token_stride + head * p.out_head_stride
                                  : (int64_t(split) * p.num_tokens + token) * p.num_heads + head;
  }
#pragma unroll
  for (int n = 0; n < kWarpStrips; ++n)
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      int row, col;
      Mma::acc_coord(lane, i, row, col);
      const int slot = row_slot(i);
      if (!row_valid[slot]) continue;
      const int dim = (dim_strip0 + n) * 16 + col;
      const float v0 = o[n][i] * inverse_sum[slot], v1 = o[n][i + 1] * inverse_sum[slot];
      if (writes_output) {
        *reinterpret_cast<uint32_t*>(p.out + out_row[slot] + dim) = float2_to_half2_rn(v0, v1);
      } else {
        *reinterpret_cast<float2*>(p.partial_out + out_row[slot] * HeadDim + dim) = make_float2(v0, v1);
        // i = 0, 2: one per slot; peers (and, in decode blocks, the other warps) write the same value
        if (n == 0 && i < 4 && dim_strip0 == 0) p.partial_lse[out_row[slot]] = lse[slot];
      }
    }
  if constexpr (kDecode) {
    if (!writes_output && arrived_last(p.split_counters + blockIdx.x * gridDim.y + kv_head, splits_with_tiles)) {
      static_assert(Plan::kKvRows * kRowHalves * 2 >= (BlockRows * kMaxSplits + BlockRows) * 4,
                    "the merge's weights fit in the K/V buffer");
      merge_splits<HeadDim, BlockRows>(p, reinterpret_cast<float*>(kv_smem), q_begin, kv_head, row0, rows,
                                       splits_with_tiles);
    }
  }
}

// Merges the splits of prefill blocks (64 rows: merged in the block like decode tiles, one block would read up to
// 64 splits × 64 rows of partials; here a block per (token, head) shares that over the GPU), weights as in
// merge_splits. Grid (num_tokens, num_heads), HeadDim / 2 threads, two dims each. A launch can carry up to
// kMaxSplits splits, most of them empty for short contexts, so the kernel avoids a chain of loads per split: all lse
// values are read in one round (thread t: splits t, t + HeadDim / 2, …) before anything else, and the partial outputs
// in unrolled groups whose loads do not wait on each other (an empty split's never-written partial is read and
// selected away: the buffer holds every split).
template <int HeadDim>
__global__ void __launch_bounds__(HeadDim / 2) combine_splits_kernel(const PagedAttentionParams p) {
  constexpr int kThreads = HeadDim / 2, kCombineWarps = kThreads / 32;
  constexpr int kLsePerThread = (kMaxSplits + kThreads - 1) / kThreads;
  __shared__ float split_weight[kMaxSplits];
  __shared__ float warp_max[kCombineWarps];
  const int token = blockIdx.x, head = blockIdx.y, tid = threadIdx.x, dim = tid * 2;
  const int64_t stride = int64_t(p.num_tokens) * p.num_heads, first = int64_t(token) * p.num_heads + head;
  float lse[kLsePerThread];
  float max_lse = negative_infinity();
#pragma unroll
  for (int i = 0; i < kLsePerThread; ++i) {
    const int s = tid + i * kThreads;
    lse[i] = s < p.splits ? p.partial_lse[first + s * stride] : negative_infinity();
    max_lse = fmaxf(max_lse, lse[i]);
  }
  if (token >= p.query_start_loc[p.num_seqs]) return;  // padding: no split wrote its partials
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    max_lse = fmaxf(max_lse, __shfl_xor_sync(0xFFFFFFFFu, max_lse, offset));
  if ((tid & 31) == 0) warp_max[tid >> 5] = max_lse;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) max_lse = fmaxf(max_lse, warp_max[w]);
#pragma unroll
  for (int i = 0; i < kLsePerThread; ++i) {
    const int s = tid + i * kThreads;
    if (s < p.splits) split_weight[s] = merge_weight(lse[i], max_lse);
  }
  __syncthreads();
  float2 sum = make_float2(0.f, 0.f);
  float weight_sum = 0.f;
#pragma unroll 8
  for (int s = 0; s < p.splits; ++s) {
    const float weight = split_weight[s];
    const float2 v = *reinterpret_cast<const float2*>(p.partial_out + (first + s * stride) * HeadDim + dim);
    if (weight > 0.f) {
      sum.x += weight * v.x;
      sum.y += weight * v.y;
      weight_sum += weight;
    }
  }
  const float inverse = weight_sum > 0.f ? 1.f / weight_sum : 0.f;
  *reinterpret_cast<uint32_t*>(p.out + token * p.out_token_stride + head * p.out_head_stride + dim) =
      float2_to_half2_rn(sum.x * inverse, sum.y * inverse);
}

// Copies the new tokens' keys and values into their cache slots. Grid (num_tokens), one 16-byte vector of
// K or V per thread and step; slot −1 means "not stored".
__global__ void __launch_bounds__(kKvWriteThreads) write_kv_cache_kernel(const KvCacheWriteParams p) {
  const int token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0) return;
  const int64_t base = (slot / p.block_size) * p.cache_block_stride + (slot % p.block_size) * p.cache_slot_stride;
  const int chunks = p.head_size / 8, per_tensor = p.num_kv_heads * chunks;
  for (int v = threadIdx.x; v < 2 * per_tensor; v += blockDim.x) {
    const bool is_value = v >= per_tensor;
    const int head = (v % per_tensor) / chunks, c = (v % chunks) * 8;
    const uint16_t* src = is_value ? p.value + token * p.value_token_stride + head * p.value_head_stride
                                   : p.key + token * p.key_token_stride + head * p.key_head_stride;
    uint16_t* dst = (is_value ? p.value_cache : p.key_cache) + base + head * p.cache_head_stride;
    *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(src + c);
  }
}

}  // namespace attention
}  // namespace volta_fp4
