// Weight-only-quantized GEMM for Volta and newer: y[M,N] = x[M,K] · W[N,K]ᵀ · row_scale[n] + bias[n].
// Kernel code only (no torch or host headers): included by weight_gemm.cu and by tools/sm70_check.py (NVRTC).
//
// ─── Weight layout ("tiles"), produced once at load by prepare_* in weight_gemm.cu ─────────────────────────
// W is padded with zeros to Np = N rounded up to kTileN (64) rows and Kp = K rounded up to kTileK (128)
// columns and cut into tiles of 64 rows × 128 columns. Tile (nt, kt) is one contiguous chunk at byte offset
// (nt · Kp/128 + kt) · Format::kChunkBytes, so a block that walks K for one row strip reads one contiguous stream.
// Inside a chunk the bytes are ordered the way the 128 threads of a block load them: thread t owns tile row
// r = t % 64 and the 64 columns starting at h·64 with h = t / 64, and its j-th 16-byte load is vector
// j·128 + t. Every load instruction of a warp therefore reads 512 contiguous bytes.
//   NVFP4 (4608 bytes): vectors 0..255 hold codes: vector (j, h, r) = row r, columns h·64 + j·32 … +31, as
//     four 32-bit words of 8 codes each, whose nibbles are reordered to [e0 e2 e4 e6 e1 e3 e5 e7] (nibble 0 =
//     bits 0..3) so that one shift puts an (even, odd) pair into the two fp16 halves of a register.
//     Bytes 4096..4607: the E4M3 block scales, 4 bytes per thread at 4096 + 4·t: row r, blocks h·4 … h·4+3.
//   FP8 E4M3 (8192 bytes): vector (j, h, r), j = 0..3, = row r, columns h·64 + j·16 … +15, bytes in order.
// row_scale[N] (float32, unpadded) carries the per-output-row decode scale times the power of two that the
// in-register conversion leaves out (see each Format); bias[N] is fp16.
//
// ─── Pipeline (one kernel template for both formats and both MMA atoms) ──────────────────────────────────
// Block = 4 warps, output tile BM × 64 (BM = 16, 32, 64 by M), K walked in 128-column stages. Volta has no
// asynchronous copy, so global → shared goes through registers: a ring of Format::kStagesInFlight stages of packed
// weights (2 at BM = 64, where registers are short) is loaded ahead, each stage is dequantized on its way from
// registers into shared memory, stored there as fp16 in one of two buffers
// (rows padded to 136 halves so fragment loads are bank-conflict free), and the MMA atom reads its fragments
// from there. One barrier per stage: the double buffer lets the next stage be written while a slower warp
// still reads the previous one. Warp w computes output columns w·16 … w·16+15 for all BM rows.
// Split-K (small M): blocks of the same output tile write fp32 partials; the last one to arrive (counted with
// a per-layer semaphore that it resets to zero) sums them in split order (deterministic) and runs the
// epilogue. Epilogue: acc · row_scale[n] + bias[n], rounded once to fp16.
// Small M (≤ 8) has a second kernel on the same tiles, weight_gemv_kernel (CUDA cores, weights decoded in
// registers, no shared-memory round trip for them): see "GEMV path" below.
#pragma once

#include "mma_atoms.cuh"

