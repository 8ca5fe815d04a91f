// The GEMM ops' host-side decisions, apart from the host code that makes the launches
// (csrc/driver/weight_gemm_driver.cpp, the kernel image through the CUDA driver API) so that tests compile them
// alone. Which path an M
// takes, the fused kernel's block rows and split-K, the GEMV's stream-K cut, the dequantize chunking, and the name
// of every kernel the ops launch (the kernel table the wheel build compiles: tools/sm70_check.py lists the same).
// Torch- and CUDA-free.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gemm/weight_gemm_shape.h"

namespace volta_fp4 {

enum class Path : int64_t { kAuto = 0, kFused = 1, kDequantCublas = 2, kGemv = 3 };

// The M cut-overs of `auto` and the dequantize + cuBLAS chunk. Python sets them once when it loads the ops
// (configure_gemm, from VLLM_VOLTA_FP4_GEMV_MAX_M / VLLM_VOLTA_FP4_CUBLAS_MIN_M / VLLM_VOLTA_FP4_DEQUANT_CHUNK_MIB,
// read by vllm_volta_fp4/envs.py); a value below the smallest allowed keeps the default.
//
// Largest M that `auto` sends to the GEMV (weight_gemv_kernel; 0 disables it, values above kGemvMaxM are clamped).
// The GEMV decodes each weight once into MMA fragments and the tensor cores apply it to all M ≤ 8 rows (M = 9-16: one
// more MMA per decoded fragment), so its cost per weight hardly grows with M (NVFP4 decode: 11 integer + 4 fp16
// multiplies per 8 weights; mma.sync: 1 m16n8k16 per 8 weights per lane on sm_80+, 2 m8n8k4 = 8 HMMA steps on
// sm_70, so ≈ 3.5 issue slots per weight on a V100 with loads and loop, against 10.1 available at full bandwidth).
// The fused kernel decodes the same way; at M = 9-16 the two tie summed over the 27B shapes (the GEMV wins on gate_up,
// the fused kernel on qkv, down and gdn_in: docs/gemm.md, v11), so the GEMV keeps every M it supports.
//
// Where the dequantize + cuBLAS path takes over from the fused kernel (M ≥ this). Measured on an H100 (docs/gemm.md,
// v11): the fused kernel beats dequantize + cuBLAS on every 27B shape at M = 128 (1.1-1.6×), which wins at M = 256
// (measure on a V100 before moving it).
constexpr int64_t kDefaultCublasMinM = 129;

// Dequantize + cuBLAS: the fp16 scratch that one chunk of weight rows is dequantized into before its cuBLAS call
// (VLLM_VOLTA_FP4_DEQUANT_CHUNK_MIB). Measured on the H200 (benchmarks/bench_dequant_chunk.py, docs/gemm.md): chunks
// that stay in L2 (2-30 MiB of its 60) are slower, not faster, at every M = 128-8192 — cuBLAS on a few hundred rows
// runs far below its rate — and 96-256 MiB beat 32-64 at M ≥ 512 on most shapes (fewer, larger cuBLAS calls);
// 128 MiB takes the 27B's largest weight (gate_up, 356 MB in fp16) in 3 chunks.
constexpr int64_t kDefaultDequantChunkBytes = int64_t(128) << 20;

struct GemmSettings {
  int64_t gemv_max_m = kGemvMaxM;
  int64_t cublas_min_m = kDefaultCublasMinM;
  int64_t dequant_chunk_bytes = kDefaultDequantChunkBytes;
};

inline GemmSettings& gemm_settings() {
  static GemmSettings settings;
  return settings;
}

inline void configure_gemm(int64_t gemv_max, int64_t cublas_min, int64_t dequant_chunk_mib) {
  gemm_settings().gemv_max_m = gemv_max < 0 ? kGemvMaxM : std::min<int64_t>(gemv_max, kGemvMaxM);
  gemm_settings().cublas_min_m = cublas_min < 1 ? kDefaultCublasMinM : cublas_min;
  gemm_settings().dequant_chunk_bytes = dequant_chunk_mib < 1 ? kDefaultDequantChunkBytes : dequant_chunk_mib << 20;
}

// The path `path` (an op argument) means for M rows; kAuto when `path` is not one of the four values.
inline Path choose_path(int64_t m, int64_t path) {
  if (path != int64_t(Path::kAuto)) {
    const bool known = path == int64_t(Path::kFused) || path == int64_t(Path::kDequantCublas) ||
                       path == int64_t(Path::kGemv);
    return known ? Path(path) : Path::kAuto;
  }
  return m <= gemm_settings().gemv_max_m ? Path::kGemv
         : m >= gemm_settings().cublas_min_m ? Path::kDequantCublas
                                              : Path::kFused;
}

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Fused kernel: BM rows per block for M rows; more rows than 32 take several m-tiles (blockIdx.y).
inline int fused_block_rows(int64_t m) { return m <= 16 ? 16 : kFusedMaxBlockRows; }

// Split K so that the SMs' resident blocks are busy, choosing among whole waves: cost ≈ waves × (k-tiles per
// block + a pipeline fill of ~2). Only where one semaphore per block tile exists. Sets p.k_tiles_per_split and
// p.splits; returns the grid (strip groups, m-tiles, splits).
struct Grid3 {
  unsigned x, y, z;
};
inline Grid3 plan_fused(GemmParams& p, int64_t n_tiles, int64_t slots, bool sm70_atom) {
  const int bm = fused_block_rows(p.M), strips = fused_strips_per_block(sm70_atom, bm);
  const int64_t groups = (n_tiles + strips - 1) / strips, m_tiles = (p.M + bm - 1) / bm;
  const int64_t tiles = groups * m_tiles;
  int64_t splits = 1, best_cost = INT64_MAX;
  for (int64_t s = 1; s <= (m_tiles <= kMaxSplitMTiles ? std::min<int64_t>(p.k_tiles, 64) : 1); ++s) {
    const int64_t per = (p.k_tiles + s - 1) / s, waves = (tiles * s + slots - 1) / slots, cost = waves * (per + 2);
    if (cost < best_cost) best_cost = cost, splits = s;
  }
  p.k_tiles_per_split = int((p.k_tiles + splits - 1) / splits);
  p.splits = int((p.k_tiles + p.k_tiles_per_split - 1) / p.k_tiles_per_split);
  return {unsigned(groups), unsigned(m_tiles), unsigned(p.splits)};
}

// GEMV, stream-K: the (strip, k-tile) stream cut into one equal range per resident block slot (one wave). Sets
// p.tiles_per_block; returns the number of blocks. Partials ([blocks, 2, M, 64] fp32) are needed when
// gemv_needs_partials.
inline int64_t plan_gemv(GemmParams& p, int64_t n_tiles, int64_t slots) {
  const int64_t tiles = n_tiles * p.k_tiles;
  const int64_t per = std::max<int64_t>(kGemvMinTilesPerBlock, (tiles + slots - 1) / slots);
  p.tiles_per_block = int(per);
  return (tiles + per - 1) / per;
}
inline bool gemv_needs_partials(const GemmParams& p) { return p.tiles_per_block % p.k_tiles != 0; }

// Rows per chunk: the fewest chunks of at most chunk_bytes, cut into equal shares of whole 64-row tiles (no small
// last chunk), at least one tile.
inline int64_t dequant_rows_per_chunk(int64_t n, int64_t k, int64_t chunk_bytes) {
  const int64_t tiles = (n + kTileN - 1) / kTileN, max_tiles = std::max<int64_t>(1, chunk_bytes / (2 * k) / kTileN);
  const int64_t chunks = (tiles + max_tiles - 1) / max_tiles;
  return (tiles + chunks - 1) / chunks * kTileN;
}

// ─── Kernel names (the NVRTC name expressions of the instantiations the ops launch) ──────────────────────────
inline const char* atom_name(bool sm70_atom) { return sm70_atom ? "volta_fp4::Sm70Mma" : "volta_fp4::Sm80Mma"; }
inline const char* format_name(bool nvfp4) { return nvfp4 ? "volta_fp4::Nvfp4Format" : "volta_fp4::Fp8Format"; }

inline std::string fused_kernel_name(bool sm70_atom, bool nvfp4, int bm) {
  return std::string("volta_fp4::weight_gemm_kernel<") + atom_name(sm70_atom) + ", " + format_name(nvfp4) + ", " +
         std::to_string(bm) + ">";
}
inline std::string gemv_kernel_name(bool sm70_atom, bool nvfp4, int m) {
  return std::string("volta_fp4::weight_gemv_kernel<") + atom_name(sm70_atom) + ", " + format_name(nvfp4) + ", " +
         std::to_string(m) + ">";
}
inline std::string dequantize_kernel_name(bool nvfp4) {
  return std::string("volta_fp4::dequantize_tiles_kernel<") + format_name(nvfp4) + ">";
}

// Every kernel the ops can launch: the kernel table that the kernel image must carry.
inline std::vector<std::string> launched_kernel_names() {
  std::vector<std::string> names;
  for (const bool sm70 : {true, false})
    for (const bool nvfp4 : {true, false})
      for (const int bm : {16, kFusedMaxBlockRows}) names.push_back(fused_kernel_name(sm70, nvfp4, bm));
  for (const bool sm70 : {true, false})
    for (const bool nvfp4 : {true, false})
      for (int m = 1; m <= kGemvMaxM; ++m) names.push_back(gemv_kernel_name(sm70, nvfp4, m));
  for (const bool nvfp4 : {true, false}) names.push_back(dequantize_kernel_name(nvfp4));
  return names;
}

}  // namespace volta_fp4
