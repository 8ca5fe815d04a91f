"""The attention ops' host decisions (csrc/attention/attention_plan.h), compiled alone with the host compiler: the
busy row tiles a launch is planned for and the split-KV count chosen from the kernel's resident block slots; and the
kernel's share of KV tiles per split (split_share, attention_shape.h), the same function the kernel calls."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from devkit import v100
from tests.host_program import requires_host_compiler, run_host_program

H200_SMS = 132

pytestmark = requires_host_compiler


def _evaluate(tmp_path: Path, calls: list[str]) -> list[int]:
    """The values of C++ expressions over the plan's functions (namespace volta_fp4::attention)."""
    body = [f"  std::printf(\"%lld\\n\", (long long)({call}));" for call in calls]
    output = run_host_program(tmp_path, ["attention/attention_plan.h"], body,
                              preamble="using namespace volta_fp4::attention;")
    return [int(line) for line in output.split()]


# (what, busy_row_tiles(num_tokens, group, num_seqs, block_rows), expected)
BUSY_TILES = [
    ("decode, GQA 6:1, 16 sequences: one tile each", "busy_row_tiles(16, 6, 16, kDecodeRows)", 16),
    ("decode, GQA 8:1, 64 sequences", "busy_row_tiles(64, 8, 64, kDecodeRows)", 64),
    ("MTP verification K = 3 at 6:1: 24 rows, two tiles per sequence", "busy_row_tiles(16, 6, 4, kDecodeRows)", 8),
    ("one prefill of 4096 tokens at 6:1", "busy_row_tiles(4096, 6, 1, kPrefillRows)", 384),
    ("no sequence: no division by zero", "busy_row_tiles(0, 6, 0, kDecodeRows)", 0),
]

# (what, choose_splits(requested, busy_tiles, num_kv_heads, max_seq_len, slots), expected). The slots are the H200's
# 132 SMs × the resident blocks per SM of the decode kernel there (2 at head_dim 128/256, 4 at 64); the expected
# counts are the fastest forced counts of the H200 sweep (benchmarks/results/attention-decode-h200.md, 4 KV heads).
SPLITS = [
    ("d256, batch 4: 16 blocks on 264 slots", f"choose_splits(0, 4, 4, 4096, {2 * H200_SMS})", 16),
    ("d256, batch 16", f"choose_splits(0, 16, 4, 4096, {2 * H200_SMS})", 4),
    ("d256, batch 64: the busy blocks fill a wave", f"choose_splits(0, 64, 4, 4096, {2 * H200_SMS})", 1),
    ("d64, batch 16", f"choose_splits(0, 16, 4, 4096, {4 * H200_SMS})", 8),
    ("d64, batch 64", f"choose_splits(0, 64, 4, 4096, {4 * H200_SMS})", 2),
    ("batch 1 at 2048 tokens: one KV tile per split", f"choose_splits(0, 1, 4, 2048, {2 * H200_SMS})", 32),
    ("batch 4 at 512 tokens: one KV tile per split", f"choose_splits(0, 4, 4, 512, {2 * H200_SMS})", 8),
    ("batch 1 at 32768: kMaxSplits (the kernel uses fewer where they would get < 4 tiles)",
     f"choose_splits(0, 1, 4, 32768, {2 * H200_SMS})", 64),
    ("a forced count is kept", f"choose_splits(48, 1, 4, 32768, {2 * H200_SMS})", 48),
    ("more busy blocks than slots", f"choose_splits(0, 400, 8, 4096, {2 * H200_SMS})", 1),
    ("a requested count is kept", f"choose_splits(5, 64, 4, 4096, {2 * H200_SMS})", 5),
    ("a requested count above the KV tiles is clamped", "choose_splits(100, 1, 4, 64, 264)", 1),
]


@pytest.mark.parametrize("table", [BUSY_TILES, SPLITS], ids=["busy_row_tiles", "choose_splits"])
def test_plan_cases(tmp_path, table):
    values = _evaluate(tmp_path, [call for _, call, _ in table])
    got = {what: value for (what, _, _), value in zip(table, values, strict=True)}
    assert got == {what: want for what, _, want in table}