namespace volta_fp4 {

constexpr int kTileN = 64;
constexpr int kTileK = 128;
constexpr int kThreads = 128;
constexpr int kWarpN = 16;               // output columns per warp
static_assert(kSmemRowHalves == kTileK + 8, "an x/w tile row is one row of the atoms' shared-memory layout");
constexpr int kMaxSplitMTiles = 8;       // split-K semaphores per row strip (see prepare_*)

// Dynamic shared memory of weight_gemm_kernel<…, BM>: two buffers of BM x rows and 64 w rows.
__host__ __device__ constexpr int fused_smem_bytes(int bm) { return 2 * (bm + kTileN) * kSmemRowHalves * 2; }
constexpr int kVoltaMaxSmemPerBlock = 96 * 1024;

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t out;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
}
__device__ __forceinline__ uint32_t broadcast_low(uint32_t pair) { return __byte_perm(pair, 0, 0x1010); }
__device__ __forceinline__ uint32_t broadcast_high(uint32_t pair) { return __byte_perm(pair, 0, 0x3232); }
__device__ __forceinline__ float2 half2_to_float2(uint32_t pair) {
  float2 out;
  asm("{.reg .f16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.f32.f16 %0, lo;\n cvt.f32.f16 %1, hi;}"
      : "=f"(out.x), "=f"(out.y) : "r"(pair));
  return out;
}
__device__ __forceinline__ uint32_t float2_to_half2_rn(float lo_value, float hi_value) {
  uint32_t out;
  asm("{.reg .f16 lo, hi;\n cvt.rn.f16.f32 lo, %1;\n cvt.rn.f16.f32 hi, %2;\n mov.b32 %0, {lo, hi};}"
      : "=r"(out) : "f"(lo_value), "f"(hi_value));
  return out;
}
constexpr uint32_t kHalf2TwoPow15 = 0x78007800u;  // (2^15, 2^15)

// E4M3 bytes b0 (bits 0..7) and b1 (bits 16..23) → two fp16 equal to value · 2^-8 (exact: same exponent
// field width offset by the bias difference 15 - 7, subnormals included).
__device__ __forceinline__ uint32_t e4m3_pair_to_half2_bits(uint32_t x) {
  return ((x & 0x007F007Fu) << 7) | ((x & 0x00800080u) << 8);
}

__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t out;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(c));
  return out;
}
// PTX prmt.b32 in its default mode: selector nibble i picks byte (nibble & 7) of {b (bytes 0-3), c (4-7)} for
// output byte i, or, when the nibble's bit 3 is set, that byte's sign bit replicated (0x00 for a byte < 0x80).
// Written in PTX because __byte_perm documents only the low three selector bits.
__device__ __forceinline__ uint32_t prmt(uint32_t b, uint32_t c, uint32_t selector) {
  uint32_t out;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(b), "r"(c), "r"(selector));
  return out;
}

// One 32-bit word of the NVFP4 tile layout (nibbles [e0 e2 e4 e6 e1 e3 e5 e7]) → four fp16 pairs holding the
// E2M1 values at their true magnitude (0 … 6, exact), pair p = (e_2p, e_2p+1). Every E2M1 magnitude is an fp16
// whose low byte is zero, so a byte table indexed by the 3 magnitude bits gives the high byte: two prmt look up
// the four even and the four odd elements, one prmt per pair interleaves them with zero bytes (selector nibble 8 =
// sign of byte 0 of a table entry = 0x00), and the sign bit (nibble bit 3) is shifted to bit 15 / 31.
// 15 integer instructions per 8 weights.
__device__ __forceinline__ void e2m1_word_to_half2(uint32_t word, uint32_t* out) {
  constexpr uint32_t kHighBytesLow = 0x3E3C3800u;   // fp16 high bytes of 0, 0.5, 1, 1.5
  constexpr uint32_t kHighBytesHigh = 0x46444240u;  // … of 2, 3, 4, 6
  const uint32_t magnitude = word & 0x77777777u;
  const uint32_t even = prmt(kHighBytesLow, kHighBytesHigh, magnitude);        // |e0| |e2| |e4| |e6|
  const uint32_t odd = prmt(kHighBytesLow, kHighBytesHigh, magnitude >> 16);   // |e1| |e3| |e5| |e7|
#pragma unroll
  for (int p = 0; p < 4; ++p)
    out[p] = prmt(even, odd, 0x4808u | (p << 4) | (p << 12)) | ((word << (12 - 4 * p)) & 0x80008000u);
}

