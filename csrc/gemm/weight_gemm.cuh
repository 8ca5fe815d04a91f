// Weight-only-quantized GEMM for Volta and newer: y[M,N] = x[M,K] · W[N,K]ᵀ · row_scale[n] + bias[n].
// Kernel code only (no torch or host headers): compiled by NVRTC into the kernel image (tools/sm70_check.py).
//
// ─── Weight layout ("tiles"), produced once at load by prepare_* (weight_gemm_driver.cpp) ─────────────────────────
// W is padded with zeros to Np = N rounded up to kTileN (64) rows and Kp = K rounded up to kTileK (128)
// columns and cut into tiles of 64 rows × 128 columns. Tile (nt, kt) is one contiguous chunk at byte offset
// (nt · Kp/128 + kt) · Format::kChunkBytes: the whole weight is one stream of chunks in (row strip, k-tile) order.
// A chunk is 4 records of Format::kRecordBytes, record rg = tile rows 16·rg … 16·rg+15 (a "row group"), each read
// by one warp. Lane slot v = 0…31 of a record (g = v / 4, t = v % 4) owns rows g and g+8 of the group and, in each
// 64-column half h, the 16 columns h·64 + 16·t … +15; its j-th 16-byte vector is vector j·32 + v of the record,
// so every warp load reads 512 contiguous bytes. Word b (0…3) of a lane's half h covers columns
// c = h·64 + 16·t + 4·b … c+3 of both rows, which is what one MMA step of the GEMV needs in registers
// (see "GEMV path"); the dequantize kernel stores the same 64 weights per thread to shared memory.
//   NVFP4 (1152-byte records, 4608-byte chunks): vector h = half h, four 32-bit words of 8 E2M1 codes in slots
//     i = 2p + q = row g + 8·(p & 1), column c + 2·(p >> 1) + q, so that e2m1_word_to_half2 (which says where a
//     slot's magnitude and sign bits are) yields the fp16 pairs (row g, c…c+1), (g+8, c…c+1), (g, c+2…c+3),
//     (g+8, c+2…c+3). Bytes 1024…1151: the E4M3 block scales, 4 per lane at 1024 + 4·v:
//     (row g, half 0), (g+8, 0), (g, 1), (g+8, 1) — the one block each of those 16-column pieces lies in.
//   FP8 E4M3 (2048-byte records, 8192-byte chunks): vector 2·h + r = row g + 8·r, the 16 columns of half h in order.
// Both formats decode to w · 2^-8 in fp16, exactly (NVFP4: E2M1 × E4M3 block scale has ≤ 5 significant bits and
// lies in [2^-18, 10.5]); row_scale[N] (float32, unpadded) is the per-output-row decode scale · 2^8; bias[N] is fp16.
//
// ─── Kernels ─────────────────────────────────────────────────────────────────────────────────────────────────
// weight_gemv_kernel (M ≤ 16) and weight_gemm_kernel (the fused kernel, M up to the dequantize + cuBLAS cut-over)
// decode weights in registers straight into MMA A fragments ("GEMV path" below): no shared memory for weights, and
// each decoded fragment feeds one MMA per 8 rows of x. dequantize_tiles_kernel writes fp16 weights for cuBLAS (large
// M). Epilogue everywhere: acc · row_scale[n] + bias[n], rounded once to fp16.
#pragma once

#include "common/fp16.cuh"
#include "common/last_arrival.cuh"
#include "common/mma_atoms.cuh"
#include "gemm/weight_gemm_shape.h"

namespace volta_fp4 {

static_assert(kSmemRowHalves == kTileK + 8, "a shared x or w tile row is one k-tile and 8 halves of padding");

// E4M3 bytes b0 (bits 0..7) and b1 (bits 16..23) → two fp16 equal to value · 2^-8 (exact: same exponent
// field width offset by the bias difference 15 - 7, subnormals included).
__device__ __forceinline__ uint32_t e4m3_pair_to_half2_bits(uint32_t x) {
  return ((x & 0x007F007Fu) << 7) | ((x & 0x00800080u) << 8);
}

// Weights are read once: a 16-byte load that does not allocate in L1 (x, read by the four warps of a block, stays).
__device__ __forceinline__ uint4 load_stream(const uint4* address) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(address));
  return v;
}
// PTX prmt.b32 in its default mode: selector nibble i picks byte (nibble & 7) of {b (bytes 0-3), c (4-7)} for
// output byte i, or, when the nibble's bit 3 is set, that byte's sign bit replicated (0x00 for a byte < 0x80).
// Written in PTX because __byte_perm documents only the low three selector bits.
__device__ __forceinline__ uint32_t prmt(uint32_t b, uint32_t c, uint32_t selector) {
  uint32_t out;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(b), "r"(c), "r"(selector));
  return out;
}

