"""The trained model as a text-in, text-out service: an MLflow pyfunc that embeds a question with
the teacher, maps it with the model and returns the nearest texts of the answer bank
(pipeline/answer/).

- answering.py: the answer model, with no MLflow; answerer.py: the pyfunc (MLflow
  models-from-code: the file itself is the model's code);
- log.py: logs it into the active MLflow run, named after the run (models:/<model_id> serves it).
"""