// ─── Weight formats ───────────────────────────────────────────────────────────────────────────────────────
// Each thread dequantizes its 64 columns of one tile row into 32 fp16 pairs (columns in order).
struct Nvfp4Format {
  static constexpr int kChunkBytes = 4608;
  static constexpr int kVectors = 2;
  static constexpr int kStagesInFlight = 4;
  static constexpr int kGemvStagesInFlight = 2;  // weight_gemv_kernel: 2 × 36 B loaded ahead per thread
  // E2M1 bits placed in the fp16 exponent/mantissa give value · 2^-14; block scales are converted to
  // scale · 2^7 (≤ 57344, exact), so the product is value · scale · 2^-7 and row_scale carries 2^7.
  static constexpr float kRowScaleFactor = 128.0f;
  struct Stage {
    uint4 codes[kVectors];
    uint32_t scales;
  };
  __device__ __forceinline__ static void load(Stage& s, const uint8_t* chunk, int tid) {
    const uint4* vectors = reinterpret_cast<const uint4*>(chunk);
#pragma unroll
    for (int j = 0; j < kVectors; ++j) s.codes[j] = __ldg(vectors + j * kThreads + tid);
    s.scales = __ldg(reinterpret_cast<const uint32_t*>(chunk + 4096) + tid);
  }
  __device__ __forceinline__ static void dequantize(const Stage& s, uint32_t out[32]) {
    const uint32_t s01 = hmul2(e4m3_pair_to_half2_bits(__byte_perm(s.scales, 0, 0x4140)), kHalf2TwoPow15);
    const uint32_t s23 = hmul2(e4m3_pair_to_half2_bits(__byte_perm(s.scales, 0, 0x4342)), kHalf2TwoPow15);
    const uint32_t block_scale[4] = {broadcast_low(s01), broadcast_high(s01), broadcast_low(s23), broadcast_high(s23)};
    const uint32_t* words = reinterpret_cast<const uint32_t*>(s.codes);
#pragma unroll
    for (int w = 0; w < 4 * kVectors; ++w) {  // word w: columns 8w … 8w+7, block w / 2
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const uint32_t x = words[w] >> (4 * p);  // codes of columns 8w+2p (bits 0..3) and 8w+2p+1 (16..19)
        const uint32_t bits = ((x << 9) & 0x0E000E00u) | ((x << 12) & 0x80008000u);
        out[4 * w + p] = hmul2(bits, block_scale[w / 2]);
      }
    }
  }
  // ─ GEMV hooks (weight_gemv_kernel): a stage is 4 groups of 16 columns; group g = block g of the thread's row.
  // Group g → the 8 fp16 pairs of columns 16g … 16g+15 at true E2M1 magnitude (words 2g and 2g+1).
  __device__ __forceinline__ static void gemv_decode(const Stage& s, int g, uint32_t (&out)[8]) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(s.codes);
    e2m1_word_to_half2(words[2 * g], out);
    e2m1_word_to_half2(words[2 * g + 1], out + 4);
  }
  // Block scales as fp32 scale · 2^-8 (exact: via fp16, subnormals included). With row_scale = global · 2^7 the
  // accumulator needs one more factor 2: kGemvAccFactor.
  __device__ __forceinline__ static void gemv_scales(const Stage& s, float (&scale)[4]) {
    const float2 s01 = half2_to_float2(e4m3_pair_to_half2_bits(__byte_perm(s.scales, 0, 0x4140)));
    const float2 s23 = half2_to_float2(e4m3_pair_to_half2_bits(__byte_perm(s.scales, 0, 0x4342)));
    scale[0] = s01.x, scale[1] = s01.y, scale[2] = s23.x, scale[3] = s23.y;
  }
  static constexpr float kGemvAccFactor = 2.0f;
};

