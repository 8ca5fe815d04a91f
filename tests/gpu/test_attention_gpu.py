"""The CUDA paged-attention ops against plain softmax attention in float64, on the device.

Each case builds a fresh random batch in a paged cache whose unowned slots and spare blocks are NaN (a read
outside a sequence poisons the output), writes the new tokens with the write_kv_cache op, poisons the output
with NaN, runs the op with one MMA atom, then checks that every output element was written, nothing is NaN,
and ‖out − ref‖ / ‖ref‖ and the largest error against the float64 reference on the dense keys/values (no
paging involved). Skipped without CUDA or without the built extension."""

from __future__ import annotations

import math

import pytest
import torch

from devkit.random_batches import RandomPagedBatch
from vllm_volta_fp4.ops import attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not attention.kernels_available(), reason="needs CUDA and vllm_volta_fp4._C with attention ops"),
]

# P is rounded to fp16 before P·V and the output to fp16: relative errors of a few 1e-4.
REL_TOL = 2e-3
MAX_ABS_TOL = 1e-2

# (context_len, query_len) per sequence. Odd lengths everywhere; contexts past one 64-key tile and past a
# split; prefill rows past one 64-row tile. Decode: 101 tokens (2 tiles) stays in one split of any forced count,
# 4099 (65 tiles) takes 32 splits of a forced 64 (split_share), 20011 (313 tiles) all 64 with 5 tiles each, so the
# merge reads past 32 splits.
BATCHES = {
    "prefill-one": [(0, 1)],
    "prefill-odd": [(0, 77), (0, 130), (0, 3)],
    "decode": [(0, 1), (16, 1), (63, 1), (100, 1), (300, 1), (1029, 1), (4099, 1), (20011, 1)],
    "chunked-prefill": [(96, 61), (1000, 257)],
    "prefix-hit": [(64, 33), (128, 1), (512, 200)],
    "mixed": [(0, 1), (513, 1), (37, 90), (0, 257), (2000, 1), (250, 17)],
    # few rows per sequence (the host's decode blocks): speculative verification, and one sequence with several
    # 16-row tiles among decodes
    "speculative": [(63, 4), (300, 4), (1029, 4), (0, 4)],
    "decode-long-row": [(100, 40), (16, 1), (63, 1), (7, 1)],
    # more sequences than a block has threads: the kernel finds a block's sequence by counting 128 at a time
    "many-sequences": [((37 * i) % 190, 1 + (i % 7 == 0)) for i in range(300)],
}
# (num_heads, num_kv_heads): MHA, GQA 4:1, Qwen3.8-27B's 24:4, MQA.
HEADS = [(4, 4), (8, 2), (24, 4), (8, 1)]
ATOMS = [70, 80]


def _atoms() -> list[int]:
    return ATOMS if torch.cuda.get_device_capability()[0] >= 8 else [70]


def _run_case(batch_name: str, heads: tuple[int, int], head_size: int, block_size: int, mma: int,
              sliding_window: int = 0, num_splits: int = 0, seed: int = 0):
    if mma not in _atoms():
        pytest.skip(f"the SM{mma} atom needs a newer GPU")
    batch = RandomPagedBatch(BATCHES[batch_name], heads[0], heads[1], head_size, block_size,
                                       device="cuda", seed=seed)
    batch.write_new_tokens()
    if sliding_window:
        batch.free_blocks_outside_window(sliding_window)  # as vLLM does: those blocks now read as NaN
    scale = 1.0 / math.sqrt(head_size)
    out = torch.full_like(batch.query, float("nan"))
    attention.paged_attention(batch.query, batch.kv_cache, batch.block_table, batch.query_start_loc,
                              batch.seq_lens, batch.max_seq_len, scale, sliding_window, out=out, mma=mma,
                              num_splits=num_splits)
    torch.cuda.synchronize()
    ref = batch.dense_reference(scale, sliding_window)
    got = out.cpu().double()
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} of {got.numel()} outputs NaN (unwritten?)"
    rel = float((got - ref).norm() / ref.norm())
    max_abs = float((got - ref).abs().max())
    print(f"{batch_name} heads={heads} d={head_size} bs={block_size} sm{mma} window={sliding_window} "
          f"splits={num_splits}: rel {rel:.2e}, max abs {max_abs:.2e}")
    assert rel < REL_TOL and max_abs < MAX_ABS_TOL, (rel, max_abs)


@pytest.mark.parametrize("mma", ATOMS)
@pytest.mark.parametrize("head_size", attention.HEAD_SIZES)
@pytest.mark.parametrize("batch_name", list(BATCHES))
def test_batches(batch_name, head_size, mma):
    _run_case(batch_name, (24, 4), head_size, 16, mma, seed=sum(map(ord, batch_name)) + head_size)


@pytest.mark.parametrize("mma", ATOMS)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("block_size", [16, 32, 528])  # 528: a hybrid model's attention block size
def test_gqa_and_block_sizes(heads, block_size, mma):
    _run_case("mixed", heads, 128, block_size, mma, seed=block_size + heads[0])


@pytest.mark.parametrize("mma", ATOMS)
@pytest.mark.parametrize("head_size", attention.HEAD_SIZES)
@pytest.mark.parametrize("window", [1, 33, 256])
def test_sliding_window(window, head_size, mma):
    _run_case("mixed", (8, 2), head_size, 16, mma, sliding_window=window, seed=window)


@pytest.mark.parametrize("mma", ATOMS)
@pytest.mark.parametrize("num_splits", [1, 2, 5, 64])
@pytest.mark.parametrize("head_size", [64, 256])
def test_forced_kv_splits(num_splits, head_size, mma):
    _run_case("decode", (24, 4), head_size, 16, mma, num_splits=num_splits, seed=num_splits)
    _run_case("chunked-prefill", (24, 4), head_size, 16, mma, sliding_window=100, num_splits=num_splits,
              seed=num_splits + 1)


