// Gated DeltaNet (the linear-attention layers of Qwen3.5 / Qwen3.8) for Volta and newer: the chunked gated
// delta rule for prefill, the one-token recurrent update for decode, the causal depthwise conv1d in front of it
// (prefill and decode, with vLLM's per-sequence conv state), the gated RMSNorm behind it and the l2 norm of q/k.
// Kernel code only (no torch or host headers): compiled by NVRTC into the kernel image (tools/sm70_check.py) and for
// the sm_70 check (tests/test_gdn_sm70_compile.py). Matrix products go through the MMA atoms of mma_atoms.cuh.
//
// ─── Data layouts (vLLM's; see vllm_volta_fp4/ops/gdn.py for the math) ─────────────────────────────────────────
// q, k [tokens, H, D] and v, out [tokens, HV, D] fp16, any token/head strides that keep 16-byte rows (vLLM
//   hands views of its fused projection). V-head hv reads k-head hv / (HV / H). head_k_dim = head_v_dim = D.
// Varlen batch: sequence s owns tokens cu_seqlens[s] … cu_seqlens[s+1]-1 and state slot state_indices[s]; a
//   slot < 0 or == null_slot is padding (nothing read or written, zero output).
// Recurrent state [slots, HV, D (v), D (k)] fp32 or fp16 (vLLM's mamba_ssm_cache_dtype), k contiguous: row v of a
//   head is what the state computes v from, so splitting v across blocks splits the state without communication.
// Conv state [slots, dim, ≥ width-1] fp16, any strides (vLLM's default cache is (slots, width-1, dim), seen
//   transposed); columns 0 … width-2 hold the last inputs, oldest first.
//
// ─── Chunked prefill (two kernels) ─────────────────────────────────────────────────────────────────────────
// Per sequence and v-head, chunks of kChunk = 64 tokens. With G_t the running sum of the log-decay g inside the
// chunk and S0 the state [v][k] at its start (every exponent below is ≤ 0):
//   A = strictly-lower(β_t e^{G_t − G_j} k_t·k_j),  T = (I + A)⁻¹,  W = T diag(β e^G) K,  U' = T diag(β) V
//   U = U' − W S0ᵀ,  O = scale · diag(e^G) Q S0ᵀ + P U  with  P = lower-incl-diag(scale · e^{G_t − G_j} q_t·k_j)
//   S = e^{G_63} S0 + (diag(e^{G_63 − G}) U)ᵀ K
// Padding tokens of a short last chunk are zero with g = 0, β = 0, which makes their rows of T the identity and
// their W, U', P, U rows zero, so both kernels always work on all 64 rows.
// 1. chunk_prepare_kernel, grid (chunk slots, HV): everything that does not depend on S0, for all chunks at once:
//    K·Kᵀ and Q·Kᵀ (HMMA), the triangular solve for T (fp32, CUDA cores: column c of T is one thread's forward
//    substitution, all 64 values in registers, A read as smem broadcasts; two warps solve while the other two
//    compute P), then W and U' (HMMA). Writes W, U' [64][D] and P [64][64] fp16 and G [64] fp32 per (chunk, v-head)
//    into a workspace. Chunk slot of chunk c of sequence s: ⌊cu_seqlens[s] / 64⌋ + s + c, so the workspace is
//    bounded by tokens / 64 + num_seqs without reading the batch on the host.
// 2. chunk_state_kernel, grid (D / kVSlice, HV, num_seqs): the sequential part. A block keeps kVSlice rows of the
//    fp32 state in MMA accumulators across all chunks of its sequence (so the state never rounds; the products
//    read an fp16 copy, as FLA's kernels do) and per chunk computes U and O for its v columns and the new state.
//    Warps 0-1 form U (then Uᵀ and the decayed Uᵀ go to smem), warps 2-3 form O; all four update the state.
// fp16 operands, fp32 accumulation; T, W, U', P, U and S0 are rounded to fp16 once each before they enter a
// product (relative 2⁻¹¹).
//
// ─── Shared memory ─────────────────────────────────────────────────────────────────────────────────────────
// Operands of a product over head dims are rows of D + 8 halves; over the chunk's tokens, rows of 64 + 8 (the
// atoms' bank-conflict-free strides). Transposed operands (Kᵀ, Vᵀ, Uᵀ: rows = dims, tokens contiguous) are written
// with 2-byte stores by lanes that take consecutive tokens, so a warp's stores hit distinct words.
#pragma once