def test_busy_tiles_within_the_grid_and_splits_within_one_wave(tmp_path):
    """On random launch shapes: the busy tiles never exceed the grid's row tiles (the kernel's upper bound), and an
    automatic count above 1 never asks for more blocks than the slots hold."""
    rng = random.Random(0)
    shapes = []
    for _ in range(200):
        seqs = rng.randint(1, 300)
        tokens, group, rows = seqs * rng.choice([1, 2, 4, 8]) + rng.randint(0, 50), rng.choice([1, 4, 6, 8, 16]), \
            rng.choice(["kDecodeRows", "kPrefillRows"])
        shapes.append((tokens, group, seqs, rows, rng.choice([1, 2, 4, 8]), rng.randint(1, 40000),
                       rng.choice([80, 132]) * rng.randint(1, 4)))
    calls = []
    for tokens, group, seqs, rows, heads, max_len, slots in shapes:
        busy = f"busy_row_tiles({tokens}, {group}, {seqs}, {rows})"
        calls += [busy, f"row_tiles({tokens}, {group}, {seqs}, {rows})",
                  f"choose_splits(0, {busy}, {heads}, {max_len}, {slots})"]
    values = _evaluate(tmp_path, calls)
    assert len(values) == len(calls)
    for shape, busy, grid, splits in zip(shapes, values[0::3], values[1::3], values[2::3], strict=True):
        heads, slots = shape[4], shape[6]
        assert 1 <= busy <= grid, shape
        assert splits == 1 or busy * heads * splits <= slots, shape


