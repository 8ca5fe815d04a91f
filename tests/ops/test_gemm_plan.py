"""The GEMM ops' host decisions (csrc/gemm/weight_gemm_plan.h), compiled alone with the host compiler: the path an M
takes under the configured cut-overs, and how dequantize + cuBLAS cuts a weight into chunks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.host_program import requires_host_compiler, run_host_program

pytestmark = requires_host_compiler

MIB = 1 << 20


def _evaluate(tmp_path: Path, statements: list[str]) -> list[int]:
    """Run the statements in order; each `print(expression)` prints the expression's value."""
    body = [f"  std::printf(\"%lld\\n\", (long long)({s[6:-1]}));" if s.startswith("print(") else f"  {s};"
            for s in statements]
    output = run_host_program(tmp_path, ["gemm/weight_gemm_plan.h"], body, preamble="using namespace volta_fp4;")
    return [int(line) for line in output.split()]


# (what, dequant_rows_per_chunk(n, k, chunk_bytes), expected rows)
CHUNKS = [
    ("qkv_proj in 64 MiB: 3 equal chunks of 75 tiles, not 102 + 102 + 20",
     f"dequant_rows_per_chunk(14336, 5120, {64 * MIB})", 4800),
    ("down_proj in 64 MiB: 3 of 27 tiles", f"dequant_rows_per_chunk(5120, 17408, {64 * MIB})", 1728),
    ("a weight below the chunk: one chunk of its whole tiles", f"dequant_rows_per_chunk(208, 400, {64 * MIB})", 256),
    ("a chunk below one tile's rows still takes one tile", "dequant_rows_per_chunk(1040, 5136, 1)", 64),
    ("the GPU test's 4816 x 2064 in 1 MiB: 26 chunks of 3 tiles", f"dequant_rows_per_chunk(4816, 2064, {MIB})", 192),
]


@pytest.mark.parametrize("what, call, expected", CHUNKS, ids=[c[0] for c in CHUNKS])
def test_dequant_chunk_rows(tmp_path, what, call, expected):
    assert _evaluate(tmp_path, [f"print({call})"]) == [expected]


def test_dequant_chunks_are_the_fewest_equal_ones_within_the_budget(tmp_path):
    rng = random.Random(0)
    cases = [(rng.randint(1, 40000), 16 * rng.randint(1, 2000), rng.choice([1, 3, 64, 200]) * MIB) for _ in range(300)]
    rows = _evaluate(tmp_path, [f"print(dequant_rows_per_chunk({n}, {k}, {b}))" for n, k, b in cases])
    for (n, k, budget), r in zip(cases, rows, strict=True):
        tiles, chunk_tiles = -(-n // 64), r // 64
        max_tiles = max(1, budget // (2 * k) // 64)
        assert r % 64 == 0 and 1 <= chunk_tiles <= max_tiles, (n, k, budget, r)
        chunks = -(-tiles // chunk_tiles)
        assert chunks == -(-tiles // max_tiles), (n, k, budget, r)  # as few chunks as the budget allows
        assert chunk_tiles * (chunks - 1) < tiles, (n, k, budget, r)  # the last chunk is not empty


def test_configure_gemm_sets_the_cut_overs_and_the_chunk(tmp_path):
    values = _evaluate(tmp_path, [
        "print(gemm_settings().dequant_chunk_bytes)", "print(int(choose_path(16, 0)))",
        "print(int(choose_path(17, 0)))", "print(int(choose_path(129, 0)))",
        "configure_gemm(4, 100, 3)",
        "print(gemm_settings().dequant_chunk_bytes)", "print(int(choose_path(4, 0)))", "print(int(choose_path(5, 0)))",
        "print(int(choose_path(100, 0)))", "print(int(choose_path(4, 1)))",
        "configure_gemm(-1, 0, 0)",  # below the smallest allowed values: the defaults again
        "print(gemm_settings().dequant_chunk_bytes)", "print(int(choose_path(16, 0)))",
        "print(int(choose_path(128, 0)))", "print(int(choose_path(129, 0)))",
    ])
    gemv, fused, cublas = 3, 1, 2
    assert values == [128 * MIB, gemv, fused, cublas, 3 * MIB, gemv, fused, cublas, fused, 128 * MIB, gemv, fused,
                      cublas]


def test_fused_grid_covers_every_strip_row_and_k_tile_once(tmp_path):
    """plan_fused: strip groups × m-tiles × splits cover the output and K exactly, with split-K only where a block
    tile has a semaphore."""
    rng = random.Random(1)
    cases = [(rng.randint(1, 600), rng.randint(1, 300), rng.randint(1, 140), rng.choice([132, 264, 160]),
              rng.choice(["true", "false"])) for _ in range(200)]
    statements = []
    for m, n_tiles, k_tiles, slots, sm70 in cases:
        statements += ["{ GemmParams p{}", f"p.M = {m}", f"p.k_tiles = {k_tiles}",
                       f"const Grid3 g = plan_fused(p, {n_tiles}, {slots}, {sm70})",
                       "print(g.x)", "print(g.y)", "print(g.z)", "print(p.k_tiles_per_split)", "print(p.splits)",
                       f"print(fused_block_rows({m}))", f"print(fused_strips_per_block({sm70}, fused_block_rows({m})))",
                       "}"]
    values = _evaluate(tmp_path, statements)
    for i, (m, n_tiles, k_tiles, _, sm70) in enumerate(cases):
        groups, m_tiles, splits, per, p_splits, bm, strips = values[7 * i:7 * i + 7]
        case = (m, n_tiles, k_tiles, sm70)
        assert bm == (16 if m <= 16 else 32) and strips == (1 if sm70 == "true" and bm == 32 else 2), case
        assert (groups - 1) * strips < n_tiles <= groups * strips, case
        assert (m_tiles - 1) * bm < m <= m_tiles * bm, case
        assert splits == p_splits and (splits - 1) * per < k_tiles <= splits * per, case
        assert splits == 1 or m_tiles <= 8, case  # one semaphore per (strip group, m-tile ≤ 8)
