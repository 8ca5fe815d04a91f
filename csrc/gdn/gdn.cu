// Torch bindings of the Gated DeltaNet kernels in gdn.cuh (layouts described there): argument checks, the
// chunked-prefill workspace, MMA-atom / head-dim / state-dtype / conv-width dispatch, registered in the
// `volta_fp4` library next to the GEMM and attention ops.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/host_utils.h"
#include "gdn/gdn.cuh"
#include "gdn/gdn_plan.h"

namespace volta_fp4 {
namespace gdn {
namespace {

const uint16_t* half_ptr(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>()); }
uint16_t* mutable_half_ptr(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::Half>()); }

void check_head_dim(int64_t d) {
  TORCH_CHECK(d == 64 || d == 128, "the GDN kernels support head dims 64 and 128 (head_k_dim == head_v_dim), got ", str(d));
}

// fp16 [tokens, heads, D] with a contiguous last dim and 16-byte aligned rows (views of a fused projection are fine).
void check_heads(const at::Tensor& t, const char* name, const at::Device& device, int64_t tokens, int64_t heads,
                 int64_t d) {
  TORCH_CHECK(t.device() == device && t.scalar_type() == at::kHalf && t.dim() == 3, name,
              " must be a 3-D float16 tensor on ", device, ", got ", t.scalar_type(), " ", str(t.sizes()), " on ",
              t.device());
  TORCH_CHECK(t.size(0) == tokens && (heads < 0 || t.size(1) == heads) && t.size(2) == d, name, " must be [", str(tokens),
              ", ", heads < 0 ? "heads" : std::to_string(heads), ", ", str(d), "], got ", str(t.sizes()));
  TORCH_CHECK(t.stride(2) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
              name, " needs a contiguous last dimension and 16-byte aligned rows; strides ", str(t.strides()));
}

void check_vector(const at::Tensor& t, const char* name, const at::Device& device, at::ScalarType type,
                  int64_t min_size) {
  TORCH_CHECK(t.device() == device && t.scalar_type() == type && t.dim() == 1 && t.is_contiguous() &&
                  t.size(0) >= min_size,
              name, " must be a contiguous ", type, " vector of at least ", str(min_size), " entries on ", device, ", got ",
              t.scalar_type(), " ", str(t.sizes()), " on ", t.device());
}

const bool* optional_flags(const c10::optional<at::Tensor>& flags, const at::Device& device, int64_t num_seqs) {
  if (!flags.has_value()) return nullptr;
  check_vector(*flags, "has_initial_state", device, at::kBool, num_seqs);
  return flags->data_ptr<bool>();
}

// [slots, HV, D, D] float32 or float16, each head's [D, D] contiguous (slot and head strides free).
void check_state(const at::Tensor& state, const at::Device& device, int64_t v_heads, int64_t d) {
  TORCH_CHECK(state.device() == device && (state.scalar_type() == at::kFloat || state.scalar_type() == at::kHalf) &&
                  state.dim() == 4 && state.size(1) == v_heads && state.size(2) == d && state.size(3) == d,
              "state must be a float32 or float16 [slots, ", str(v_heads), ", ", str(d), ", ", str(d), "] tensor on ", device,
              ", got ", state.scalar_type(), " ", str(state.sizes()));
  TORCH_CHECK(state.stride(3) == 1 && state.stride(2) == d && state.stride(1) % 2 == 0 && state.stride(0) % 2 == 0 &&
                  reinterpret_cast<uintptr_t>(state.data_ptr()) % 8 == 0,
              "state needs contiguous [D, D] heads and even strides; strides ", str(state.strides()));
}

struct HeadShape {
  int64_t k_heads, d, v_heads;
};

// q, k [rows, H, D] and v, out [rows, HV, D] fp16 on one CUDA device, HV a multiple of H (v-head hv reads k-head
// hv / (HV / H)).
HeadShape check_qkv_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out) {
  const at::Device device = q.device();
  TORCH_CHECK(device.is_cuda(), "q must be a CUDA tensor");
  const int64_t rows = q.size(0), k_heads = q.size(1), d = q.size(2), v_heads = v.size(1);
  check_head_dim(d);
  check_heads(q, "q", device, rows, k_heads, d);
  check_heads(k, "k", device, rows, k_heads, d);
  check_heads(v, "v", device, rows, -1, d);
  check_heads(out, "out", device, rows, v_heads, d);
  TORCH_CHECK(v_heads % k_heads == 0, "v heads (", str(v_heads), ") must be a multiple of k heads (", str(k_heads), ")");
  return {k_heads, d, v_heads};
}

