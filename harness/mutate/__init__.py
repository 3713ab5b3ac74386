"""hicache-fuzz mutate: mutation testing of sglang's HiCache transfer sources (see docs/mutate.md).

Self-contained: it imports nothing of the campaign internals; it runs the campaign as a subprocess."""