#include "common/fp16.cuh"
#include "common/mma_atoms.cuh"
#include "gdn/gdn_shape.h"

namespace volta_fp4 {
namespace gdn {

constexpr float kSoftplusThreshold = 20.f;

__device__ __forceinline__ float half_to_float(uint16_t h) { return half2_to_float2(uint32_t(h)).x; }
__device__ __forceinline__ uint16_t float_to_half(float f) { return uint16_t(float2_to_half2_rn(f, 0.f) & 0xFFFFu); }
__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ bool is_padding(int slot, int null_slot) { return slot < 0 || slot == null_slot; }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
  return v;
}

// Work unit `index` of a varlen batch cut into units of `unit` tokens: sequence s owns units
// ⌊starts[s] / unit⌋ + s … (at least ⌈len / unit⌉ of them); returns the last sequence whose first unit is at or
// before `index` (binary search over starts[0 … num_seqs]).
__device__ __forceinline__ int unit_base(const int* starts, int seq, int unit) { return starts[seq] / unit + seq; }
__device__ __forceinline__ int find_sequence(const int* starts, int num_seqs, int unit, int index) {
  int seq = 0;
  for (int lo = 0, hi = num_seqs - 1; lo <= hi;) {
    const int mid = (lo + hi) >> 1;
    if (unit_base(starts, mid, unit) <= index) {
      seq = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return seq;
}

// State element pairs (two adjacent k) in the cache's dtype: float or fp16 bits.
template <class StateT>
struct StatePair;
template <>
struct StatePair<float> {
  __device__ __forceinline__ static float2 load(const float* p) { return *reinterpret_cast<const float2*>(p); }
  __device__ __forceinline__ static void store(float* p, float x, float y) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
  }
};
template <>
struct StatePair<uint16_t> {
  __device__ __forceinline__ static float2 load(const uint16_t* p) {
    return half2_to_float2(*reinterpret_cast<const uint32_t*>(p));
  }
  __device__ __forceinline__ static void store(uint16_t* p, float x, float y) {
    *reinterpret_cast<uint32_t*>(p) = float2_to_half2_rn(x, y);
  }
};

// acc[s] += A · B_sᵀ for one warp: A = BM rows at `a`, B_s = rows s·16 … s·16+15 at `b`, both `Depth` halves
// long and RowHalves apart in shared memory. A's fragments are read once per k-step for all strips.
template <class Mma, int BM, int Strips, int Depth, int RowHalves>
__device__ __forceinline__ void warp_mma(float (&acc)[Strips][BM / 2], const uint16_t* a, const uint16_t* b,
                                         int lane) {
#pragma unroll 4
  for (int k = 0; k < Depth; k += Mma::kK) {
    typename Mma::template Frags<BM> f;
    Mma::template load_a<BM, RowHalves>(f, a, k, lane);
#pragma unroll
    for (int s = 0; s < Strips; ++s) {
      Mma::template load_b<BM, RowHalves>(f, b + s * 16 * RowHalves, k, lane);
      Mma::template mma<BM>(acc[s], f);
    }
  }
}

// visit(s, i, row, col) for each accumulator pair (elements i, i + 1: columns col, col + 1 of one row) of a warp's
// Strips × (BM × 16) tile; row in 0 … BM − 1, col = s · 16 + the column inside strip s.
template <class Mma, int BM, int Strips, class Visit>
__device__ __forceinline__ void for_each_acc_pair(int lane, Visit&& visit) {
#pragma unroll
  for (int s = 0; s < Strips; ++s)
#pragma unroll
    for (int i = 0; i < BM / 2; i += 2) {
      int row, col;
      Mma::acc_coord(lane, i, row, col);
      visit(s, i, row, s * 16 + col);
    }
}

template <int Strips, int N>
__device__ __forceinline__ void zero(float (&acc)[Strips][N]) {
#pragma unroll
  for (int s = 0; s < Strips; ++s)
#pragma unroll
    for (int i = 0; i < N; ++i) acc[s][i] = 0.f;
}

// `rows` rows of D halves (row r at src + r · src_stride; rows ≥ valid read as zero) → smem rows of RowHalves.
template <int D, int RowHalves>
__device__ __forceinline__ void load_rows(uint16_t* dst, const uint16_t* src, int64_t src_stride, int rows,
                                          int valid, int tid) {
  constexpr int kVectors = D / 8;
  for (int v = tid; v < rows * kVectors; v += kBlockThreads) {
    const int r = v / kVectors, c = (v % kVectors) * 8;
    const uint4 value = r < valid ? *reinterpret_cast<const uint4*>(src + r * src_stride + c) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(dst + r * RowHalves + c) = value;
  }
}

// The chunk's token rows [64][D] (token t at src + t · src_stride; t ≥ valid is zero), each times token_scale[t]
// (smem; null = 1), → smem transposed: row d holds dim d of the 64 tokens (kTokenRowHalves apart). Lanes take
// consecutive tokens: their 16-byte loads are half-sector reads (the other half is the next iteration's, from L1),
// their 2-byte stores of one dim are 64 contiguous bytes.
template <int D>
__device__ __forceinline__ void load_rows_transposed(uint16_t* dst, const uint16_t* src, int64_t src_stride,
                                                     int valid, const float* token_scale, int tid) {
  for (int v = tid; v < kChunk * (D / 8); v += kBlockThreads) {
    const int t = v % kChunk, c = (v / kChunk) * 8;
    uint4 value = t < valid ? *reinterpret_cast<const uint4*>(src + t * src_stride + c) : make_uint4(0, 0, 0, 0);
    uint32_t* pairs = reinterpret_cast<uint32_t*>(&value);
    if (token_scale) {
      const float scale = token_scale[t];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = half2_to_float2(pairs[e]);
        pairs[e] = float2_to_half2_rn(f.x * scale, f.y * scale);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dst[(c + 2 * e) * kTokenRowHalves + t] = uint16_t(pairs[e] & 0xFFFFu);
      dst[(c + 2 * e + 1) * kTokenRowHalves + t] = uint16_t(pairs[e] >> 16);
    }
  }
}

// ─── Chunked prefill ──────────────────────────────────────────────────────────────────────────────────────
// ChunkParams, PrepareSmem and StateSmem: gdn_shape.h.

template <class Mma, int D>
__global__ void __launch_bounds__(kBlockThreads) chunk_prepare_kernel(const ChunkParams p) {
  using Smem = PrepareSmem<D>;
  constexpr int kRow = Smem::kRowHalves;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* panel0 = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* panel1 = panel0 + Smem::kPanelHalves;
  uint16_t* t_smem = panel0 + Smem::kTOffset;
  float* a_smem = reinterpret_cast<float*>(smem_raw + Smem::kABytesOffset);
  float* g_smem = reinterpret_cast<float*>(smem_raw + Smem::kVectorsBytesOffset);
  float* beta_smem = g_smem + kChunk;
  float* beta_decay_smem = beta_smem + kChunk;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hv = blockIdx.y, chunk_slot = blockIdx.x;
  const int seq = find_sequence(p.cu_seqlens, p.num_seqs, kChunk, chunk_slot);
  const int begin = p.cu_seqlens[seq], len = p.cu_seqlens[seq + 1] - begin;
  const int first = (chunk_slot - unit_base(p.cu_seqlens, seq, kChunk)) * kChunk;
  if (first >= len || is_padding(p.state_indices[seq], p.null_slot)) return;
  const int n = min(kChunk, len - first), token0 = begin + first, h = hv / p.heads_per_k_head;
  const int64_t ws = int64_t(chunk_slot) * p.num_v_heads + hv;

  // 1. G (inclusive scan of g over the chunk: a warp scan per half, then the second half adds the first's total),
  //    β, K and Q rows.
  if (tid < kChunk) {
    const bool valid = tid < n;
    float g = valid ? p.g[int64_t(token0 + tid) * p.num_v_heads + hv] : 0.f;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const float other = __shfl_up_sync(0xffffffffu, g, offset);
      if (lane >= offset) g += other;
    }
    g_smem[tid] = g;
    beta_smem[tid] = valid ? p.beta[int64_t(token0 + tid) * p.num_v_heads + hv] : 0.f;
  }
  load_rows<D, kRow>(panel0, p.k + token0 * p.k_token_stride + h * p.k_head_stride, p.k_token_stride, kChunk, n, tid);
  load_rows<D, kRow>(panel1, p.q + token0 * p.q_token_stride + h * p.q_head_stride, p.q_token_stride, kChunk, n, tid);
  __syncthreads();
  if (tid >= 32 && tid < kChunk) g_smem[tid] += g_smem[31];
  __syncthreads();
  if (tid < kChunk) {
    beta_decay_smem[tid] = beta_smem[tid] * __expf(g_smem[tid]);
    p.g_cumsum[ws * kChunk + tid] = g_smem[tid];
  }

  // 2. A = strictly-lower(β_t e^{G_t − G_j} K Kᵀ) → fp32 smem; warp w: rows 16w … 16w+15.
  {
    float acc[kChunk / 16][8];
    zero(acc);
    warp_mma<Mma, 16, kChunk / 16, D, kRow>(acc, panel0 + warp * 16 * kRow, panel0, lane);
    for_each_acc_pair<Mma, 16, kChunk / 16>(lane, [&](int s, int i, int row, int j) {
      const int t = warp * 16 + row;
      const float a0 = j < t ? beta_smem[t] * __expf(g_smem[t] - g_smem[j]) * acc[s][i] : 0.f;
      const float a1 = j + 1 < t ? beta_smem[t] * __expf(g_smem[t] - g_smem[j + 1]) * acc[s][i + 1] : 0.f;
      *reinterpret_cast<float2*>(a_smem + t * Smem::kARowFloats + j) = make_float2(a0, a1);
    });
  }
  __syncthreads();

  // 3. Warps 0-1: T = (I + A)⁻¹ by forward substitution, column c = tid per thread (x_t = δ_tc − Σ_{j<t} A_tj x_j;
  //    the x_j not yet computed are 0 and meet A_tj = 0, so rows are read four at a time).
  //    Warps 2-3: P (rows 32 · (warp − 2) …), straight to the workspace.
  if (warp < 2) {
    const int c = tid;
    float x[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) x[t] = 0.f;
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      float sum = t == c ? 1.f : 0.f;
      const float4* a_row = reinterpret_cast<const float4*>(a_smem + t * Smem::kARowFloats);
#pragma unroll
      for (int j4 = 0; j4 < (t + 3) / 4; ++j4) {
        const float4 a = a_row[j4];
        sum -= a.x * x[4 * j4] + a.y * x[4 * j4 + 1] + a.z * x[4 * j4 + 2] + a.w * x[4 * j4 + 3];
      }
      x[t] = sum;
    }
#pragma unroll
    for (int t = 0; t < kChunk; ++t) t_smem[t * kTokenRowHalves + c] = float_to_half(x[t]);
  } else {
    const int row0 = (warp - 2) * 32;
    float acc[kChunk / 16][16];
    zero(acc);
    warp_mma<Mma, 32, kChunk / 16, D, kRow>(acc, panel1 + row0 * kRow, panel0, lane);
    uint16_t* p_out = p.p + ws * kChunk * kChunk;
    for_each_acc_pair<Mma, 32, kChunk / 16>(lane, [&](int s, int i, int row, int j) {
      const int t = row0 + row;
      const float e0 = j <= t ? p.scale * __expf(g_smem[t] - g_smem[j]) * acc[s][i] : 0.f;
      const float e1 = j + 1 <= t ? p.scale * __expf(g_smem[t] - g_smem[j + 1]) * acc[s][i + 1] : 0.f;
      *reinterpret_cast<uint32_t*>(p_out + t * kChunk + j) = float2_to_half2_rn(e0, e1);
    });
  }
  __syncthreads();