struct Fp8Format {
  static constexpr int kChunkBytes = 8192;
  static constexpr int kVectors = 4;
  static constexpr int kStagesInFlight = 2;
  static constexpr int kGemvStagesInFlight = 1;  // weight_gemv_kernel: 64 B loaded ahead per thread
  static constexpr float kRowScaleFactor = 256.0f;  // e4m3_pair_to_half2_bits leaves out 2^8
  struct Stage {
    uint4 codes[kVectors];
  };
  __device__ __forceinline__ static void load(Stage& s, const uint8_t* chunk, int tid) {
    const uint4* vectors = reinterpret_cast<const uint4*>(chunk);
#pragma unroll
    for (int j = 0; j < kVectors; ++j) s.codes[j] = __ldg(vectors + j * kThreads + tid);
  }
  __device__ __forceinline__ static void dequantize(const Stage& s, uint32_t out[32]) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(s.codes);
#pragma unroll
    for (int w = 0; w < 4 * kVectors; ++w) {
      out[2 * w] = e4m3_pair_to_half2_bits(__byte_perm(words[w], 0, 0x4140));
      out[2 * w + 1] = e4m3_pair_to_half2_bits(__byte_perm(words[w], 0, 0x4342));
    }
  }
  // GEMV hooks: group g = vector g (columns 16g … 16g+15), values · 2^-8 (row_scale carries 2^8); no block scale.
  __device__ __forceinline__ static void gemv_decode(const Stage& s, int g, uint32_t (&out)[8]) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(s.codes) + 4 * g;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      out[2 * w] = e4m3_pair_to_half2_bits(__byte_perm(words[w], 0, 0x4140));
      out[2 * w + 1] = e4m3_pair_to_half2_bits(__byte_perm(words[w], 0, 0x4342));
    }
  }
  __device__ __forceinline__ static void gemv_scales(const Stage&, float (&scale)[4]) {
    scale[0] = scale[1] = scale[2] = scale[3] = 1.0f;
  }
  static constexpr float kGemvAccFactor = 1.0f;
};

struct GemmParams {
  const uint16_t* x;  // [M, K], row stride ldx (elements), 16-byte aligned rows
  int64_t ldx;
  const uint8_t* weight_tiles;
  const float* row_scale;  // [N]
  const uint16_t* bias;      // [N] or null
  uint16_t* y;               // [M, N] contiguous
  float* partials;         // [splits, M, Np] when splits > 1
  int* counters;           // [Np/64 · kMaxSplitMTiles], zero between calls
  int M, N, K;
  int k_tiles;             // Kp / 128
  int k_tiles_per_split;
  int splits;
};

__device__ __forceinline__ void store_pair(const GemmParams& p, int m, int n, float v0, float v1) {
  if (m >= p.M || n >= p.N) return;  // N is a multiple of 16, so n < N implies n + 1 < N
  const float2 scale = *reinterpret_cast<const float2*>(p.row_scale + n);
  float2 out = make_float2(v0 * scale.x, v1 * scale.y);
  if (p.bias) {
    const float2 b = half2_to_float2(*reinterpret_cast<const uint32_t*>(p.bias + n));
    out.x += b.x;
    out.y += b.y;
  }
  *reinterpret_cast<uint32_t*>(p.y + int64_t(m) * p.N + n) = float2_to_half2_rn(out.x, out.y);
}

