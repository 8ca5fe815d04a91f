// What the GEMM kernels (weight_gemm.cuh) and their host code share: tile sizes, the weight-tile formats' sizes,
// the launch-parameter struct. Torch- and CUDA-free, so that it compiles under nvcc, NVRTC and a plain C++
// compiler (the driver-API host code in csrc/driver/).
#pragma once

#include "common/host_device.h"
#include "common/int_types.cuh"
#include "common/smem_rows.h"

namespace volta_fp4 {

constexpr int kTileN = 64;
constexpr int kTileK = 128;
constexpr int kThreads = 128;
constexpr int kMaxSplitMTiles = 8;       // split-K semaphores per row strip (see prepare_*)

// The fused kernel (weight_gemm_kernel<Mma, Format, BM>): BM = 16 or 32 x rows per block, more rows in several
// m-tiles (a 64-row block ran up to 1.7× slower than two 32-row m-tiles on an H100: docs/gemm.md, v11); 4 warps per
// 64-row strip and 2 strips per block sharing the x tile, except on sm_70 at BM = 32, where the atom's 16 accumulators
// per 8 rows need one strip per block to keep 2 blocks resident. Dynamic shared memory: two buffers of BM x rows.
constexpr int kFusedMaxBlockRows = 32;
VOLTA_FP4_HOST_DEVICE constexpr int fused_strips_per_block(bool sm70_atom, int bm) {
  return sm70_atom && bm > 16 ? 1 : 2;
}
VOLTA_FP4_HOST_DEVICE constexpr int fused_block_threads(bool sm70_atom, int bm) {
  return kThreads * fused_strips_per_block(sm70_atom, bm);
}
VOLTA_FP4_HOST_DEVICE constexpr int fused_smem_bytes(int bm) { return 2 * bm * kSmemRowHalves * 2; }

constexpr int kGemvMaxM = 16;
constexpr int kGemvMinBlocks = 4;      // __launch_bounds__ for M ≤ 8: ≤ 128 registers, 16 warps per SM at least
constexpr int kGemvMinBlocksWide = 3;  // M = 9-16: a second accumulator set, ≤ 168 registers, 12 warps per SM
constexpr int kGemvMinTilesPerBlock = 2;

// Bytes of one (64-row strip, 128-column k-tile) chunk of prepared weights, and the power of two the decode
// leaves out (folded into the row scales by prepare_*). The device-side formats (Nvfp4Format, Fp8Format) derive
// from these.
struct Nvfp4Tiles {
  static constexpr int kChunkBytes = 4608;
  static constexpr float kRowScaleFactor = 256.0f;
};
struct Fp8Tiles {
  static constexpr int kChunkBytes = 8192;
  static constexpr float kRowScaleFactor = 256.0f;  // e4m3_pair_to_half2_bits leaves out 2^8
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
  int k_tiles_per_split;  // fused kernel: split-K
  int splits;
  int tiles_per_block;    // GEMV: tiles of the (strip, k-tile) stream per block
};

}  // namespace volta_fp4
