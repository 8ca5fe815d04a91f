// Torch bindings of the weight-only GEMMs in weight_gemm.cuh: weight repacking (prepare_*), the GEMM ops
// with dispatch by M and by MMA atom, and the ops' registration in the `volta_fp4` library.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/host_utils.h"
#include "gemm/weight_gemm.cuh"
#include "gemm/weight_gemm_plan.h"

namespace volta_fp4 {
namespace {

std::string shape(const at::Tensor& t) { return str(t.sizes()); }

void check_weight_inputs(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must have ", str(dim), " dimensions, got ", str(t.dim()));
}

// Row scales → float32 [N] including the format's power-of-two factor; a scalar is broadcast.
at::Tensor make_row_scale(const at::Tensor& scale, int64_t n, float format_factor, const at::Tensor& like) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat, "scale must be float32, got ", scale.scalar_type());
  TORCH_CHECK(scale.numel() == 1 || scale.numel() == n, "scale must have 1 or N=", str(n), " elements, got ",
              str(scale.numel()));
  return (scale.to(like.device()).reshape({-1}).expand({n}) * format_factor).contiguous();
}

at::Tensor make_split_k_counters(int64_t n, const at::Tensor& like) {
  return at::zeros({round_up(n, kTileN) / kTileN * kMaxSplitMTiles}, like.options().dtype(at::kInt));
}

// packed [N, K/2] uint8, block_scale [N, K/16] e4m3, global_scale [N] or scalar float32 (decode scale)
// → (weight_tiles [Np/64, Kp/128, 4608] uint8, row_scale [N] float32, split_k_counters int32).
std::tuple<at::Tensor, at::Tensor, at::Tensor> prepare_nvfp4(const at::Tensor& packed, const at::Tensor& block_scale,
                                                              const at::Tensor& global_scale) {
  check_weight_inputs(packed, "packed", at::kByte, 2);
  check_weight_inputs(block_scale, "block_scale", at::kFloat8_e4m3fn, 2);
  const int64_t n = packed.size(0), k = packed.size(1) * 2;
  TORCH_CHECK(n % 16 == 0 && k % 16 == 0, "NVFP4 weight [", str(n), ", ", str(k), "]: N and K must be multiples of 16");
  TORCH_CHECK(block_scale.size(0) == n && block_scale.size(1) == k / 16, "block_scale must be [", str(n), ", ",
              str(k / 16), "], got ", shape(block_scale));
  const c10::cuda::CUDAGuard guard(packed.device());
  const int64_t np = round_up(n, kTileN), kp = round_up(k, kTileK);
  const at::Tensor codes_padded = at::constant_pad_nd(packed.contiguous(), {0, (kp - k) / 2, 0, np - n});
  // Element e of a row is byte e / 2's low (even e) or high nibble.
  const at::Tensor codes =
      at::stack({at::bitwise_and(codes_padded, 15), at::bitwise_right_shift(codes_padded, 4)}, 2).reshape({np, kp});
  // Row = ((nt·4 + rg)·2 + r)·8 + g, column = ((kt·2 + h)·4 + t)·16 + 4b + 2·pair + q (layout in weight_gemm.cuh):
  // record words in the order (h, g, t, b), slot i = 4·pair + 2r + q inside a word.
  const at::Tensor slots = codes.reshape({np / kTileN, 4, 2, 8, kp / kTileK, 2, 4, 4, 2, 2})
                               .permute({0, 4, 1, 5, 3, 6, 7, 8, 2, 9})
                               .reshape({np / kTileN, kp / kTileK, 4, 256, 8});
  // Byte j of a word: magnitude of slot 2j | sign of slot 4+j << 3 | magnitude of slot 2j+1 << 4 | sign of slot j << 7.
  const at::Tensor magnitude = at::bitwise_and(slots, 7), sign = at::bitwise_right_shift(slots, 3);
  const at::Tensor code_records =
      at::bitwise_or(at::bitwise_or(magnitude.slice(4, 0, 8, 2), at::bitwise_left_shift(sign.slice(4, 4, 8), 3)),
                     at::bitwise_or(at::bitwise_left_shift(magnitude.slice(4, 1, 8, 2), 4),
                                    at::bitwise_left_shift(sign.slice(4, 0, 4), 7)))
          .reshape({np / kTileN, kp / kTileK, 4, 1024});
  // Scales: row (nt, rg, r, g), block (kt, h, t) → record bytes (g, t, h, r).
  const at::Tensor scales_padded =
      at::constant_pad_nd(block_scale.contiguous().view(at::kByte), {0, (kp - k) / 16, 0, np - n});
  const at::Tensor scale_records = scales_padded.reshape({np / kTileN, 4, 2, 8, kp / kTileK, 2, 4})
                                       .permute({0, 4, 1, 3, 6, 5, 2})
                                       .reshape({np / kTileN, kp / kTileK, 4, 128});
  const at::Tensor tiles =
      at::cat({code_records, scale_records}, 3).reshape({np / kTileN, kp / kTileK, Nvfp4Format::kChunkBytes}).contiguous();
  return {tiles, make_row_scale(global_scale, n, Nvfp4Format::kRowScaleFactor, packed), make_split_k_counters(n, packed)};
}