// One 32-bit word of the NVFP4 tile layout → four fp16 pairs holding the E2M1 values at their true magnitude
// (0 … 6, exact), pair p = (slot 2p, slot 2p+1). The word holds 8 codes in slots: slot i's 3 magnitude bits are
// bits 4i … 4i+2, its sign bit is bit 8i+7 for i < 4 and bit 8(i−4)+3 for i ≥ 4 (the nibbles' top bits). Every
// E2M1 magnitude is an fp16 whose low byte is zero, so a prmt with the magnitudes as selector looks up the fp16
// high bytes of four slots at once in a table of 8 bytes; the signs of slots 0-3 already sit at those bytes' top
// bits (4-7: after a shift by 4), and a prmt with zero bytes spreads two high bytes to [0, hi, 0, hi].
// 11 integer instructions per 8 weights.
__device__ __forceinline__ void e2m1_word_to_half2(uint32_t word, uint32_t (&out)[4]) {
  constexpr uint32_t kHighBytesLow = 0x3E3C3800u;   // fp16 high bytes of 0, 0.5, 1, 1.5
  constexpr uint32_t kHighBytesHigh = 0x46444240u;  // … of 2, 3, 4, 6
  const uint32_t magnitude = word & 0x77777777u;
  const uint32_t slots0to3 = prmt(kHighBytesLow, kHighBytesHigh, magnitude) | (word & 0x80808080u);
  const uint32_t slots4to7 = prmt(kHighBytesLow, kHighBytesHigh, magnitude >> 16) | ((word << 4) & 0x80808080u);
  out[0] = prmt(slots0to3, 0, 0x1404u);  // [0, slot 0, 0, slot 1]
  out[1] = prmt(slots0to3, 0, 0x3424u);
  out[2] = prmt(slots4to7, 0, 0x1404u);
  out[3] = prmt(slots4to7, 0, 0x3424u);
}

// ─── Weight formats ───────────────────────────────────────────────────────────────────────────────────────
// load: one lane's vectors of a record (lane slot v). decode: word b of half h → the four fp16 pairs
// a[0] = (row g, columns c, c+1), a[1] = (g+8, c, c+1), a[2] = (g, c+2, c+3), a[3] = (g+8, c+2, c+3), value · 2^-8,
// with the block scales from scales() (computed once per stage).
struct Nvfp4Format : Nvfp4Tiles {
  static constexpr int kRecordBytes = kChunkBytes / 4;
  static constexpr int kGemvStagesInFlight = 3;  // weight_gemv_kernel ring: tiles of 36 B of weights + 64 B of x per lane
  struct Stage {
    uint4 codes[2];
    uint32_t scales;
  };
  __device__ __forceinline__ static void load(Stage& s, const uint8_t* record, int v) {
    const uint4* vectors = reinterpret_cast<const uint4*>(record);
    s.codes[0] = load_stream(vectors + v);
    s.codes[1] = load_stream(vectors + 32 + v);
    s.scales = __ldg(reinterpret_cast<const uint32_t*>(record + 1024) + v);
  }
  // [h][r]: the block scale of row g + 8r in half h, as scale · 2^-8 in both fp16 halves (exact, subnormals too).
  struct Scales {
    uint32_t s[2][2];
  };
  __device__ __forceinline__ static Scales scales(const Stage& s) {
    const uint32_t half0 = e4m3_pair_to_half2_bits(__byte_perm(s.scales, 0, 0x4140));
    const uint32_t half1 = e4m3_pair_to_half2_bits(__byte_perm(s.scales, 0, 0x4342));
    return {{{broadcast_low(half0), broadcast_high(half0)}, {broadcast_low(half1), broadcast_high(half1)}}};
  }
  // E2M1 at true magnitude (exact) times the block scale · 2^-8: one mul.f16x2 per pair, exact (see the layout).
  __device__ __forceinline__ static void decode(const Stage& s, const Scales& sc, int h, int b, uint32_t (&a)[4]) {
    uint32_t magnitude[4];
    e2m1_word_to_half2(reinterpret_cast<const uint32_t*>(&s.codes[h])[b], magnitude);
#pragma unroll
    for (int p = 0; p < 4; ++p) a[p] = hmul2(magnitude[p], sc.s[h][p & 1]);
  }
};

