"""Learned baselines: rivals trained on the model's own data, loss and schedule (docs/evaluation.md)."""
