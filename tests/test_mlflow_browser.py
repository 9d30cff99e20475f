"""The MLflow UI's run-comparison page, as a person sees it, for two synthetic runs.

This checks the harness in tests/helpers/ (real `mlflow server`, headless Chromium through
Playwright) on runs logged straight to a throwaway sqlite store, without the pipeline: both runs by
name, the parameter that differs with both values on one row, and each metric's latest value as
the UI formats it. The screenshot goes to test-artifacts/ (git-ignored) for a human to look at.

Needs Chromium, like tests/test_report_screenshot.py (`./dev test` installs Debian's package).
About 15-25 s on a 2-core machine: most of it is the server's start and the UI's first load, so
it is in the slow set; the default suite drives the same harness on the real experiments
(tests/test_experiments.py).
"""

import pytest
from mlflow.tracking import MlflowClient

from pipeline.core.paths import REPO_ROOT
from tests.helpers.browser import compare_runs_url, format_metric, open_page
from tools.servers import start_mlflow_server

pytestmark = pytest.mark.integration

ARTIFACTS = REPO_ROOT / "test-artifacts"
SHARED_PARAMS = {"train.epochs": "3", "model.hidden": "64", "data.seed": "0"}
RUNS = {  # run name -> (the differing param, metrics by step)
    "smoke-lr-a": ({"train.lr": "0.003"}, {"train/loss": [1.5, 0.9, 0.61234], "test/cosine": [0.812345]}),
    "smoke-lr-b": ({"train.lr": "0.01"}, {"train/loss": [1.4, 0.7, 0.456789], "test/cosine": [0.86249]}),
}


def log_runs(uri: str, artifacts_uri: str) -> tuple[str, list[str]]:
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("browser-synthetic", artifact_location=artifacts_uri)
    run_ids = []
    for name, (params, metrics) in RUNS.items():
        run_id = client.create_run(experiment_id, run_name=name).info.run_id
        for key, value in {**SHARED_PARAMS, **params}.items():
            client.log_param(run_id, key, value)
        for key, values in metrics.items():
            for step, value in enumerate(values):
                client.log_metric(run_id, key, value, step=step)
        client.set_terminated(run_id)
        run_ids.append(run_id)
    return experiment_id, run_ids


@pytest.mark.slow  # 14-16 s: the default suite keeps its 10 minutes
def test_compare_page_synthetic_runs(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # tmp_path is absolute: sqlite:////...
    experiment_id, run_ids = log_runs(uri, (tmp_path / "artifacts").as_uri())
    latest = {
        name: {key: format_metric(values[-1]) for key, values in metrics.items()} for name, (_, metrics) in RUNS.items()
    }
    assert latest["smoke-lr-a"]["test/cosine"] == "0.812"  # the UI rounds to 3 decimals
    assert latest["smoke-lr-b"]["test/cosine"] == "0.862"

    with start_mlflow_server(uri, tmp_path / "served-artifacts") as base_url:
        url = compare_runs_url(base_url, experiment_id, run_ids)
        values = [v for by_key in latest.values() for v in by_key.values()]
        text = open_page(
            url,
            expect=[
                "Comparing 2 Runs from 1 Experiment",
                *RUNS,
                *run_ids,
                "train.lr",
                "test/cosine",
                "train/loss",
                *values,
            ],
            screenshot=ARTIFACTS / "mlflow-compare-synthetic.png",
        )

    lines = text.splitlines()
    # Parameters: one row per key, tab-separated, runs in the URL's order.
    assert "train.lr\t0.003\t0.01" in lines, text
    for key, value in SHARED_PARAMS.items():
        assert f"{key}\t{value}\t{value}" in lines, text
    # Metrics: the table's text lists the keys first, then the values row by row (latest step).
    metrics = text[text.index("\nMetrics\n") :]
    order = sorted(latest["smoke-lr-a"])  # the page sorts the keys
    expected = [*order, *(latest[name][key] for key in order for name in RUNS)]
    assert "\n".join(expected) in metrics, metrics[:500]
