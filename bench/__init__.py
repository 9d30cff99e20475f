"""Benchmarks: `python -m bench.<name>` prints one JSON object as its last line. Figures are
ratios measured in the same run (these machines are shared and noisy; absolute times drift)."""