struct Fp8Format : Fp8Tiles {
  static constexpr int kRecordBytes = kChunkBytes / 4;
  static constexpr int kGemvStagesInFlight = 2;  // 64 B of weights + 64 B of x per lane and tile (sm_70 registers)
  struct Stage {
    uint4 codes[4];  // [2h + r]: row g + 8r, half h
  };
  __device__ __forceinline__ static void load(Stage& s, const uint8_t* record, int v) {
    const uint4* vectors = reinterpret_cast<const uint4*>(record);
#pragma unroll
    for (int j = 0; j < 4; ++j) s.codes[j] = load_stream(vectors + j * 32 + v);
  }
  struct Scales {};
  __device__ __forceinline__ static Scales scales(const Stage&) { return {}; }
  __device__ __forceinline__ static void decode(const Stage& s, const Scales&, int h, int b, uint32_t (&a)[4]) {
    const uint32_t row_g = reinterpret_cast<const uint32_t*>(&s.codes[2 * h])[b];
    const uint32_t row_g8 = reinterpret_cast<const uint32_t*>(&s.codes[2 * h + 1])[b];
    a[0] = e4m3_pair_to_half2_bits(__byte_perm(row_g, 0, 0x4140));
    a[1] = e4m3_pair_to_half2_bits(__byte_perm(row_g8, 0, 0x4140));
    a[2] = e4m3_pair_to_half2_bits(__byte_perm(row_g, 0, 0x4342));
    a[3] = e4m3_pair_to_half2_bits(__byte_perm(row_g8, 0, 0x4342));
  }
};

// A thread's whole stage (its 64 weights of the record) as fp16: out[h][r][j] = row g + 8r, columns
// h·64 + 16·t + 2j, +1 (lane slot v = 4g + t). For the dequantize kernel.
template <class Format>
__device__ __forceinline__ void dequantize_stage(const typename Format::Stage& s, uint32_t (&out)[2][2][8]) {
  const typename Format::Scales sc = Format::scales(s);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      uint32_t a[4];
      Format::decode(s, sc, h, b, a);
      out[h][0][2 * b] = a[0];
      out[h][1][2 * b] = a[1];
      out[h][0][2 * b + 1] = a[2];
      out[h][1][2 * b + 1] = a[3];
    }
  }
}

// Writes a dequantized stage into a [64][kSmemRowHalves] fp16 tile: row group rg, lane slot v.
__device__ __forceinline__ void store_stage_to_tile(const uint32_t (&w)[2][2][8], uint16_t* tile, int rg, int v) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      uint4* dst = reinterpret_cast<uint4*>(tile + (rg * 16 + (v >> 2) + 8 * r) * kSmemRowHalves + h * 64 + (v & 3) * 16);
      dst[0] = *reinterpret_cast<const uint4*>(&w[h][r][0]);
      dst[1] = *reinterpret_cast<const uint4*>(&w[h][r][4]);
    }
  }
}