def test_write_kv_cache_matches_reference():
    batch = RandomPagedBatch(BATCHES["mixed"], 8, 2, 128, 16, device="cuda", seed=7)
    expected = batch.kv_cache.clone()
    attention.reference_write_kv_cache(batch.new_key, batch.new_value, expected, batch.slot_mapping)
    padded_slots = torch.cat([batch.slot_mapping, torch.full((5,), -1, device="cuda")])  # vLLM pads with -1
    padded_key = torch.cat([batch.new_key, torch.randn_like(batch.new_key[:5])])
    padded_value = torch.cat([batch.new_value, torch.randn_like(batch.new_value[:5])])
    attention.write_kv_cache(padded_key, padded_value, batch.kv_cache, padded_slots)
    torch.cuda.synchronize()
    assert torch.equal(batch.kv_cache.isnan(), expected.isnan())
    assert torch.equal(batch.kv_cache.nan_to_num(), expected.nan_to_num())


def test_strided_query_and_output():
    """vLLM hands q as a view of the fused qkv projection and out as a view of a wider buffer."""
    batch = RandomPagedBatch(BATCHES["mixed"], 8, 2, 64, 16, device="cuda", seed=11)
    batch.write_new_tokens()
    tokens = batch.query.shape[0]
    qkv = torch.randn(tokens, 12, 64, device="cuda", dtype=torch.float16)
    qkv[:, :8] = batch.query
    wide_out = torch.full((tokens, 16, 64), float("nan"), device="cuda", dtype=torch.float16)
    out = wide_out[:, 4:12]
    attention.paged_attention(qkv[:, :8], batch.kv_cache, batch.block_table, batch.query_start_loc,
                              batch.seq_lens, batch.max_seq_len, 0.125, out=out)
    torch.cuda.synchronize()
    ref = batch.dense_reference(0.125)
    assert float((out.cpu().double() - ref).norm() / ref.norm()) < REL_TOL
    assert wide_out[:, :4].isnan().all() and wide_out[:, 12:].isnan().all()  # nothing outside the view


@pytest.mark.parametrize("mma", ATOMS)
@pytest.mark.parametrize("head_size", [64, 256])
def test_repeated_runs_are_bitwise_identical(head_size, mma):
    """No race between blocks or with the split-KV reduction: 30 launches on one mixed batch (decodes that split
    the KV length, chunked prefill with context, prefix hits) give the same bits, with other work in between."""
    if mma not in _atoms():
        pytest.skip(f"the SM{mma} atom needs a newer GPU")
    batch = RandomPagedBatch(BATCHES["mixed"], 24, 4, head_size, 16, device="cuda", seed=head_size)
    batch.write_new_tokens()
    outputs = []
    for _ in range(30):
        out = torch.full_like(batch.query, float("nan"))
        attention.paged_attention(batch.query, batch.kv_cache, batch.block_table, batch.query_start_loc,
                                  batch.seq_lens, batch.max_seq_len, 0.1, out=out, mma=mma)
        torch.randn(1 << 20, device="cuda").sum()  # unrelated work between launches changes the timing
        outputs.append(out)
    torch.cuda.synchronize()
    assert not outputs[0].isnan().any()
    assert all(torch.equal(outputs[0], other) for other in outputs[1:])


@pytest.mark.parametrize("mma", ATOMS)
@pytest.mark.parametrize("num_splits", [0, 3, 64])
def test_split_merge_is_deterministic_and_leaves_counters_zero(num_splits, mma):
    """Decode blocks merge their KV splits in the split that finishes last: the output must not depend on which one
    that is, and the arrival counters must be all zero again after every call (the next call, or a CUDA graph
    replay, counts from zero)."""
    if mma not in _atoms():
        pytest.skip(f"the SM{mma} atom needs a newer GPU")
    batch = RandomPagedBatch(BATCHES["speculative"] + BATCHES["decode"], 24, 4, 256, 16, device="cuda", seed=31)
    batch.write_new_tokens()
    counters = attention.split_counters(batch.query.device)
    outputs = []
    for _ in range(5):
        out = torch.full_like(batch.query, float("nan"))
        attention.paged_attention(batch.query, batch.kv_cache, batch.block_table, batch.query_start_loc,
                                  batch.seq_lens, batch.max_seq_len, 1 / 16, out=out, mma=mma, num_splits=num_splits)
        torch.cuda.synchronize()
        assert int(counters.count_nonzero()) == 0
        outputs.append(out)
    assert not outputs[0].isnan().any()
    assert all(torch.equal(out, outputs[0]) for out in outputs[1:])


def test_split_counters_too_few_are_refused():
    """A decode launch with more (row tile, KV head) pairs to merge than the counters it is given fails before any
    launch, naming both counts (the ops' own counters hold every automatic split count, and forced counts on batches
    far beyond the tests')."""
    batch = RandomPagedBatch([(100, 1)] * 4, 24, 4, 256, 16, device="cuda", seed=5)
    batch.write_new_tokens()
    out = torch.full_like(batch.query, float("nan"))
    too_few = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="split counters; split_counters has 1"):
        torch.ops.volta_fp4.paged_attention(out, batch.query, batch.kv_cache, batch.block_table,
                                            batch.query_start_loc, batch.seq_lens, too_few, batch.max_seq_len,
                                            1 / 16, 0, 0, 2)
    torch.cuda.synchronize()
    assert out.isnan().all() and int(too_few.count_nonzero()) == 0  # nothing launched
