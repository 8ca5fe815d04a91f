"""Random batches for the kernel tests and benchmarks: paged-attention sequences and Gated-DeltaNet varlen
batches, with every slot no sequence owns poisoned (NaN) so that a kernel reading the wrong place shows up."""

from __future__ import annotations

import math

import torch

from vllm_volta_fp4.ops import attention, gdn


class RandomPagedBatch:
    """A batch of sequences with random keys, values and queries in a paged cache, for tests and benchmarks.

    ``seqs`` lists (context_len, query_len): the first context_len tokens are already in the cache (prefix hit
    or earlier chunks); the query_len new tokens' keys/values are in ``new_key``/``new_value`` with their
    ``slot_mapping`` and still have to be written (call ``write_new_tokens``). Blocks are assigned in random
    order; every cache slot no sequence owns, and every unused block-table entry's block, is NaN, so a read
    outside a sequence shows up in the output."""

    def __init__(self, seqs: list[tuple[int, int]], num_heads: int, num_kv_heads: int, head_size: int,
                 block_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float16,
                 seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.seqs, self.num_heads, self.num_kv_heads = seqs, num_heads, num_kv_heads
        blocks_per_seq = [(c + q + block_size - 1) // block_size for c, q in seqs]
        num_blocks = sum(blocks_per_seq) + 2  # + spare blocks that stay NaN
        order = torch.randperm(num_blocks, generator=generator).tolist()
        self.poisoned_block = order.pop()
        self.block_table = torch.full((len(seqs), max(blocks_per_seq)), self.poisoned_block, dtype=torch.int32)
        self.kv_cache = torch.full((num_blocks, 2, block_size, num_kv_heads, head_size), float("nan"), dtype=dtype)
        self.keys, self.values = [], []  # dense [seq_len, kv_heads, head_size] per sequence
        new_keys, new_values, slots = [], [], []
        for seq, ((context, q_len), n_blocks) in enumerate(zip(seqs, blocks_per_seq, strict=True)):
            self.block_table[seq, :n_blocks] = torch.tensor([order.pop() for _ in range(n_blocks)])
            keys = torch.randn(context + q_len, num_kv_heads, head_size, generator=generator).to(dtype)
            values = torch.randn(context + q_len, num_kv_heads, head_size, generator=generator).to(dtype)
            self.keys.append(keys)
            self.values.append(values)
            positions = torch.arange(context + q_len)
            slot = self.block_table[seq, positions // block_size].long() * block_size + positions % block_size
            cached = slot[:context]
            self.kv_cache[cached // block_size, 0, cached % block_size] = keys[:context]
            self.kv_cache[cached // block_size, 1, cached % block_size] = values[:context]
            new_keys.append(keys[context:])
            new_values.append(values[context:])
            slots.append(slot[context:])
        self.new_key, self.new_value = torch.cat(new_keys), torch.cat(new_values)
        self.slot_mapping = torch.cat(slots)
        q_lens = torch.tensor([q for _, q in seqs])
        self.query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(torch.int32)
        self.seq_lens = torch.tensor([c + q for c, q in seqs], dtype=torch.int32)
        self.max_seq_len = int(self.seq_lens.max())
        self.query = torch.randn(int(q_lens.sum()), num_heads, head_size, generator=generator).to(dtype)
        for name in ("block_table", "kv_cache", "new_key", "new_value", "slot_mapping", "query_start_loc",
                     "seq_lens", "query"):
            setattr(self, name, getattr(self, name).to(device))

    def free_blocks_outside_window(self, sliding_window: int) -> None:
        """Point block-table entries no query can see through the window at the NaN block, as vLLM frees them."""
        block_size = self.kv_cache.shape[2]
        for seq, (context, _) in enumerate(self.seqs):
            first_key = max(0, context - sliding_window + 1)
            self.block_table[seq, : first_key // block_size] = self.poisoned_block

    def write_new_tokens(self) -> None:
        attention.write_kv_cache(self.new_key, self.new_value, self.kv_cache, self.slot_mapping)

    def dense_reference(self, scale: float, sliding_window: int = 0,
                        compute_dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Plain softmax attention on the dense per-sequence keys/values (no paging involved)."""
        outputs = []
        starts = self.query_start_loc.tolist()
        for seq, (context, _) in enumerate(self.seqs):
            q = self.query[starts[seq]: starts[seq + 1]].cpu().to(compute_dtype)
            keys, values = self.keys[seq].to(compute_dtype), self.values[seq].to(compute_dtype)
            outputs.append(attention.softmax_attention(q, keys, values,
                                             scale, context, sliding_window, self.num_heads // self.num_kv_heads))
        return torch.cat(outputs)


class RandomGdnBatch:
    """A varlen batch of random GDN inputs at given shapes, for tests and benchmarks: q, k (l2-normalised unless
    ``normalised=False``), v, gating (g from realistic A_log / dt_bias / a, beta = sigmoid(b)), a state cache whose
    slots are assigned in random order (never slot 0), ``has_initial_state`` and the conv1d inputs (x, weight, bias,
    conv state). Unowned state slots are NaN so that a kernel touching the wrong slot shows up."""

    def __init__(self, lengths: list[int], k_heads: int, v_heads: int, head_dim: int, *, conv_width: int = 4,
                 state_dtype: torch.dtype = torch.float32, dtype: torch.dtype = torch.float16,
                 has_initial: list[bool] | None = None, normalised: bool = True, device: torch.device | str = "cpu",
                 seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        n, tokens = len(lengths), sum(lengths)
        self.lengths, self.k_heads, self.v_heads, self.head_dim = lengths, k_heads, v_heads, head_dim

        def randn(*shape):
            return torch.randn(*shape, generator=gen)

        self.cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
        q, k = randn(tokens, k_heads, head_dim), randn(tokens, k_heads, head_dim)
        if normalised:
            q, k = gdn.reference_l2norm(q), gdn.reference_l2norm(k)
        self.q, self.k, self.v = q.to(dtype), k.to(dtype), randn(tokens, v_heads, head_dim).to(dtype)
        # exp(A_log) log-uniform in [0.01, 2]: per-token decays from ~0.99 (state carried across many chunks) to
        # ~0.2 (forgotten within a few tokens).
        self.A_log = torch.empty(v_heads).uniform_(math.log(0.01), math.log(2.0), generator=gen)
        self.dt_bias = randn(v_heads) * 0.5
        self.a, self.b = randn(tokens, v_heads).to(dtype), randn(tokens, v_heads).to(dtype)
        self.g, self.beta = gdn.gdn_gating(self.A_log, self.a, self.b, self.dt_bias)
        slots = n + 3
        order = 1 + torch.randperm(slots - 1, generator=gen)  # slot 0 stays free: vLLM 0.20.2's null block
        self.state_indices = order[:n].to(torch.int32)
        self.state = torch.full((slots, v_heads, head_dim, head_dim), float("nan")).to(state_dtype)
        self.state[self.state_indices.long()] = (randn(n, v_heads, head_dim, head_dim) * 0.3).to(state_dtype)
        self.has_initial_state = torch.tensor(has_initial if has_initial is not None else [True] * n)
        conv_dim = head_dim * (2 * k_heads + v_heads)
        self.conv_x = randn(tokens, conv_dim).to(dtype)
        self.conv_weight = (randn(conv_dim, conv_width) * 0.5).to(dtype)
        self.conv_bias = (randn(conv_dim) * 0.1).to(dtype)
        self.conv_state = torch.full((slots, conv_width - 1, conv_dim), float("nan"), dtype=dtype)
        self.conv_state[self.state_indices.long()] = randn(n, conv_width - 1, conv_dim).to(dtype)
        for name in ("cu_seqlens", "q", "k", "v", "A_log", "dt_bias", "a", "b", "g", "beta", "state_indices",
                     "state", "has_initial_state", "conv_x", "conv_weight", "conv_bias", "conv_state"):
            setattr(self, name, getattr(self, name).to(device))

    @property
    def conv_state_view(self) -> torch.Tensor:
        """[slots, dim, width - 1], the transposed view vLLM hands the conv kernels (its cache is (slots, width-1,
        dim), dim contiguous)."""
        return self.conv_state.transpose(1, 2)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


class PersistentAttentionInputs:
    """Attention inputs in buffers allocated once, as vLLM's model runner keeps them, so that a CUDA graph captured
    on one batch can be replayed on others. ``load`` copies a RandomPagedBatch in, padded the way vLLM pads a batch
    to a captured size: sequences past the batch have query length 0 (query_start_loc repeats its last value),
    seq_len 0 and a block table of ``pad_block``; tokens past the batch have slot -1 and random queries."""

    def __init__(self, max_seqs: int, max_tokens: int, max_blocks_per_seq: int, num_blocks: int, num_heads: int,
                 num_kv_heads: int, head_size: int, block_size: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float16, pad_block: int = 0):
        def buffer(*shape, dtype=dtype):
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.pad_block = pad_block
        self.query, self.out = buffer(max_tokens, num_heads, head_size), buffer(max_tokens, num_heads, head_size)
        self.new_key = buffer(max_tokens, num_kv_heads, head_size)
        self.new_value = buffer(max_tokens, num_kv_heads, head_size)
        self.kv_cache = buffer(num_blocks, 2, block_size, num_kv_heads, head_size)
        self.block_table = buffer(max_seqs, max_blocks_per_seq, dtype=torch.int32)
        self.query_start_loc = buffer(max_seqs + 1, dtype=torch.int32)
        self.seq_lens = buffer(max_seqs, dtype=torch.int32)
        self.slot_mapping = buffer(max_tokens, dtype=torch.int64)

    def load(self, batch: RandomPagedBatch, num_seqs: int, num_tokens: int, seed: int = 0) -> None:
        real_seqs, real_tokens = len(batch.seqs), batch.query.shape[0]
        assert real_seqs <= num_seqs and real_tokens <= num_tokens
        generator = torch.Generator().manual_seed(seed)
        self.kv_cache.fill_(float("nan"))
        self.kv_cache[: batch.kv_cache.shape[0]].copy_(batch.kv_cache)
        self.block_table.fill_(self.pad_block)
        self.block_table[:real_seqs, : batch.block_table.shape[1]].copy_(batch.block_table)
        self.query_start_loc.fill_(real_tokens)
        self.query_start_loc[: real_seqs + 1].copy_(batch.query_start_loc)
        self.seq_lens.zero_()
        self.seq_lens[:real_seqs].copy_(batch.seq_lens)
        self.slot_mapping.fill_(-1)
        self.slot_mapping[:real_tokens].copy_(batch.slot_mapping)
        for name in ("query", "new_key", "new_value"):
            target, source = getattr(self, name), getattr(batch, name)
            target.copy_(torch.randn(target.shape, generator=generator).to(target.dtype))  # padding: any values
            target[:real_tokens].copy_(source)
        self.out.fill_(float("nan"))

    def views(self, num_seqs: int, num_tokens: int) -> dict[str, torch.Tensor]:
        """The buffers as one forward of ``num_seqs`` sequences and ``num_tokens`` tokens sees them."""
        return {"query": self.query[:num_tokens], "out": self.out[:num_tokens], "new_key": self.new_key[:num_tokens],
                "new_value": self.new_value[:num_tokens], "kv_cache": self.kv_cache,
                "block_table": self.block_table[:num_seqs], "query_start_loc": self.query_start_loc[: num_seqs + 1],
                "seq_lens": self.seq_lens[:num_seqs], "slot_mapping": self.slot_mapping[:num_tokens]}
