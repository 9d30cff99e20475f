"""Answering a question from the answer bank, as both the evaluate stage (which measures it) and
the served model (pipeline/serve/) do it, so that neither imports the other (its modules:
docs/architecture.md)."""
