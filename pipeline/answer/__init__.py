"""Answering a question from the answer bank, as both the evaluate stage (which measures it) and
the served model (pipeline/serve/) do it, so that neither imports the other:

- bank.py: the bank (every distinct target text with its teacher vector, and its group), built
  from the shards, and its file with no pickle and its digest;
- prediction.py: a model's predictions, batch by batch;
- ranking.py: the k nearest distinct facts of the bank;
- confidence.py: the rule that says whether the top answer can be trusted, and its file.
"""
