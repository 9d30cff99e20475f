"""Shared infrastructure every stage uses: the config schema, errors, paths, atomic writes, CPU
numerics, process groups and lifetimes, where a stage may write, and reading what an earlier
stage wrote.
Nothing here imports torch at import time (stages pin the numerics before torch loads)."""
