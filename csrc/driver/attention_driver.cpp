// The attention ops: argument checks and the host decisions of attention/attention_plan.h, against torch's stable
// C++ ABI, launching the kernel image through the CUDA driver API on torch's current stream. Built by a plain C++ compiler.
#include <cstdint>
#include <string>

#include "attention/attention_plan.h"
#include "driver/cuda_driver.h"
#include "driver/stable_torch.h"

namespace volta_fp4 {
namespace {

using namespace driver::stable_torch;
using namespace attention;

const uint16_t* half_ptr(const Tensor& t) { return static_cast<const uint16_t*>(t.data_ptr()); }

void check_half_heads(const Tensor& t, const char* name, int64_t head_size) {
  STD_TORCH_CHECK(t.is_cuda() && t.scalar_type() == ScalarType::Half && t.dim() == 3, name,
                  " must be a 3-D CUDA float16 tensor [tokens, heads, head_size], got ", shape(t));
  STD_TORCH_CHECK(t.size(2) == head_size && t.stride(2) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
                  name, " needs head_size ", str(head_size),
                  ", a contiguous last dimension and 16-byte aligned rows; got ", shape(t));
}

void check_kv_cache(const Tensor& kv_cache) {
  STD_TORCH_CHECK(kv_cache.is_cuda() && kv_cache.scalar_type() == ScalarType::Half && kv_cache.dim() == 5 &&
                      kv_cache.size(1) == 2,
                  "kv_cache must be a CUDA float16 [num_blocks, 2, block_size, num_kv_heads, head_size] tensor, got ",
                  shape(kv_cache));
  bool aligned = kv_cache.stride(4) == 1 && reinterpret_cast<uintptr_t>(kv_cache.data_ptr()) % 16 == 0;
  for (int64_t d = 0; d < 4; ++d) aligned = aligned && kv_cache.stride(d) % 8 == 0;
  STD_TORCH_CHECK(aligned, "kv_cache needs a contiguous last dimension and 16-byte aligned rows");
}

void check_int32_vector(const Tensor& t, const char* name, int device) {
  STD_TORCH_CHECK(t.is_cuda() && t.get_device_index() == device && t.scalar_type() == ScalarType::Int &&
                      t.is_contiguous(),
                  name, " must be a contiguous int32 tensor on cuda:", str(device));
}

// key, value [tokens, kv_heads, head_size] fp16 → kv_cache[block, 0|1, slot, head] at slot_mapping[token].
void write_kv_cache(Tensor key, Tensor value, Tensor kv_cache, Tensor slot_mapping) {
  check_kv_cache(kv_cache);
  const int64_t head_size = kv_cache.size(4), num_kv_heads = kv_cache.size(3);
  check_half_heads(key, "key", head_size);
  check_half_heads(value, "value", head_size);
  STD_TORCH_CHECK(key.size(1) == num_kv_heads && value.size(1) == num_kv_heads && value.size(0) == key.size(0),
                  "key and value must be [tokens, ", str(num_kv_heads), ", ", str(head_size), "], got ", shape(key),
                  " and ", shape(value));
  const int device = kv_cache.get_device_index();
  STD_TORCH_CHECK(slot_mapping.is_cuda() && slot_mapping.get_device_index() == device &&
                      slot_mapping.scalar_type() == ScalarType::Long && slot_mapping.dim() == 1 &&
                      slot_mapping.is_contiguous() && slot_mapping.size(0) >= key.size(0),
                  "slot_mapping must be a contiguous int64 vector with an entry per token");
  STD_TORCH_CHECK(key.get_device_index() == device && value.get_device_index() == device,
                  "key, value and kv_cache must be on one device");
  const int64_t num_tokens = key.size(0);
  if (num_tokens == 0) return;
  const torch::stable::accelerator::DeviceGuard guard(device);
  KvCacheWriteParams p{};
  p.key = half_ptr(key);
  p.value = half_ptr(value);
  p.key_token_stride = key.stride(0);
  p.key_head_stride = key.stride(1);
  p.value_token_stride = value.stride(0);
  p.value_head_stride = value.stride(1);
  p.slot_mapping = static_cast<const int64_t*>(slot_mapping.data_ptr());
  p.key_cache = static_cast<uint16_t*>(kv_cache.data_ptr());
  p.value_cache = p.key_cache + kv_cache.stride(1);
  p.cache_block_stride = kv_cache.stride(0);
  p.cache_slot_stride = kv_cache.stride(2);
  p.cache_head_stride = kv_cache.stride(3);
  p.num_kv_heads = int(num_kv_heads);
  p.head_size = int(head_size);
  p.block_size = int(kv_cache.size(2));
  void* args[] = {&p};
  loaded_kernel(device, write_kv_cache_kernel_name(), kKvWriteThreads, 0)
      .kernel.launch({unsigned(num_tokens)}, kKvWriteThreads, 0, current_stream(device), args);
}

// out[t, h] = softmax(scale · q[t, h] · Kᵀ + causal/window mask) · V over the paged cache (attention.cuh).
// num_splits: 0 = chosen by attention_plan.h's choose_splits. split_counters: all-zero int32 scratch that every call
// leaves all zero, one counter per (row tile, KV head) of a decode launch with several splits.
void paged_attention(Tensor out, Tensor query, Tensor kv_cache, Tensor block_table, Tensor query_start_loc,
                     Tensor seq_lens, Tensor split_counters, int64_t max_seq_len, double scale,
                     int64_t sliding_window, int64_t mma, int64_t num_splits) {
  check_kv_cache(kv_cache);
  const int64_t head_size = kv_cache.size(4), num_kv_heads = kv_cache.size(3);
  STD_TORCH_CHECK(supported_head_size(head_size), "head_size must be 64, 128 or 256, got ", str(head_size));
  check_half_heads(query, "query", head_size);
  check_half_heads(out, "out", head_size);
  const int64_t num_tokens = query.size(0), num_heads = query.size(1);
  STD_TORCH_CHECK(out.size(0) == num_tokens && out.size(1) == num_heads, "out must have the shape of query ",
                  shape(query), ", got ", shape(out));
  STD_TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads (", str(num_heads),
                  ") must be a multiple of num_kv_heads (", str(num_kv_heads), ")");
  const int device = kv_cache.get_device_index();
  STD_TORCH_CHECK(query.get_device_index() == device && out.get_device_index() == device,
                  "query, out and kv_cache must be on one device");
  check_int32_vector(query_start_loc, "query_start_loc", device);
  check_int32_vector(seq_lens, "seq_lens", device);
  check_int32_vector(split_counters, "split_counters", device);
  STD_TORCH_CHECK(block_table.is_cuda() && block_table.get_device_index() == device &&
                      block_table.scalar_type() == ScalarType::Int && block_table.dim() == 2 &&
                      block_table.stride(1) == 1,
                  "block_table must be an int32 [num_seqs, max_blocks] tensor with contiguous rows");
  const int64_t num_seqs = seq_lens.size(0);
  STD_TORCH_CHECK(query_start_loc.size(0) == num_seqs + 1 && block_table.size(0) >= num_seqs,
                  "query_start_loc needs num_seqs + 1 entries and block_table num_seqs rows");
  STD_TORCH_CHECK(sliding_window >= 0 && max_seq_len >= 0, "sliding_window and max_seq_len must be >= 0");
  if (num_tokens == 0 || num_seqs == 0) return;
  const torch::stable::accelerator::DeviceGuard guard(device);
  const bool sm70 = use_sm70_atom(mma, device);

  PagedAttentionParams p{};
  p.query = half_ptr(query);
  p.q_token_stride = query.stride(0);
  p.q_head_stride = query.stride(1);
  p.key_cache = half_ptr(kv_cache);
  p.value_cache = p.key_cache + kv_cache.stride(1);
  p.cache_block_stride = kv_cache.stride(0);
  p.cache_slot_stride = kv_cache.stride(2);
  p.cache_head_stride = kv_cache.stride(3);
  p.block_table = static_cast<const int*>(block_table.data_ptr());
  p.block_table_stride = block_table.stride(0);
  p.query_start_loc = static_cast<const int*>(query_start_loc.data_ptr());
  p.seq_lens = static_cast<const int*>(seq_lens.data_ptr());
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.num_seqs = int(num_seqs);
  p.num_tokens = int(num_tokens);
  p.num_heads = int(num_heads);
  const int64_t group = num_heads / num_kv_heads;
  p.group = make_fast_divisor(uint32_t(group));
  p.block_size = make_fast_divisor(uint32_t(kv_cache.size(2)));
  p.window = int(sliding_window);
  p.scale_log2 = float(scale * 1.4426950408889634);

  const int block_rows = choose_block_rows(num_tokens, group, num_seqs);
  const int64_t tiles = row_tiles(num_tokens, group, num_seqs, block_rows);
  const int d = int(head_size);
  const int smem = attention_launch_smem_bytes(d, block_rows, driver::shared_memory_per_multiprocessor(device),
                                               driver::reserved_shared_memory_per_block(device));
  const LoadedKernel& kernel = loaded_kernel(device, paged_attention_kernel_name(sm70, d, block_rows),
                                             kThreadsPerBlock, smem);
  p.splits = choose_splits(num_splits, busy_row_tiles(num_tokens, group, num_seqs, block_rows), num_kv_heads,
                           max_seq_len, int64_t(driver::multiprocessor_count(device)) * kernel.blocks_per_sm);
  Tensor partial_out, partial_lse;
  if (p.splits > 1) {
    STD_TORCH_CHECK(block_rows != kDecodeRows || tiles * num_kv_heads <= split_counters.numel(), "splitting ",
                    str(tiles * num_kv_heads), " row tiles x KV heads ", str(p.splits),
                    " ways needs as many split counters; split_counters has ", str(split_counters.numel()));
    p.split_counters = static_cast<int*>(split_counters.data_ptr());
    partial_out = torch::stable::new_empty(query, {p.splits, num_tokens, num_heads, head_size}, ScalarType::Float);
    partial_lse = torch::stable::new_empty(query, {p.splits, num_tokens, num_heads}, ScalarType::Float);
    p.partial_out = static_cast<float*>(partial_out.data_ptr());
    p.partial_lse = static_cast<float*>(partial_lse.data_ptr());
  }
  void* stream = current_stream(device);
  void* args[] = {&p};
  kernel.kernel.launch({unsigned(tiles), unsigned(num_kv_heads), unsigned(p.splits)}, kThreadsPerBlock,
                       unsigned(smem), stream, args);
  if (p.splits > 1 && block_rows == kPrefillRows) {  // decode blocks merge their splits themselves
    loaded_kernel(device, combine_splits_kernel_name(d), d / 2, 0)
        .kernel.launch({unsigned(num_tokens), unsigned(num_heads)}, unsigned(d / 2), 0, stream, args);
  }
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(volta_fp4, m) {
  m.def("write_kv_cache(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()");
  m.def("paged_attention(Tensor(a!) out, Tensor query, Tensor kv_cache, Tensor block_table, Tensor query_start_loc, "
        "Tensor seq_lens, Tensor(b!) split_counters, int max_seq_len, float scale, int sliding_window, int mma, "
        "int num_splits) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(volta_fp4, CUDA, m) {
  m.impl("write_kv_cache", TORCH_BOX(&write_kv_cache));
  m.impl("paged_attention", TORCH_BOX(&paged_attention));
}

}  // namespace volta_fp4
