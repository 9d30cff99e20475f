"""The MLflow UI's run-comparison page, as a person sees it, for two synthetic runs.

This checks the harness in tests/helpers/ (real `mlflow server`, headless Chromium through
Playwright) on runs logged straight to a throwaway sqlite store, without the pipeline: both runs by
name, the parameter that differs with both values on one row, and each metric's latest value as
the UI formats it. The same server then shows a decision (pipeline/tracking/decisions.py) in the
decisions table, and arms against a baseline of record (pipeline/tracking/arms.py) in the arms
table, each in its saved view, and a logged model's page its description. The screenshots go to
test-artifacts/ (git-ignored) for a human to look at.

Needs Chromium, like tests/test_report_screenshot.py (`./dev test` installs Debian's package).
About 40 s on a 2-core machine: most of it is the server's start and the UI's page loads, so
it is in the slow set; the default suite drives the same harness on the real experiments
(tests/test_experiments.py).
"""

import pytest
from mlflow.tracking import MlflowClient

from pipeline.core.paths import REPO_ROOT
from tests.helpers.browser import QUIET_ASSISTANT_JS, compare_runs_url, format_metric, open_page
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


@pytest.mark.slow  # about 40 s (seven pages): the default suite keeps its 10 minutes
def test_compare_page_synthetic_runs(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # tmp_path is absolute: sqlite:////...
    experiment_id, run_ids = log_runs(uri, (tmp_path / "artifacts").as_uri())
    latest = {
        name: {key: format_metric(values[-1]) for key, values in metrics.items()} for name, (_, metrics) in RUNS.items()
    }
    assert latest["smoke-lr-a"]["test/cosine"] == "0.812"  # the UI rounds to 3 decimals
    assert latest["smoke-lr-b"]["test/cosine"] == "0.862"

    decisions_id, decision_run, arms_id = log_decision_and_arms(uri, tmp_path, experiment_id, run_ids)
    model_id = describe_a_model(uri, experiment_id, run_ids[0])

    with start_mlflow_server(uri, tmp_path / "served-artifacts") as base_url:
        check_decisions_and_arms_tables(uri, base_url, decisions_id, decision_run, arms_id)
        # A logged model's page opens on its description (pipeline/tracking/run_note.py), not "No description".
        text = open_page(
            f"{base_url}/#/experiments/{experiment_id}/models/{model_id}?workflowType=machine_learning",
            expect=["Description", "The answer model of the run", "smoke-lr-a"],
            screenshot=ARTIFACTS / "mlflow-model-description.png",
            init_script=QUIET_ASSISTANT_JS,
            height=700,
        )
        assert "No description" not in text
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


DECISION = {  # a ./dev decide result, cut to what the record reads (tests/test_tracking_decisions.py)
    "name": "smoke-lr-b",
    "metric": "cosine",
    "margin": 0.002,
    "outcome": "better",
    "a": {"label": "A", "overrides": ["preset=smoke"], "arm": {"digest": "aaaa", "name": "smoke"}, "seeds": [0]},
    "b": {
        "label": "B",
        "overrides": ["preset=smoke", "train.lr=0.01"],
        "arm": {"digest": "bbbb", "name": "smoke lr=0.01"},
        "seeds": [0],
    },
    "covers": "test items and training seeds (the smoke reference)",
    "looks": [{"rounds": 1}],
    "method": {"levels": {"1": 0.985, "2": 0.99}},
    "metrics": {
        "cosine": {"difference": 0.05, "ci_low": 0.03, "ci_high": 0.07, "prob_b_better": 1.0, "outcome": "better"}
    },
}


def log_decision_and_arms(uri: str, tmp_path, experiment_id: str, run_ids: list[str]) -> tuple[str, str, str]:
    """A decision of the two runs and their arms against the first as the baseline, in the store."""
    from pipeline.core.environment import temporary_env
    from pipeline.tracking.arms import log_arms
    from pipeline.tracking.decisions import SWITCH, log_decision
    from pipeline.tracking.views import ensure_arms_table_view

    page = tmp_path / "smoke-lr-b.html"
    page.write_text("<html><body>the decision page</body></html>")
    with temporary_env({"MLFLOW_TRACKING_URI": uri, SWITCH: "1"}):
        decisions_id, decision_run = log_decision(
            DECISION, "decide", files=[page], model_experiment="browser-synthetic"
        )
    client = MlflowClient(tracking_uri=uri)
    arms_id = client.create_experiment("browser-synthetic-arms", artifact_location=(tmp_path / "arms").as_uri())
    ensure_arms_table_view(client, arms_id, {})
    difference = {"difference": 0.05, "ci_low": 0.03, "ci_high": 0.07, "outcome": "better"}
    rows = [
        {
            "arm": {"digest": digest, "name": name},
            "run_ids": [run_id],
            "seeds": [0],
            "covers": "test items and training seeds",
            "means": {"cosine": {"value": mean, "ci_low": mean - 0.02, "ci_high": mean + 0.02}},
            "vs_baseline": {"cosine": difference} if digest == "bbbb" else {},
            "params": {**SHARED_PARAMS, **RUNS[run_name][0], "run.seed": "0"},
        }
        for (digest, name, mean), run_id, run_name in zip(
            (("aaaa", "smoke", 0.812), ("bbbb", "smoke lr=0.01", 0.862)), run_ids, RUNS
        )
    ]
    log_arms(client, experiment_id, arms_id, rows, "smoke [aaaa] (HEAD)")
    return decisions_id, decision_run, arms_id


def check_decisions_and_arms_tables(
    uri: str, base_url: str, decisions_id: str, decision_run: str, arms_id: str
) -> None:
    from pipeline.tracking.views import ARMS_TABLE_VIEW_KEY, DECISIONS_VIEW_KEY, runs_url
    from tests.helpers.browser import view_page

    # The decisions table: the decision's row with its outcome, metric, interval and change.
    view = view_page(
        runs_url(base_url, decisions_id, DECISIONS_VIEW_KEY),
        expect=["smoke-lr-b", "better", "cosine", "+0.050 [+0.030, +0.070]", "train.lr=0.01"],
        screenshot=ARTIFACTS / "mlflow-decisions-table.png",
        height=500,
        init_script=QUIET_ASSISTANT_JS,
    )
    assert f"/#/experiments/{decisions_id}/runs" in view.url, view.url
    # The decision's run: its page (and the result as JSON) as artifacts, the page previewed.
    open_page(
        f"{base_url}/#/experiments/{decisions_id}/runs/{decision_run}/artifacts/decision/smoke-lr-b.html",
        expect=["smoke-lr-b.html", "decision.json", "decision/smoke-lr-b.html"],
        screenshot=ARTIFACTS / "mlflow-decision-run.png",
        init_script=QUIET_ASSISTANT_JS,
    )
    # The arms table: one row per arm, its replicate count, its mean's interval, its difference.
    view = view_page(
        runs_url(base_url, arms_id, ARMS_TABLE_VIEW_KEY),
        expect=["smoke lr=0.01", "1 (seeds 0)", "0.862 [0.842, 0.882]", "+0.050 [+0.030, +0.070] better", "this is"],
        screenshot=ARTIFACTS / "mlflow-arms-table.png",
        height=500,
        init_script=QUIET_ASSISTANT_JS,
    )
    # Two arms compared: the plot is what differs between them (train.lr; not the seed, not an
    # arm's name) against the headline mean, the arm run's first metric.
    arm_runs = [r.info.run_id for r in MlflowClient(tracking_uri=uri).search_runs([arms_id])]
    view = view_page(
        compare_runs_url(base_url, arms_id, arm_runs),
        expect=["Parallel Coordinates Plot", "Parameters:", "Metrics:", "eval/test_cosine"],
        screenshot=ARTIFACTS / "mlflow-compare-arms.png",
        full_page=False,
        height=1000,
        init_script=QUIET_ASSISTANT_JS,
    )
    lines = view.text.splitlines()
    assert lines[lines.index("Parameters:") + 1] == "train.lr", lines[lines.index("Parameters:") :][:6]
    assert lines[lines.index("Metrics:") + 1] == "eval/test_cosine", lines[lines.index("Metrics:") :][:6]


def describe_a_model(uri: str, experiment_id: str, run_id: str) -> str:
    """A logged model of the run, described as the stages describe theirs: its id."""
    from mlflow.entities import LoggedModelOutput

    from pipeline.tracking.run_note import NOTE_TAG, model_note_text

    client = MlflowClient(tracking_uri=uri)
    model = client.create_logged_model(experiment_id, source_run_id=run_id, name="smoke-lr-a-model")
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, 0)])
    tags = client.get_run(run_id).data.tags
    client.set_logged_model_tags(model.model_id, {NOTE_TAG: model_note_text(tags, model.model_id)})
    return model.model_id
