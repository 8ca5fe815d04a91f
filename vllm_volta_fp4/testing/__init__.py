"""Tiny checkpoints made here and greedy generation through vLLM: what the demo runs, shared with the tests and
benchmarks."""