// ─── GEMV path (small M, PATH_GEMV): weights decoded in registers straight into MMA fragments ─────────────
// yᵀ = W · xᵀ with the weights as the MMA's A operand (16 rows of a row group × k) and xᵀ as B (k × 8 columns
// = 8 rows of x; columns ≥ M feed outputs that are never stored), so the tensor cores apply each decoded weight to
// all 8 rows and the cost per weight is the decode (NVFP4: 11 integer instructions + 4 mul.f16x2 per 8 weights)
// whatever M ≤ 8 is; M = 9-16 adds a second B (x rows 8-15) to the same decoded A.
// An MMA sums over its k slots, so the slots may stand for any columns as long as A and B agree; the record
// layout gives lane slot v = (g, t) the columns c … c+3 of rows g and g+8 for step (h, b), which is
//   sm_80 m16n8k16: A rows g, g+8, slots 2t, 2t+1 ↔ c, c+1 and 2t+8, 2t+9 ↔ c+2, c+3; B = x[g][c … c+3];
//   sm_70 m8n8k4 (four independent 8×8×4 products, one per quad-pair): quad-pair q takes slots v = 4i + q
//   (i = lane's row in the pair), so the pair shares its columns; two products per step (rows g, g+8) and the
//   four pairs' sums are added by two shuffles at the end (in a fixed order).
// Accumulation in fp32 by the MMA; products exact (fp16 × fp16 into fp32) — as precise as the fused kernel.
//
// Work split, "stream-K": the weight is one stream of tiles in (strip, k-tile) order. Block b (4 warps, warp w =
// row group w of every tile) takes tiles [b·per, (b+1)·per) of it, with one block per resident block slot, so
// every block reads the same bytes and the grid is a single wave: no partial last wave, no idle slots (a strip ×
// split grid leaves up to a third of the slots idle or in a tail at these sizes). Each warp keeps
// Format::kGemvStagesInFlight tiles (its weights and its x fragments, x through L1 since the four warps read the
// same x) loaded ahead, across strip boundaries. A strip that a block covers whole is stored directly; a strip
// split between blocks ("pieces") is finished by the last piece to arrive (per-strip semaphore, reset by it),
// which sums the fp32 partials in block order: deterministic.

__device__ __forceinline__ void store_one(const GemmParams& p, int m, int n, float v) {
  float out = v * p.row_scale[n];
  if (p.bias) out += half2_to_float2(uint32_t(p.bias[n])).x;
  p.y[int64_t(m) * p.N + n] = uint16_t(float2_to_half2_rn(out, 0.f) & 0xFFFFu);
}

// Weight stages each warp keeps loaded ahead: what the format's registers per stage and the atom's accumulators allow.
template <class Mma, class Format>
__device__ constexpr int ring_stages() {
  return Format::kGemvStagesInFlight < Mma::kGemvMaxStages ? Format::kGemvStagesInFlight : Mma::kGemvMaxStages;
}

// Calls f(i, row, m) for each accumulator i of a GEMV-hook accumulator set that this lane stores (after
// Mma::gemv_reduce): row of the 16-row record and row m (0 … 7) of the 8-row x block it holds.
template <class Mma, class F>
__device__ __forceinline__ void for_each_gemv_output(int lane, F&& f) {
  if (!Mma::gemv_writes(lane)) return;
#pragma unroll
  for (int i = 0; i < Mma::kGemvAcc; ++i) {
    int row, m;
    Mma::gemv_coord(lane, i, row, m);
    f(i, row, m);
  }
}

