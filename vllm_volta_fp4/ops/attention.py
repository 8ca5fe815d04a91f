"""Paged attention over vLLM's KV cache: the CUDA ops (csrc/attention/attention.cuh, driver/attention_driver.cpp)
and a pure-torch reference that is both the CPU fallback and the test oracle.

Layouts (the backend's choice, see csrc/attention/attention.cuh for the kernels' view):
  * ``kv_cache``: [num_blocks, 2, block_size, num_kv_heads, head_size] fp16; ``[:, 0]`` keys, ``[:, 1]`` values.
    Token j of sequence s sits in block ``block_table[s, j // block_size]``, slot ``j % block_size``.
  * ``query``/``out``: [num_tokens, num_heads, head_size]. The tokens of sequence s are rows
    ``query_start_loc[s] : query_start_loc[s+1]`` and are the *last* ``q_len`` of its ``seq_lens[s]`` tokens,
    so chunked prefill and prefix-cache hits (query attends to cached + new keys) need nothing special.
  * ``sliding_window``: W > 0 lets the query at position p see keys p - W + 1 … p; 0 = unlimited.
``mma`` picks the MMA atom as in vllm_volta_fp4.ops.linear (0 = by compute capability, 70, 80;
VLLM_VOLTA_FP4_MMA sets the default).
"""

from __future__ import annotations

import torch

from vllm_volta_fp4.ops import extension

HEAD_SIZES = (64, 128, 256)
_OPS = extension.OpFamily("paged_attention")
# Arrival counters per device for the split-KV merge (split_counters): one per (row tile, KV head) of a decode launch
# with several splits. An automatic split count keeps those within the GPU's resident block slots, at most 32 per
# SM, so this many serve GPUs of up to 2048 SMs; a forced count beyond them is refused by the op.
SPLIT_COUNTERS = 1 << 16
_split_counters: dict[torch.device, torch.Tensor] = {}


def kernels_available() -> bool:
    """The extension has the attention ops and a CUDA device is usable."""
    return _OPS.available()


def split_counters(device: torch.device) -> torch.Tensor:
    """The all-zero scratch in which a decode launch's KV splits on ``device`` count their arrivals (the last one
    merges them). Made on first use and kept, so that CUDA graphs captured with it stay valid; every call leaves it
    all zero. Calls on one device share it, so they must not run concurrently on two streams."""
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    counters = _split_counters.get(device)
    if counters is None:
        counters = _split_counters[device] = torch.zeros(SPLIT_COUNTERS, dtype=torch.int32, device=device)
    return counters


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store key/value [tokens, kv_heads, head_size] at ``slot_mapping`` (int64, -1 = skip) in ``kv_cache``."""
    if _OPS.runs_on(key, kv_cache):
        torch.ops.volta_fp4.write_kv_cache(key, value, kv_cache, slot_mapping)
    else:
        reference_write_kv_cache(key, value, kv_cache, slot_mapping)


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int, scale: float,
                    sliding_window: int = 0, out: torch.Tensor | None = None, *, mma: int | None = None,
                    num_splits: int = 0) -> torch.Tensor:
    """Causal attention of ``query`` over the paged cache; returns ``out`` [tokens, heads, head_size].

    ``query_start_loc[-1]`` must equal ``query.shape[0]``. ``num_splits``: 0 = split the KV length when the
    query tiles alone would leave the GPU idle (decode, long contexts); n forces n splits (tests)."""
    if out is None:
        out = torch.empty_like(query)
    if _OPS.runs_on(query, kv_cache):
        torch.ops.volta_fp4.paged_attention(
            out, query, kv_cache, block_table, query_start_loc, seq_lens, split_counters(query.device),
            int(max_seq_len), float(scale), int(sliding_window or 0),
            extension.default_mma() if mma is None else mma, int(num_splits))
    else:
        reference_paged_attention(query, kv_cache, block_table, query_start_loc, seq_lens, scale,
                                  sliding_window, out=out)
    return out


def reference_write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                             slot_mapping: torch.Tensor) -> None:
    slots = slot_mapping[: key.shape[0]].long()
    stored = slots >= 0
    block_size = kv_cache.shape[2]
    blocks, offsets = slots[stored] // block_size, slots[stored] % block_size
    kv_cache[blocks, 0, offsets] = key[stored].to(kv_cache.dtype)
    kv_cache[blocks, 1, offsets] = value[stored].to(kv_cache.dtype)


def gather_sequence_kv(kv_cache: torch.Tensor, block_table_row: torch.Tensor,
                       seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``seq_len`` keys and values of one sequence, each [seq_len, kv_heads, head_size]."""
    block_size = kv_cache.shape[2]
    blocks = block_table_row[: (seq_len + block_size - 1) // block_size].long()
    kv = kv_cache[blocks]  # [n, 2, block_size, kv_heads, head_size]
    keys = kv[:, 0].reshape(-1, *kv.shape[-2:])[:seq_len]
    values = kv[:, 1].reshape(-1, *kv.shape[-2:])[:seq_len]
    return keys, values


def reference_paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                              query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                              sliding_window: int | None = 0, out: torch.Tensor | None = None,
                              compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Plain softmax attention per sequence over the keys gathered from the paged cache."""
    if out is None:
        out = torch.empty_like(query)
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    group = query.shape[1] // kv_cache.shape[3]
    for seq, seq_len in enumerate(lens):
        begin, end = starts[seq], starts[seq + 1]
        if end == begin:
            continue
        keys, values = gather_sequence_kv(kv_cache, block_table[seq], seq_len)
        context = seq_len - (end - begin)
        # Keys before the first query's window may sit in blocks vLLM has already freed: leave them out.
        first_key = max(0, context - sliding_window + 1) if sliding_window else 0
        out[begin:end] = softmax_attention(query[begin:end].to(compute_dtype), keys[first_key:].to(compute_dtype),
                                           values[first_key:].to(compute_dtype), scale, context - first_key,
                                           sliding_window, group).to(out.dtype)
    return out


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, context: int,
                      sliding_window: int | None, group: int) -> torch.Tensor:
    """q [q_len, heads, d] at positions context … context+q_len-1; k, v [seq_len, kv_heads, d]."""
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    positions = context + torch.arange(q.shape[0], device=q.device)[:, None]
    keys = torch.arange(k.shape[0], device=q.device)[None, :]
    visible = keys <= positions
    if sliding_window:
        visible &= positions - keys < sliding_window
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def _register_fakes() -> None:
    @torch.library.register_fake("volta_fp4::write_kv_cache")
    def _(key, value, kv_cache, slot_mapping):
        return None

    @torch.library.register_fake("volta_fp4::paged_attention")
    def _(out, query, kv_cache, block_table, query_start_loc, seq_lens, split_counters, max_seq_len, scale,
          sliding_window, mma, num_splits):
        return None


_OPS.on_load(_register_fakes)
