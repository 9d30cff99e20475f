"""The trained model as a text-in, text-out service: an MLflow pyfunc that embeds a question with
the teacher, maps it with the model and returns the nearest texts of the answer bank
(pipeline/answer/; its modules: docs/architecture.md)."""
