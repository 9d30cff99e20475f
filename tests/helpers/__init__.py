"""What several tests share: a real `mlflow server` on a loopback port (mlflow_server.py) and the
MLflow UI's pages opened in headless Chromium through Playwright (browser.py)."""