// Rows 9-16 (a server decoding 9-16 sequences, MTP verification of K = 3 at batch 4): x rows 8-15 are a second B
// operand of the same decoded A fragment, so each decoded weight feeds one more MMA into a second accumulator set
// and nothing more is decoded. Their x fragments are read from L1 when the tile is computed, not loaded ahead in
// the ring (16 more registers per tile in flight would not fit), and the kernel may use registers for 3 blocks per SM
// (12 decoding warps) instead of 4.
//
// Grid: ceil(tiles / p.tiles_per_block) blocks of kThreads; p.partials: [grid][2][M][64] (a block's first and last
// strip can be pieces). M is the exact row count (p.M == M).
template <class Mma, class Format, int M>
__global__ void __launch_bounds__(kThreads, M > 8 ? kGemvMinBlocksWide : kGemvMinBlocks)
    weight_gemv_kernel(const GemmParams p) {
  static_assert(M >= 1 && M <= kGemvMaxM, "GEMV rows");
  constexpr int kXBlocks = (M + 7) / 8;  // blocks of 8 x rows, one B operand (and accumulator set) each
  constexpr int kRing = ring_stages<Mma, Format>();
  using XFragments = uint4[2][2];  // [h]: x row g, columns h·64 + 16t … +15 of the tile
  struct Stage {
    typename Format::Stage w;
    XFragments x;  // x rows 0-7
  };
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int v = Mma::gemv_slot(lane), g = v >> 2, t = v & 3;
  const int per = p.tiles_per_block, tiles = (p.N + kTileN - 1) / kTileN * p.k_tiles;
  const int j_begin = blockIdx.x * per, count = min(per, tiles - j_begin);

  // Next stage to load: its record and its first column. Lanes of x rows ≥ M load row 0: B column g only feeds
  // outputs of that row, which are never stored, so it need not be zero. Columns ≥ K must be (the last k-tile of a
  // strip when K is not a multiple of 128; uniform over the block): zero-filled there only.
  const uint8_t* next_record = p.weight_tiles + int64_t(j_begin) * Format::kChunkBytes + warp * Format::kRecordBytes;
  const uint16_t* x_lane = p.x + int64_t(g < M ? g : 0) * p.ldx + 16 * t;
  const uint16_t* x_lane_high = p.x + int64_t(g + 8 < M ? g + 8 : 0) * p.ldx + 16 * t;  // M > 8 only
  const int k_end = p.k_tiles * kTileK;
  auto load_x = [&](XFragments& x, const uint16_t* lane_row, int k) {
    const uint4* src = reinterpret_cast<const uint4*>(lane_row + k);
    if (k + kTileK <= p.K) {
#pragma unroll
      for (int h = 0; h < 2; ++h) x[h][0] = __ldg(src + 8 * h), x[h][1] = __ldg(src + 8 * h + 1);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool inside = k + h * 64 + 16 * t < p.K;  // K is a multiple of 16: 16 columns wholly in or out
        x[h][0] = inside ? __ldg(src + 8 * h) : make_uint4(0, 0, 0, 0);
        x[h][1] = inside ? __ldg(src + 8 * h + 1) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  int next_k = j_begin % p.k_tiles * kTileK;
  auto load = [&](Stage& s) {
    Format::load(s.w, next_record, v);
    load_x(s.x, x_lane, next_k);
    next_record += Format::kChunkBytes;
    next_k += kTileK;
    if (next_k == k_end) next_k = 0;
  };

  Stage ring[kRing];
#pragma unroll
  for (int s = 0; s < kRing; ++s)
    if (s < count) load(ring[s]);

  constexpr int kChains = Mma::kGemvChains;  // column half h accumulates into chain h % kChains
  float acc[kXBlocks][kChains][Mma::kGemvAcc];
#pragma unroll
  for (int xb = 0; xb < kXBlocks; ++xb)
#pragma unroll
    for (int c = 0; c < kChains; ++c)
#pragma unroll
      for (int i = 0; i < Mma::kGemvAcc; ++i) acc[xb][c][i] = 0.f;

  int kt = j_begin % p.k_tiles, strip = j_begin / p.k_tiles, piece_begin_kt = kt;
  // At the end of a strip or of the block's range: store the strip's sums, or publish them as a piece.
  auto finish_strip = [&]() {
    float sum[kXBlocks][Mma::kGemvAcc];
#pragma unroll
    for (int xb = 0; xb < kXBlocks; ++xb) {
#pragma unroll
      for (int i = 0; i < Mma::kGemvAcc; ++i) {
        sum[xb][i] = acc[xb][0][i];
#pragma unroll
        for (int c = 1; c < kChains; ++c) sum[xb][i] += acc[xb][c][i];
#pragma unroll
        for (int c = 0; c < kChains; ++c) acc[xb][c][i] = 0.f;
      }
      Mma::gemv_reduce(sum[xb]);
    }
    const int n_base = strip * kTileN + warp * 16;
    if (piece_begin_kt == 0 && kt + 1 == p.k_tiles) {  // the whole strip: no other piece
#pragma unroll
      for (int xb = 0; xb < kXBlocks; ++xb)
        for_each_gemv_output<Mma>(lane, [&](int i, int row, int m) {
          if (m + 8 * xb < M && n_base + row < p.N) store_one(p, m + 8 * xb, n_base + row, sum[xb][i]);
        });
      return;
    }
    // Partial slot: 0 = this block's first strip, 1 = its last one (the strips between are whole).
    const int side = j_begin < strip * p.k_tiles ? 1 : 0;
    auto partial = [&](int block, int s, int m, int row) {
      return p.partials + ((int64_t(block) * 2 + s) * M + m) * kTileN + warp * 16 + row;
    };
#pragma unroll
    for (int xb = 0; xb < kXBlocks; ++xb)
      for_each_gemv_output<Mma>(lane, [&](int i, int row, int m) {
        if (m + 8 * xb < M) *partial(blockIdx.x, side, m + 8 * xb, row) = sum[xb][i];
      });
    const int first_block = strip * p.k_tiles / per, last_block = ((strip + 1) * p.k_tiles - 1) / per;
    if (!arrived_last(p.counters + strip * kMaxSplitMTiles, last_block - first_block + 1)) return;
#pragma unroll
    for (int xb = 0; xb < kXBlocks; ++xb)
      for_each_gemv_output<Mma>(lane, [&](int i, int row, int m) {
        m += 8 * xb;
        if (m >= M || n_base + row >= p.N) return;
        float total = 0.f;
        for (int b = first_block; b <= last_block; ++b)  // a block that starts before this strip ends in it
          total += __ldcg(partial(b, b * per < strip * p.k_tiles ? 1 : 0, m, row));
        store_one(p, m, n_base + row, total);
      });
  };

  for (int i0 = 0; i0 < count; i0 += kRing) {
#pragma unroll
    for (int s = 0; s < kRing; ++s) {
      const int i = i0 + s;
      if (i >= count) break;
      const typename Format::Scales sc = Format::scales(ring[s].w);
      XFragments x_high;  // x rows 8-15 of this tile (M > 8)
      if (kXBlocks > 1) load_x(x_high, x_lane_high, kt * kTileK);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t* xw[2] = {reinterpret_cast<const uint32_t*>(ring[s].x[h]),
                                 reinterpret_cast<const uint32_t*>(x_high[h])};
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          uint32_t a[4];
          Format::decode(ring[s].w, sc, h, b, a);
#pragma unroll
          for (int xb = 0; xb < kXBlocks; ++xb)
            Mma::gemv_mma(acc[xb][h % kChains], a, xw[xb][2 * b], xw[xb][2 * b + 1]);
        }
      }
      // Refill this slot only now: it needs no second register set, and kRing - 1 tiles stay in flight meanwhile.
      if (i + kRing < count) load(ring[s]);
      if (kt + 1 == p.k_tiles || i + 1 == count) {
        finish_strip();
        piece_begin_kt = 0;
        ++strip;
      }
      if (++kt == p.k_tiles) kt = 0;
    }
  }
}

