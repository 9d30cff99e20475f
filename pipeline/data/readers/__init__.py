"""Dataset readers: `dataset.py` reads a dataset spec, one module per format, `checks.py` the rows."""