// One value per (row, v-head): a contiguous [rows, HV] tensor of ``type`` on ``device``.
void check_per_head(const at::Tensor& t, const char* name, const at::Device& device, at::ScalarType type,
                    int64_t rows, int64_t v_heads) {
  TORCH_CHECK(t.device() == device && t.scalar_type() == type && t.is_contiguous() && t.dim() == 2 && t.size(0) == rows &&
                  t.size(1) == v_heads,
              name, " must be a contiguous ", type, " [", str(rows), ", ", str(v_heads), "] tensor on ", device, ", got ", t.scalar_type(),
              " ", str(t.sizes()));
}

// The q, k, v pointers and token/head strides of ChunkParams and DecodeParams (same field names in both).
template <class Params>
void set_qkv(Params& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  p.q = half_ptr(q);
  p.q_token_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.k = half_ptr(k);
  p.k_token_stride = k.stride(0);
  p.k_head_stride = k.stride(1);
  p.v = half_ptr(v);
  p.v_token_stride = v.stride(0);
  p.v_head_stride = v.stride(1);
}


template <int D, bool Gated>
void launch_row_norm(const RowNormParams& p) {
  row_norm_kernel<D, Gated><<<unsigned(row_norm_blocks(p.rows)), kBlockThreads, 0,
                              at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <bool Gated>
void row_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor* z, const at::Tensor* weight, double eps) {
  const at::Device device = x.device();
  auto check_rows = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == device && t.scalar_type() == at::kHalf && t.dim() == 2 && t.stride(1) == 1 &&
                    t.stride(0) % 2 == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 4 == 0 &&
                    t.sizes() == x.sizes(),
                name, " must be a float16 [rows, D] tensor like x ", str(x.sizes()), " with contiguous rows on ", device,
                ", got ", t.scalar_type(), " ", str(t.sizes()), " strides ", str(t.strides()));
  };
  check_rows(x, "x");
  check_rows(out, "out");
  check_head_dim(x.size(1));
  RowNormParams p{};
  if (Gated) {
    check_rows(*z, "z");
    check_vector(*weight, "weight", device, at::kHalf, x.size(1));
    p.z = half_ptr(*z);
    p.z_row_stride = z->stride(0);
    p.weight = half_ptr(*weight);
  }
  if (x.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  p.x = half_ptr(x);
  p.x_row_stride = x.stride(0);
  p.out = mutable_half_ptr(out);
  p.out_row_stride = out.stride(0);
  p.rows = int(x.size(0));
  p.eps = float(eps);
  if (x.size(1) == 64) return launch_row_norm<64, Gated>(p);
  return launch_row_norm<128, Gated>(p);
}

// out = x / sqrt(Σx² + eps) per row (vLLM's fla l2norm_fwd).
void l2norm(at::Tensor& out, const at::Tensor& x, double eps) { row_norm<false>(out, x, nullptr, nullptr, eps); }

// out = rmsnorm(x) · weight · silu(z) per row (vLLM's RMSNormGated, norm before gate).
void gated_rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight, double eps) {
  row_norm<true>(out, x, &z, &weight, eps);
}