// weight [N, K] e4m3, scale [N] or scalar float32 → (weight_tiles [Np/64, Kp/128, 8192] uint8, row_scale, counters).
std::tuple<at::Tensor, at::Tensor, at::Tensor> prepare_fp8(const at::Tensor& weight, const at::Tensor& scale) {
  check_weight_inputs(weight, "weight", at::kFloat8_e4m3fn, 2);
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % 16 == 0 && k % 16 == 0, "FP8 weight [", str(n), ", ", str(k), "]: N and K must be multiples of 16");
  const c10::cuda::CUDAGuard guard(weight.device());
  const int64_t np = round_up(n, kTileN), kp = round_up(k, kTileK);
  const at::Tensor padded = at::constant_pad_nd(weight.contiguous().view(at::kByte), {0, kp - k, 0, np - n});
  // Row (nt, rg, r, g), column (kt, h, t, 16 bytes) → record vectors (h, r, g, t).
  const at::Tensor tiles = padded.reshape({np / kTileN, 4, 2, 8, kp / kTileK, 2, 4, 16})
                               .permute({0, 4, 1, 5, 2, 3, 6, 7})
                               .reshape({np / kTileN, kp / kTileK, Fp8Format::kChunkBytes})
                               .contiguous();
  return {tiles, make_row_scale(scale, n, Fp8Format::kRowScaleFactor, weight), make_split_k_counters(n, weight)};
}

template <class Mma, class Format, int BM>
void launch_fused(GemmParams p, int64_t n_tiles, const at::Tensor& x) {
  const int smem_bytes = fused_smem_bytes(BM);
  auto kernel = weight_gemm_kernel<Mma, Format, BM>;
  static int blocks_per_sm = [&] {
    allow_dynamic_smem(kernel, smem_bytes);
    // Prefer shared memory over L1: blocks per SM are bounded by it, and the weights stream through once.
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem_bytes));
    return std::max(blocks, 1);
  }();
  const int64_t slots = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * blocks_per_sm;
  const Grid3 g = plan_fused(p, n_tiles, slots);
  at::Tensor partials;
  if (p.splits > 1) {
    partials = at::empty({p.splits, p.M, n_tiles * kTileN}, x.options().dtype(at::kFloat));
    p.partials = partials.data_ptr<float>();
  }
  const dim3 grid(g.x, g.y, g.z);
  kernel<<<grid, kThreads, smem_bytes, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class Mma, class Format>
void launch_fused_for_m(const GemmParams& p, int64_t n_tiles, const at::Tensor& x) {
  switch (fused_block_rows(p.M)) {
    case 16: return launch_fused<Mma, Format, 16>(p, n_tiles, x);
    case 32: return launch_fused<Mma, Format, 32>(p, n_tiles, x);
    default: return launch_fused<Mma, Format, 64>(p, n_tiles, x);
  }
}

template <class Mma, class Format, int M>
void launch_gemv(GemmParams p, int64_t n_tiles, const at::Tensor& x) {
  auto kernel = weight_gemv_kernel<Mma, Format, M>;
  static const int blocks_per_sm = [&] {
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0));
    return std::max(blocks, 1);
  }();
  const int64_t slots = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * blocks_per_sm;
  const int64_t blocks = plan_gemv(p, n_tiles, slots);
  at::Tensor partials;
  if (gemv_needs_partials(p)) {  // some strips are split between blocks
    partials = at::empty({blocks, 2, p.M, kTileN}, x.options().dtype(at::kFloat));
    p.partials = partials.data_ptr<float>();
  }
  kernel<<<unsigned(blocks), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class Mma, class Format>