  // 4. (β e^G K)ᵀ → panel 0, (β V)ᵀ → panel 1 (K and Q rows are no longer needed).
  load_rows_transposed<D>(panel0, p.k + token0 * p.k_token_stride + h * p.k_head_stride, p.k_token_stride, n,
                          beta_decay_smem, tid);
  load_rows_transposed<D>(panel1, p.v + token0 * p.v_token_stride + hv * p.v_head_stride, p.v_token_stride, n,
                          beta_smem, tid);
  __syncthreads();

  // 5. W = T (β e^G K), U' = T (β V); warp w: rows 16w …, 64 columns per pass.
#pragma unroll 1
  for (int product = 0; product < 2; ++product) {
    const uint16_t* b = product == 0 ? panel0 : panel1;
    uint16_t* dst = (product == 0 ? p.w : p.u) + ws * kChunk * D;
#pragma unroll 1
    for (int col0 = 0; col0 < D; col0 += 64) {
      float acc[4][8];
      zero(acc);
      warp_mma<Mma, 16, 4, kChunk, kTokenRowHalves>(acc, t_smem + warp * 16 * kTokenRowHalves,
                                                     b + col0 * kTokenRowHalves, lane);
      for_each_acc_pair<Mma, 16, 4>(lane, [&](int s, int i, int row, int col) {
        *reinterpret_cast<uint32_t*>(dst + (warp * 16 + row) * D + col0 + col) =
            float2_to_half2_rn(acc[s][i], acc[s][i + 1]);
      });
    }
  }
}

