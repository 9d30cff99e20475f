"""The embed stage's library: the sentence-transformers teacher, the embedding of a dataset into
shards, the content-addressed embedding cache, and the multi-process embedding."""
