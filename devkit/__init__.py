"""Development aids shared by the tests and benchmarks (not installed): random kernel batches, engine internals,
the fp16-safety probe."""
