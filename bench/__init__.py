"""Benchmarks: `python -m bench.<name>` prints one JSON object as its last line; with --save it
also writes bench/results/<name>.json, the committed source of the figures docs quote
(bench/results.py, bench/figures.py). Figures are ratios measured in the same run, in this
process's CPU seconds where they compare arms of one process (bench/clock.py): these machines
are shared, and wall time moves with the neighbours."""
