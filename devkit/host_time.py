"""Where an in-process vLLM engine spends host time per decode step: Python's profiler over one ``generate``, for
the cases where wall-clock and GPU time per step part (issue #15's "no extra host time", #16's drafting loop)."""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path


def host_profile(llm, prompts: list[list[int]], decode_tokens: int, path: Path, rows: int = 60) -> None:
    """Write to ``path`` the functions of one greedy ``generate`` of ``decode_tokens`` tokens over ``prompts``,
    by cumulative and by own time, with call counts (a layer's Python running per step shows there: under a FULL
    CUDA graph its forward is not called at all)."""
    from vllm_volta_fp4.testing.greedy import generate_greedy

    profiler = cProfile.Profile()
    profiler.enable()
    generate_greedy(llm, prompts, decode_tokens)
    profiler.disable()
    text = io.StringIO()
    text.write(f"# one generate: {len(prompts)} prompt(s), {decode_tokens} tokens\n")
    for order in ("cumulative", "tottime"):
        pstats.Stats(profiler, stream=text).strip_dirs().sort_stats(order).print_stats(rows)
    path.write_text(text.getvalue())