// ─── Fused path (PATH_FUSED: a server's 17-128 rows, prefill chunks) ───────────────────────────────────────
// The GEMV's decode with x as B operands of BM/8 blocks of 8 rows: every decoded A fragment feeds BM/8 MMAs, so the
// decode cost per weight falls as M grows while the weights are read once and never touch shared memory (the
// kernel it replaces dequantized each tile into shared memory and read it back with ldmatrix: 0.4-0.6× cuBLAS at
// M = 64-128). x is the operand that is reused, by every warp of the block: each k-tile of it (BM × 128 fp16) is
// staged through shared memory, double-buffered, loaded one k-tile ahead into registers (Volta has no asynchronous
// copy); one barrier per k-tile. Lane slot (g, t) reads x row xb·8 + g, columns h·64 + 16t … +15 of the buffer as
// two 16-byte vectors, each the B fragments of two MMA steps (the record layout's column order, "GEMV path").
// Block: 4 warps per 64-row strip (warp w: row group w % 4 of strip blockIdx.x · kStrips + w / 4), kStrips strips
// sharing the x tile; output BM × 64·kStrips per block, one m-tile per blockIdx.y. Each warp streams its record of
// every k-tile through a ring of weight stages like the GEMV's. With an odd strip count the last block's second
// strip does not exist: its warps stage x and meet the barriers, nothing else.
// Split-K (blockIdx.z) when strips × m-tiles leave SMs idle: fp32 partials [splits][M][Np], summed in split order
// (deterministic) by the block that arrives last at its (strip group, m-tile) semaphore.
// Registers (the __launch_bounds__ asks for 2 blocks per SM): accumulators 4 per x block on sm_80, 16 on sm_70 —
// hence one strip per block there at BM = 32 (fused_strips_per_block).
template <class Mma, class Format, int BM>
__global__ void __launch_bounds__(fused_block_threads(Mma::kSm70Atom, BM), 2) weight_gemm_kernel(const GemmParams p) {
  constexpr int kStrips = fused_strips_per_block(Mma::kSm70Atom, BM);
  constexpr int kBlockThreads = fused_block_threads(Mma::kSm70Atom, BM);
  constexpr int kXBlocks = BM / 8;
  constexpr int kXVectors = BM * (kTileK / 8) / kBlockThreads;  // 16-byte x loads per thread and k-tile
  constexpr int kRing = ring_stages<Mma, Format>();
  static_assert(BM % 16 == 0 && BM <= kFusedMaxBlockRows, "block rows");
  static_assert(kXVectors >= 1 && kXVectors * kBlockThreads == BM * kTileK / 8, "x tile loads");
  static_assert(fused_smem_bytes(BM) <= kVoltaMaxSmemPerBlock, "Volta allows 96 KB of shared memory per block");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const x_tiles = reinterpret_cast<uint16_t*>(smem_raw);  // [2][BM][kSmemRowHalves]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, row_group = warp % 4;
  const int v = Mma::gemv_slot(lane), g = v >> 2, t = v & 3;
  const int n_tiles = (p.N + kTileN - 1) / kTileN, strip = blockIdx.x * kStrips + warp / 4;
  const bool computes = strip < n_tiles;
  const int m0 = blockIdx.y * BM, split = blockIdx.z;
  const int kt_begin = split * p.k_tiles_per_split;
  const int kt_count = min(p.k_tiles_per_split, p.k_tiles - kt_begin);
  const uint8_t* const record = p.weight_tiles + (int64_t(computes ? strip : 0) * p.k_tiles + kt_begin) *
                                                     Format::kChunkBytes + row_group * Format::kRecordBytes;

  // x rows ≥ M and columns ≥ K (the last k-tile when K is not a multiple of 128) are zero-filled: the padded
  // weights there are zero, but 0 · (whatever lies past x) need not be.
  uint4 x_next[kXVectors];
  auto load_x = [&](int kt) {
#pragma unroll
    for (int j = 0; j < kXVectors; ++j) {
      const int q = j * kBlockThreads + tid, row = q >> 4, k = kt * kTileK + (q & 15) * 8;
      x_next[j] = m0 + row < p.M && k < p.K ? __ldg(reinterpret_cast<const uint4*>(p.x + int64_t(m0 + row) * p.ldx + k))
                                             : make_uint4(0, 0, 0, 0);
    }
  };

  typename Format::Stage ring[kRing];
#pragma unroll
  for (int s = 0; s < kRing; ++s)
    if (computes && s < kt_count) Format::load(ring[s], record + int64_t(s) * Format::kChunkBytes, v);
  if (kt_count > 0) load_x(kt_begin);

  float acc[kXBlocks][Mma::kGemvAcc];
#pragma unroll
  for (int xb = 0; xb < kXBlocks; ++xb)
#pragma unroll
    for (int i = 0; i < Mma::kGemvAcc; ++i) acc[xb][i] = 0.f;

  for (int i0 = 0; i0 < kt_count; i0 += kRing) {
#pragma unroll
    for (int s = 0; s < kRing; ++s) {
      const int i = i0 + s;
      if (i >= kt_count) break;
      // Buffer i % 2 is free: its last readers (k-tile i - 2) finished before the barrier of k-tile i - 1.
      uint16_t* const x_tile = x_tiles + (i & 1) * BM * kSmemRowHalves;
#pragma unroll
      for (int j = 0; j < kXVectors; ++j) {
        const int q = j * kBlockThreads + tid;
        *reinterpret_cast<uint4*>(x_tile + (q >> 4) * kSmemRowHalves + (q & 15) * 8) = x_next[j];
      }
      if (i + 1 < kt_count) load_x(kt_begin + i + 1);
      __syncthreads();
      if (!computes) continue;
      const typename Format::Scales sc = Format::scales(ring[s]);
      const uint16_t* const x_lane = x_tile + g * kSmemRowHalves + 16 * t;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {  // steps b = 2·pair, 2·pair + 1: one 16-byte x vector per x block
          uint32_t a[2][4];
          Format::decode(ring[s], sc, h, 2 * pair, a[0]);
          Format::decode(ring[s], sc, h, 2 * pair + 1, a[1]);
#pragma unroll
          for (int xb = 0; xb < kXBlocks; ++xb) {
            const uint4 x = *reinterpret_cast<const uint4*>(x_lane + xb * 8 * kSmemRowHalves + h * 64 + 8 * pair);
            Mma::gemv_mma(acc[xb], a[0], x.x, x.y);
            Mma::gemv_mma(acc[xb], a[1], x.z, x.w);
          }
        }
      }
      if (i + kRing < kt_count) Format::load(ring[s], record + int64_t(i + kRing) * Format::kChunkBytes, v);
    }
  }