void launch_gemv_for_m(const GemmParams& p, int64_t n_tiles, const at::Tensor& x) {
  switch (p.M) {
    case 1: return launch_gemv<Mma, Format, 1>(p, n_tiles, x);
    case 2: return launch_gemv<Mma, Format, 2>(p, n_tiles, x);
    case 3: return launch_gemv<Mma, Format, 3>(p, n_tiles, x);
    case 4: return launch_gemv<Mma, Format, 4>(p, n_tiles, x);
    case 5: return launch_gemv<Mma, Format, 5>(p, n_tiles, x);
    case 6: return launch_gemv<Mma, Format, 6>(p, n_tiles, x);
    case 7: return launch_gemv<Mma, Format, 7>(p, n_tiles, x);
    case 8: return launch_gemv<Mma, Format, 8>(p, n_tiles, x);
    default: TORCH_CHECK(false, "the GEMV path (path=3) takes M <= ", str(kGemvMaxM), " rows, got ", str(p.M));
  }
}

template <class Format>
void dequantize_then_cublas(const GemmParams& p, int64_t n_tiles, const at::Tensor& x, at::Tensor& y,
                            const c10::optional<at::Tensor>& bias) {
  if (bias) y.copy_(bias->unsqueeze(0).expand_as(y));
  const int64_t rows_per_chunk = dequant_rows_per_chunk(p.K);
  const at::Tensor w = at::empty({std::min<int64_t>(rows_per_chunk, n_tiles * kTileN), p.K}, x.options());
  for (int64_t row = 0; row < p.N; row += rows_per_chunk) {
    const int64_t rows = std::min<int64_t>(rows_per_chunk, p.N - row);
    const dim3 grid(unsigned((rows + kTileN - 1) / kTileN), unsigned(p.k_tiles));
    dequantize_tiles_kernel<Format><<<grid, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        p.weight_tiles, p.row_scale, reinterpret_cast<uint16_t*>(w.data_ptr<at::Half>()), int(row), p.N, p.K,
        p.k_tiles);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // cuBLAS writes straight into the column slice y[:, row:row+rows] (row-major with leading dimension N).
    at::Tensor y_slice = y.narrow(1, row, rows);
    const at::Tensor w_chunk_t = w.narrow(0, 0, rows).t();
    if (bias) {
      at::addmm_out(y_slice, y_slice, x, w_chunk_t);
    } else {
      at::mm_out(y_slice, x, w_chunk_t);
    }
  }
}