template <class Mma, class Format, int BM>
__global__ void __launch_bounds__(kThreads) weight_gemm_kernel(const GemmParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(smem_raw);
  constexpr int kBufHalves = (BM + kTileN) * kSmemRowHalves;  // x rows, then w rows
  constexpr int kXVectors = BM * (kTileK / 8) / kThreads;     // 16-byte x loads per thread per stage
  // At BM = 64 the x prefetch and accumulators need the registers; that tile is compute-heavier anyway.
  constexpr int kRing = BM >= 64 ? 2 : Format::kStagesInFlight;
  static_assert(kXVectors >= 1 && BM % 16 == 0 && kRing % 2 == 0, "tile configuration");
  static_assert(fused_smem_bytes(BM) <= kVoltaMaxSmemPerBlock, "Volta allows 96 KB of shared memory per block");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_tile = blockIdx.x, m0 = blockIdx.y * BM, split = blockIdx.z;
  const int kt_begin = split * p.k_tiles_per_split;
  const int kt_count = min(p.k_tiles_per_split, p.k_tiles - kt_begin);
  const uint8_t* strip = p.weight_tiles + int64_t(n_tile) * p.k_tiles * Format::kChunkBytes;

  typename Format::Stage ring[kRing];
  uint4 x_stage[kXVectors];
  auto load_x = [&](int kt) {
#pragma unroll
    for (int v = 0; v < kXVectors; ++v) {
      const int q = v * kThreads + tid, row = q >> 4, k = kt * kTileK + (q & 15) * 8;
      x_stage[v] = (m0 + row < p.M && k < p.K)
                       ? *reinterpret_cast<const uint4*>(p.x + int64_t(m0 + row) * p.ldx + k)
                       : make_uint4(0, 0, 0, 0);
    }
  };
  // Stage i of this block is k-tile kt_begin + i.
#pragma unroll
  for (int s = 0; s < kRing; ++s)
    if (s < kt_count) Format::load(ring[s], strip + int64_t(kt_begin + s) * Format::kChunkBytes, tid);
  if (kt_count > 0) load_x(kt_begin);

  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.f;

  const int w_row = tid % kTileN, w_col = (tid / kTileN) * 64;
  for (int i0 = 0; i0 < kt_count; i0 += kRing) {
#pragma unroll
    for (int s = 0; s < kRing; ++s) {
      const int i = i0 + s;
      if (i >= kt_count) break;
      uint16_t* sx = smem + (s & 1) * kBufHalves;
      uint16_t* sw = sx + BM * kSmemRowHalves;
#pragma unroll
      for (int v = 0; v < kXVectors; ++v) {
        const int q = v * kThreads + tid;
        *reinterpret_cast<uint4*>(sx + (q >> 4) * kSmemRowHalves + (q & 15) * 8) = x_stage[v];
      }
      {
        uint32_t w[32];
        Format::dequantize(ring[s], w);
        uint4* dst = reinterpret_cast<uint4*>(sw + w_row * kSmemRowHalves + w_col);
#pragma unroll
        for (int c = 0; c < 8; ++c) dst[c] = *reinterpret_cast<const uint4*>(&w[4 * c]);
      }
      if (i + kRing < kt_count)
        Format::load(ring[s], strip + int64_t(kt_begin + i + kRing) * Format::kChunkBytes, tid);
      if (i + 1 < kt_count) load_x(kt_begin + i + 1);
      __syncthreads();
      const uint16_t* sw_strip = sw + warp * kWarpN * kSmemRowHalves;
#pragma unroll
      for (int k = 0; k < kTileK; k += Mma::kK) {
        typename Mma::template Frags<BM> f;
        Mma::template load<BM>(f, sx, sw_strip, k, lane);
        Mma::template mma<BM>(acc, f);
      }
    }
  }

  const int n_base = n_tile * kTileN + warp * kWarpN;
  if (p.splits == 1) {
#pragma unroll
    for (int i = 0; i < BM / 2; i += 2) {
      int row, col;
      Mma::acc_coord(lane, i, row, col);
      store_pair(p, m0 + row, n_base + col, acc[i], acc[i + 1]);
    }
    return;
  }

  // Split-K: publish this split's partial tile, then the last block of the tile reduces all of them.
  const int np = gridDim.x * kTileN;
  auto partial = [&](int s, int m, int n) { return p.partials + (int64_t(s) * p.M + m) * np + n; };
#pragma unroll
  for (int i = 0; i < BM / 2; i += 2) {
    int row, col;
    Mma::acc_coord(lane, i, row, col);
    if (m0 + row < p.M) *reinterpret_cast<float2*>(partial(split, m0 + row, n_base + col)) = make_float2(acc[i], acc[i + 1]);
  }
  __shared__ int arrived_last;
  __threadfence();
  __syncthreads();
  int* counter = p.counters + n_tile * kMaxSplitMTiles + blockIdx.y;
  if (tid == 0) {
    const int arrived = atomicAdd(counter, 1);
    arrived_last = arrived == p.splits - 1;
    if (arrived_last) *counter = 0;  // leave the semaphore at zero for the next launch
  }
  __syncthreads();
  if (!arrived_last) return;
  __threadfence();
#pragma unroll
  for (int i = 0; i < BM / 2; i += 2) {
    int row, col;
    Mma::acc_coord(lane, i, row, col);
    if (m0 + row >= p.M) continue;
    float2 sum = make_float2(0.f, 0.f);
    for (int s = 0; s < p.splits; ++s) {
      const float2 v = __ldcg(reinterpret_cast<const float2*>(partial(s, m0 + row, n_base + col)));
      sum.x += v.x;
      sum.y += v.y;
    }
    store_pair(p, m0 + row, n_base + col, sum.x, sum.y);
  }
}