#pragma unroll
  for (int xb = 0; xb < kXBlocks; ++xb) Mma::gemv_reduce(acc[xb]);
  const int n_base = strip * kTileN + row_group * 16;
  if (p.splits == 1) {
    if (!computes) return;
#pragma unroll
    for (int xb = 0; xb < kXBlocks; ++xb)
      for_each_gemv_output<Mma>(lane, [&](int i, int row, int m) {
        m += m0 + 8 * xb;
        if (m < p.M && n_base + row < p.N) store_one(p, m, n_base + row, acc[xb][i]);
      });
    return;
  }
  const int64_t np = int64_t(n_tiles) * kTileN;
  auto partial = [&](int s, int m, int n) { return p.partials + (int64_t(s) * p.M + m) * np + n; };
  if (computes) {
#pragma unroll
    for (int xb = 0; xb < kXBlocks; ++xb)
      for_each_gemv_output<Mma>(lane, [&](int i, int row, int m) {
        m += m0 + 8 * xb;
        if (m < p.M) *partial(split, m, n_base + row) = acc[xb][i];
      });
  }
  if (!arrived_last(p.counters + blockIdx.x * kMaxSplitMTiles + blockIdx.y, p.splits) || !computes) return;
#pragma unroll
  for (int xb = 0; xb < kXBlocks; ++xb)
    for_each_gemv_output<Mma>(lane, [&](int, int row, int m) {
      m += m0 + 8 * xb;
      if (m >= p.M || n_base + row >= p.N) return;
      float total = 0.f;
      for (int s = 0; s < p.splits; ++s) total += __ldcg(partial(s, m, n_base + row));
      store_one(p, m, n_base + row, total);
    });
}

