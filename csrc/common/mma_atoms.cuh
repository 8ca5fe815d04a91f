// MMA atoms: how one warp multiplies fp16 tiles held in shared memory on the tensor cores, for Volta (m8n8k4)
// and Ampere+ (m16n8k16): the shared-memory tile products of the attention and Gated-DeltaNet kernels, and the GEMV
// hooks of the GEMMs (weight_gemm.cuh), which take their A fragments from registers. Kernel code only (no torch or
// host headers): NVRTC compiles it for the sm_70 check.
#pragma once

// fp16 values travel as raw bits (uint16_t, or uint32_t holding a pair: low half = lower column) and the
// arithmetic is inline PTX, so the kernels need neither cuda_fp16.h nor a C library: NVRTC compiles this file alone.
#include "common/int_types.cuh"
#include "common/smem_rows.h"

namespace volta_fp4 {


// ─── MMA atoms ────────────────────────────────────────────────────────────────────────────────────────────
// A warp's output is BM × 16 (rows × columns of its strip): out[r][c] += Σ_k A[r][k] · B[c][k]. Each atom says
// how one k-step reads its fragments from shared memory and where accumulator element `i` of this lane lives;
// elements come in pairs (i even, i+1) of adjacent columns. A (BM rows) and B (the strip's 16 rows) are both
// k-contiguous rows RowHalves halves apart (default kSmemRowHalves = 136; any multiple of 8 works, and
// RowHalves / 2 ≡ 4 mod 8 words keeps the reads bank-conflict free). load_a and load_b fill the two halves of the
// fragments separately, so a warp that sweeps several strips with one A reads A once.

// Volta HMMA: mma.sync.aligned.m8n8k4 runs four independent 8×8×4 products, one per quad-pair
// (lanes q·4…q·4+3 and q·4+16…q·4+19). Quad-pair q takes rows (q & 1)·8 and columns (q >> 1)·8, so one
// instruction is a 16×16×4 product. Within a quad-pair, lane row/column = lane % 4 + 4·(lane ≥ 16).
struct Sm70Mma {
  static constexpr bool kSm70Atom = true;
  static constexpr int kK = 4;
  template <int BM>
  struct Frags {
    uint2 a[BM / 16];
    uint2 b;
  };
  template <int BM, int RowHalves = kSmemRowHalves>
  __device__ __forceinline__ static void load_a(Frags<BM>& f, const uint16_t* sx, int k, int lane) {
    const int quad_pair = (lane >> 2) & 3, in_pair = (lane & 3) + ((lane >> 4) << 2);
#pragma unroll
    for (int mt = 0; mt < BM / 16; ++mt)
      f.a[mt] = *reinterpret_cast<const uint2*>(sx + (mt * 16 + (quad_pair & 1) * 8 + in_pair) * RowHalves + k);
  }
  template <int BM, int RowHalves = kSmemRowHalves>
  __device__ __forceinline__ static void load_b(Frags<BM>& f, const uint16_t* sw_strip, int k, int lane) {
    const int quad_pair = (lane >> 2) & 3, in_pair = (lane & 3) + ((lane >> 4) << 2);
    f.b = *reinterpret_cast<const uint2*>(sw_strip + ((quad_pair >> 1) * 8 + in_pair) * RowHalves + k);
  }
  template <int BM, int RowHalves = kSmemRowHalves>
  __device__ __forceinline__ static void load(Frags<BM>& f, const uint16_t* sx, const uint16_t* sw_strip, int k,
                                              int lane) {
    load_a<BM, RowHalves>(f, sx, k, lane);
    load_b<BM, RowHalves>(f, sw_strip, k, lane);
  }
  // B of the same 16 columns from a [k][column] tile (rows k, the strip's 16 columns contiguous from sw_col), in
  // m8n8k4's row-major B fragment: lane holds B[k + lane % 4][4 columns, the upper 4 of its quad-pair's 8 for lanes
  // ≥ 16]. Multiply it with mma<BM, true>.
  template <int BM, int RowHalves = kSmemRowHalves>
  __device__ __forceinline__ static void load_b_k_major(Frags<BM>& f, const uint16_t* sw_col, int k, int lane) {
    const int quad_pair = (lane >> 2) & 3;
    f.b = *reinterpret_cast<const uint2*>(sw_col + (k + (lane & 3)) * RowHalves + (quad_pair >> 1) * 8 +
                                          ((lane >> 4) << 2));
  }
  // kBKMajor: f.b came from load_b_k_major (row-major B fragment).
  template <int BM, bool kBKMajor = false>
  __device__ __forceinline__ static void mma(float (&acc)[BM / 2], const Frags<BM>& f) {
#pragma unroll
    for (int mt = 0; mt < BM / 16; ++mt) {
      float* c = acc + mt * 8;
#if defined(__CUDA_ARCH__)
// One m8n8k4 with B in the given layout (the only difference between the two forms).
#define VOLTA_FP4_HMMA_M8N8K4(B_LAYOUT)                                                                 \
  asm("mma.sync.aligned.m8n8k4.row." B_LAYOUT ".f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, "  \
      "{%10,%11}, {%0,%1,%2,%3,%4,%5,%6,%7};\n"                                                        \
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]), "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7]) \
      : "r"(f.a[mt].x), "r"(f.a[mt].y), "r"(f.b.x), "r"(f.b.y))
      if constexpr (kBKMajor) {
        VOLTA_FP4_HMMA_M8N8K4("row");
      } else {
        VOLTA_FP4_HMMA_M8N8K4("col");
      }
#undef VOLTA_FP4_HMMA_M8N8K4
#endif
    }
  }
  // f32 accumulator of m8n8k4 (PTX ISA): row = (lane & 1) + (i & 2) + 4·(lane ≥ 16),
  // column = (i & 4) + (lane & 2) + (i & 1), inside the quad-pair's 8×8 block.
  __device__ __forceinline__ static void acc_coord(int lane, int i, int& row, int& col) {
    const int quad_pair = (lane >> 2) & 3, e = i & 7;
    row = (i >> 3) * 16 + (quad_pair & 1) * 8 + (lane & 1) + (e & 2) + ((lane >> 4) << 2);
    col = (quad_pair >> 1) * 8 + (e & 4) + (lane & 2) + (e & 1);
  }
  // ─ GEMV hooks (weight_gemv_kernel and weight_gemm_kernel in weight_gemm.cuh, its "GEMV path" section).
  // Quad-pair q, row i of the pair, loads record lane slot v = 4i + q; per step two products (rows g, g+8 of the
  // row group: accumulators [r·8 + e]) with B = x[i][c … c+3].
  static constexpr int kGemvAcc = 16;
  static constexpr int kGemvChains = 1;     // the two products per step are independent already
  static constexpr int kGemvMaxStages = 2;  // 16 accumulators leave registers for 2 tiles in flight (900 GB/s: enough)
  __device__ __forceinline__ static int gemv_slot(int lane) {
    return 4 * ((lane & 3) + ((lane >> 4) << 2)) + ((lane >> 2) & 3);
  }
  __device__ __forceinline__ static void gemv_mma(float (&c)[16], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* d = c + 8 * r;
#if defined(__CUDA_ARCH__)
      asm(
          "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, {%10,%11}, "
          "{%0,%1,%2,%3,%4,%5,%6,%7};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
          : "r"(a[r]), "r"(a[r + 2]), "r"(b0), "r"(b1));
#endif
    }
  }
  // The four quad-pairs hold partial sums of the same outputs (different columns): add them, same order in all.
  __device__ __forceinline__ static void gemv_reduce(float (&c)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      c[i] += __shfl_xor_sync(0xFFFFFFFFu, c[i], 4);
      c[i] += __shfl_xor_sync(0xFFFFFFFFu, c[i], 8);
    }
  }
  __device__ __forceinline__ static bool gemv_writes(int lane) { return ((lane >> 2) & 3) == 0; }
  // Accumulator i of this lane: row of the row group and row m of x (m8n8k4 f32 layout as in acc_coord).
  __device__ __forceinline__ static void gemv_coord(int lane, int i, int& row, int& m) {
    const int e = i & 7;
    row = (i >> 3) * 8 + (lane & 1) + (e & 2) + ((lane >> 4) << 2);
    m = (e & 4) + (lane & 2) + (e & 1);
  }
};

