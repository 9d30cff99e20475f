"""MLflow tracking: the store and runs (store.py), the logging sidecar and its replay, the logged
model, and the redaction of secrets from what is logged."""