// One block per SM fits its shared memory on Volta anyway; the explicit 1 lets ptxas keep the state, the
// accumulators and the fragments in registers (at D = 64 it otherwise stops at 128 and spills).
template <class Mma, int D, class StateT>
__global__ void __launch_bounds__(kBlockThreads, 1) chunk_state_kernel(const ChunkParams p) {
  using Smem = StateSmem<D>;
  constexpr int kRow = Smem::kRowHalves;
  constexpr int kStateCols = D / kWarps;        // k columns of the state per warp
  constexpr int kStateStrips = kStateCols / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* wq = smem + Smem::kWqOffset;
  uint16_t* s0 = smem + Smem::kS0Offset;
  uint16_t* kt = smem + Smem::kKtOffset;
  uint16_t* p_smem = smem + Smem::kPOffset;
  uint16_t* ut = smem + Smem::kUtOffset;
  uint16_t* ut_decayed = smem + Smem::kUtDecayedOffset;
  float* g_smem = reinterpret_cast<float*>(smem_raw + Smem::kGBytesOffset);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int v0 = blockIdx.x * kVSlice, hv = blockIdx.y, seq = blockIdx.z;
  const int begin = p.cu_seqlens[seq], len = p.cu_seqlens[seq + 1] - begin;
  const int slot = p.state_indices[seq];
  uint16_t* out = p.out + hv * p.out_head_stride + v0;
  if (is_padding(slot, p.null_slot)) {
    for (int e = tid; e < len * kVSlice; e += kBlockThreads)
      out[(begin + e / kVSlice) * p.out_token_stride + e % kVSlice] = 0;
    return;
  }
  const int h = hv / p.heads_per_k_head;
  StateT* state = static_cast<StateT*>(p.state) + slot * p.state_slot_stride + hv * p.state_head_stride + v0 * D;

  // The state rows v0 … v0+31 live in registers as the accumulators of S += Uᵀ K: warp w holds k columns
  // w · kStateCols …; s0 is their fp16 copy that U and O read.
  float s_acc[kStateStrips][kVSlice / 2];
  zero(s_acc);
  const bool initial = p.has_initial_state == nullptr || p.has_initial_state[seq];
  const int state_col0 = warp * kStateCols;
  auto store_s0 = [&] {
    for_each_acc_pair<Mma, kVSlice, kStateStrips>(lane, [&](int s, int i, int row, int col) {
      *reinterpret_cast<uint32_t*>(s0 + row * kRow + state_col0 + col) =
          float2_to_half2_rn(s_acc[s][i], s_acc[s][i + 1]);
    });
  };
  if (initial) {
    for_each_acc_pair<Mma, kVSlice, kStateStrips>(lane, [&](int s, int i, int row, int col) {
      const float2 value = StatePair<StateT>::load(state + row * D + state_col0 + col);
      s_acc[s][i] = value.x;
      s_acc[s][i + 1] = value.y;
    });
  }
  store_s0();

  const int chunks = (len + kChunk - 1) / kChunk, base = unit_base(p.cu_seqlens, seq, kChunk);
#pragma unroll 1
  for (int c = 0; c < chunks; ++c) {
    const int first = c * kChunk, n = min(kChunk, len - first), token0 = begin + first;
    const int64_t ws = int64_t(base + c) * p.num_v_heads + hv;
    __syncthreads();  // the previous chunk's operands are consumed (first chunk: s0 is stored)
    load_rows<D, kRow>(wq, p.w + ws * kChunk * D, D, kChunk, kChunk, tid);
    load_rows<D, kRow>(wq + kChunk * kRow, p.q + token0 * p.q_token_stride + h * p.q_head_stride, p.q_token_stride,
                       kChunk, n, tid);
    load_rows<kChunk, kTokenRowHalves>(p_smem, p.p + ws * kChunk * kChunk, kChunk, kChunk, kChunk, tid);
    load_rows_transposed<D>(kt, p.k + token0 * p.k_token_stride + h * p.k_head_stride, p.k_token_stride, n, nullptr,
                            tid);
    if (tid < kChunk) g_smem[tid] = p.g_cumsum[ws * kChunk + tid];
    __syncthreads();
    const float g_last = g_smem[kChunk - 1];

    // Warps 0-1: U = U' − W S0ᵀ (rows 32 · warp …) → Uᵀ and its decayed copy. Warps 2-3: Q S0ᵀ.
    const int row0 = (warp & 1) * 32;
    float acc[2][16];
    zero(acc);
    warp_mma<Mma, 32, 2, D, kRow>(acc, wq + (warp < 2 ? row0 : kChunk + row0) * kRow, s0, lane);
    if (warp < 2) {
      const uint16_t* u_prime = p.u + ws * kChunk * D + v0;
      for_each_acc_pair<Mma, 32, 2>(lane, [&](int s, int i, int row, int vc) {
        const int t = row0 + row;
        const float2 up = half2_to_float2(*reinterpret_cast<const uint32_t*>(u_prime + t * D + vc));
        const float u0 = up.x - acc[s][i], u1 = up.y - acc[s][i + 1], decay = __expf(g_last - g_smem[t]);
        ut[vc * kTokenRowHalves + t] = float_to_half(u0);
        ut[(vc + 1) * kTokenRowHalves + t] = float_to_half(u1);
        ut_decayed[vc * kTokenRowHalves + t] = float_to_half(u0 * decay);
        ut_decayed[(vc + 1) * kTokenRowHalves + t] = float_to_half(u1 * decay);
      });
    }
    __syncthreads();

    // Warps 2-3: O = scale · e^{G_t} (Q S0ᵀ) + P U → out.
    if (warp >= 2) {
      for_each_acc_pair<Mma, 32, 2>(lane, [&](int s, int i, int row, int) {
        const float factor = p.scale * __expf(g_smem[row0 + row]);
        acc[s][i] *= factor;
        acc[s][i + 1] *= factor;
      });
      warp_mma<Mma, 32, 2, kChunk, kTokenRowHalves>(acc, p_smem + row0 * kTokenRowHalves, ut, lane);
      for_each_acc_pair<Mma, 32, 2>(lane, [&](int s, int i, int row, int vc) {
        const int t = row0 + row;
        if (t < n)
          *reinterpret_cast<uint32_t*>(out + (token0 + t) * p.out_token_stride + vc) =
              float2_to_half2_rn(acc[s][i], acc[s][i + 1]);
      });
    }

    // All warps: S = e^{G_63} S + (decayed U)ᵀ K.
    const float chunk_decay = __expf(g_last);
#pragma unroll
    for (int s = 0; s < kStateStrips; ++s)
#pragma unroll
      for (int i = 0; i < kVSlice / 2; ++i) s_acc[s][i] *= chunk_decay;
    warp_mma<Mma, kVSlice, kStateStrips, kChunk, kTokenRowHalves>(s_acc, ut_decayed,
                                                                  kt + warp * kStateCols * kTokenRowHalves, lane);
    store_s0();  // nobody reads s0 between the barrier above and the next chunk's
  }

  for_each_acc_pair<Mma, kVSlice, kStateStrips>(lane, [&](int s, int i, int row, int col) {
    StatePair<StateT>::store(state + row * D + state_col0 + col, s_acc[s][i], s_acc[s][i + 1]);
  });
}

