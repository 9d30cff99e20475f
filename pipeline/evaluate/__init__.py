"""The evaluate stage's library: retrieval over the answer bank against baselines, and the
nearest-text decoding of embeddings (its intervals come from pipeline/stats)."""
