// The GEMM ops: argument checks and the host decisions of gemm/weight_gemm_plan.h, written against torch's stable
// C++ ABI (torch/csrc/stable, targeting torch 2.10,
// so one binary serves torch 2.10 and later) and launching the kernel image through the CUDA driver API
// (cuda_driver.h) on torch's current stream. Built by a plain C++ compiler.
#include <optional>
#include <tuple>
#include <vector>

#include "driver/cuda_driver.h"
#include "driver/stable_torch.h"
#include "gemm/weight_gemm_plan.h"

namespace volta_fp4 {
namespace {

using namespace driver::stable_torch;

// ─── prepare_* (the load-time re-layouts, torch ops through the dispatcher) ─────────────────────────────────
void check_weight_inputs(const Tensor& t, const char* name, ScalarType dtype, int64_t dim) {
  STD_TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  STD_TORCH_CHECK(t.scalar_type() == dtype, name, " has the wrong dtype");
  STD_TORCH_CHECK(t.dim() == dim, name, " must have ", str(dim), " dimensions, got ", str(t.dim()));
}

// Row scales → float32 [N] including the format's power-of-two factor; a scalar is broadcast.
Tensor make_row_scale(const Tensor& scale, int64_t n, float format_factor, const Tensor& like) {
  STD_TORCH_CHECK(scale.scalar_type() == ScalarType::Float, "scale must be float32");
  STD_TORCH_CHECK(scale.numel() == 1 || scale.numel() == n, "scale must have 1 or N=", str(n), " elements, got ",
                  str(scale.numel()));
  const Tensor on_device = torch::stable::to(scale, std::nullopt, std::nullopt, like.device());
  const Tensor row = expand(reshaped(on_device, {-1}), {n});
  return torch::stable::contiguous(binary("aten::mul", row, scalar_like(row, format_factor, ScalarType::Float)));
}

Tensor make_split_k_counters(int64_t n, const Tensor& like) {
  return torch::stable::new_zeros(like, {round_up(n, kTileN) / kTileN * kMaxSplitMTiles}, ScalarType::Int);
}

std::tuple<Tensor, Tensor, Tensor> prepare_nvfp4(Tensor packed, Tensor block_scale, Tensor global_scale) {
  check_weight_inputs(packed, "packed", ScalarType::Byte, 2);
  check_weight_inputs(block_scale, "block_scale", ScalarType::Float8_e4m3fn, 2);
  const int64_t n = packed.size(0), k = packed.size(1) * 2;
  STD_TORCH_CHECK(n % 16 == 0 && k % 16 == 0, "NVFP4 weight [", str(n), ", ", str(k),
                  "]: N and K must be multiples of 16");
  STD_TORCH_CHECK(block_scale.size(0) == n && block_scale.size(1) == k / 16, "block_scale must be [", str(n), ", ",
                  str(k / 16), "], got ", shape(block_scale));
  const torch::stable::accelerator::DeviceGuard guard(packed.get_device_index());
  const int64_t np = round_up(n, kTileN), kp = round_up(k, kTileK), nt = np / kTileN, kt = kp / kTileK;
  const Tensor codes_padded = padded(torch::stable::contiguous(packed), {0, (kp - k) / 2, 0, np - n});
  // Element e of a row is byte e / 2's low (even e) or high nibble.
  const Tensor codes = reshaped(aten("aten::stack", "", std::vector<Tensor>{binary("aten::bitwise_and", codes_padded, 15),
                                                                          binary("aten::bitwise_right_shift", codes_padded, 4)},
                                    int64_t(2)),
                               {np, kp});
  // Row = ((nt·4 + rg)·2 + r)·8 + g, column = ((kt·2 + h)·4 + t)·16 + 4b + 2·pair + q (layout in weight_gemm.cuh):
  // record words in the order (h, g, t, b), slot i = 4·pair + 2r + q inside a word.
  const Tensor slots = reshaped(permute(reshaped(codes, {nt, 4, 2, 8, kt, 2, 4, 4, 2, 2}), {0, 4, 1, 5, 3, 6, 7, 8, 2, 9}),
                               {nt, kt, 4, 256, 8});
  // Byte j of a word: magnitude of slot 2j | sign of slot 4+j << 3 | magnitude of slot 2j+1 << 4 | sign of slot j << 7.
  const Tensor magnitude = binary("aten::bitwise_and", slots, 7), sign = binary("aten::bitwise_right_shift", slots, 3);
  const Tensor low = binary("aten::bitwise_or", slice(magnitude, 4, 0, 8, 2),
                            binary("aten::bitwise_left_shift", slice(sign, 4, 4, 8), 3));
  const Tensor high = binary("aten::bitwise_or", binary("aten::bitwise_left_shift", slice(magnitude, 4, 1, 8, 2), 4),
                             binary("aten::bitwise_left_shift", slice(sign, 4, 0, 4), 7));
  const Tensor code_records = reshaped(binary("aten::bitwise_or", low, high), {nt, kt, 4, 1024});
  // Scales: row (nt, rg, r, g), block (kt, h, t) → record bytes (g, t, h, r).
  const Tensor scale_bytes = aten("aten::view", "dtype", torch::stable::contiguous(block_scale), ScalarType::Byte);
  const Tensor scales_padded = padded(scale_bytes, {0, (kp - k) / 16, 0, np - n});
  const Tensor scale_records =
      reshaped(permute(reshaped(scales_padded, {nt, 4, 2, 8, kt, 2, 4}), {0, 4, 1, 3, 6, 5, 2}), {nt, kt, 4, 128});
  const Tensor tiles = torch::stable::contiguous(reshaped(
      aten("aten::cat", "", std::vector<Tensor>{code_records, scale_records}, int64_t(3)), {nt, kt, Nvfp4Tiles::kChunkBytes}));
  return {tiles, make_row_scale(global_scale, n, Nvfp4Tiles::kRowScaleFactor, packed), make_split_k_counters(n, packed)};
}

std::tuple<Tensor, Tensor, Tensor> prepare_fp8(Tensor weight, Tensor scale) {
  check_weight_inputs(weight, "weight", ScalarType::Float8_e4m3fn, 2);
  const int64_t n = weight.size(0), k = weight.size(1);
  STD_TORCH_CHECK(n % 16 == 0 && k % 16 == 0, "FP8 weight [", str(n), ", ", str(k), "]: N and K must be multiples of 16");
  const torch::stable::accelerator::DeviceGuard guard(weight.get_device_index());
  const int64_t np = round_up(n, kTileN), kp = round_up(k, kTileK), nt = np / kTileN, kt = kp / kTileK;
  const Tensor bytes = aten("aten::view", "dtype", torch::stable::contiguous(weight), ScalarType::Byte);
  const Tensor bytes_padded = padded(bytes, {0, kp - k, 0, np - n});
  // Row (nt, rg, r, g), column (kt, h, t, 16 bytes) → record vectors (h, r, g, t).
  const Tensor tiles = torch::stable::contiguous(reshaped(
      permute(reshaped(bytes_padded, {nt, 4, 2, 8, kt, 2, 4, 16}), {0, 4, 1, 5, 2, 3, 6, 7}), {nt, kt, Fp8Tiles::kChunkBytes}));
  return {tiles, make_row_scale(scale, n, Fp8Tiles::kRowScaleFactor, weight), make_split_k_counters(n, weight)};
}

// ─── the GEMM ops ─────────────────────────────────────────────────────────────────────────────────────────────
void launch_fused(GemmParams p, int64_t n_tiles, bool sm70, bool nvfp4, const Tensor& x) {
  const int device = x.get_device_index(), bm = fused_block_rows(p.M), smem = fused_smem_bytes(bm);
  const int threads = fused_block_threads(sm70, bm);
  const LoadedKernel& k = loaded_kernel(device, fused_kernel_name(sm70, nvfp4, bm), threads, smem);
  const Grid3 g = plan_fused(p, n_tiles, int64_t(driver::multiprocessor_count(device)) * k.blocks_per_sm, sm70);
  Tensor partials;
  if (p.splits > 1) {
    partials = torch::stable::new_empty(x, {p.splits, p.M, n_tiles * kTileN}, ScalarType::Float);
    p.partials = static_cast<float*>(partials.data_ptr());
  }
  void* args[] = {&p};
  k.kernel.launch({g.x, g.y, g.z}, unsigned(threads), unsigned(smem), current_stream(device), args);
}

void launch_gemv(GemmParams p, int64_t n_tiles, bool sm70, bool nvfp4, const Tensor& x) {
  STD_TORCH_CHECK(p.M >= 1 && p.M <= kGemvMaxM, "the GEMV path (path=3) takes M <= ", str(kGemvMaxM), " rows, got ",
                  str(p.M));
  const int device = x.get_device_index();
  const LoadedKernel& k = loaded_kernel(device, gemv_kernel_name(sm70, nvfp4, p.M), kThreads, 0);
  const int64_t blocks = plan_gemv(p, n_tiles, int64_t(driver::multiprocessor_count(device)) * k.blocks_per_sm);
  Tensor partials;
  if (gemv_needs_partials(p)) {  // some strips are split between blocks
    partials = torch::stable::new_empty(x, {blocks, 2, p.M, kTileN}, ScalarType::Float);
    p.partials = static_cast<float*>(partials.data_ptr());
  }
  void* args[] = {&p};
  k.kernel.launch({unsigned(blocks)}, kThreads, 0, current_stream(device), args);
}

// Dequantize a chunk of weight rows into fp16 scratch, then cuBLAS through torch (aten::linear.out writes the
// column slice y[:, row:row+rows], bias included).
void dequantize_then_cublas(GemmParams p, bool nvfp4, const Tensor& x, Tensor& y, const std::optional<Tensor>& bias) {
  const int device = x.get_device_index();
  const LoadedKernel& k = loaded_kernel(device, dequantize_kernel_name(nvfp4), kThreads, 0);
  const int64_t rows_per_chunk = dequant_rows_per_chunk(p.N, p.K, gemm_settings().dequant_chunk_bytes);
  const Tensor w = torch::stable::new_empty(x, {rows_per_chunk, p.K});
  for (int64_t row = 0; row < p.N; row += rows_per_chunk) {
    const int64_t rows = std::min<int64_t>(rows_per_chunk, p.N - row);
    const uint8_t* tiles = p.weight_tiles;
    const float* row_scale = p.row_scale;
    uint16_t* out = static_cast<uint16_t*>(w.data_ptr());
    int first_row = int(row), n = p.N, kk = p.K, k_tiles = p.k_tiles;
    void* args[] = {&tiles, &row_scale, &out, &first_row, &n, &kk, &k_tiles};
    k.kernel.launch({unsigned((rows + kTileN - 1) / kTileN), unsigned(p.k_tiles)}, kThreads, 0, current_stream(device),
                    args);
    Tensor y_slice = torch::stable::narrow(y, 1, row, rows);
    Tensor bias_all = bias ? *bias : Tensor(), w_all = w;
    const std::optional<Tensor> bias_slice =
        bias ? std::optional<Tensor>(torch::stable::narrow(bias_all, 0, row, rows)) : std::nullopt;
    aten("aten::linear", "out", x, torch::stable::narrow(w_all, 0, 0, rows), bias_slice, y_slice);
  }
}

template <bool kNvfp4>
Tensor weight_gemm(Tensor x_in, Tensor weight_tiles, Tensor row_scale, Tensor split_k_counters,
                   std::optional<Tensor> bias, int64_t mma, int64_t path) {
  const int chunk_bytes = kNvfp4 ? Nvfp4Tiles::kChunkBytes : Fp8Tiles::kChunkBytes;
  STD_TORCH_CHECK(x_in.is_cuda() && x_in.dim() == 2 && x_in.scalar_type() == ScalarType::Half,
                  "x must be a 2-D CUDA float16 tensor, got ", shape(x_in));
  STD_TORCH_CHECK(weight_tiles.scalar_type() == ScalarType::Byte && weight_tiles.dim() == 3 &&
                      weight_tiles.size(2) == chunk_bytes && weight_tiles.is_contiguous(),
                  "weight_tiles must be the contiguous uint8 [Np/64, Kp/128, ", str(chunk_bytes),
                  "] tensor from prepare_*; got ", shape(weight_tiles));
  STD_TORCH_CHECK(row_scale.scalar_type() == ScalarType::Float && row_scale.dim() == 1 && row_scale.is_contiguous(),
                  "row_scale must be a contiguous float32 [N] tensor");
  STD_TORCH_CHECK(split_k_counters.scalar_type() == ScalarType::Int && split_k_counters.is_contiguous(),
                  "split_k_counters must be the int32 tensor from prepare_*");
  const int64_t m = x_in.size(0), k = x_in.size(1), n = row_scale.size(0);
  const int64_t n_tiles = weight_tiles.size(0), k_tiles = weight_tiles.size(1);
  STD_TORCH_CHECK(round_up(n, kTileN) == n_tiles * kTileN && round_up(k, kTileK) == k_tiles * kTileK, "x has K=",
                  str(k), " and row_scale N=", str(n), ", which do not match weight_tiles ", shape(weight_tiles));
  STD_TORCH_CHECK(split_k_counters.numel() == n_tiles * kMaxSplitMTiles, "split_k_counters has the wrong size");
  const int device = x_in.get_device_index();
  for (const Tensor* t : {&weight_tiles, &row_scale, &split_k_counters})
    STD_TORCH_CHECK(t->is_cuda() && t->get_device_index() == device, "all tensors must be on cuda:", str(device));
  if (bias) {
    STD_TORCH_CHECK(bias->is_cuda() && bias->get_device_index() == device && bias->scalar_type() == ScalarType::Half &&
                        bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous(),
                    "bias must be a contiguous float16 [", str(n), "] tensor on cuda:", str(device));
  }
  const torch::stable::accelerator::DeviceGuard guard(device);
  // 16-byte row loads need unit column stride, a row stride of whole 16-byte vectors and an aligned base.
  const bool loadable = x_in.stride(1) == 1 && x_in.stride(0) % 8 == 0 &&
                        reinterpret_cast<uintptr_t>(x_in.data_ptr()) % 16 == 0;
  const Tensor x = loadable ? x_in : torch::stable::clone(torch::stable::contiguous(x_in));
  Tensor y = torch::stable::new_empty(x, {m, n});
  if (m == 0) return y;

  GemmParams p{};
  p.x = static_cast<const uint16_t*>(x.data_ptr());
  p.ldx = m > 1 ? x.stride(0) : k;
  p.weight_tiles = static_cast<const uint8_t*>(weight_tiles.data_ptr());
  p.row_scale = static_cast<const float*>(row_scale.data_ptr());
  p.bias = bias ? static_cast<const uint16_t*>(bias->data_ptr()) : nullptr;
  p.y = static_cast<uint16_t*>(y.data_ptr());
  p.counters = static_cast<int*>(split_k_counters.data_ptr());
  p.M = int(m);
  p.N = int(n);
  p.K = int(k);
  p.k_tiles = int(k_tiles);

  const Path chosen = choose_path(m, path);
  STD_TORCH_CHECK(chosen != Path::kAuto,
                  "path must be 0 (auto), 1 (fused), 2 (dequantize + cuBLAS) or 3 (GEMV, M <= " + str(kGemvMaxM) +
                      "), got ",
                  str(path));
  if (chosen == Path::kDequantCublas) {
    dequantize_then_cublas(p, kNvfp4, x, y, bias);
  } else if (chosen == Path::kGemv) {
    launch_gemv(p, n_tiles, use_sm70_atom(mma, device), kNvfp4, x);
  } else {
    launch_fused(p, n_tiles, use_sm70_atom(mma, device), kNvfp4, x);
  }
  return y;
}

}  // namespace

STABLE_TORCH_LIBRARY(volta_fp4, m) {
  m.def("configure_gemm(int gemv_max_m, int cublas_min_m, int dequant_chunk_mib) -> ()");
  m.def("prepare_nvfp4(Tensor packed, Tensor block_scale, Tensor global_scale) -> (Tensor, Tensor, Tensor)");
  m.def("prepare_fp8(Tensor weight, Tensor scale) -> (Tensor, Tensor, Tensor)");
  // split_k_counters is scratch that every call leaves all-zero, as prepare_* made it.
  m.def("nvfp4_gemm(Tensor x, Tensor weight_tiles, Tensor row_scale, Tensor split_k_counters, Tensor? bias, "
        "int mma, int path) -> Tensor");
  m.def("fp8_gemm(Tensor x, Tensor weight_tiles, Tensor row_scale, Tensor split_k_counters, Tensor? bias, "
        "int mma, int path) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(volta_fp4, CompositeExplicitAutograd, m) {
  m.impl("configure_gemm", TORCH_BOX(&configure_gemm));
}

STABLE_TORCH_LIBRARY_IMPL(volta_fp4, CUDA, m) {
  m.impl("prepare_nvfp4", TORCH_BOX(&prepare_nvfp4));
  m.impl("prepare_fp8", TORCH_BOX(&prepare_fp8));
  m.impl("nvfp4_gemm", TORCH_BOX(&weight_gemm<true>));
  m.impl("fp8_gemm", TORCH_BOX(&weight_gemm<false>));
}

}  // namespace volta_fp4
