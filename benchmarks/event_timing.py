"""CUDA-event timing shared by the kernel benchmarks (imported as a sibling: the scripts run from benchmarks/)."""

from __future__ import annotations

import statistics

import torch


def median_ms(fn, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of ``repeats`` event-timed calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
