"""MLflow tracking: the store and runs (store.py), the train stage's metric buffer on MLflow's
asynchronous queue and its replay, the logged model, and the redaction of secrets from what is logged."""
