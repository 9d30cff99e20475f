"""Benchmarks: `python -m bench.<name>` prints one JSON object as its last line; --save also writes
bench/results/<name>.json (docs/benchmarks.md)."""