// ─── Recurrent decode ─────────────────────────────────────────────────────────────────────────────────────
// Grid (D / kVSlice, HV, batch): a block updates kVSlice state rows of one (sequence, v-head); warp w takes rows
// w · 8 …, lane l holds k columns l · E … (E = D / 32), so one state row is one coalesced warp access and the
// two dot products per row are warp reductions. Memory-bound (the state is read and written once).

template <int D, class StateT>
__global__ void __launch_bounds__(kBlockThreads) recurrent_decode_kernel(const DecodeParams p) {
  constexpr int E = D / 32;
  constexpr int kRows = kVSlice / kWarps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hv = blockIdx.y, seq = blockIdx.z, v_first = blockIdx.x * kVSlice + warp * kRows;
  const int slot = p.state_indices[seq];
  uint16_t* out = p.out + seq * p.out_token_stride + hv * p.out_head_stride + v_first;
  if (is_padding(slot, p.null_slot)) {
    if (lane < kRows) out[lane] = 0;
    return;
  }
  const int h = hv / p.heads_per_k_head;
  float q[E], k[E];
  const uint16_t* q_src = p.q + seq * p.q_token_stride + h * p.q_head_stride + lane * E;
  const uint16_t* k_src = p.k + seq * p.k_token_stride + h * p.k_head_stride + lane * E;
#pragma unroll
  for (int e = 0; e < E; e += 2) {
    const float2 qe = half2_to_float2(*reinterpret_cast<const uint32_t*>(q_src + e));
    const float2 ke = half2_to_float2(*reinterpret_cast<const uint32_t*>(k_src + e));
    q[e] = qe.x, q[e + 1] = qe.y, k[e] = ke.x, k[e + 1] = ke.y;
  }
  float q_factor = p.scale, k_factor = 1.f;
  if (p.l2norm) {
    float qq = 0.f, kk = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) qq += q[e] * q[e], kk += k[e] * k[e];
    q_factor *= rsqrtf(warp_sum(qq) + 1e-6f);
    k_factor = rsqrtf(warp_sum(kk) + 1e-6f);
  }