// ─── GEMV path (small M, PATH_GEMV): CUDA cores, weights decoded in registers ─────────────────────────────
// Same tiles, same per-thread loads as the fused kernel (Format::load: thread t of a strip reads row t % 64,
// columns (t / 64)·64 … +63 of each tile; every warp load is 512 contiguous bytes), but the weights never touch
// shared memory: each thread decodes its 64 weights per tile in registers and multiplies them with x, which the
// block stages once in shared memory for its whole K range (M rows × k_tiles_per_split · 128 halves; all lanes of
// a warp read the same x address, so the reads are broadcasts). A ring of Format::kGemvStagesInFlight tiles per thread
// is kept in flight (the refill is issued before the current tile is computed). The two threads of an output row
// (column halves) add their sums through shared memory; split-K blocks then write fp32 partials and the last one
// to arrive sums them in split order (deterministic) and runs the epilogue, as in weight_gemm_kernel.
//
// Precision: within one 16-column group the products are formed and summed in fp16 (one fma.rn.f16x2 chain of 8
// per column parity, each step rounded once: error of a group sum ≲ 8 · 2^-11 · Σ|products| worst case, ~4e-4 of
// the group sum rms for random data), then converted to fp32, multiplied by the group's block scale in fp32 and accumulated in fp32
// across all groups of K — so the error does not grow with K and the result is within the fp16 output rounding
// (2^-11) to a small factor. NVFP4 values enter at their true magnitude (|v| ≤ 6, exact in fp16), FP8 as v · 2^-8
// (|·| ≤ 1.75); a group sum overflows fp16 only if 16 same-signed products exceed 65504, i.e. |x| > 682 (NVFP4) or
// > 2340 (FP8) on every element of a group with the largest codes — far beyond normalised activations.
constexpr int kGemvStrips = 2;                        // 64-row strips (output tiles) per block
constexpr int kGemvThreads = kGemvStrips * kThreads;  // 256
constexpr int kGemvMaxM = 8;
// Blocks per SM that the register budget is sized for (__launch_bounds__): 4 (≤ 64 registers, 32 warps) at M = 1,
// where warps and bytes in flight matter most; 2 (≤ 128) otherwise — at 3, M ≥ 2 spills on sm_70 for FP8 (and
// M ≥ 5 for NVFP4; tools/sm70_check.py).
__host__ __device__ constexpr int gemv_min_blocks(int m) { return m == 1 ? 4 : 2; }
constexpr int kGemvMaxSmemBytes = 24 * 1024;          // x slice: M · k_tiles_per_split · 128 · 2 bytes at most
__host__ __device__ constexpr int gemv_smem_bytes(int m, int k_tiles_per_split) {
  return m * k_tiles_per_split * kTileK * 2;
}

