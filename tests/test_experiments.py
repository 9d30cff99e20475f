"""Comparing experiments, as a researcher does: three smoke experiments made by `dvc exp run`
in the workspace, `--temp` and `--queue` + `dvc queue start` (tests/conftest.py) all land in the
repo's one MLflow store, fully tagged; each model run holds a loadable MLflow model; and DVC's
own views (`dvc exp show`, `dvc metrics diff`, `dvc plots diff`) show the same numbers as
MLflow; and the real MLflow UI's compare page shows two of them side by side in headless Chromium
(tests/helpers/; tests/test_mlflow_browser.py checks that harness on synthetic runs).
The experiments are the session's `smoke_experiments` (tests/conftest.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import EXPERIMENTS, dvc, sh
from tests.helpers.verdicts import assert_clean_tags

pytestmark = pytest.mark.e2e

# The numbers a researcher compares first; each is in a DVC metrics file and in the MLflow run.
HEADLINE = {
    "metrics/eval.json": ("eval/test/model/cosine", "eval/test/model/group_top1", "eval/test/model/mrr"),
    "metrics/train.json": ("train/loss", "train/skipped_steps", "val/cosine"),
}


@pytest.fixture(scope="module")
def store(smoke_experiments):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{smoke_experiments.root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("energy-flow")
    runs = {}
    for name in EXPERIMENTS:
        found = client.search_runs([exp.experiment_id], f"tags.stage = 'train' and tags.`dvc.exp_name` = '{name}'")
        assert len(found) == 1, f"{name}: {len(found)} model runs"
        runs[name] = found[0]
    return client, exp, runs


def test_every_way_of_running_an_experiment_lands_in_the_one_store(smoke_experiments, store):
    client, exp, runs = store
    root = smoke_experiments.root
    head = sh(["git", "rev-parse", "HEAD"], root, smoke_experiments.env).strip()
    assert exp.artifact_location == (root / "mlruns").as_uri()
    for name, lr in EXPERIMENTS.items():
        run = runs[name]
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        assert run.info.status == "FINISHED", name
        assert params["train.lr"] == lr and params["model.lattice_width"] == "4", name  # whole config
        # Provenance: the baseline commit (a temp/queue copy runs on a private stash commit),
        # dirty because -S changed params.yaml, and the diff that made it so.
        assert tags["mlflow.source.git.commit"] == head and tags["dvc.exp_baseline"] == head, name
        assert tags["mlflow.source.git.dirty"] == "true" and len(tags["git.diff.sha256"]) == 16, name
        assert len(tags["dvc.lock.sha256"]) == 16 and tags["preset"] == "smoke", name
        assert len(tags["dvc.train.sha256"]) == 16, name  # what dvc.lock records for this train stage
        assert tags["device"] == "cpu" and tags["host"] and tags["torch.version"] == torch.__version__, name
        assert_clean_tags(tags)
        # The embed run it trained on is in the same store (for smoke-b and smoke-c DVC restored
        # the shards instead of embedding again, so it is smoke-a's).
        embed = client.get_run(tags["embed.run_id"])
        assert embed.data.tags["stage"] == "embed" and embed.data.tags["dataset.sha256"] == tags["dataset.sha256"]
        assert embed.inputs.dataset_inputs and embed.inputs.dataset_inputs[0].dataset.digest == tags["dataset.sha256"]
        # Curves, eval, system metrics.
        assert len(client.get_metric_history(run.info.run_id, "train/loss")) > 5, name
        assert math.isfinite(metrics["eval/test/model/cosine"]) and "stability/verdict_code" in metrics, name
        assert run.info.run_name == name and tags["stage.evaluate.status"] == "FINISHED", name
        assert run.inputs.dataset_inputs[0].dataset.name == "qa_pairs.csv shards", name
        assert metrics["system/cpu_utilization_percentage"] >= 0, name
        assert metrics["system/system_memory_usage_megabytes"] > 0, name
        # Artifacts outlive DVC's temporary copies: they are read back from the store.
        paths = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
        assert "report/stability.html" in paths, name
        patch = client.download_artifacts(run.info.run_id, "git/diff.patch", str(root / ".." / f"dl-{name}"))
        assert f"lr: {lr}" in open(patch).read() or name == "smoke-a", name
    assert not list(root.glob(".dvc/tmp/exps/**/mlflow.db")) and not list(root.glob(".dvc/tmp/exps/**/mlruns"))
    # Different train.lr, different train stage as DVC records it.
    assert len({runs[name].data.tags["dvc.train.sha256"] for name in EXPERIMENTS}) == len(EXPERIMENTS)


def _model_pt(root, rev: str, env):
    """The experiment's models/model.pt, read from DVC's cache at that experiment's revision."""
    from pipeline.model.model_file import load_model

    code = (
        "import sys, dvc.api; sys.stdout.buffer.write(dvc.api.read('models/model.pt', repo='.', rev=sys.argv[1], "
        "mode='rb'))"
    )
    raw = subprocess.run([sys.executable, "-c", code, rev], cwd=root, env=env, capture_output=True, check=True).stdout
    path = root / ".." / f"model-{rev}.pt"
    path.write_bytes(raw)
    return load_model(path)[0]


