"""Benchmarks for fusebackend: eager, Inductor and fuse side by side (see ``benchmarks/README.md``).

``harness`` runs and times cases; ``memory_bound`` and ``models_bench`` define the suites;
``models/`` holds the self-contained models the model suite runs.
"""
