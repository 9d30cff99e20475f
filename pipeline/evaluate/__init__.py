"""The evaluate stage's library: retrieval over the answer bank against baselines, bootstrap
confidence intervals, and the nearest-text decoding of embeddings."""
