// The Gated-DeltaNet ops: argument checks and the host decisions of gdn/gdn_plan.h, against torch's stable C++
// ABI, launching the kernel image through the CUDA driver API on torch's current stream. Built by a plain C++
// compiler.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "driver/cuda_driver.h"
#include "driver/stable_torch.h"
#include "gdn/gdn_plan.h"

namespace volta_fp4 {
namespace {

using namespace driver::stable_torch;
using namespace gdn;

const uint16_t* half_ptr(const Tensor& t) { return static_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* mutable_half_ptr(const Tensor& t) { return static_cast<uint16_t*>(t.data_ptr()); }

bool on_device(const Tensor& t, int device) { return t.is_cuda() && t.get_device_index() == device; }
bool aligned(const Tensor& t, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0; }

void check_head_dim(int64_t d) {
  STD_TORCH_CHECK(supported_head_dim(d), "the GDN kernels support head dims 64 and 128 (head_k_dim == head_v_dim), got ",
                  str(d));
}

// fp16 [tokens, heads, D] with a contiguous last dim and 16-byte aligned rows (views of a fused projection are fine).
void check_heads(const Tensor& t, const char* name, int device, int64_t tokens, int64_t heads, int64_t d) {
  STD_TORCH_CHECK(on_device(t, device) && t.scalar_type() == ScalarType::Half && t.dim() == 3, name,
                  " must be a 3-D float16 tensor on cuda:", str(device), ", got ", shape(t));
  STD_TORCH_CHECK(t.size(0) == tokens && (heads < 0 || t.size(1) == heads) && t.size(2) == d, name, " must be [",
                  str(tokens), ", ", heads < 0 ? "heads" : str(heads), ", ", str(d), "], got ", shape(t));
  STD_TORCH_CHECK(t.stride(2) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && aligned(t, 16), name,
                  " needs a contiguous last dimension and 16-byte aligned rows");
}

void check_vector(const Tensor& t, const char* name, int device, ScalarType type, int64_t min_size) {
  STD_TORCH_CHECK(on_device(t, device) && t.scalar_type() == type && t.dim() == 1 && t.is_contiguous() &&
                      t.size(0) >= min_size,
                  name, " must be a contiguous vector of at least ", str(min_size), " entries of the op's dtype on cuda:",
                  str(device), ", got ", shape(t));
}

const bool* optional_flags(const std::optional<Tensor>& flags, int device, int64_t num_seqs) {
  if (!flags.has_value()) return nullptr;
  check_vector(*flags, "has_initial_state", device, ScalarType::Bool, num_seqs);
  return static_cast<const bool*>(flags->data_ptr());
}

// [slots, HV, D, D] float32 or float16, each head's [D, D] contiguous (slot and head strides free).
void check_state(const Tensor& state, int device, int64_t v_heads, int64_t d) {
  STD_TORCH_CHECK(on_device(state, device) &&
                      (state.scalar_type() == ScalarType::Float || state.scalar_type() == ScalarType::Half) &&
                      state.dim() == 4 && state.size(1) == v_heads && state.size(2) == d && state.size(3) == d,
                  "state must be a float32 or float16 [slots, ", str(v_heads), ", ", str(d), ", ", str(d),
                  "] tensor on cuda:", str(device), ", got ", shape(state));
  STD_TORCH_CHECK(state.stride(3) == 1 && state.stride(2) == d && state.stride(1) % 2 == 0 &&
                      state.stride(0) % 2 == 0 && aligned(state, 8),
                  "state needs contiguous [D, D] heads and even strides");
}

struct HeadShape {
  int64_t k_heads, d, v_heads;
};

// q, k [rows, H, D] and v, out [rows, HV, D] fp16 on one CUDA device, HV a multiple of H.
HeadShape check_qkv_out(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) {
  STD_TORCH_CHECK(q.is_cuda() && q.dim() == 3 && v.dim() == 3, "q and v must be 3-D CUDA tensors");
  const int device = q.get_device_index();
  const int64_t rows = q.size(0), k_heads = q.size(1), d = q.size(2), v_heads = v.size(1);
  check_head_dim(d);
  check_heads(q, "q", device, rows, k_heads, d);
  check_heads(k, "k", device, rows, k_heads, d);
  check_heads(v, "v", device, rows, -1, d);
  check_heads(out, "out", device, rows, v_heads, d);
  STD_TORCH_CHECK(v_heads % k_heads == 0, "v heads (", str(v_heads), ") must be a multiple of k heads (",
                  str(k_heads), ")");
  return {k_heads, d, v_heads};
}

// One value per (row, v-head): a contiguous [rows, HV] tensor of ``type``.
void check_per_head(const Tensor& t, const char* name, int device, ScalarType type, int64_t rows, int64_t v_heads) {
  STD_TORCH_CHECK(on_device(t, device) && t.scalar_type() == type && t.is_contiguous() && t.dim() == 2 &&
                      t.size(0) == rows && t.size(1) == v_heads,
                  name, " must be a contiguous [", str(rows), ", ", str(v_heads), "] tensor of the op's dtype, got ",
                  shape(t));
}

template <class Params>
void set_qkv(Params& p, const Tensor& q, const Tensor& k, const Tensor& v) {
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

template <class Params>
void launch(int device, const std::string& name, driver::Dim3 grid, int dynamic_smem, Params& p) {
  void* args[] = {&p};
  loaded_kernel(device, name, kBlockThreads, dynamic_smem)
      .kernel.launch(grid, kBlockThreads, unsigned(dynamic_smem), current_stream(device), args);
}

void row_norm(const Tensor& out, const Tensor& x, const Tensor* z, const Tensor* weight, double eps) {
  STD_TORCH_CHECK(x.is_cuda() && x.dim() == 2, "x must be a 2-D CUDA tensor, got ", shape(x));
  const int device = x.get_device_index();
  auto check_rows = [&](const Tensor& t, const char* name) {
    STD_TORCH_CHECK(on_device(t, device) && t.scalar_type() == ScalarType::Half && t.dim() == 2 &&
                        t.size(0) == x.size(0) && t.size(1) == x.size(1) && t.stride(1) == 1 && t.stride(0) % 2 == 0 &&
                        aligned(t, 4),
                    name, " must be a float16 [rows, D] tensor like x ", shape(x), " with contiguous rows, got ",
                    shape(t));
  };
  check_rows(x, "x");
  check_rows(out, "out");
  check_head_dim(x.size(1));
  RowNormParams p{};
  if (z) {
    check_rows(*z, "z");
    check_vector(*weight, "weight", device, ScalarType::Half, x.size(1));
    p.z = half_ptr(*z);
    p.z_row_stride = z->stride(0);
    p.weight = half_ptr(*weight);
  }
  if (x.size(0) == 0) return;
  const torch::stable::accelerator::DeviceGuard guard(device);
  p.x = half_ptr(x);
  p.x_row_stride = x.stride(0);
  p.out = mutable_half_ptr(out);
  p.out_row_stride = out.stride(0);
  p.rows = int(x.size(0));
  p.eps = float(eps);
  launch(device, row_norm_kernel_name(int(x.size(1)), z != nullptr), {unsigned(row_norm_blocks(p.rows))}, 0, p);
}

// out = x / sqrt(Σx² + eps) per row (vLLM's fla l2norm_fwd).
void l2norm(Tensor out, Tensor x, double eps) { row_norm(out, x, nullptr, nullptr, eps); }

// out = rmsnorm(x) · weight · silu(z) per row (vLLM's RMSNormGated, norm before gate).
void gated_rms_norm(Tensor out, Tensor x, Tensor z, Tensor weight, double eps) { row_norm(out, x, &z, &weight, eps); }

// Shared by prefill and decode: x [tokens, dim], out like x, weight [dim, width], conv_state [slots, dim, ≥ width-1].
ConvParams conv_params(const Tensor& out, const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                       const Tensor& conv_state, const Tensor& cache_indices, int64_t num_seqs, bool silu,
                       int64_t null_slot) {
  STD_TORCH_CHECK(x.is_cuda() && x.scalar_type() == ScalarType::Half && x.dim() == 2 && x.stride(1) == 1,
                  "x must be a CUDA float16 [tokens, dim] tensor with a contiguous last dim, got ", shape(x));
  const int device = x.get_device_index();
  STD_TORCH_CHECK(on_device(out, device) && out.scalar_type() == ScalarType::Half && out.dim() == 2 &&
                      out.size(0) == x.size(0) && out.size(1) == x.size(1) && out.stride(1) == 1,
                  "out must be a float16 tensor like x ", shape(x), " with a contiguous last dim");
  const int64_t dim = x.size(1);
  STD_TORCH_CHECK(on_device(weight, device) && weight.scalar_type() == ScalarType::Half && weight.dim() == 2 &&
                      weight.size(0) == dim && weight.is_contiguous(),
                  "weight must be a contiguous float16 [", str(dim), ", width] tensor, got ", shape(weight));
  const int64_t width = weight.size(1);
  STD_TORCH_CHECK(supported_conv_width(width), "conv width must be 2, 3 or 4, got ", str(width));
  if (bias.has_value()) check_vector(*bias, "bias", device, ScalarType::Half, dim);
  STD_TORCH_CHECK(on_device(conv_state, device) && conv_state.scalar_type() == ScalarType::Half &&
                      conv_state.dim() == 3 && conv_state.size(1) == dim && conv_state.size(2) >= width - 1,
                  "conv_state must be a float16 [slots, ", str(dim), ", >= ", str(width - 1), "] tensor, got ",
                  shape(conv_state));
  check_vector(cache_indices, "cache_indices", device, ScalarType::Int, num_seqs);
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
  p.cache_indices = static_cast<const int*>(cache_indices.data_ptr());
  p.num_seqs = int(num_seqs);
  p.dim = int(dim);
  p.null_slot = int(null_slot);
  p.silu = silu;
  return p;
}

void launch_conv(ConvParams& p, int device, int64_t width, int64_t block_rows) {
  const torch::stable::accelerator::DeviceGuard guard(device);
  launch(device, causal_conv1d_kernel_name(int(width)), {unsigned(channel_blocks(p.dim)), unsigned(block_rows)}, 0,
         p);
}

// Varlen causal conv1d (vLLM's causal_conv1d_fn on x.T); the conv state of each sequence is read (where
// has_initial_state) and left holding its last width − 1 inputs.
void causal_conv1d_prefill(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                           Tensor query_start_loc, Tensor cache_indices, std::optional<Tensor> has_initial_state,
                           bool silu, int64_t null_slot) {
  STD_TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  const int device = x.get_device_index();
  check_vector(query_start_loc, "query_start_loc", device, ScalarType::Int, 1);
  const int64_t num_seqs = query_start_loc.size(0) - 1;
  ConvParams p = conv_params(out, x, weight, bias, conv_state, cache_indices, num_seqs, silu, null_slot);
  p.query_start_loc = static_cast<const int*>(query_start_loc.data_ptr());
  p.has_initial_state = optional_flags(has_initial_state, device, num_seqs);
  if (num_seqs == 0 || x.size(0) == 0) return;
  launch_conv(p, device, weight.size(1), conv_segments(x.size(0), num_seqs));
}

// One token per sequence (vLLM's causal_conv1d_update without speculative tokens): x [batch, dim].
void causal_conv1d_decode(Tensor out, Tensor x, Tensor weight, std::optional<Tensor> bias, Tensor conv_state,
                          Tensor cache_indices, bool silu, int64_t null_slot) {
  ConvParams p = conv_params(out, x, weight, bias, conv_state, cache_indices, x.size(0), silu, null_slot);
  if (x.size(0) == 0) return;
  launch_conv(p, x.get_device_index(), weight.size(1), x.size(0));
}

// The gated delta rule over a varlen prefill batch (gdn.cuh, "Chunked prefill"): out [tokens, HV, D]; the final
// state of each sequence replaces state[state_indices[s]].
void chunked_prefill(Tensor out, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor state,
                     Tensor state_indices, std::optional<Tensor> has_initial_state, Tensor cu_seqlens, double scale,
                     bool use_qk_l2norm, int64_t null_slot, int64_t mma) {
  const auto [k_heads, d, v_heads] = check_qkv_out(q, k, v, out);
  const int device = q.get_device_index();
  const int64_t tokens = q.size(0);
  check_per_head(g, "g", device, ScalarType::Float, tokens, v_heads);
  check_per_head(beta, "beta", device, ScalarType::Float, tokens, v_heads);
  check_state(state, device, v_heads, d);
  check_vector(cu_seqlens, "cu_seqlens", device, ScalarType::Int, 1);
  const int64_t num_seqs = cu_seqlens.size(0) - 1;
  check_vector(state_indices, "state_indices", device, ScalarType::Int, num_seqs);
  const bool* has_initial = optional_flags(has_initial_state, device, num_seqs);
  if (num_seqs == 0) return;
  const bool sm70 = use_sm70_atom(mma, device);
  const torch::stable::accelerator::DeviceGuard guard(device);

  Tensor q_used = q, k_used = k;
  if (use_qk_l2norm) {
    q_used = torch::stable::new_empty(q, {tokens, k_heads, d});
    k_used = torch::stable::new_empty(k, {tokens, k_heads, d});
    for (auto [src, dst] : {std::pair{&q, &q_used}, std::pair{&k, &k_used}}) {
      l2norm(reshaped(*dst, {tokens * k_heads, d}), reshaped(*src, {tokens * k_heads, d}), 1e-6);
    }
  }
  const int64_t slots = chunk_slots(tokens, num_seqs);
  const Tensor w = torch::stable::new_empty(q, {slots, v_heads, kChunk, d});
  const Tensor u = torch::stable::new_empty(q, {slots, v_heads, kChunk, d});
  const Tensor p_scores = torch::stable::new_empty(q, {slots, v_heads, kChunk, kChunk});
  const Tensor g_cumsum = torch::stable::new_empty(q, {slots, v_heads, kChunk}, ScalarType::Float);

  ChunkParams p{};
  set_qkv(p, q_used, k_used, v);
  p.g = static_cast<const float*>(g.data_ptr());
  p.beta = static_cast<const float*>(beta.data_ptr());
  p.cu_seqlens = static_cast<const int*>(cu_seqlens.data_ptr());
  p.state_indices = static_cast<const int*>(state_indices.data_ptr());
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
  p.g_cumsum = static_cast<float*>(g_cumsum.data_ptr());
  p.num_seqs = int(num_seqs);
  p.num_v_heads = int(v_heads);
  p.heads_per_k_head = int(v_heads / k_heads);
  p.null_slot = int(null_slot);
  p.scale = float(scale);
  const int dim = int(d);
  const bool fp32_state = state.scalar_type() == ScalarType::Float;
  launch(device, chunk_prepare_kernel_name(sm70, dim), {unsigned(slots), unsigned(v_heads)},
         dim == 64 ? PrepareSmem<64>::kBytes : PrepareSmem<128>::kBytes, p);
  launch(device, chunk_state_kernel_name(sm70, dim, fp32_state),
         {unsigned(dim / kVSlice), unsigned(v_heads), unsigned(num_seqs)},
         dim == 64 ? StateSmem<64>::kBytes : StateSmem<128>::kBytes, p);
}

// One delta-rule step per sequence with the gating computed from a, b (vLLM's
// fused_sigmoid_gating_delta_rule_update, one token per sequence, state updated in place).
void recurrent_decode(Tensor out, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias,
                      Tensor state, Tensor state_indices, double scale, bool use_qk_l2norm, int64_t null_slot) {
  const auto [k_heads, d, v_heads] = check_qkv_out(q, k, v, out);
  const int device = q.get_device_index();
  const int64_t batch = q.size(0);
  check_per_head(a, "a", device, ScalarType::Half, batch, v_heads);
  check_per_head(b, "b", device, ScalarType::Half, batch, v_heads);
  check_vector(A_log, "A_log", device, ScalarType::Float, v_heads);
  check_vector(dt_bias, "dt_bias", device, ScalarType::Float, v_heads);
  check_state(state, device, v_heads, d);
  check_vector(state_indices, "state_indices", device, ScalarType::Int, batch);
  if (batch == 0) return;
  const torch::stable::accelerator::DeviceGuard guard(device);
  DecodeParams p{};
  set_qkv(p, q, k, v);
  p.a = half_ptr(a);
  p.b = half_ptr(b);
  p.A_log = static_cast<const float*>(A_log.data_ptr());
  p.dt_bias = static_cast<const float*>(dt_bias.data_ptr());
  p.state = state.data_ptr();
  p.state_slot_stride = state.stride(0);
  p.state_head_stride = state.stride(1);
  p.state_indices = static_cast<const int*>(state_indices.data_ptr());
  p.out = mutable_half_ptr(out);
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.num_v_heads = int(v_heads);
  p.heads_per_k_head = int(v_heads / k_heads);
  p.null_slot = int(null_slot);
  p.scale = float(scale);
  p.l2norm = use_qk_l2norm;
  launch(device, recurrent_decode_kernel_name(int(d), state.scalar_type() == ScalarType::Float),
         {unsigned(d / kVSlice), unsigned(v_heads), unsigned(batch)}, 0, p);
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(volta_fp4, m) {
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

STABLE_TORCH_LIBRARY_IMPL(volta_fp4, CUDA, m) {
  m.impl("gdn_l2norm", TORCH_BOX(&l2norm));
  m.impl("gdn_gated_rms_norm", TORCH_BOX(&gated_rms_norm));
  m.impl("gdn_causal_conv1d_prefill", TORCH_BOX(&causal_conv1d_prefill));
  m.impl("gdn_causal_conv1d_decode", TORCH_BOX(&causal_conv1d_decode));
  m.impl("gdn_chunked_prefill", TORCH_BOX(&chunked_prefill));
  m.impl("gdn_recurrent_decode", TORCH_BOX(&recurrent_decode));
}

}  // namespace volta_fp4
