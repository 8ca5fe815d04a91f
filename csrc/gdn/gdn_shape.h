// What the Gated-DeltaNet kernels (gdn.cuh) and their host code share: chunk and block sizes, the chunked
// prefill's shared-memory plans and the launch-parameter structs (their fields are described in gdn.cuh, with the
// kernels). Torch- and CUDA-free, so that it compiles under nvcc, NVRTC and a plain C++ compiler (the driver-API
// host code in csrc/driver/).
#pragma once

#include "common/int_types.cuh"
#include "common/smem_rows.h"

namespace volta_fp4 {
namespace gdn {

constexpr int kChunk = 64;
constexpr int kBlockThreads = 128;
constexpr int kWarps = kBlockThreads / 32;
constexpr int kVSlice = 32;  // state rows (v) per block of chunk_state_kernel and recurrent_decode_kernel
constexpr int kTokenRowHalves = kChunk + 8;
constexpr int kConvSegment = 64;  // tokens per block of causal_conv1d_kernel

struct ChunkParams {
  const uint16_t* q;  // [tokens, H, D]
  int64_t q_token_stride, q_head_stride;
  const uint16_t* k;
  int64_t k_token_stride, k_head_stride;
  const uint16_t* v;  // [tokens, HV, D]
  int64_t v_token_stride, v_head_stride;
  const float* g;     // [tokens, HV] log-decay
  const float* beta;  // [tokens, HV]
  const int* cu_seqlens;  // [num_seqs + 1]
  const int* state_indices;
  const bool* has_initial_state;  // [num_seqs] or null (all)
  void* state;                    // [slots, HV, D, D] float or fp16
  int64_t state_slot_stride, state_head_stride;
  uint16_t* out;  // [tokens, HV, D]
  int64_t out_token_stride, out_head_stride;
  // Workspace per (chunk slot, v-head), index chunk_slot · HV + hv.
  uint16_t* w;       // [64][D]  T diag(β e^G) K
  uint16_t* u;       // [64][D]  T diag(β) V
  uint16_t* p;       // [64][64] causal decayed scale · Q Kᵀ
  float* g_cumsum;   // [64]     G
  int num_seqs, num_v_heads, heads_per_k_head, null_slot;
  float scale;
};

template <int D>
struct PrepareSmem {
  static_assert(D == 64 || D == 128, "head dim must be 64 or 128");
  static constexpr int kRowHalves = D + 8;
  // Panel 0: K rows [64][D + 8], later (β e^G K)ᵀ [D][72]; panel 1: Q rows, later (β V)ᵀ.
  static constexpr int kPanelHalves =
      kChunk * kRowHalves > D * kTokenRowHalves ? kChunk * kRowHalves : D * kTokenRowHalves;
  static constexpr int kARowFloats = kChunk + 8;  // fp32 A rows: 16-byte aligned, two wavefronts per float2 store
  static constexpr int kTOffset = 2 * kPanelHalves;                  // T [64][72] fp16 (halves)
  static constexpr int kABytesOffset = (kTOffset + kChunk * kTokenRowHalves) * 2;
  static constexpr int kVectorsBytesOffset = kABytesOffset + kChunk * kARowFloats * 4;  // G, β, β e^G: 64 floats each
  static constexpr int kBytes = kVectorsBytesOffset + 3 * kChunk * 4;
  static_assert(kABytesOffset % 16 == 0, "fp32 A rows are read as float4");
  static_assert(kBytes <= kVoltaMaxSmemPerBlock, "Volta allows 96 KB of shared memory per block");
};

template <int D>
struct StateSmem {
  static_assert(D == 64 || D == 128, "head dim must be 64 or 128");
  static constexpr int kRowHalves = D + 8;
  static constexpr int kWqOffset = 0;                                // W rows 0-63, Q rows 64-127 [128][D + 8]
  static constexpr int kS0Offset = kWqOffset + 2 * kChunk * kRowHalves;  // S0 (fp16) [kVSlice][D + 8]
  static constexpr int kKtOffset = kS0Offset + kVSlice * kRowHalves;     // Kᵀ [D][72]
  static constexpr int kPOffset = kKtOffset + D * kTokenRowHalves;       // P [64][72]
  static constexpr int kUtOffset = kPOffset + kChunk * kTokenRowHalves;  // Uᵀ [kVSlice][72]
  static constexpr int kUtDecayedOffset = kUtOffset + kVSlice * kTokenRowHalves;  // (diag(e^{G_63 − G}) U)ᵀ
  static constexpr int kGBytesOffset = (kUtDecayedOffset + kVSlice * kTokenRowHalves) * 2;
  static constexpr int kBytes = kGBytesOffset + kChunk * 4;
  static_assert(kBytes <= kVoltaMaxSmemPerBlock, "Volta allows 96 KB of shared memory per block");
};

struct DecodeParams {
  const uint16_t* q;  // [batch, H, D]
  int64_t q_token_stride, q_head_stride;
  const uint16_t* k;
  int64_t k_token_stride, k_head_stride;
  const uint16_t* v;  // [batch, HV, D]
  int64_t v_token_stride, v_head_stride;
  const uint16_t* a;  // [batch, HV] fp16: g = −exp(A_log) · softplus(a + dt_bias)
  const uint16_t* b;  // [batch, HV] fp16: β = sigmoid(b)
  const float* A_log;
  const float* dt_bias;
  void* state;  // [slots, HV, D, D]
  int64_t state_slot_stride, state_head_stride;
  const int* state_indices;  // [batch]
  uint16_t* out;             // [batch, HV, D]
  int64_t out_token_stride, out_head_stride;
  int num_v_heads, heads_per_k_head, null_slot;
  float scale;
  bool l2norm;
};

struct ConvParams {
  const uint16_t* x;  // [tokens, dim]
  int64_t x_token_stride;
  uint16_t* out;      // [tokens, dim]
  int64_t out_token_stride;
  const uint16_t* weight;  // [dim, width]
  const uint16_t* bias;    // [dim] or null
  uint16_t* state;         // [slots, dim, ≥ width − 1]
  int64_t state_slot_stride, state_dim_stride, state_pos_stride;
  const int* query_start_loc;     // [num_seqs + 1], or null: decode
  const int* cache_indices;       // [num_seqs]
  const bool* has_initial_state;  // [num_seqs] or null (all)
  int num_seqs, dim, null_slot;
  bool silu;
};

struct RowNormParams {
  const uint16_t* x;  // [rows, D]
  int64_t x_row_stride;
  const uint16_t* z;  // [rows, D] (gated only)
  int64_t z_row_stride;
  const uint16_t* weight;  // [D] (gated only)
  uint16_t* out;
  int64_t out_row_stride;
  int rows;
  float eps;
};

}  // namespace gdn
}  // namespace volta_fp4