def test_split_share_covers_every_tile_once_and_merges_few_splits(tmp_path):
    """split_share, the kernel's division of a row tile's KV tiles among a launch's splits (paged_attention_kernel
    calls it; its PTX is the inline arithmetic's): for every tile count up to 32768 tokens' and every split count, the
    shares of the splits cover each tile exactly once, splits_with_tiles counts the splits that get any, fewer than
    kMinTilesToSplit tiles stay in one split, and more than kCheapMergeSplits splits get tiles only where each gets at
    least kMinTilesPastCheapMerge (fewer splits to merge, which a CUDA graph's split count for its longest context
    would otherwise force on short contexts)."""
    max_tiles = 32768 // 64 + 3
    body = [f"  for (int tiles = 0; tiles <= {max_tiles}; ++tiles)",
            "    for (int splits = 1; splits <= kMaxSplits; ++splits) {",
            "      const SplitShare share = split_share(tiles, splits);",
            '      std::printf("%d %d %d %d\\n", tiles, splits, share.tiles_per_split, share.splits_with_tiles);',
            "    }",
            '  std::printf("%d %d %d %d\\n", kMaxSplits, kCheapMergeSplits, kMinTilesPastCheapMerge,',
            "              kMinTilesToSplit);"]
    lines = run_host_program(tmp_path, ["attention/attention_shape.h"], body,
                             preamble="using namespace volta_fp4::attention;").splitlines()
    max_splits, cheap, min_tiles, min_to_split = map(int, lines[-1].split())
    assert (min_tiles, min_to_split) == (4, 3)  # the rules the sweeps measured (split_share's comment)
    rows = [tuple(map(int, line.split())) for line in lines[:-1]]
    assert len(rows) == (max_tiles + 1) * max_splits
    for tiles, splits, per_split, with_tiles in rows:
        covered = []
        for split in range(splits):  # the kernel's tile_first / tile_end of this split
            first = split * per_split
            covered += range(first, min(tiles, first + per_split))
        nonempty = sum(1 for split in range(splits) if split * per_split < tiles)
        case = (tiles, splits, per_split, with_tiles)
        assert covered == list(range(tiles)), case
        assert with_tiles == nonempty <= splits, case
        assert with_tiles <= cheap or per_split >= min_tiles, case
        if tiles < min_to_split:  # too few tiles to pay for a merge: one split takes them all
            assert with_tiles == min(tiles, 1), case
        elif splits <= cheap:  # up to kCheapMergeSplits, the tiles are spread over all splits
            assert per_split == -(-tiles // splits), case


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("along_dims", [True, False], ids=["along-dims", "along-keys"])
def test_kv_thread_map_covers_the_tile_once(tmp_path, head_size, along_dims):
    """KvThreadMap, which of a KV tile's 16-byte vectors each of the block's threads loads and stores
    (paged_attention_kernel): every (key, 8 dims) of the 64-key tile exactly once; a thread's vectors inside the panel
    of their dim offset (so that shared-memory offsets are a per-thread base plus a constant); along dims, each run of
    8 lanes reads 128 contiguous, aligned bytes of one key (one cache line: decode blocks); along keys, a warp's lanes
    take 32 consecutive keys at the same dims, one key per thread (prefill blocks)."""
    map_type = f"KvThreadMap<{head_size}, {'true' if along_dims else 'false'}>"
    body = [f"  using Map = {map_type};",
            "  for (int tid = 0; tid < kThreadsPerBlock; ++tid)",
            "    for (int j = 0; j < Map::kVectors; ++j)",
            '      std::printf("%d %d %d %d %d %d\\n", tid, j, Map::key(tid), Map::key_offset(j), Map::dim0(tid), '
            "Map::dim_offset(j));",
            '  std::printf("%d %d\\n", kTileKeys, kPanelCols);']
    lines = run_host_program(tmp_path, ["attention/attention_shape.h"], body,
                             preamble="using namespace volta_fp4::attention;").splitlines()
    tile_keys, panel = map(int, lines[-1].split())
    vectors = [tuple(map(int, line.split())) for line in lines[:-1]]
    covered = sorted((key + key_offset, dim0 + dim_offset) for _, _, key, key_offset, dim0, dim_offset in vectors)
    assert covered == [(key, dim) for key in range(tile_keys) for dim in range(0, head_size, 8)]
    for tid, j, _, _, dim0, dim_offset in vectors:
        assert (dim0 + dim_offset) // panel == dim_offset // panel and dim0 + dim_offset % panel < panel, (tid, j)
    by_vector = {}
    for tid, j, key, key_offset, dim0, dim_offset in vectors:
        by_vector.setdefault((tid // 32, j), []).append((key + key_offset, dim0 + dim_offset))
    for (warp, j), lanes in by_vector.items():
        assert len(lanes) == 32, (warp, j)
        if along_dims:
            for run in range(0, 32, 8):
                keys = {key for key, _ in lanes[run:run + 8]}
                dims = [dim for _, dim in lanes[run:run + 8]]
                assert len(keys) == 1 and dims == list(range(dims[0], dims[0] + 64, 8)) and dims[0] % 64 == 0, \
                    (warp, j, run)
        else:
            assert [key for key, _ in lanes] == list(range(lanes[0][0], lanes[0][0] + 32)), (warp, j)
            assert len({dim for _, dim in lanes}) == 1, (warp, j)


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("along_dims", [True, False], ids=["along-dims", "along-keys"])
def test_kv_block_lookups_serve_every_key_slot(tmp_path, head_size, along_dims):
    """KvSource looks each of a warp's keys up once: the lane lookup_lane(lane, k) of a thread's warp looks up exactly
    that thread's k-th key (the row it shuffles over), and along dims a warp makes one lookup per distinct key."""
    map_type = f"KvThreadMap<{head_size}, {'true' if along_dims else 'false'}>"
    body = [f"  using Map = {map_type};",
            "  for (int tid = 0; tid < kThreadsPerBlock; ++tid)",
            "    for (int k = 0; k < Map::kKeys; ++k)",
            '      std::printf("%d %d %d %d\\n", tid, Map::key(tid) + k * Map::kKeyStep, '
            "Map::lookup_key(tid - tid % 32 + Map::lookup_lane(tid % 32, k)), Map::lookup_key(tid));"]
    lines = run_host_program(tmp_path, ["attention/attention_shape.h"], body,
                             preamble="using namespace volta_fp4::attention;").splitlines()
    rows = [tuple(map(int, line.split())) for line in lines]
    assert rows and all(key == looked_up for _, key, looked_up, _ in rows), \
        [row for row in rows if row[1] != row[2]][:4]
    for warp in range(len({tid // 32 for tid, *_ in rows})):
        needed = {key for tid, key, _, _ in rows if tid // 32 == warp}
        lookups = {own for tid, _, _, own in rows if tid // 32 == warp}
        assert lookups == needed, (warp, sorted(needed), sorted(lookups))
        assert len(needed) == (16 if along_dims else 32), warp


# Shared memory per SM and reserved bytes per block: (what, bytes per SM, reserved per block). Hopper / Ampere / Ada
# / Volta, as their CUDA device attributes report them.
SMS = [("H100/H200", 233472, 1024), ("A100", 167936, 1024), ("RTX 4090", 102400, 1024), ("V100", 98304, 0)]


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("what,smem_per_sm,reserved", SMS, ids=[s[0] for s in SMS])
def test_decode_smem_request_caps_residency(tmp_path, head_size, what, smem_per_sm, reserved):
    """The request never falls below the plan; with it, at most decode_max_blocks_per_sm blocks fit by shared memory,
    and exactly that many where the SM has room for them (allocation in 128-byte units, as the hardware rounds)."""
    plan = f"attention_smem_bytes({head_size}, kDecodeRows)"
    cap = f"decode_max_blocks_per_sm({head_size})"
    plan_bytes, max_blocks, request = _evaluate(
        tmp_path, [plan, cap, f"attention_launch_smem_bytes({head_size}, kDecodeRows, {smem_per_sm}, {reserved})"])
    def allocated(request_bytes: int) -> int:  # what a resident block takes of the SM
        return -(-(request_bytes + reserved) // 128) * 128

    fitting = smem_per_sm // allocated(request)
    assert request >= plan_bytes
    assert fitting <= max_blocks, (what, request, fitting)
    if max_blocks * allocated(plan_bytes) <= smem_per_sm:
        assert fitting == max_blocks, (what, request, fitting)


@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_prefill_launch_requests_its_plan(tmp_path, head_size):
    """Prefill blocks are not held to a residency: their launch asks for exactly their shared-memory plan."""
    plan, request = _evaluate(tmp_path, [f"attention_smem_bytes({head_size}, kPrefillRows)",
                                         f"attention_launch_smem_bytes({head_size}, kPrefillRows, 233472, 1024)"])
    assert request == plan


@pytest.mark.parametrize("block_rows", ["kPrefillRows", "kDecodeRows"])
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_smem_rows_fit_their_data_and_read_without_bank_conflicts(tmp_path, head_size, block_rows):
    """Q/K/V rows hold a panel's head dims and P rows a tile's keys, each + 8 halves: 16-byte aligned, and RowHalves / 2
    ≡ 4 (mod 8) words, which starts the 8 rows of an atom's read 4 banks apart (mma_atoms.cuh); a row 136 halves wide
    at head_dim 64 would make a V100 hold one prefill block less."""
    plan = f"SmemPlan<{head_size}, {block_rows}>"
    row, p_row, total = _evaluate(tmp_path, [f"{plan}::kRowHalves", f"{plan}::kPRowHalves", f"{plan}::kBytes"])
    assert row == min(head_size, 128) + 8 and p_row == 64 + 8
    for halves in (row, p_row):
        assert halves % 8 == 0 and halves // 2 % 8 == 4
    panels = -(-head_size // 128)
    rows = 64 if block_rows == "kPrefillRows" else 16
    stats = 0 if rows == 64 else 4 * 16 * 4
    assert total == ((panels * rows + panels * 64) * row + rows * p_row) * 2 + stats


@pytest.mark.parametrize("head_size,blocks", [(64, 3), (128, 2), (256, 1)])
def test_prefill_blocks_per_v100_sm_by_shared_memory(tmp_path, head_size, blocks):
    """What the narrow rows buy a V100 (96 KB per SM, no reservation): 3 / 2 / 1 prefill blocks at head_dim 64 / 128 /
    256 by shared memory (1 / 1 / 1 with every row 136 halves wide)."""
    (plan,) = _evaluate(tmp_path, [f"attention_launch_smem_bytes({head_size}, kPrefillRows, {v100.SMEM_PER_SM}, 0)"])
    assert v100.occupancy(1, 128, plan) == (blocks, "shared memory")
