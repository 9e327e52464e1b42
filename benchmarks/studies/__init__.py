"""One-off studies: measurements behind a design choice, kept runnable. ``benchmarks/README.md`` lists them."""