// Tiles → fp16 W rows [row_begin, row_begin + rows) × K, row_scale applied in fp32 and rounded once.
// Grid: (rows / 64, Kp / 128); the dequantize + cuBLAS path for large M. Each thread dequantizes the 64 weights it
// loaded; the tile goes through shared memory so that the global stores run along rows (a warp
// writes two full 256-byte row segments per instruction instead of 32 scattered 16-byte pieces).
template <class Format>
__global__ void __launch_bounds__(kThreads) dequantize_tiles_kernel(const uint8_t* weight_tiles, const float* row_scale,
                                                                    uint16_t* w, int row_begin, int N, int K,
                                                                    int k_tiles) {
  __shared__ __align__(16) uint16_t tile[kTileN * kSmemRowHalves];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_tile = row_begin / kTileN + blockIdx.x, kt = blockIdx.y;
  typename Format::Stage stage;
  Format::load(stage, weight_tiles + (int64_t(n_tile) * k_tiles + kt) * Format::kChunkBytes + warp * Format::kRecordBytes,
               lane);
  uint32_t v[2][2][8];
  dequantize_stage<Format>(stage, v);
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // rows g and g + 8 of row group `warp`
    const int n = n_tile * kTileN + warp * 16 + (lane >> 2) + 8 * r;
    const float scale = n < N ? row_scale[n] : 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 f = half2_to_float2(v[h][r][j]);
        v[h][r][j] = float2_to_half2_rn(f.x * scale, f.y * scale);
      }
    }
  }
  store_stage_to_tile(v, tile, warp, lane);
  __syncthreads();
  constexpr int kVectorsPerRow = kTileK / 8;
#pragma unroll
  for (int pass = 0; pass < kTileN * kVectorsPerRow / kThreads; ++pass) {
    const int q = pass * kThreads + tid, r = q / kVectorsPerRow, k = kt * kTileK + (q % kVectorsPerRow) * 8;
    const int out_n = n_tile * kTileN + r;
    if (out_n < N && k < K)  // K is a multiple of 16, so a vector of 8 is wholly inside or outside
      *reinterpret_cast<uint4*>(w + int64_t(out_n - row_begin) * K + k) =
          *reinterpret_cast<const uint4*>(tile + r * kSmemRowHalves + (q % kVectorsPerRow) * 8);
  }
}

}  // namespace volta_fp4