// One stage (one tile of the thread's row: 4 groups of 16 columns) against M rows of x. x points at this thread's
// 64 columns of the tile in row 0; rows are x_stride halves apart.
template <class Format, int M>
__device__ __forceinline__ void gemv_stage(const typename Format::Stage& s, const uint16_t* x, int x_stride,
                                           float (&acc)[M]) {
  float scale[4];
  Format::gemv_scales(s, scale);
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    uint32_t w[8];
    Format::gemv_decode(s, g, w);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const uint4* xv = reinterpret_cast<const uint4*>(x + m * x_stride + g * 16);
      const uint4 a = xv[0], b = xv[1];
      uint32_t sum = hmul2(w[0], a.x);
      sum = hfma2(w[1], a.y, sum);
      sum = hfma2(w[2], a.z, sum);
      sum = hfma2(w[3], a.w, sum);
      sum = hfma2(w[4], b.x, sum);
      sum = hfma2(w[5], b.y, sum);
      sum = hfma2(w[6], b.z, sum);
      sum = hfma2(w[7], b.w, sum);
      const float2 f = half2_to_float2(sum);
      acc[m] = fmaf(f.x + f.y, scale[g], acc[m]);
    }
  }
}

__device__ __forceinline__ void store_one(const GemmParams& p, int m, int n, float v) {
  float out = v * p.row_scale[n];
  if (p.bias) out += half2_to_float2(uint32_t(p.bias[n])).x;
  p.y[int64_t(m) * p.N + n] = uint16_t(float2_to_half2_rn(out, 0.f) & 0xFFFFu);
}

// Grid: (ceil(n_tiles / kGemvStrips), splits); block kGemvThreads; dynamic smem gemv_smem_bytes(M, k_tiles_per_split).
// M is the exact row count (p.M == M).
template <class Format, int M>
__global__ void __launch_bounds__(kGemvThreads, gemv_min_blocks(M)) weight_gemv_kernel(const GemmParams p) {
  static_assert(M >= 1 && M <= kGemvMaxM, "GEMV rows");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem_raw);  // [M][k_tiles_per_split · 128]
  __shared__ float upper_half_sums[kGemvStrips * kTileN][M];
  __shared__ int arrived_last;
  constexpr int kRing = Format::kGemvStagesInFlight;

  const int tid = threadIdx.x, strip = tid / kThreads, strip_tid = tid % kThreads;
  const int n_tiles = (p.N + kTileN - 1) / kTileN;
  const int n_tile = blockIdx.x * kGemvStrips + strip, split = blockIdx.y;
  const bool strip_valid = n_tile < n_tiles;
  const int kt_begin = split * p.k_tiles_per_split;
  const int kt_count = min(p.k_tiles_per_split, p.k_tiles - kt_begin);
  const uint8_t* chunks = p.weight_tiles + (int64_t(n_tile) * p.k_tiles + kt_begin) * Format::kChunkBytes;

  // Weights first, so that they are in flight while x is staged.
  typename Format::Stage ring[kRing];