#pragma unroll
  for (int e = 0; e < E; ++e) q[e] *= q_factor, k[e] *= k_factor;

  const int64_t gate = int64_t(seq) * p.num_v_heads + hv;
  const float x = half_to_float(p.a[gate]) + p.dt_bias[hv];
  const float softplus = x <= kSoftplusThreshold ? log1pf(__expf(x)) : x;
  const float decay = __expf(-__expf(p.A_log[hv]) * softplus);
  const float beta = 1.f / (1.f + __expf(-half_to_float(p.b[gate])));
  const uint16_t* v = p.v + seq * p.v_token_stride + hv * p.v_head_stride + v_first;

  StateT* state = static_cast<StateT*>(p.state) + slot * p.state_slot_stride + hv * p.state_head_stride +
                  int64_t(v_first) * D + lane * E;
  float s[kRows][E];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int e = 0; e < E; e += 2) {
      const float2 pair = StatePair<StateT>::load(state + r * D + e);
      s[r][e] = pair.x, s[r][e + 1] = pair.y;
    }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float sk = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) sk += (s[r][e] *= decay) * k[e];
    const float u = beta * (half_to_float(v[r]) - warp_sum(sk));
    float o = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) o += (s[r][e] += u * k[e]) * q[e];
    o = warp_sum(o);