void launch_conv(const ConvParams& p, int width, int64_t block_rows) {
  const dim3 grid(unsigned(channel_blocks(p.dim)), unsigned(block_rows));
  auto stream = at::cuda::getCurrentCUDAStream();
  switch (width) {
    case 2: causal_conv1d_kernel<2><<<grid, kBlockThreads, 0, stream>>>(p); break;
    case 3: causal_conv1d_kernel<3><<<grid, kBlockThreads, 0, stream>>>(p); break;
    case 4: causal_conv1d_kernel<4><<<grid, kBlockThreads, 0, stream>>>(p); break;
    default: TORCH_CHECK(false, "conv width must be 2, 3 or 4, got ", str(width));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Shared by prefill and decode: x [tokens, dim], out like x, weight [dim, width], conv_state [slots, dim, ≥ width-1].
ConvParams conv_params(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias, at::Tensor& conv_state, const at::Tensor& cache_indices,
                       int64_t num_seqs, bool silu, int64_t null_slot) {
  const at::Device device = x.device();
  TORCH_CHECK(x.device().is_cuda() && x.scalar_type() == at::kHalf && x.dim() == 2 && x.stride(1) == 1,
              "x must be a CUDA float16 [tokens, dim] tensor with a contiguous last dim, got ", x.scalar_type(), " ",
              str(x.sizes()), " strides ", str(x.strides()));
  TORCH_CHECK(out.device() == device && out.scalar_type() == at::kHalf && out.sizes() == x.sizes() &&
                  out.stride(1) == 1,
              "out must be a float16 tensor like x ", str(x.sizes()), " with a contiguous last dim");
  const int64_t dim = x.size(1);
  TORCH_CHECK(weight.device() == device && weight.scalar_type() == at::kHalf && weight.dim() == 2 &&
                  weight.size(0) == dim && weight.is_contiguous(),
              "weight must be a contiguous float16 [", str(dim), ", width] tensor, got ", weight.scalar_type(), " ",
              str(weight.sizes()));
  const int64_t width = weight.size(1);
  if (bias.has_value()) check_vector(*bias, "bias", device, at::kHalf, dim);
  TORCH_CHECK(conv_state.device() == device && conv_state.scalar_type() == at::kHalf && conv_state.dim() == 3 &&
                  conv_state.size(1) == dim && conv_state.size(2) >= width - 1,
              "conv_state must be a float16 [slots, ", str(dim), ", >= ", str(width - 1), "] tensor, got ",
              conv_state.scalar_type(), " ", str(conv_state.sizes()));
  check_vector(cache_indices, "cache_indices", device, at::kInt, num_seqs);
  ConvParams p{};
  p.x = half_ptr(x);
  p.x_token_stride = x.stride(0);
  p.out = mutable_half_ptr(out);
  p.out_token_stride = out.stride(0);
  p.weight = half_ptr(weight);
  p.bias = bias.has_value() ? half_ptr(*bias) : nullptr;
  p.state = mutable_half_ptr(conv_state);
  p.state_slot_stride = conv_state.stride(0);
  p.state_dim_stride = conv_state.stride(1);
  p.state_pos_stride = conv_state.stride(2);
  p.cache_indices = cache_indices.data_ptr<int>();
  p.num_seqs = int(num_seqs);
  p.dim = int(dim);
  p.null_slot = int(null_slot);
  p.silu = silu;
  return p;
}

// Varlen causal conv1d (vLLM's causal_conv1d_fn on x.T); the conv state of each sequence is read (where
// has_initial_state) and left holding its last width − 1 inputs.
void causal_conv1d_prefill(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, at::Tensor& conv_state,
                           const at::Tensor& query_start_loc, const at::Tensor& cache_indices,
                           const c10::optional<at::Tensor>& has_initial_state, bool silu, int64_t null_slot) {
  const int64_t num_seqs = query_start_loc.size(0) - 1;
  check_vector(query_start_loc, "query_start_loc", x.device(), at::kInt, 1);
  ConvParams p = conv_params(out, x, weight, bias, conv_state, cache_indices, num_seqs, silu, null_slot);
  p.query_start_loc = query_start_loc.data_ptr<int>();
  p.has_initial_state = optional_flags(has_initial_state, x.device(), num_seqs);
  if (num_seqs == 0 || x.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  launch_conv(p, int(weight.size(1)), conv_segments(x.size(0), num_seqs));
}

// One token per sequence (vLLM's causal_conv1d_update without speculative tokens): x [batch, dim].
void causal_conv1d_decode(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                          const c10::optional<at::Tensor>& bias, at::Tensor& conv_state,
                          const at::Tensor& cache_indices, bool silu, int64_t null_slot) {
  const ConvParams p = conv_params(out, x, weight, bias, conv_state, cache_indices, x.size(0), silu, null_slot);
  if (x.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  launch_conv(p, int(weight.size(1)), x.size(0));
}

template <class Mma, int D, class StateT>
void launch_chunked(const ChunkParams& p, int64_t slots) {
  auto stream = at::cuda::getCurrentCUDAStream();
  auto prepare = chunk_prepare_kernel<Mma, D>;
  auto state_pass = chunk_state_kernel<Mma, D, StateT>;
  static const bool configured = [&] {
    allow_dynamic_smem(prepare, PrepareSmem<D>::kBytes);
    allow_dynamic_smem(state_pass, StateSmem<D>::kBytes);
    return true;
  }();
  (void)configured;
  prepare<<<dim3(unsigned(slots), unsigned(p.num_v_heads)), kBlockThreads, PrepareSmem<D>::kBytes, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  state_pass<<<dim3(unsigned(D / kVSlice), unsigned(p.num_v_heads), unsigned(p.num_seqs)), kBlockThreads,
               StateSmem<D>::kBytes, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class Mma, class StateT>
void launch_chunked_for_dim(const ChunkParams& p, int64_t d, int64_t slots) {
  if (d == 64) return launch_chunked<Mma, 64, StateT>(p, slots);
  return launch_chunked<Mma, 128, StateT>(p, slots);
}

template <class Mma>
void launch_chunked_for_state(const ChunkParams& p, at::ScalarType state_type, int64_t d, int64_t slots) {
  if (state_type == at::kFloat) return launch_chunked_for_dim<Mma, float>(p, d, slots);
  return launch_chunked_for_dim<Mma, uint16_t>(p, d, slots);
}

// The gated delta rule over a varlen prefill batch (gdn.cuh, "Chunked prefill"): out [tokens, HV, D]; the final
// state of each sequence replaces state[state_indices[s]].
void chunked_prefill(at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& g, const at::Tensor& beta, at::Tensor& state, const at::Tensor& state_indices,
                     const c10::optional<at::Tensor>& has_initial_state, const at::Tensor& cu_seqlens, double scale,
                     bool use_qk_l2norm, int64_t null_slot, int64_t mma) {
  const at::Device device = q.device();
  const int64_t tokens = q.size(0);
  const auto [k_heads, d, v_heads] = check_qkv_out(q, k, v, out);
  check_per_head(g, "g", device, at::kFloat, tokens, v_heads);
  check_per_head(beta, "beta", device, at::kFloat, tokens, v_heads);
  check_state(state, device, v_heads, d);
  check_vector(cu_seqlens, "cu_seqlens", device, at::kInt, 1);
  const int64_t num_seqs = cu_seqlens.size(0) - 1;
  check_vector(state_indices, "state_indices", device, at::kInt, num_seqs);
  const bool* has_initial = optional_flags(has_initial_state, device, num_seqs);
  if (num_seqs == 0) return;
  const bool sm70 = use_sm70_atom(mma, device);
  const c10::cuda::CUDAGuard guard(device);

  at::Tensor q_used = q, k_used = k;
  if (use_qk_l2norm) {
    q_used = at::empty_like(q, at::MemoryFormat::Contiguous);
    k_used = at::empty_like(k, at::MemoryFormat::Contiguous);
    for (auto [src, dst] : {std::pair{&q, &q_used}, std::pair{&k, &k_used}}) {
      at::Tensor dst_rows = dst->view({tokens * k_heads, d});
      l2norm(dst_rows, src->reshape({tokens * k_heads, d}), 1e-6);
    }
  }
  const int64_t slots = chunk_slots(tokens, num_seqs);
  const auto half = q.options().dtype(at::kHalf);
  at::Tensor w = at::empty({slots, v_heads, kChunk, d}, half);
  at::Tensor u = at::empty({slots, v_heads, kChunk, d}, half);
  at::Tensor p_scores = at::empty({slots, v_heads, kChunk, kChunk}, half);
  at::Tensor g_cumsum = at::empty({slots, v_heads, kChunk}, q.options().dtype(at::kFloat));

  ChunkParams p{};
  set_qkv(p, q_used, k_used, v);
  p.g = g.data_ptr<float>();
  p.beta = beta.data_ptr<float>();
  p.cu_seqlens = cu_seqlens.data_ptr<int>();
  p.state_indices = state_indices.data_ptr<int>();
  p.has_initial_state = has_initial;
  p.state = state.data_ptr();
  p.state_slot_stride = state.stride(0);
  p.state_head_stride = state.stride(1);
  p.out = mutable_half_ptr(out);
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.w = mutable_half_ptr(w);
  p.u = mutable_half_ptr(u);
  p.p = mutable_half_ptr(p_scores);
  p.g_cumsum = g_cumsum.data_ptr<float>();
  p.num_seqs = int(num_seqs);
  p.num_v_heads = int(v_heads);
  p.heads_per_k_head = int(v_heads / k_heads);
  p.null_slot = int(null_slot);
  p.scale = float(scale);
  if (sm70) {
    launch_chunked_for_state<Sm70Mma>(p, state.scalar_type(), d, slots);
  } else {
    launch_chunked_for_state<Sm80Mma>(p, state.scalar_type(), d, slots);
  }
}

template <int D>
void launch_decode(const DecodeParams& p, at::ScalarType state_type, int64_t batch) {
  const dim3 grid(unsigned(D / kVSlice), unsigned(p.num_v_heads), unsigned(batch));
  auto stream = at::cuda::getCurrentCUDAStream();
  if (state_type == at::kFloat) {
    recurrent_decode_kernel<D, float><<<grid, kBlockThreads, 0, stream>>>(p);
  } else {
    recurrent_decode_kernel<D, uint16_t><<<grid, kBlockThreads, 0, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// One delta-rule step per sequence with the gating computed from a, b (vLLM's
// fused_sigmoid_gating_delta_rule_update, one token per sequence, state updated in place).
void recurrent_decode(at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log, const at::Tensor& dt_bias,
                      at::Tensor& state, const at::Tensor& state_indices, double scale, bool use_qk_l2norm,
                      int64_t null_slot) {
  const at::Device device = q.device();
  const int64_t batch = q.size(0);
  const auto [k_heads, d, v_heads] = check_qkv_out(q, k, v, out);
  check_per_head(a, "a", device, at::kHalf, batch, v_heads);
  check_per_head(b, "b", device, at::kHalf, batch, v_heads);
  check_vector(A_log, "A_log", device, at::kFloat, v_heads);
  check_vector(dt_bias, "dt_bias", device, at::kFloat, v_heads);
  check_state(state, device, v_heads, d);
  check_vector(state_indices, "state_indices", device, at::kInt, batch);
  if (batch == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  DecodeParams p{};
  set_qkv(p, q, k, v);
  p.a = half_ptr(a);
  p.b = half_ptr(b);
  p.A_log = A_log.data_ptr<float>();
  p.dt_bias = dt_bias.data_ptr<float>();
  p.state = state.data_ptr();
  p.state_slot_stride = state.stride(0);
  p.state_head_stride = state.stride(1);
  p.state_indices = state_indices.data_ptr<int>();
  p.out = mutable_half_ptr(out);
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.num_v_heads = int(v_heads);
  p.heads_per_k_head = int(v_heads / k_heads);
  p.null_slot = int(null_slot);
  p.scale = float(scale);
  p.l2norm = use_qk_l2norm;
  if (d == 64) return launch_decode<64>(p, state.scalar_type(), batch);
  return launch_decode<128>(p, state.scalar_type(), batch);
}

}  // namespace
}  // namespace gdn

TORCH_LIBRARY_FRAGMENT(volta_fp4, m) {
  m.def("gdn_l2norm(Tensor(a!) out, Tensor x, float eps) -> ()");
  m.def("gdn_gated_rms_norm(Tensor(a!) out, Tensor x, Tensor z, Tensor weight, float eps) -> ()");
  m.def("gdn_causal_conv1d_prefill(Tensor(a!) out, Tensor x, Tensor weight, Tensor? bias, Tensor(b!) conv_state, "
        "Tensor query_start_loc, Tensor cache_indices, Tensor? has_initial_state, bool silu, int null_slot) -> ()");
  m.def("gdn_causal_conv1d_decode(Tensor(a!) out, Tensor x, Tensor weight, Tensor? bias, Tensor(b!) conv_state, "
        "Tensor cache_indices, bool silu, int null_slot) -> ()");
  m.def("gdn_chunked_prefill(Tensor(a!) out, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
        "Tensor(b!) state, Tensor state_indices, Tensor? has_initial_state, Tensor cu_seqlens, float scale, "
        "bool use_qk_l2norm, int null_slot, int mma) -> ()");
  m.def("gdn_recurrent_decode(Tensor(a!) out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, "
        "Tensor dt_bias, Tensor(b!) state, Tensor state_indices, float scale, bool use_qk_l2norm, "
        "int null_slot) -> ()");
}

TORCH_LIBRARY_IMPL(volta_fp4, CUDA, m) {
  m.impl("gdn_l2norm", &gdn::l2norm);
  m.impl("gdn_gated_rms_norm", &gdn::gated_rms_norm);
  m.impl("gdn_causal_conv1d_prefill", &gdn::causal_conv1d_prefill);
  m.impl("gdn_causal_conv1d_decode", &gdn::causal_conv1d_decode);
  m.impl("gdn_chunked_prefill", &gdn::chunked_prefill);
  m.impl("gdn_recurrent_decode", &gdn::recurrent_decode);
}

}  // namespace volta_fp4
