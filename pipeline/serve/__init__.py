"""The trained model as a text-in, text-out service: an MLflow pyfunc that embeds a question with
the teacher, maps it with the model and returns the nearest texts of the answer bank.

- bank.py: the answer bank (every distinct target text with its teacher vector) in a file with no
  pickle, and its digest;
- answerer.py: the pyfunc (MLflow models-from-code: the file itself is the model's code);
- log.py: logs it into the active MLflow run, named after the run (models:/<model_id> serves it).
"""