// Ampere+ mma.sync.aligned.m16n8k16; two per k-step cover the warp's 16 columns. Fragments come from
// ldmatrix.x4 (four 8×8 matrices per instruction; lane l gives the address of row l % 8 of matrix l / 8); with
// kTranspose (.trans) each matrix is transposed on the way.
template <bool kTranspose = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row_address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row_address));
  if constexpr (kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // the host never selects the SM80 atom below compute capability 8.0
#endif
}

struct Sm80Mma {
  static constexpr bool kSm70Atom = false;
  static constexpr int kK = 16;
  template <int BM>
  struct Frags {
    uint32_t a[BM / 16][4];  // m16n8k16 A: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (8-15, 8-15)
    uint32_t b[4];           // B of columns 0-7: (k 0-7), (k 8-15); then columns 8-15 likewise
  };
  template <int BM, int RowHalves = kSmemRowHalves>
  __device__ __forceinline__ static void load_a(Frags<BM>& f, const uint16_t* sx, int k, int lane) {
    const int matrix = lane >> 3, row = lane & 7;
#pragma unroll
    for (int mt = 0; mt < BM / 16; ++mt)
      ldmatrix_x4(f.a[mt], sx + (mt * 16 + (matrix & 1) * 8 + row) * RowHalves + k + (matrix >> 1) * 8);
  }
  template <int BM, int RowHalves = kSmemRowHalves>
  __device__ __forceinline__ static void load_b(Frags<BM>& f, const uint16_t* sw_strip, int k, int lane) {
    const int matrix = lane >> 3, row = lane & 7;
    ldmatrix_x4(f.b, sw_strip + ((matrix >> 1) * 8 + row) * RowHalves + k + (matrix & 1) * 8);
  }
  template <int BM, int RowHalves = kSmemRowHalves>
  __device__ __forceinline__ static void load(Frags<BM>& f, const uint16_t* sx, const uint16_t* sw_strip, int k,
                                              int lane) {
    load_a<BM, RowHalves>(f, sx, k, lane);
    load_b<BM, RowHalves>(f, sw_strip, k, lane);
  }
  // B of the same 16 columns from a [k][column] tile (rows k, the 16 columns contiguous from sw_col), transposed by
  // ldmatrix: what load_b reads from a [column][k] tile, without storing the transpose.
  template <int BM, int RowHalves = kSmemRowHalves>
  __device__ __forceinline__ static void load_b_k_major(Frags<BM>& f, const uint16_t* sw_col, int k, int lane) {
    const int matrix = lane >> 3, row = lane & 7;
    ldmatrix_x4<true>(f.b, sw_col + (k + (matrix & 1) * 8 + row) * RowHalves + (matrix >> 1) * 8);
  }
  // kBKMajor: f.b came from load_b_k_major, already in the column-major B fragment (ldmatrix transposed it).
  template <int BM, bool kBKMajor = false>
  __device__ __forceinline__ static void mma(float (&acc)[BM / 2], const Frags<BM>& f) {
#pragma unroll
    for (int mt = 0; mt < BM / 16; ++mt) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float* c = acc + mt * 8 + nt * 4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(f.a[mt][0]), "r"(f.a[mt][1]), "r"(f.a[mt][2]), "r"(f.a[mt][3]), "r"(f.b[2 * nt]),
              "r"(f.b[2 * nt + 1]));
#elif defined(__CUDA_ARCH__)
        __trap();  // the host never selects this atom below compute capability 8.0
#endif
      }
    }
  }
  __device__ __forceinline__ static void acc_coord(int lane, int i, int& row, int& col) {
    const int e = i & 3;
    row = (i >> 3) * 16 + (lane >> 2) + (e >> 1) * 8;
    col = ((i >> 2) & 1) * 8 + (lane & 3) * 2 + (e & 1);
  }
  // ─ GEMV hooks: lane slot v = lane; A = rows g, g+8 (g = lane / 4), B column g = x row g; accumulators
  // (row g, m 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) with t = lane % 4.
  static constexpr int kGemvAcc = 4;
  static constexpr int kGemvChains = 2;  // accumulator sets (column halves h) so that MMAs need not wait on each other
  static constexpr int kGemvMaxStages = 4;
  __device__ __forceinline__ static int gemv_slot(int lane) { return lane; }
  __device__ __forceinline__ static void gemv_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
    __trap();  // the host never selects this atom below compute capability 8.0
#endif
  }
  __device__ __forceinline__ static void gemv_reduce(float (&)[4]) {}
  __device__ __forceinline__ static bool gemv_writes(int) { return true; }
  __device__ __forceinline__ static void gemv_coord(int lane, int i, int& row, int& m) {
    row = (lane >> 2) + (i >> 1) * 8;
    m = (lane & 3) * 2 + (i & 1);
  }
};

}  // namespace volta_fp4