#pragma unroll
    for (int e = 0; e < E; e += 2) StatePair<StateT>::store(state + r * D + e, s[r][e], s[r][e + 1]);
    if (lane == 0) out[r] = float_to_half(o);
  }
}

// ─── Causal conv1d ────────────────────────────────────────────────────────────────────────────────────────
// One thread per channel, a block per (128 channels, segment of kConvSegment tokens of one sequence), the last
// width − 1 inputs in registers. Prefill: segments as work units of find_sequence; a segment past the first reads
// its window from x. Only the first segment touches the conv state: it reads the initial window and writes the
// sequence's final one (the last width − 1 inputs, from x or, for a sequence shorter than that, shifted from the
// old state), so no segment can see a state another one already replaced. Decode (query_start_loc null): block
// row s is sequence s with its one token.

template <int Width>
__global__ void __launch_bounds__(kBlockThreads) causal_conv1d_kernel(const ConvParams p) {
  const int channel = blockIdx.x * kBlockThreads + threadIdx.x;
  const bool decode = p.query_start_loc == nullptr;
  const int seq = decode ? int(blockIdx.y) : find_sequence(p.query_start_loc, p.num_seqs, kConvSegment, blockIdx.y);
  const int begin = decode ? seq : p.query_start_loc[seq];
  const int len = decode ? 1 : p.query_start_loc[seq + 1] - begin;
  const int first = decode ? 0 : (int(blockIdx.y) - unit_base(p.query_start_loc, seq, kConvSegment)) * kConvSegment;
  if (channel >= p.dim || first >= len) return;
  const int last = min(len, first + kConvSegment);
  const uint16_t* x = p.x + int64_t(begin) * p.x_token_stride + channel;
  uint16_t* out = p.out + int64_t(begin) * p.out_token_stride + channel;
  const int slot = p.cache_indices[seq];
  if (is_padding(slot, p.null_slot)) {
    for (int t = first; t < last; ++t) out[t * p.out_token_stride] = 0;
    return;
  }

  float w[Width];
#pragma unroll
  for (int j = 0; j < Width; ++j) w[j] = half_to_float(p.weight[channel * Width + j]);
  const float bias = p.bias ? half_to_float(p.bias[channel]) : 0.f;
  float window[Width - 1];  // the inputs before the current token, oldest first
  if (first == 0) {
    uint16_t* state = p.state + slot * p.state_slot_stride + channel * p.state_dim_stride;
    const bool initial = p.has_initial_state == nullptr || p.has_initial_state[seq];
#pragma unroll
    for (int i = 0; i < Width - 1; ++i) window[i] = initial ? half_to_float(state[i * p.state_pos_stride]) : 0.f;
#pragma unroll
    for (int i = 0; i < Width - 1; ++i) {
      const int pos = len - (Width - 1) + i;  // the input the state's column i holds afterwards
      state[i * p.state_pos_stride] = pos >= 0 ? x[pos * p.x_token_stride] : float_to_half(window[pos + Width - 1]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < Width - 1; ++i) window[i] = half_to_float(x[(first - (Width - 1) + i) * p.x_token_stride]);
  }
  for (int t = first; t < last; ++t) {
    const float input = half_to_float(x[t * p.x_token_stride]);
    float acc = bias + w[Width - 1] * input;
#pragma unroll
    for (int j = 0; j < Width - 1; ++j) acc += w[j] * window[j];
    out[t * p.out_token_stride] = float_to_half(p.silu ? silu(acc) : acc);
#pragma unroll
    for (int j = 0; j < Width - 2; ++j) window[j] = window[j + 1];
    window[Width - 2] = input;
  }
}

// ─── Row norms ────────────────────────────────────────────────────────────────────────────────────────────
// A warp per row of D, E = D / 32 elements per lane, fp32 throughout, rounded once. Gated: vLLM's RMSNormGated
// (norm before gate, SiLU gate): x · rsqrt(mean(x²) + eps) · weight · silu(z). Not gated: the l2 norm of q / k,
// x · rsqrt(Σx² + eps).

template <int D, bool Gated>
__global__ void __launch_bounds__(kBlockThreads) row_norm_kernel(const RowNormParams p) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x & 31, row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  float x[E];
  const uint16_t* src = p.x + row * p.x_row_stride + lane * E;
  float sum = 0.f;
#pragma unroll
  for (int e = 0; e < E; e += 2) {
    const float2 pair = half2_to_float2(*reinterpret_cast<const uint32_t*>(src + e));
    x[e] = pair.x, x[e + 1] = pair.y;
    sum += pair.x * pair.x + pair.y * pair.y;
  }
  sum = warp_sum(sum);
  const float factor = rsqrtf((Gated ? sum / D : sum) + p.eps);
  uint16_t* dst = p.out + row * p.out_row_stride + lane * E;
#pragma unroll
  for (int e = 0; e < E; e += 2) {
    float y0 = x[e] * factor, y1 = x[e + 1] * factor;
    if (Gated) {
      const float2 z = half2_to_float2(*reinterpret_cast<const uint32_t*>(p.z + row * p.z_row_stride + lane * E + e));
      const float2 w = half2_to_float2(*reinterpret_cast<const uint32_t*>(p.weight + lane * E + e));
      y0 *= w.x * silu(z.x);
      y1 *= w.y * silu(z.y);
    }
    *reinterpret_cast<uint32_t*>(dst + e) = float2_to_half2_rn(y0, y1);
  }
}

}  // namespace gdn
}  // namespace volta_fp4