#pragma unroll
  for (int s = 0; s < kRing; ++s)
    if (strip_valid && s < kt_count) Format::load(ring[s], chunks + int64_t(s) * Format::kChunkBytes, strip_tid);

  const int x_stride = p.k_tiles_per_split * kTileK;
  const int x_vectors_per_row = kt_count * (kTileK / 8);
  for (int q = tid; q < M * x_vectors_per_row; q += kGemvThreads) {
    const int m = q / x_vectors_per_row, c = (q - m * x_vectors_per_row) * 8, k = kt_begin * kTileK + c;
    // K is a multiple of 16: a vector of 8 is wholly inside or outside; outside (tile padding) reads as zero.
    const uint4 v = k < p.K ? *reinterpret_cast<const uint4*>(p.x + int64_t(m) * p.ldx + k) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(xs + m * x_stride + c) = v;
  }
  __syncthreads();

  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  if (strip_valid) {
    const uint16_t* x_half = xs + (strip_tid / kTileN) * 64;
    for (int i0 = 0; i0 < kt_count; i0 += kRing) {
#pragma unroll
      for (int s = 0; s < kRing; ++s) {
        const int i = i0 + s;
        if (i >= kt_count) break;
        const typename Format::Stage stage = ring[s];
        if (i + kRing < kt_count) Format::load(ring[s], chunks + int64_t(i + kRing) * Format::kChunkBytes, strip_tid);
        gemv_stage<Format, M>(stage, x_half + i * kTileK, x_stride, acc);
      }
    }
  }

  // Column half 1 hands its sums to column half 0 (fixed order: half 0 + half 1).
  const int block_row = strip * kTileN + strip_tid % kTileN;
  const bool owner = strip_valid && strip_tid < kTileN;
  if (strip_tid >= kTileN) {
#pragma unroll
    for (int m = 0; m < M; ++m) upper_half_sums[block_row][m] = acc[m];
  }
  __syncthreads();
  const int n = n_tile * kTileN + strip_tid % kTileN;
  if (owner) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = (acc[m] + upper_half_sums[block_row][m]) * Format::kGemvAccFactor;
  }
  if (p.splits == 1) {
    if (owner && n < p.N) {
#pragma unroll
      for (int m = 0; m < M; ++m) store_one(p, m, n, acc[m]);
    }
    return;
  }

  const int64_t np = int64_t(n_tiles) * kTileN;
  if (owner) {
#pragma unroll
    for (int m = 0; m < M; ++m) p.partials[(int64_t(split) * M + m) * np + n] = acc[m];
  }
  __threadfence();
  __syncthreads();
  int* counter = p.counters + blockIdx.x * kGemvStrips * kMaxSplitMTiles;  // the first strip's first semaphore
  if (tid == 0) {
    const int arrived = atomicAdd(counter, 1);
    arrived_last = arrived == p.splits - 1;
    if (arrived_last) *counter = 0;  // leave the semaphore at zero for the next launch
  }
  __syncthreads();
  if (!arrived_last) return;
  __threadfence();
  if (owner && n < p.N) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float sum = 0.f;
      for (int s = 0; s < p.splits; ++s) sum += __ldcg(p.partials + (int64_t(s) * M + m) * np + n);
      store_one(p, m, n, sum);
    }
  }
}

// Tiles → fp16 W rows [row_begin, row_begin + rows) × K, row_scale applied in fp32 and rounded once.
// Grid: (rows / 64, Kp / 128); the dequantize + cuBLAS path for large M. Each thread dequantizes its part of the
// tile row it loaded; the tile goes through shared memory so that the global stores run along rows (a warp
// writes two full 256-byte row segments per instruction instead of 32 scattered 16-byte pieces).
template <class Format>
__global__ void __launch_bounds__(kThreads) dequantize_tiles_kernel(const uint8_t* weight_tiles, const float* row_scale,
                                                                    uint16_t* w, int row_begin, int N, int K,
                                                                    int k_tiles) {
  __shared__ __align__(16) uint16_t tile[kTileN * kSmemRowHalves];
  const int tid = threadIdx.x, n_tile = row_begin / kTileN + blockIdx.x, kt = blockIdx.y;
  typename Format::Stage stage;
  Format::load(stage, weight_tiles + (int64_t(n_tile) * k_tiles + kt) * Format::kChunkBytes, tid);
  const int row = tid % kTileN, n = n_tile * kTileN + row;
  const float scale = n < N ? row_scale[n] : 0.f;
  uint32_t v[32];
  Format::dequantize(stage, v);
  uint4* dst = reinterpret_cast<uint4*>(tile + row * kSmemRowHalves + (tid / kTileN) * 64);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    uint4 out;
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = half2_to_float2(v[4 * c + e]);
      o[e] = float2_to_half2_rn(f.x * scale, f.y * scale);
    }
    dst[c] = out;
  }
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