def test_the_logged_mlflow_model_reloads_and_predicts_exactly_like_the_dvc_model(smoke_experiments, store, tmp_path):
    import mlflow.pyfunc
    import mlflow.pytorch

    from pipeline.data.shards import open_split

    client, _, runs = store
    root = smoke_experiments.root
    mlflow.set_tracking_uri(client.tracking_uri)
    x = torch.as_tensor(np.asarray(open_split(root / "data/shards", "test").inputs[:40]), dtype=torch.float32)
    for name in ("smoke-a", "smoke-b"):
        uri = f"runs:/{runs[name].info.run_id}/model"
        signature = mlflow.models.get_model_info(uri).signature
        for spec in (signature.inputs.inputs[0], signature.outputs.inputs[0]):
            assert spec.type == np.dtype("float32") and spec.shape == (-1, 384), name
        reference = _model_pt(root, name, smoke_experiments.env)
        with torch.no_grad():
            expected = reference(x).pred
            got = mlflow.pytorch.load_model(uri)(x)
        assert torch.equal(got, expected), name
        pyfunc = mlflow.pyfunc.load_model(uri)
        assert np.array_equal(np.asarray(pyfunc.predict(x.numpy())), expected.numpy()), name
    # The model carries the pipeline package: it loads where this repository is not importable.
    elsewhere = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, mlflow.pytorch; mlflow.set_tracking_uri(sys.argv[1]); "
            "assert 'pipeline' not in sys.modules; m = mlflow.pytorch.load_model(sys.argv[2]); "
            "print(type(m).__module__, type(m).__name__)",
            client.tracking_uri,
            f"runs:/{runs['smoke-a'].info.run_id}/model",
        ],
        cwd=tmp_path,
        env={k: v for k, v in smoke_experiments.env.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    assert elsewhere.stdout.split()[-2:] == ["pipeline.tracking.logged_model", "EmbeddingPredictor"]
    # Different params, different models: the comparison is not of two copies.
    assert (
        runs["smoke-a"].data.metrics["eval/test/model/cosine"] != runs["smoke-b"].data.metrics["eval/test/model/cosine"]
    )


def _exp_show(root, env) -> dict:
    """name -> {metrics file -> {key: value}} from `dvc exp show --json`."""
    rows = json.loads(sh(dvc("exp", "show", "--json"), root, env))
    found = {}
    for baseline in rows:
        for branch in baseline.get("experiments") or []:
            for exp in branch.get("revs") or []:
                if exp.get("name") in EXPERIMENTS:
                    found[exp["name"]] = {f: d["data"] for f, d in (exp["data"].get("metrics") or {}).items()}
    return found


def test_dvc_exp_show_and_metrics_diff_list_the_headline_metrics_mlflow_has(smoke_experiments, store):
    _, _, runs = store
    root, env = smoke_experiments.root, smoke_experiments.env
    shown = _exp_show(root, env)
    assert set(shown) == set(EXPERIMENTS)
    diff = json.loads(sh(dvc("metrics", "diff", "smoke-a", "smoke-b", "--all", "--json"), root, env))
    for path, keys in HEADLINE.items():
        for key in keys:
            for name in EXPERIMENTS:
                assert shown[name][path][key] == pytest.approx(runs[name].data.metrics[key], rel=1e-12), (name, key)
            assert diff[path][key]["old"] == shown["smoke-a"][path][key], key
            assert diff[path][key]["new"] == shown["smoke-b"][path][key], key
    for name in EXPERIMENTS:
        assert shown[name]["metrics/stability.json"]["verdict"] == runs[name].data.tags["stability.verdict"]


def test_dvc_plots_diff_shows_both_experiments_training_curves(smoke_experiments, store, tmp_path):
    client, _, runs = store
    root, env = smoke_experiments.root, smoke_experiments.env
    proc = subprocess.run(
        dvc("plots", "diff", "smoke-a", "smoke-b", "--json"),
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr  # no plot whose file DVC lacks
    plots = json.loads(proc.stdout)["data"]
    (loss,) = plots["loss"]
    assert loss["revisions"] == ["smoke-a", "smoke-b"]
    for name in ("smoke-a", "smoke-b"):
        rows = loss["content"]["data"]["values"]
        curve = [(int(r["step"]), float(r["train/loss"])) for r in rows if r["rev"] == name]
        history = client.get_metric_history(runs[name].info.run_id, "train/loss")
        # DVC's curve is MLflow's curve (where the run's final figure, logged at the last step,
        # repeats the last row's loss).
        assert curve == sorted({(m.step, m.value) for m in history}), name
    # The report's PNGs are not DVC outputs (they show time and memory, which differ on every
    # run): they are in each run's MLflow artifacts instead.
    assert not any(k.startswith("reports/plots") for k in plots)
    out = tmp_path / "plots"
    sh(dvc("plots", "diff", "smoke-a", "smoke-b", "-o", str(out)), root, env)
    html = (out / "index.html").read_text()
    assert "smoke-a" in html and "smoke-b" in html and "train/loss" in html


def test_mlflow_ui_compare_page_shows_both_experiments_in_a_real_browser(smoke_experiments, store):
    """The real `mlflow server` over the project's store, its run-comparison page in headless
    Chromium: both model runs by name and id, the param that differs (train.lr) with both values
    on one row, shared params, and the headline metrics with both runs' values as the UI rounds
    them (the Metrics grid is scrolled through, as a person would). The screenshot, taken with
    "Show diff only" switched on, is kept in test-artifacts/mlflow-compare-smoke.png."""
    from pipeline.core.paths import REPO_ROOT
    from tests.helpers.browser import (
        GRID_ROWS_HEADING,
        SHOW_DIFF_ONLY_JS,
        compare_runs_url,
        format_metric,
        open_page,
    )
    from tests.helpers.mlflow_server import start_mlflow_server

    client, exp, runs = store
    pair = [runs["smoke-a"], runs["smoke-b"]]
    ids = [r.info.run_id for r in pair]
    lr = f"train.lr\t{EXPERIMENTS['smoke-a']}\t{EXPERIMENTS['smoke-b']}"
    metric_rows = [
        "\t".join([key, *(format_metric(r.data.metrics[key]) for r in pair)])
        for keys in HEADLINE.values()
        for key in keys
    ]
    with start_mlflow_server(client.tracking_uri, smoke_experiments.root / "served-artifacts") as base_url:
        text = open_page(
            compare_runs_url(base_url, exp.experiment_id, ids),
            expect=["Comparing 2 Runs from 1 Experiment", "smoke-a", "smoke-b", *ids, lr, *metric_rows],
            screenshot=REPO_ROOT / "test-artifacts" / "mlflow-compare-smoke.png",
            scroll_grids=True,
            before_screenshot=SHOW_DIFF_ONLY_JS,
        )  # the picture: what sets the two runs apart
    page, grid = text.split(GRID_ROWS_HEADING)
    lines = page.splitlines()
    assert lr in lines and "model.lattice_width\t4\t4" in lines and "run.preset\tsmoke\tsmoke" in lines
    assert "dvc.exp_name\tsmoke-a\tsmoke-b" in lines  # the tags, with the DVC experiment names
    rows = grid.strip().splitlines()
    assert set(metric_rows) <= set(rows)
    # Every metric of both runs is on the page, system metrics included.
    shown = {row.split("\t")[0] for row in rows}
    assert shown == set(pair[0].data.metrics) | set(pair[1].data.metrics)
    assert any(key.startswith("system/") for key in shown)