template <class Format>
at::Tensor weight_gemm(const at::Tensor& x_in, const at::Tensor& weight_tiles, const at::Tensor& row_scale,
                       const at::Tensor& split_k_counters, const c10::optional<at::Tensor>& bias, int64_t mma,
                       int64_t path) {
  TORCH_CHECK(x_in.is_cuda() && x_in.dim() == 2 && x_in.scalar_type() == at::kHalf, "x must be a 2-D CUDA float16 tensor, got ",
              x_in.scalar_type(), " ", shape(x_in), " on ", x_in.device());
  TORCH_CHECK(weight_tiles.scalar_type() == at::kByte && weight_tiles.dim() == 3 &&
                  weight_tiles.size(2) == Format::kChunkBytes && weight_tiles.is_contiguous(),
              "weight_tiles must be the contiguous uint8 [Np/64, Kp/128, ", str(Format::kChunkBytes),
              "] tensor from prepare_*; got ", shape(weight_tiles));
  TORCH_CHECK(row_scale.scalar_type() == at::kFloat && row_scale.dim() == 1 && row_scale.is_contiguous(),
              "row_scale must be a contiguous float32 [N] tensor");
  TORCH_CHECK(split_k_counters.scalar_type() == at::kInt && split_k_counters.is_contiguous(),
              "split_k_counters must be the int32 tensor from prepare_*");
  const int64_t m = x_in.size(0), k = x_in.size(1), n = row_scale.size(0);
  const int64_t n_tiles = weight_tiles.size(0), k_tiles = weight_tiles.size(1);
  TORCH_CHECK(round_up(n, kTileN) == n_tiles * kTileN && round_up(k, kTileK) == k_tiles * kTileK,
              "x has K=", str(k), " and row_scale N=", str(n), ", which do not match weight_tiles ", shape(weight_tiles));
  TORCH_CHECK(split_k_counters.numel() == n_tiles * kMaxSplitMTiles, "split_k_counters has the wrong size");
  for (const at::Tensor* t : {&weight_tiles, &row_scale, &split_k_counters})
    TORCH_CHECK(t->device() == x_in.device(), "all tensors must be on ", x_in.device());
  if (bias) {
    TORCH_CHECK(bias->device() == x_in.device() && bias->scalar_type() == at::kHalf && bias->dim() == 1 &&
                    bias->size(0) == n && bias->is_contiguous(),
                "bias must be a contiguous float16 [", str(n), "] tensor on ", x_in.device());
  }
  const c10::cuda::CUDAGuard guard(x_in.device());
  // 16-byte row loads need unit column stride, a row stride of whole 16-byte vectors and an aligned base.
  const bool loadable = x_in.stride(1) == 1 && x_in.stride(0) % 8 == 0 &&
                        reinterpret_cast<uintptr_t>(x_in.data_ptr()) % 16 == 0;
  const at::Tensor x = loadable ? x_in : x_in.contiguous().clone();
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0) return y;

  GemmParams p{};
  p.x = reinterpret_cast<const uint16_t*>(x.data_ptr<at::Half>());
  p.ldx = m > 1 ? x.stride(0) : k;
  p.weight_tiles = weight_tiles.data_ptr<uint8_t>();
  p.row_scale = row_scale.data_ptr<float>();
  p.bias = bias ? reinterpret_cast<const uint16_t*>(bias->data_ptr<at::Half>()) : nullptr;
  p.y = reinterpret_cast<uint16_t*>(y.data_ptr<at::Half>());
  p.counters = split_k_counters.data_ptr<int>();
  p.M = int(m);
  p.N = int(n);
  p.K = int(k);
  p.k_tiles = int(k_tiles);

  const Path chosen = choose_path(m, path);
  TORCH_CHECK(chosen != Path::kAuto,
              "path must be 0 (auto), 1 (fused), 2 (dequantize + cuBLAS) or 3 (GEMV, M <= 8), got ", str(path));
  if (chosen == Path::kGemv) {
    if (use_sm70_atom(mma, x.device())) {
      launch_gemv_for_m<Sm70Mma, Format>(p, n_tiles, x);
    } else {
      launch_gemv_for_m<Sm80Mma, Format>(p, n_tiles, x);
    }
  } else if (chosen == Path::kDequantCublas) {
    dequantize_then_cublas<Format>(p, n_tiles, x, y, bias);
  } else if (use_sm70_atom(mma, x.device())) {
    launch_fused_for_m<Sm70Mma, Format>(p, n_tiles, x);
  } else {
    launch_fused_for_m<Sm80Mma, Format>(p, n_tiles, x);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY(volta_fp4, m) {
  m.def("set_gemm_cutovers(int gemv_max_m, int cublas_min_m) -> ()", &set_gemm_cutovers);
  m.def("prepare_nvfp4(Tensor packed, Tensor block_scale, Tensor global_scale) -> (Tensor, Tensor, Tensor)");
  m.def("prepare_fp8(Tensor weight, Tensor scale) -> (Tensor, Tensor, Tensor)");
  // split_k_counters is scratch that every call leaves all-zero, as prepare_* made it.
  m.def("nvfp4_gemm(Tensor x, Tensor weight_tiles, Tensor row_scale, Tensor split_k_counters, Tensor? bias, "
        "int mma, int path) -> Tensor");
  m.def("fp8_gemm(Tensor x, Tensor weight_tiles, Tensor row_scale, Tensor split_k_counters, Tensor? bias, "
        "int mma, int path) -> Tensor");
}

TORCH_LIBRARY_IMPL(volta_fp4, CUDA, m) {
  m.impl("prepare_nvfp4", &prepare_nvfp4);
  m.impl("prepare_fp8", &prepare_fp8);
  m.impl("nvfp4_gemm", &weight_gemm<Nvfp4Format>);
  m.impl("fp8_gemm", &weight_gemm<Fp8Format>);
}

}  // namespace volta_fp4
