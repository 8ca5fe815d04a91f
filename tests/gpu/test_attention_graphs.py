"""The attention ops inside a CUDA graph, as vLLM's FULL decode graphs run them: captured once per padded batch
size on persistent buffers (devkit.random_batches.PersistentAttentionInputs) with the engine's fixed split basis,
then replayed on other batches of that size — other context lengths (longer than at capture, past several
splits), prefix-cache-hit style contexts, fewer real sequences than the captured size (vLLM's padding) — each
replay equal, bit for bit, to the eager ops on the same buffers, and close to the float64 dense reference.
Skipped without CUDA or without the built extension."""

from __future__ import annotations

import math

import pytest
import torch

from devkit.random_batches import PersistentAttentionInputs, RandomPagedBatch
from vllm_volta_fp4.ops import attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not attention.kernels_available(), reason="needs CUDA and vllm_volta_fp4._C with attention ops"),
]

SPLIT_BASIS = 8192  # max_model_len: what the metadata builder passes as max_seq_len for graph-shaped batches
BLOCK_SIZE, MAX_BLOCKS_PER_SEQ = 16, 8192 // 16
REL_TOL = 2e-3
# Per captured size: batches replayed on its graph, (context_len, query_len) per real sequence. The first is the
# capture batch (short contexts, as vLLM's dummy capture run has).
REPLAYS = {
    (1, 1): [[(3, 1)], [(4099, 1)], [(64, 1)]],
    (4, 1): [[(1, 1)] * 4, [(15, 1), (300, 1), (1029, 1), (7000, 1)], [(128, 1), (128, 1)], [(63, 1)]],
    (8, 1): [[(1, 1)] * 8, [(17 * i + 5, 1) for i in range(8)], [(2000, 1), (0, 1), (511, 1)]],
    (4, 3): [[(2, 3)] * 4, [(500, 3), (61, 3), (3000, 3), (0, 3)], [(96, 3)]],  # speculative decoding: 1 + 2
}


def run_ops(views: dict, scale: float, mma: int) -> None:
    attention.write_kv_cache(views["new_key"], views["new_value"], views["kv_cache"], views["slot_mapping"])
    attention.paged_attention(views["query"], views["kv_cache"], views["block_table"], views["query_start_loc"],
                              views["seq_lens"], SPLIT_BASIS, scale, out=views["out"], mma=mma)


@pytest.mark.parametrize("mma", [70, 80])
@pytest.mark.parametrize("heads", [(8, 2), (24, 4)], ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("head_size", [128, 256])
@pytest.mark.parametrize("size", list(REPLAYS), ids=lambda s: f"{s[0]}seqs-q{s[1]}")
def test_graph_replay_equals_eager(size, head_size, heads, mma):
    num_seqs, q_len = size
    num_heads, num_kv_heads = heads
    scale = 1 / math.sqrt(head_size)
    num_blocks = num_seqs * MAX_BLOCKS_PER_SEQ + 2
    buffers = PersistentAttentionInputs(num_seqs, num_seqs * q_len, MAX_BLOCKS_PER_SEQ, num_blocks, num_heads,
                                        num_kv_heads, head_size, BLOCK_SIZE, device="cuda")
    views = buffers.views(num_seqs, num_seqs * q_len)

    def load(seqs, seed):
        batch = RandomPagedBatch(seqs, num_heads, num_kv_heads, head_size, BLOCK_SIZE, device="cuda", seed=seed)
        buffers.load(batch, num_seqs, num_seqs * q_len, seed=seed)
        return batch

    capture_batch, *replays = REPLAYS[size]
    load(capture_batch, seed=0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_ops(views, scale, mma)  # warm-up outside the capture (kernel attributes, allocator)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_ops(views, scale, mma)
    for seed, seqs in enumerate(replays, start=1):
        batch = load(seqs, seed)
        tokens = batch.query.shape[0]
        run_ops(views, scale, mma)
        eager = views["out"][:tokens].clone()
        batch = load(seqs, seed)
        graph.replay()
        torch.cuda.synchronize()
        replayed = views["out"][:tokens]
        assert torch.equal(replayed, eager), f"replay {seqs} differs from eager"
        assert not replayed.isnan().any()
        reference = batch.dense_reference(scale).cuda()
        rel = float((replayed.double() - reference).norm() / reference.norm())
        assert rel < REL_TOL, (seqs, rel)
