"""Experiment statistics and decisions: the bootstrap over test items, the seeds' luck, intervals
that cover both, the decision between two arms (one look or a sequence of them), the ranking of a
sweep's arms, and where the item tables they read come from. The evaluate stage uses the first
ones; tools/ (compare, decide, seeds) are the command lines on the rest."""
