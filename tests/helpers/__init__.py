"""What several tests share: the MLflow UI's pages opened in headless Chromium through Playwright
(browser.py), fake stage inputs and synthetic data. The real `mlflow server` the UI tests start
is tools/servers.py (benchmarks use it too); the per-flow reference model the model
is held to is bench/reference_model.py (bench.model times it)."""
