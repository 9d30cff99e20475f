"""Comparing experiments, as a researcher does: three smoke experiments made by `dvc exp run`
in the workspace, `--temp` and `--queue` + `dvc queue start` (tests/conftest.py) all land in the
repo's one MLflow store, fully tagged; each model run holds a loadable MLflow model; and DVC's
own views (`dvc exp show`, `dvc metrics diff`, `dvc plots diff`) show the same numbers as
MLflow; and the real MLflow UI shows them in headless Chromium, through one `mlflow server`: the
runs table `./dev ui` links to (eval columns, best first), the compare page (two of them side by
side, and what differs) and a logged model's page (its dataset and eval metrics); screenshots in
test-artifacts/ (tests/helpers/; tests/test_mlflow_browser.py checks that harness on synthetic runs).
The experiments are the session's `smoke_experiments` (tests/conftest.py); the slow tier runs them."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from pipeline.tracking.metric_names import mlflow_key
from tests.conftest import EXPERIMENTS, dvc, sh
from tests.helpers.verdicts import assert_clean_tags

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # reads the three smoke experiments (three smoke runs to make)

# The numbers a researcher compares first; each is in a DVC metrics file (under its file key) and
# in the MLflow run (under mlflow_key's name).
HEADLINE = {
    "metrics/eval.json": ("eval/test/model/cosine", "eval/test/model/group_top1", "eval/test/model/mrr"),
    "metrics/train.json": ("train/loss", "train/skipped_steps", "val/cosine"),
}
DATASET = "qa_pairs.csv · 600 pairs · smoke"  # the smoke preset's shards, as the Dataset column names them


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
        # Curves, eval, system metrics (under machine/: the run page would list system/* first).
        assert len(client.get_metric_history(run.info.run_id, "curves/loss")) > 5, name
        assert math.isfinite(metrics["eval/test_cosine"]) and "stability/verdict_code" in metrics, name
        assert run.info.run_name == name and tags["stage.evaluate.status"] == "FINISHED", name
        assert run.inputs.dataset_inputs[0].dataset.name == DATASET, name
        assert metrics["machine/cpu_percent"] >= 0, name
        assert metrics["machine/memory_percent"] > 0, name
        # Readable in ten seconds: at most 60 metrics, one chart section each prefix, the
        # overrides with preset, the intervals as tags.
        assert len(metrics) <= 60 and all(k.count("/") == 1 for k in metrics), sorted(metrics)
        overrides = "preset=smoke" + ("" if name == "smoke-a" else f" train.lr={float(lr)!r}")  # smoke-a: its lr
        assert tags["run.overrides"] == overrides, (name, tags["run.overrides"])
        assert tags["eval.test.group_top1"].startswith(f"{metrics['eval/test_group_top1']:.3f} ["), name
        # Artifacts outlive DVC's temporary copies: they are read back from the store.
        paths = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
        assert "report/stability.html" in paths, name
        patch = client.download_artifacts(run.info.run_id, "git/diff.patch", str(root / ".." / f"dl-{name}"))
        assert f"lr: {lr}" in open(patch).read() or name == "smoke-a", name
    assert not list(root.glob(".dvc/tmp/exps/**/mlflow.db")) and not list(root.glob(".dvc/tmp/exps/**/mlruns"))
    # Different train.lr, different train stage as DVC records it.
    assert len({runs[name].data.tags["dvc.train.sha256"] for name in EXPERIMENTS}) == len(EXPERIMENTS)


def _dvc_read(root, path: str, rev: str, env) -> bytes:
    """A DVC output at that experiment's revision, read from DVC's cache."""
    code = (
        "import sys, dvc.api; sys.stdout.buffer.write(dvc.api.read(sys.argv[1], repo='.', rev=sys.argv[2], mode='rb'))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, path, rev], cwd=root, env=env, capture_output=True, check=True
    ).stdout


def test_each_run_logs_the_answer_model_it_was_evaluated_as(smoke_experiments, store, tmp_path):
    """The logged model of each experiment's run is its own trained model as a text-in, text-out
    pyfunc: its model file is the experiment's models/model.pt, its bank the one evaluate scored
    (the run's eval.bank_sha256), and asked the test questions it gives the evaluate stage's own
    ranking (reports/eval_items.parquet of that experiment), one text per fact. It loads where this repository
    is not importable (the pipeline package travels with it) and holds no pickle."""
    import hashlib

    import mlflow.pyfunc
    import pandas as pd

    from pipeline.answer.bank import build_bank
    from pipeline.data.shards import open_split

    client, _, runs = store
    root = smoke_experiments.root
    mlflow.set_tracking_uri(client.tracking_uri)
    splits = [open_split(root / "data/shards", s) for s in ("train", "val", "test")]
    bank = build_bank(splits)
    text_of = dict(zip(bank.ids, bank.texts))
    group_of = dict(zip(bank.ids, bank.groups))  # each text's fact, as the answer model groups them
    questions = [str(q) for q in splits[2].input_texts]
    for name in ("smoke-a", "smoke-b"):
        run = runs[name]
        (output,) = run.outputs.model_outputs  # one model per run
        # Named after its run and preset (the Models tab lists them apart), found by its id.
        assert client.get_logged_model(output.model_id).name == f"{name}-{run.info.run_id[:8]}", name
        uri = f"models:/{output.model_id}"
        info = mlflow.models.get_model_info(uri)
        assert info.signature.inputs.input_names() == ["question"], name
        assert info.metadata["bank_sha256"] == run.data.tags["eval.bank_sha256"], name
        model_pt = _dvc_read(root, "models/model.pt", name, smoke_experiments.env)
        assert info.metadata["model_sha256"] == hashlib.sha256(model_pt).hexdigest(), name
        assert [o.model_id for o in run.outputs.model_outputs] == [info.model_id], name  # one model per run
        items_path = tmp_path / f"{name}-items.parquet"
        items_path.write_bytes(_dvc_read(root, "reports/eval_items.parquet", name, smoke_experiments.env))
        items = pd.read_parquet(items_path)
        assert items["input"].tolist() == questions, name
        got = mlflow.pyfunc.load_model(uri).predict(pd.DataFrame({"question": questions}), params={"k": 5})
        # Its answers are evaluate's ranking with one text per fact: the first text of each fact
        # among evaluate's top 5 (in that order) leads the model's 5 distinct facts.
        for answers, top5 in zip(got["answers"].tolist(), items["top5"]):
            firsts, seen = [], set()
            for i in top5:
                if group_of[i] not in seen:
                    seen.add(group_of[i])
                    firsts.append(text_of[i])
            assert list(answers[: len(firsts)]) == firsts, name
            assert len({bank.groups[bank.index[a]] for a in answers}) == len(answers) == 5, name
    # It loads where this repository is not importable, with no pickle.
    elsewhere = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, mlflow, pandas as pd; mlflow.set_tracking_uri(sys.argv[1]); "
            "m = mlflow.pyfunc.load_model(sys.argv[2]); "
            "print(m.predict(pd.DataFrame({'question': ['What is the capital of France?']}), params={'k': 1})"
            "['answers'][0][0]); print(sys.modules['pipeline'].__file__)",
            client.tracking_uri,
            f"models:/{runs['smoke-a'].outputs.model_outputs[0].model_id}",
        ],
        cwd=tmp_path,
        env={k: v for k, v in smoke_experiments.env.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    answer, package = elsewhere.stdout.strip().splitlines()[-2:]
    # The package is the model's own copy (models:/ on a local store loads from the store's
    # directory, which may lie under the project; never the project's pipeline/ itself).
    assert answer in bank.texts and "/code/pipeline/" in package
    assert not package.startswith(str(root / "pipeline") + "/"), package
    # Different params, different models: the comparison is not of two copies.
    assert runs["smoke-a"].data.metrics["eval/test_cosine"] != runs["smoke-b"].data.metrics["eval/test_cosine"]


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
                logged = runs[name].data.metrics[mlflow_key(key)]
                assert shown[name][path][key] == pytest.approx(logged, rel=1e-12), (name, key)
            assert diff[path][key]["old"] == shown["smoke-a"][path][key], key
            assert diff[path][key]["new"] == shown["smoke-b"][path][key], key
    for name in EXPERIMENTS:
        stability = shown[name]["metrics/stability.json"]
        warned = any(isinstance(c, dict) and c.get("status") == "warn" for c in stability.values())
        headline = "stable, with warnings" if stability["verdict"] == "stable" and warned else stability["verdict"]
        assert headline == runs[name].data.tags["stability.verdict"], name


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
        history = client.get_metric_history(runs[name].info.run_id, "curves/loss")
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


@pytest.fixture(scope="module")
def mlflow_ui(smoke_experiments, store):
    """One real `mlflow server` over the project's store for this module's browser tests (a start
    takes 6-15 s on 2 cores): its base URL."""
    from tools.servers import start_mlflow_server

    client, _, _ = store
    with start_mlflow_server(client.tracking_uri, smoke_experiments.root / "served-artifacts") as base_url:
        yield base_url


def _shards_digest(runs) -> str:
    """The digest of the model runs' dataset (the shards' manifest), one for all three runs."""
    digests = set()
    for name, run in runs.items():
        (dataset_input,) = run.inputs.dataset_inputs
        assert dataset_input.dataset.name == DATASET, name
        digests.add(dataset_input.dataset.digest)
    (digest,) = digests
    assert len(digest) == 16 and int(digest, 16) >= 0
    return digest


def test_mlflow_ui_compare_page_shows_both_experiments_in_a_real_browser(store, mlflow_ui):
    """The real `mlflow server` over the project's store, its run-comparison page in headless
    Chromium: both model runs by name and id, the param that differs (train.lr) with both values
    on one row, shared params, and the headline metrics with both runs' values as the UI rounds
    them (the Metrics grid is scrolled through, as a person would). Then "Show diff only" switched
    on: the eval metrics that differ stay, both values on one row, the equal ones (eval/bank_size)
    and the equal params go. The screenshot, taken with the diff on, is kept in
    test-artifacts/mlflow-compare-smoke.png."""
    from pipeline.core.paths import REPO_ROOT
    from tests.helpers.browser import (
        GRID_ROWS_HEADING,
        QUIET_ASSISTANT_JS,
        SHOW_DIFF_ONLY_JS,
        compare_runs_url,
        format_metric,
        view_page,
    )

    client, exp, runs = store
    pair = [runs["smoke-a"], runs["smoke-b"]]
    ids = [r.info.run_id for r in pair]
    lr = f"train.lr\t{EXPERIMENTS['smoke-a']}\t{EXPERIMENTS['smoke-b']}"
    metric_rows = [
        "\t".join([mlflow_key(key), *(format_metric(r.data.metrics[mlflow_key(key)]) for r in pair)])
        for keys in HEADLINE.values()
        for key in keys
    ]
    view = view_page(
        compare_runs_url(mlflow_ui, exp.experiment_id, ids),
        expect=["Comparing 2 Runs from 1 Experiment", "smoke-a", "smoke-b", *ids, lr, *metric_rows],
        screenshot=REPO_ROOT / "test-artifacts" / "mlflow-compare-smoke.png",
        scroll_grids=True,
        before_screenshot=SHOW_DIFF_ONLY_JS,  # the picture: what sets the two runs apart
        init_script=QUIET_ASSISTANT_JS,
    )
    page, grid = view.text.split(GRID_ROWS_HEADING)
    lines = page.splitlines()
    assert lr in lines and "model.lattice_width\t4\t4" in lines and "run.preset\tsmoke\tsmoke" in lines
    assert "dvc.exp_name\tsmoke-a\tsmoke-b" in lines  # the tags, with the DVC experiment names
    rows = grid.strip().splitlines()
    assert set(metric_rows) <= set(rows)
    # Every metric of both runs is on the page, system metrics included.
    shown = {row.split("\t")[0] for row in rows}
    assert shown == set(pair[0].data.metrics) | set(pair[1].data.metrics)
    assert any(key.startswith("machine/") for key in shown)

    # Show diff only: the eval metrics that differ, each with both values on one row; the equal
    # ones hidden (the baselines do not depend on the model: same data, same scores), and the
    # equal params.
    a, b = (r.data.metrics for r in pair)
    evals = sorted(k for k in a.keys() & b.keys() if k.startswith("eval"))
    differ = [k for k in evals if a[k] != b[k]]
    same = [k for k in evals if a[k] == b[k]]
    assert "eval/test_cosine" in differ and "eval_baselines/ridge_group_top1" in same
    diff_page, diff_grid = view.text_after.split(GRID_ROWS_HEADING)
    diff_rows = diff_grid.strip().splitlines()
    for key in differ:
        assert f"{key}\t{format_metric(a[key])}\t{format_metric(b[key])}" in diff_rows, key
    assert not {row.split("\t")[0] for row in diff_rows} & set(same)
    diff_lines = diff_page.splitlines()
    assert lr in diff_lines and "model.lattice_width\t4\t4" not in diff_lines


# Where the run page's parts are, for the "first screen" checks: the description's headline
# paragraph (the box shows its first lines, "Show more" the rest) and the Metrics table's loss.
_RUN_PAGE_JS = """() => {
  const box = r => r && r.getBoundingClientRect();
  const headline = [...document.querySelectorAll('p')].find(e => e.innerText.startsWith('Test ('));
  const more = [...document.querySelectorAll('button, a, span')].find(e => e.innerText.trim() === 'Show more');
  const loss = [...document.querySelectorAll('a')].find(e => e.innerText.trim() === 'curves/loss');
  return {headline: box(headline)?.bottom ?? null, more: box(more)?.top ?? null,
          loss: box(loss)?.bottom ?? null, height: innerHeight};
}"""


def test_mlflow_ui_run_page_opens_on_the_headline_and_the_training_curves(store, mlflow_ui):
    """smoke-b's run page in headless Chromium, as a researcher opens it (1600 x 1000, no
    scrolling). Overview: the description's first paragraph (what the collapsed box shows) gives
    test group top-1, cosine and the difference from ridge, each with its 95 % interval, and the
    verdict; the Metrics table starts with the training curves (the loss first), on screen. Model
    metrics: the first chart section is `curves`, line charts of loss, val loss and cosine,
    gradient norm, update ratio, step time and lr, the other sections after it, each named for
    what it shows. Screenshots: test-artifacts/mlflow-run-page-overview.png and
    test-artifacts/mlflow-run-page-curves.png."""
    import re

    from pipeline.core.paths import REPO_ROOT
    from tests.helpers.browser import QUIET_ASSISTANT_JS, view_page

    client, exp, runs = store
    run = runs["smoke-b"]
    tags = run.data.tags
    headline = [tags[t] for t in ("eval.test.group_top1", "eval.test.cosine", "eval.test.vs_ridge.group_top1")]
    page = f"{mlflow_ui}/#/experiments/{exp.experiment_id}/runs/{run.info.run_id}"
    view = view_page(
        page,
        expect=["Description", *headline, f"Stability: {tags['stability.verdict']}", "curves/loss"],
        screenshot=REPO_ROOT / "test-artifacts" / "mlflow-run-page-overview.png",
        full_page=False,
        height=1000,
        init_script=QUIET_ASSISTANT_JS,
        read_js=_RUN_PAGE_JS,
    )
    where = view.read
    # The headline is in the description's visible lines, and the loss row in the window.
    assert where["headline"] is not None and where["headline"] <= (where["more"] or where["height"]), where
    assert where["loss"] is not None and where["loss"] <= where["height"], where
    # The table's first row (after its headers: Metric, Value, and Models where the run has one).
    table = [line for line in view.text.split("\nMetric\nValue\n", 1)[1].splitlines() if "/" in line]
    assert table[0] == "curves/loss", table[:6]
    assert f"Metrics ({len(run.data.metrics)})" in view.text and len(run.data.metrics) <= 60

    view = view_page(
        f"{page}/model-metrics",
        expect=["curves", "(7)", "loss", "grad_norm", "update_ratio", "val_cosine", "Step"],
        screenshot=REPO_ROOT / "test-artifacts" / "mlflow-run-page-curves.png",
        full_page=False,
        height=1000,
        init_script=QUIET_ASSISTANT_JS,
    )
    lines = view.text.splitlines()
    # A section's header is its name, then its chart count on the next line: "curves", "(7)".
    sections = [name for name, count in zip(lines, lines[1:]) if re.fullmatch(r"\(\d+\)", count)]
    assert sections[0] == "curves" and lines[lines.index("curves") + 1] == "(7)", sections
    named = [name for name in sections if name != "Model metrics"]  # (MLflow's own, for keys with no "/": empty)
    assert named == sorted(named) and "eval" in named and "System metrics" not in sections, sections
    # Line charts (the x axis is the step), each legend naming the run and the curve.
    assert "smoke-b (curves/loss)" in view.text


def test_mlflow_ui_compare_page_opens_on_a_plot_of_the_lr_against_the_loss(store, mlflow_ui):
    """The compare page of two runs that differ in train.lr opens on MLflow's parallel-coordinates
    plot of the params that differ against the first metric both runs have (in the order the
    store first saw them): train.lr against the training loss, not the CPU use the system
    sampler used to log first. The screenshot is test-artifacts/mlflow-compare-default-plot.png."""
    from pipeline.core.paths import REPO_ROOT
    from tests.helpers.browser import QUIET_ASSISTANT_JS, compare_runs_url, view_page

    client, exp, runs = store
    ids = [runs[name].info.run_id for name in ("smoke-a", "smoke-b")]
    view = view_page(
        compare_runs_url(mlflow_ui, exp.experiment_id, ids),
        expect=["Parallel Coordinates Plot", "Parameters:", "Metrics:", "curves/loss"],
        screenshot=REPO_ROOT / "test-artifacts" / "mlflow-compare-default-plot.png",
        full_page=False,
        height=1000,
        init_script=QUIET_ASSISTANT_JS,
    )
    lines = view.text.splitlines()
    assert lines[lines.index("Parameters:") + 1] == "train.lr", lines[lines.index("Parameters:") :][:6]
    assert lines[lines.index("Metrics:") + 1] == "curves/loss", lines[lines.index("Metrics:") :][:6]


def test_dev_ui_link_opens_the_runs_table_with_the_eval_columns_best_first(store, mlflow_ui):
    """The link `./dev ui` prints (views.runs_url) in headless Chromium: the runs table, not the
    GenAI overview MLflow 3.17 lands on by default, in the saved view "Evaluation": the three runs
    by name, test group top-1 as the table prints it (unrounded), the headline intervals (tags:
    value and 95 % interval in one cell), the stability verdict, the preset, the dataset (name and
    digest) and the logged model, rows sorted by test group top-1, best first. The screenshot is
    kept in test-artifacts/mlflow-runs-table.png."""
    from pipeline.core.paths import REPO_ROOT
    from pipeline.tracking.views import runs_url
    from tests.helpers.browser import QUIET_ASSISTANT_JS, RUNS_TABLE_ROWS_JS, js_number, view_page

    client, exp, runs = store
    digest = _shards_digest(runs)
    columns = ("eval/test_group_top1",)
    intervals = ("eval.test.group_top1", "eval.test.cosine", "eval.test.vs_ridge.group_top1")
    values = [js_number(run.data.metrics[key]) for run in runs.values() for key in columns]
    values += [run.data.tags[tag] for run in runs.values() for tag in intervals]
    view = view_page(
        runs_url(mlflow_ui, exp.experiment_id),
        expect=[
            "You're viewing a shared view",
            *EXPERIMENTS,
            *columns,
            "stability.verdict",
            "preset",
            "Dataset",
            "Models",
            f"{DATASET} ({digest})",
            *values,
        ],
        screenshot=REPO_ROOT / "test-artifacts" / "mlflow-runs-table.png",
        # A laptop's width: the grid renders only the columns in view, and the view is sized so
        # that the eval columns, the verdict, Dataset and Models are all drawn at it.
        width=1600,
        height=700,
        init_script=QUIET_ASSISTANT_JS,
        # The cells, and where each column's header ends (the grid keeps a few columns beyond
        # the window in the page, so a cell being there does not mean it is seen).
        read_js=f"""() => ({{rows: ({RUNS_TABLE_ROWS_JS})(), width: window.innerWidth,
            right: Object.fromEntries([...document.querySelectorAll('[role=columnheader][col-id]')]
                .map(h => [h.getAttribute('col-id'), h.getBoundingClientRect().right]))}})""",
    )
    rows = view.read["rows"]
    # Everything up to the logged model is on screen at a laptop's width, without scrolling.
    for column in ("attributes.`Dataset`", "attributes.`Models`", "tags.`stability.verdict`", "tags.`preset`"):
        assert 0 < view.read["right"][column] <= view.read["width"], (column, view.read["right"])
    # The runs tab of the model experiment (the app rewrites the URL with the view's sort).
    assert f"/#/experiments/{exp.experiment_id}/runs?" in view.url and "/overview" not in view.url, view.url
    assert "orderByKey=metrics.%60eval%2Ftest_group_top1%60&orderByAsc=false" in view.url, view.url
    # (Other modules' runs may share the store: tests/test_e2e.py repros in the same project,
    # and its runs are named after the preset and their overrides, e.g. "smoke epochs=1".)
    names = [row["attributes.`Run Name`"].splitlines()[-1] for row in rows]
    assert set(EXPERIMENTS) <= set(names), rows
    for name, row in zip(names, rows):
        if name not in EXPERIMENTS:
            continue
        run = runs[name]
        for key in columns:
            assert row[f"metrics.`{key}`"] == js_number(run.data.metrics[key]), (name, key, row)
        for tag in (*intervals, "stability.verdict", "preset"):
            assert row[f"tags.`{tag}`"] == run.data.tags[tag], (name, tag, row)
        assert row["attributes.`Dataset`"].splitlines()[:2] == [f"{DATASET} ({digest})", "Training"], row
        (output,) = run.outputs.model_outputs
        assert row["attributes.`Models`"] == client.get_logged_model(output.model_id).name, (name, row)
    # Best group top-1 first (runs without one, e.g. a killed train stage's, come last).
    shown = [row["metrics.`eval/test_group_top1`"] for row in rows]
    top1 = [float(v) for v in shown if v != "-"]
    assert top1 == sorted(top1, reverse=True) and shown[: len(top1)] == [v for v in shown if v != "-"], shown


def test_dev_ui_arms_link_groups_the_runs_by_arm_with_their_count(store, mlflow_ui):
    """`./dev ui`'s second link (views.runs_url(..., "arms")) in headless Chromium: the same table
    grouped by the tag `arm`: a row per arm, named after it, with the number of its runs (the
    replicates: runs that differ only in the seed). The three smoke experiments differ in
    train.lr: three arms, one run each. The screenshot is kept in test-artifacts/mlflow-arms.png."""
    from pipeline.core.paths import REPO_ROOT
    from pipeline.tracking.views import ARMS_VIEW_KEY, runs_url
    from tests.helpers.browser import QUIET_ASSISTANT_JS, view_page

    client, exp, runs = store
    arms = {run.data.tags["arm"] for run in runs.values()}
    assert len(arms) == len(EXPERIMENTS)  # another lr: another arm
    view = view_page(
        runs_url(mlflow_ui, exp.experiment_id, ARMS_VIEW_KEY),
        expect=["Group by: arm", *(f"Group: {arm}" for arm in arms), *EXPERIMENTS],
        screenshot=REPO_ROOT / "test-artifacts" / "mlflow-arms.png",
        width=1600,
        height=700,
        init_script=QUIET_ASSISTANT_JS,
    )
    for arm in arms:
        # The group's row: its name, then its run count (other modules may add runs of one arm).
        line = next(line for line in view.text.splitlines() if line == f"Group: {arm}")
        after = view.text.splitlines()[view.text.splitlines().index(line) + 1]
        assert after.isdigit() and int(after) >= 1, (arm, after)


def test_mlflow_ui_logged_model_page_shows_its_dataset_and_eval_metrics(store, mlflow_ui):
    """smoke-a's logged model (the Models tab's row) in headless Chromium: the run it came from,
    the dataset it was trained and evaluated on (MLflow writes the digest with a "#" on this
    page), and its eval metrics, each tied to that dataset, with the run's values unrounded. The
    screenshot, with the metrics searched for "eval/test_", is kept in
    test-artifacts/mlflow-model-page.png."""
    from pipeline.core.paths import REPO_ROOT
    from tests.helpers.browser import QUIET_ASSISTANT_JS, js_number, type_into_js, view_page

    client, exp, runs = store
    run = runs["smoke-a"]
    (output,) = run.outputs.model_outputs
    model = client.get_logged_model(output.model_id)
    dataset = f"{DATASET} (#{_shards_digest(runs)})"
    key = "eval/test_group_top1"
    # A row of the Metrics table: Metric | Dataset | Source run | Value.
    row = "\n".join([key, dataset, "smoke-a", js_number(run.data.metrics[key])])
    view = view_page(
        f"{mlflow_ui}/#/experiments/{exp.experiment_id}/models/{model.model_id}?workflowType=machine_learning",
        expect=[model.name, model.model_id, "Datasets used", dataset, "Source run", row],
        screenshot=REPO_ROOT / "test-artifacts" / "mlflow-model-page.png",
        full_page=False,  # the metrics box scrolls by itself; the rest of the page is parameters
        height=1300,
        before_screenshot=type_into_js("Search metrics", "eval/test_"),
        init_script=QUIET_ASSISTANT_JS,
    )
    lines = view.text.splitlines()
    about = lines[lines.index("About this logged model") :]  # the panel on the right
    assert about[about.index("Source run") + 1] == "smoke-a"
    assert about[about.index("Model ID") + 1] == model.model_id
    assert about[about.index("Datasets used") + 1] == dataset
    # The Runs box: the run and its input.
    assert "\n".join(["Run", "Input", "smoke-a", dataset]) in view.text
    # The metrics searched for: the test split's eval metrics of the model, every one tied to the
    # dataset, with the run's value.
    table = view.text_after.split("\nMetric\nDataset\nSource run\nValue\n", 1)[1].split("\nParameters (", 1)[0]
    cells = table.splitlines()
    shown = {cells[i]: cells[i + 1 : i + 4] for i in range(0, len(cells), 4)}
    metrics = run.data.metrics
    expected = {k: [dataset, "smoke-a", js_number(v)] for k, v in metrics.items() if k.startswith("eval/test_")}
    # (MLflow 3.17's search keeps some rows that do not match in the list, e.g. the report's
    # stability metrics, linked to the model after it was logged: only the eval rows are asserted.)
    assert {k: v for k, v in shown.items() if k.startswith("eval/")} == expected
