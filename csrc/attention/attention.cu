// Torch bindings of the paged-attention kernels in attention.cuh (layouts described there): the KV-cache
// write, the attention launch with its split-KV choice and MMA-atom dispatch, registered in the `volta_fp4`
// library next to the GEMM ops.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "attention/attention.cuh"
#include "attention/attention_plan.h"
#include "common/host_utils.h"

namespace volta_fp4 {
namespace attention {
namespace {

void check_half_heads(const at::Tensor& t, const char* name, int64_t head_size) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kHalf && t.dim() == 3, name,
              " must be a 3-D CUDA float16 tensor [tokens, heads, head_size], got ", t.scalar_type(), " ",
              str(t.sizes()), " on ", t.device());
  TORCH_CHECK(t.size(2) == head_size && t.stride(2) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
              name, " needs head_size ", str(head_size), ", a contiguous last dimension and 16-byte aligned rows; got ",
              str(t.sizes()), " strides ", str(t.strides()));
}

void check_kv_cache(const at::Tensor& kv_cache) {
  TORCH_CHECK(kv_cache.is_cuda() && kv_cache.scalar_type() == at::kHalf && kv_cache.dim() == 5 &&
                  kv_cache.size(1) == 2,
              "kv_cache must be a CUDA float16 [num_blocks, 2, block_size, num_kv_heads, head_size] tensor, got ",
              kv_cache.scalar_type(), " ", str(kv_cache.sizes()));
  TORCH_CHECK(kv_cache.stride(4) == 1 && kv_cache.stride(3) % 8 == 0 && kv_cache.stride(2) % 8 == 0 &&
                  kv_cache.stride(1) % 8 == 0 && kv_cache.stride(0) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(kv_cache.data_ptr()) % 16 == 0,
              "kv_cache needs a contiguous last dimension and 16-byte aligned rows; strides ", str(kv_cache.strides()));
}

void check_int32_vector(const at::Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK(t.device() == device && t.scalar_type() == at::kInt && t.is_contiguous(), name,
              " must be a contiguous int32 tensor on ", device, ", got ", t.scalar_type(), " on ", t.device());
}

// key, value [tokens, kv_heads, head_size] fp16 → kv_cache[block, 0|1, slot, head] at slot_mapping[token].
void write_kv_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache,
                    const at::Tensor& slot_mapping) {
  check_kv_cache(kv_cache);
  const int64_t head_size = kv_cache.size(4), num_kv_heads = kv_cache.size(3);
  check_half_heads(key, "key", head_size);
  check_half_heads(value, "value", head_size);
  TORCH_CHECK(key.size(1) == num_kv_heads && value.size(1) == num_kv_heads && value.size(0) == key.size(0),
              "key and value must be [tokens, ", str(num_kv_heads), ", ", str(head_size), "], got ", str(key.sizes()), " and ",
              str(value.sizes()));
  TORCH_CHECK(slot_mapping.device() == kv_cache.device() && slot_mapping.scalar_type() == at::kLong &&
                  slot_mapping.dim() == 1 && slot_mapping.is_contiguous() && slot_mapping.size(0) >= key.size(0),
              "slot_mapping must be a contiguous int64 vector with an entry per token");
  TORCH_CHECK(key.device() == kv_cache.device() && value.device() == kv_cache.device(),
              "key, value and kv_cache must be on one device");
  const int64_t num_tokens = key.size(0);
  if (num_tokens == 0) return;
  const c10::cuda::CUDAGuard guard(kv_cache.device());
  KvCacheWriteParams p{};
  p.key = reinterpret_cast<const uint16_t*>(key.data_ptr<at::Half>());
  p.value = reinterpret_cast<const uint16_t*>(value.data_ptr<at::Half>());
  p.key_token_stride = key.stride(0);
  p.key_head_stride = key.stride(1);
  p.value_token_stride = value.stride(0);
  p.value_head_stride = value.stride(1);
  p.slot_mapping = slot_mapping.data_ptr<int64_t>();
  p.key_cache = reinterpret_cast<uint16_t*>(kv_cache.data_ptr<at::Half>());
  p.value_cache = p.key_cache + kv_cache.stride(1);
  p.cache_block_stride = kv_cache.stride(0);
  p.cache_slot_stride = kv_cache.stride(2);
  p.cache_head_stride = kv_cache.stride(3);
  p.num_kv_heads = int(num_kv_heads);
  p.head_size = int(head_size);
  p.block_size = int(kv_cache.size(2));
  write_kv_cache_kernel<<<unsigned(num_tokens), kKvWriteThreads, 0, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class Mma, int HeadDim>
void launch_attention(const PagedAttentionParams& p, int64_t tiles, int64_t num_kv_heads) {
  constexpr int smem_bytes = SmemPlan<HeadDim>::kBytes;
  auto kernel = paged_attention_kernel<Mma, HeadDim>;
  static const bool configured = [&] {
    allow_dynamic_smem(kernel, smem_bytes);
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned(tiles), unsigned(num_kv_heads), unsigned(p.splits));
  kernel<<<grid, kThreadsPerBlock, smem_bytes, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (p.splits > 1) {
    combine_splits_kernel<HeadDim><<<dim3(unsigned(p.num_tokens), unsigned(p.num_heads)), HeadDim / 2, 0,
                                     at::cuda::getCurrentCUDAStream()>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <class Mma>
void launch_for_head_dim(const PagedAttentionParams& p, int64_t head_size, int64_t tiles, int64_t kv_heads) {
  switch (head_size) {
    case 64: return launch_attention<Mma, 64>(p, tiles, kv_heads);
    case 128: return launch_attention<Mma, 128>(p, tiles, kv_heads);
    case 256: return launch_attention<Mma, 256>(p, tiles, kv_heads);
    default: TORCH_CHECK(false, "head_size must be 64, 128 or 256, got ", str(head_size));
  }
}

// out[t, h] = softmax(scale · q[t, h] · Kᵀ + causal/window mask) · V over the paged cache (attention.cuh).
// num_splits: 0 = chosen by attention_plan.h (split the KV length when the row tiles alone leave SMs idle).
void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                     const at::Tensor& block_table, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                     int64_t max_seq_len, double scale, int64_t sliding_window, int64_t mma, int64_t num_splits) {
  check_kv_cache(kv_cache);
  const int64_t head_size = kv_cache.size(4), num_kv_heads = kv_cache.size(3);
  check_half_heads(query, "query", head_size);
  check_half_heads(out, "out", head_size);
  const int64_t num_tokens = query.size(0), num_heads = query.size(1);
  TORCH_CHECK(out.size(0) == num_tokens && out.size(1) == num_heads, "out must have the shape of query ",
              str(query.sizes()), ", got ", str(out.sizes()));
  TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads (", str(num_heads), ") must be a multiple of num_kv_heads (",
              str(num_kv_heads), ")");
  const at::Device device = kv_cache.device();
  TORCH_CHECK(query.device() == device && out.device() == device, "query, out and kv_cache must be on one device");
  check_int32_vector(query_start_loc, "query_start_loc", device);
  check_int32_vector(seq_lens, "seq_lens", device);
  TORCH_CHECK(block_table.device() == device && block_table.scalar_type() == at::kInt && block_table.dim() == 2 &&
                  block_table.stride(1) == 1,
              "block_table must be an int32 [num_seqs, max_blocks] tensor with contiguous rows");
  const int64_t num_seqs = seq_lens.size(0);
  TORCH_CHECK(query_start_loc.size(0) == num_seqs + 1 && block_table.size(0) >= num_seqs,
              "query_start_loc needs num_seqs + 1 entries and block_table num_seqs rows");
  TORCH_CHECK(sliding_window >= 0 && max_seq_len >= 0, "sliding_window and max_seq_len must be >= 0");
  if (num_tokens == 0 || num_seqs == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  const bool sm70 = use_sm70_atom(mma, device);

  PagedAttentionParams p{};
  p.query = reinterpret_cast<const uint16_t*>(query.data_ptr<at::Half>());
  p.q_token_stride = query.stride(0);
  p.q_head_stride = query.stride(1);
  p.key_cache = reinterpret_cast<const uint16_t*>(kv_cache.data_ptr<at::Half>());
  p.value_cache = p.key_cache + kv_cache.stride(1);
  p.cache_block_stride = kv_cache.stride(0);
  p.cache_slot_stride = kv_cache.stride(2);
  p.cache_head_stride = kv_cache.stride(3);
  p.block_table = block_table.data_ptr<int>();
  p.block_table_stride = block_table.stride(0);
  p.query_start_loc = query_start_loc.data_ptr<int>();
  p.seq_lens = seq_lens.data_ptr<int>();
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr<at::Half>());
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.num_seqs = int(num_seqs);
  p.num_tokens = int(num_tokens);
  p.num_heads = int(num_heads);
  p.group = int(num_heads / num_kv_heads);
  p.block_size = int(kv_cache.size(2));
  p.window = int(sliding_window);
  p.scale_log2 = float(scale * 1.4426950408889634);

  const int64_t tiles = row_tiles(num_tokens, p.group, num_seqs);
  p.splits = choose_splits(num_splits, tiles, num_kv_heads, max_seq_len,
                           at::cuda::getDeviceProperties(device.index())->multiProcessorCount);
  at::Tensor partial_out, partial_lse;
  if (p.splits > 1) {
    partial_out = at::empty({p.splits, num_tokens, num_heads, head_size}, query.options().dtype(at::kFloat));
    partial_lse = at::empty({p.splits, num_tokens, num_heads}, query.options().dtype(at::kFloat));
    p.partial_out = partial_out.data_ptr<float>();
    p.partial_lse = partial_lse.data_ptr<float>();
  }
  if (sm70) {
    launch_for_head_dim<Sm70Mma>(p, head_size, tiles, num_kv_heads);
  } else {
    launch_for_head_dim<Sm80Mma>(p, head_size, tiles, num_kv_heads);
  }
}

}  // namespace
}  // namespace attention

TORCH_LIBRARY_FRAGMENT(volta_fp4, m) {
  m.def("write_kv_cache(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()");
  m.def("paged_attention(Tensor(a!) out, Tensor query, Tensor kv_cache, Tensor block_table, Tensor query_start_loc, "
        "Tensor seq_lens, int max_seq_len, float scale, int sliding_window, int mma, int num_splits) -> ()");
}

TORCH_LIBRARY_IMPL(volta_fp4, CUDA, m) {
  m.impl("write_kv_cache", &attention::write_kv_cache);
  m.impl("paged_attention", &attention::paged_attention);
}

}  // namespace volta_fp4
