"""CUDA-event timing shared by the kernel benchmarks (imported as a sibling: the scripts run from benchmarks/)."""

from __future__ import annotations

import statistics

import torch

# ~2 ms of GPU spin at 2 GHz (~3 ms on a V100): longer than the host needs to issue any one benchmarked call.
LAUNCH_COVER_CYCLES = 4_000_000


def median_ms(fn, repeats: int, warmup: int = 3, hide_launch: bool = False) -> float:
    """Median milliseconds of ``repeats`` event-timed calls of ``fn`` after ``warmup`` untimed ones.

    With ``hide_launch`` a GPU spin is queued before each timed call, so that the host's work for the call (Python
    wrappers, Triton's launcher, op dispatch) overlaps the spin and the events measure the call's GPU time, as
    under CUDA graphs; a call that waits for the GPU itself still counts the host time after the wait."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hide_launch:
            torch.cuda._sleep(LAUNCH_COVER_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
