"""Dataset handling: read (input, target) text pairs, split them, store embeddings as shards,
and feed shards to training in batches."""
