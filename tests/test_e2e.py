"""End to end, as a user runs it: a fresh git repository holding the project, the smoke preset
selected through `dvc exp run -S preset=smoke` (Hydra composition), every stage run by DVC, the
outputs, metrics and MLflow runs checked, a second `dvc repro` that re-runs only the report, a plain
`dvc repro` after an edit, and a killed train stage that resumes. The repository is the session's
`smoke_workspace` (tests/conftest.py); the tests that change its workspace come last, and they are
slow (each runs a stage or the pipeline again)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.report.checks import CHECK_ORDER
from tests.conftest import sh
from tests.helpers.verdicts import assert_clean_report, assert_clean_tags

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def project(smoke_workspace):
    return smoke_workspace.root, smoke_workspace.env, smoke_workspace.workspace_log


def test_every_stage_ran_and_wrote_its_outputs(project):
    root, _, out = project
    for stage in ("embed", "train", "baseline", "evaluate", "report"):
        assert f"Running stage '{stage}'" in out
    for rel in (
        "data/shards/manifest.json",
        "models/model.pt",
        "baselines/mlp.pt",
        "metrics/baseline.json",
        "runs/train.json",
        "runs/embed.json",
        "telemetry/train_steps.csv",
        "telemetry/train_perf.csv",
        "reports/eval_items.parquet",
        "telemetry/train_events.json",
        "metrics/train.json",
        "metrics/eval.json",
        "metrics/stability.json",
        "reports/stability.md",
        "reports/stability.html",
        "reports/eval_samples.csv",
        "reports/plots/loss.png",
        "reports/plots/grad_norm.png",
        "reports/plots/memory.png",
        "reports/plots/adaptive_steps.png",
        "reports/plots/learning.png",
    ):
        assert (root / rel).is_file() and (root / rel).stat().st_size > 0, rel
    assert "preset: smoke" in (root / "params.yaml").read_text()


def test_metrics_are_finite_and_named_split_slash_metric(project):
    root = project[0]
    train = json.loads((root / "metrics/train.json").read_text())
    ev = json.loads((root / "metrics/eval.json").read_text())
    for key in ("train/skipped_steps", "train/loss"):
        assert math.isfinite(train[key]), key
    # What depends on the machine (speed, memory, wall time) stays out of the DVC metrics, which
    # must be identical between identical runs; it goes to telemetry/train_perf.json.
    assert not [k for k in train if k.startswith(("perf/", "mem/", "system/")) or k == "train/seconds"], train
    perf = json.loads((root / "telemetry/train_perf.json").read_text())
    assert math.isfinite(perf["perf/samples_per_s"]) and perf["perf/samples_per_s"] > 0
    for key in (
        "eval/test/model/cosine",
        "eval/test/model/top1",
        "eval/test/model/top5",
        "eval/val/model/cosine",
        "eval/test/ridge/cosine",
        "eval/test/identity/top1",
        "eval/test/identity/group_top1",
        "eval/test/ridge/top5",
        "eval/test/nearest/cosine",
        "eval/val/nearest/top1",
        "eval/test/model/group_top1/ci95_low",
        "eval/test/model_vs_ridge/mrr/p_value",
        "eval/bank_size",
    ):
        assert math.isfinite(ev[key]), key
    assert 0 <= ev["eval/test/model/top1"] <= ev["eval/test/model/top5"] <= 1
    assert ev["eval/test/model/top1"] <= ev["eval/test/model/group_top1"] <= ev["eval/test/model/group_top5"] <= 1
    # The answer model's confidence rule, calibrated on val and measured on held-out questions: a
    # smoke model may reach no threshold (inf: never confident), and then answers nothing, so its
    # precision is NaN.
    assert ev["eval/answer/threshold"] >= 0 and ev["eval/answer/out_of_bank_questions"] > 0
    for split in ("val", "test"):
        share, precision = ev[f"eval/answer/{split}_answered_share"], ev[f"eval/answer/{split}_answered_precision"]
        assert 0 <= share <= 1 and (0 <= precision <= 1 or (share == 0 and math.isnan(precision))), (split, ev)
    assert 0 <= ev["eval/answer/out_of_bank_refused_share"] <= 1
    stab = json.loads((root / "metrics/stability.json").read_text())
    assert_clean_report(stab)
    for check in CHECK_ORDER:
        assert isinstance(stab[check]["pass"], bool), check


def test_the_smoke_run_matches_the_committed_reference(smoke_workspace):
    """Loss at every logged step, eval point metrics and shard digests of smoke-a against
    tests/smoke_reference.json, at tolerances that pass thread-count noise and fail a real
    numerics change (tools/reference.py has the measurements)."""
    from tools import reference as smoke_reference

    problems, notes = smoke_reference.compare(smoke_reference.load(), smoke_workspace.smoke_a)
    assert not problems, "\n".join(problems + notes + [smoke_reference.REFRESH_HINT])


def test_mlflow_store_holds_the_embed_run_and_the_model_run(project):
    from mlflow.tracking import MlflowClient

    root = project[0]
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("energy-flow")
    # The workspace experiment (smoke-a) made one model run, and one embed run in an experiment
    # of its own (it would crowd the comparison of models).
    runs = client.search_runs([exp.experiment_id], "tags.`dvc.exp_name` = 'smoke-a'")
    assert [r.data.tags.get("stage") for r in runs] == ["train"], "one model run among the models"
    model_run = runs[0]
    embed_exp = client.get_experiment_by_name("energy-flow-embed")
    (embed_run,) = client.search_runs([embed_exp.experiment_id], "tags.`dvc.exp_name` = 'smoke-a'")
    assert embed_run.data.tags["stage"] == "embed"
    assert embed_run.info.status == model_run.info.status == "FINISHED"
    assert embed_run.info.run_name == model_run.info.run_name == "smoke-a"  # the DVC experiment's name
    for e in (exp, embed_exp):
        assert e.tags["mlflow.experimentKind"] == "custom_model_development"
    assert model_run.data.tags["embed.run_id"] == embed_run.info.run_id
    for tags in (embed_run.data.tags, model_run.data.tags):
        assert tags["preset"] == "smoke" and len(tags["mlflow.source.git.commit"]) == 40
        assert tags["mlflow.source.git.dirty"] in ("true", "false")
    # The model run's dataset: the shards, by the manifest's digest, linked to the embed run.
    (shards,) = model_run.inputs.dataset_inputs
    manifest_sha = hashlib.sha256((root / "data" / "shards" / "manifest.json").read_bytes()).hexdigest()
    # Named so that a smoke run's data and a default run's differ at a glance.
    assert shards.dataset.name == "qa_pairs.csv · 600 pairs · smoke" and shards.dataset.digest == manifest_sha[:16]
    input_tags = {t.key: t.value for t in shards.tags}
    assert input_tags["embed.run_id"] == embed_run.info.run_id and input_tags["mlflow.data.context"] == "training"
    assert input_tags["source.path"] == "data/raw/qa_pairs.csv" and int(input_tags["rows.train"]) > 0
    m = model_run.data.metrics
    for key in (
        "curves/loss",
        "speed/samples_per_s",
        "eval/test_cosine",
        "eval_baselines/ridge_group_top1",
        "stability/verdict_code",
        "stability/failed_checks",
        "eval_baselines/model_vs_mlp_group_top1",
    ):
        assert key in m and math.isfinite(m[key]), key
    # The MLP baseline on the model's run: its size and replicates, and the learning check's word on
    # the strongest baseline (also in the run's description).
    tags = model_run.data.tags
    assert tags["baseline.mlp.seeds"] == "3" and int(tags["baseline.mlp.params"]) > 0
    assert tags["eval.test.vs_mlp.group_top1"].count("[") == 1
    # The floors (identity, nearest) as interval tags; the MLP's training per epoch as an artifact.
    assert tags["eval.test.vs_nearest.group_top1"].count("[") == 1 and "eval.test.identity.group_top1" in tags
    (root.parent / "dl-mlp").mkdir(exist_ok=True)
    history = client.download_artifacts(model_run.info.run_id, "baseline/mlp_history.json", str(root.parent / "dl-mlp"))
    replicates = json.loads(Path(history).read_text())["replicates"]
    assert len(replicates) == 3 and "val/cosine" in replicates[0]["epochs"][-1], replicates
    assert " on " in tags["learning.vs_strongest"] and "strongest baseline" in tags["mlflow.note.content"]
    # One chart section per key prefix on the run page: one '/' per key; the intervals are tags.
    # (a bound on the keys, so that a new telemetry column cannot flood the page)
    assert [k for k in m if k.count("/") != 1] == [] and len(m) <= 60, sorted(m)
    assert model_run.data.tags["eval.test.group_top1"].count("[") == 1
    assert model_run.data.tags["run.overrides"].startswith("preset=smoke")
    assert "**smoke-a**" in model_run.data.tags["mlflow.note.content"]
    verdict = assert_clean_tags(model_run.data.tags)
    assert (m["stability/verdict_code"] == 2) == (verdict == "unstable") and m["stability/failed_checks"] >= 0
    # Filterable by verdict, as in the UI's search box (the tag as shown: with warnings or not).
    shown = model_run.data.tags["stability.verdict"]
    assert shown.startswith(verdict) and model_run.info.run_id in [
        r.info.run_id for r in client.search_runs([exp.experiment_id], f"tags.`stability.verdict` = '{shown}'")
    ]
    assert model_run.data.params["train.lr"] == "0.003"  # the whole resolved config, flattened
    assert len(client.get_metric_history(model_run.info.run_id, "curves/loss")) > 3  # a curve, not a point
    artifacts = {a.path for a in client.list_artifacts(model_run.info.run_id, "report")}
    assert {"report/stability.html", "report/stability.md", "report/stability_evidence.json"} <= artifacts
    assert "data/rows_used" in embed_run.data.metrics


@pytest.mark.slow
def test_second_repro_reruns_only_the_report_and_changes_no_output(project):
    """Nothing changed: embed, train and evaluate are skipped. The report stage is
    `always_changed` (its time and memory checks read telemetry/train_perf.*, which DVC does not
    track), so it runs again and writes the same metrics/stability.json."""
    root, env, _ = project
    lock = (root / "dvc.lock").read_bytes()
    stability = (root / "metrics/stability.json").read_bytes()
    out = sh([sys.executable, "-m", "dvc", "repro"], root, env)
    ran = [s for s in ("embed", "train", "baseline", "evaluate", "report") if f"Running stage '{s}'" in out]
    assert ran == ["report"], out
    assert (root / "dvc.lock").read_bytes() == lock and (root / "metrics/stability.json").read_bytes() == stability
    status = sh([sys.executable, "-m", "dvc", "status"], root, env)
    assert "always changed" in status and not [
        s for s in ("embed:", "train:", "baseline:", "evaluate:") if s in status
    ], status


def test_renaming_the_mlflow_experiment_reruns_no_stage(project):
    """run.experiment only labels the MLflow runs: no stage lists it as a DVC param, so renaming
    it leaves embed, train and evaluate up to date (the report is always re-run anyway)."""
    root, env, _ = project
    params = root / "params.yaml"
    original = params.read_bytes()
    try:
        text = original.decode()
        assert "experiment: energy-flow" in text
        params.write_text(text.replace("experiment: energy-flow", "experiment: renamed-by-a-user"))
        status = sh([sys.executable, "-m", "dvc", "status"], root, env)
        assert not [s for s in ("embed:", "train:", "evaluate:") if s in status], status
    finally:
        params.write_bytes(original)


def test_a_change_to_the_report_leaves_train_and_evaluate_up_to_date(project):
    """The report's checks, plots and HTML live in pipeline/report, which only the report stage
    lists: editing them must not re-train the model (or re-evaluate it)."""
    root, env, _ = project
    for rel in ("pipeline/report/render.py", "pipeline/report/checks/suite.py", "pipeline/report/plots.py"):
        path = root / rel
        original = path.read_bytes()
        try:
            path.write_bytes(original + b"\n# an edit to the report\n")
            status = sh([sys.executable, "-m", "dvc", "status"], root, env)
            assert "pipeline/report" in status, status  # the report stage sees it...
            assert not [s for s in ("embed:", "train:", "evaluate:") if s in status], (rel, status)  # ...no other
        finally:
            path.write_bytes(original)


@pytest.mark.slow
def test_report_judges_time_and_memory_only_when_measured_under_its_own_settings(project):
    """The train stage labels telemetry/train_perf.json with its settings' digest. The report of
    the run that made it judges memory and step time; handed another run's file (as after DVC
    restored a cached train stage), it never judges this run by another's numbers: it reads the
    model run's own copies from MLflow (train/train_perf.*) and judges by those, and with no run
    to read them from (tracking off) it skips both and says why."""
    root, env, _ = project
    stability = json.loads((root / "metrics/stability.json").read_text())
    assert stability["memory_growth"]["status"] != "skip", stability["memory_growth"]
    assert stability["step_time_degradation"]["status"] != "skip"
    perf_json = root / "telemetry/train_perf.json"
    original = perf_json.read_bytes()
    try:
        perf = json.loads(original)
        assert len(perf["settings_digest"]) == 16
        perf_json.write_text(json.dumps({**perf, "settings_digest": "0" * 16}))
        out = sh([sys.executable, "-m", "stages.report"], root, env)
        assert "time and memory: from the model's MLflow run" in out and "measured under other settings" in out, out
        assert json.loads((root / "metrics/stability.json").read_text()) == stability  # the run's own numbers
        out = sh([sys.executable, "-m", "stages.report", "run.tracking=disabled"], root, env)
        assert "measured under other settings" in out, out[-3000:]
        stale = json.loads((root / "metrics/stability.json").read_text())
        skipped = {"pass": True, "status": "skip"}
        assert stale["memory_growth"] == stale["step_time_degradation"] == stale["device_utilisation"] == skipped
        md = (root / "reports/stability.md").read_text()
        assert "measured under other settings" in md and "dvc repro --force --single-item train" in md
    finally:
        perf_json.write_bytes(original)
        sh([sys.executable, "-m", "stages.report"], root, env)
    assert json.loads((root / "metrics/stability.json").read_text()) == stability


@pytest.mark.slow
def test_dvc_exp_run_pointing_an_output_at_a_users_directory_deletes_nothing(project):
    """`dvc exp run` force-checks-out every output before running, deleting whatever is at an
    output path it has no record of: were dvc.yaml's outs `${train.out_dir}`, notes/ would be gone
    before any stage ran. They are fixed paths, and the stage refuses another train.out_dir."""
    root, env, _ = project
    notes = root / "notes"
    notes.mkdir()
    (notes / "thesis.md").write_text("months of work\n")
    params = (root / "params.yaml").read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "run", "-S", "preset=smoke", "-S", "train.out_dir=notes"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    try:
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert (
            "] config error: parameter 'train.out_dir' = 'notes': under DVC (dvc repro, dvc exp run) the "
            "train stage's output is models, as dvc.yaml declares it" in out
        ), out[-3000:]
        assert "Traceback" not in out
        assert sorted(os.listdir(notes)) == ["thesis.md"] and (notes / "thesis.md").read_text() == "months of work\n"
    finally:
        (root / "params.yaml").write_bytes(params)
        sh([sys.executable, "-m", "dvc", "checkout", "--force"], root, env)  # the outputs DVC removed before train
    assert (root / "models/model.pt").is_file() and (notes / "thesis.md").is_file()


@pytest.mark.slow
def test_plain_repro_after_an_edit_reruns_train_evaluate_report_not_embed_and_is_tracked(project):
    """No `dvc exp run`: the user edits params.yaml and runs `dvc repro`. A new model run lands in
    the same store, with no experiment name, dirty (params.yaml differs from the commit)."""
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    root, env, _ = project
    params = OmegaConf.load(root / "params.yaml")
    params.train.epochs = 1
    OmegaConf.save(params, root / "params.yaml")
    out = sh([sys.executable, "-m", "dvc", "repro"], root, env)
    assert "Running stage 'embed'" not in out and "'embed' didn't change" in out, out
    for stage in ("train", "evaluate", "report"):
        assert f"Running stage '{stage}'" in out
    assert json.loads((root / "metrics/train.json").read_text())["train/steps"] < 20
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    run_id = json.loads((root / "runs/train.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "dvc.exp_name" not in run.data.tags
    assert run.data.params["train.epochs"] == "1" and run.data.tags["mlflow.source.git.dirty"] == "true"
    assert "eval/test_cosine" in run.data.metrics
    assert_clean_tags(run.data.tags)


@pytest.mark.slow
def test_sigkilled_train_stage_resumes_in_the_same_mlflow_run(project):
    """`kill -9` of the train stage, then the stage again: it resumes from its last checkpoint,
    continues the same MLflow run, finishes it and removes the checkpoint."""
    import signal
    import time

    from mlflow.tracking import MlflowClient

    root, env, _ = project
    ckpt = root / "checkpoints/train/last.pt"
    # 6 epochs of 15 steps, a checkpoint every 10: the kill lands with up to 80 steps still to run
    # (seconds even on a busy machine, where the 20 ms poll below gets its turn long before).
    args = [sys.executable, "-m", "stages.train", "train.epochs=6", "train.checkpoint_every=10"]
    proc = subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL and ckpt.exists()
    out = sh(args, root, env)
    assert "resumed from the checkpoint at step" in out and not ckpt.exists()
    resumed_at = int(out.split("resumed from the checkpoint at step ")[1].split()[0])
    total = json.loads((root / "metrics/train.json").read_text())["train/steps"]
    assert resumed_at % 10 == 0 and 0 < resumed_at < total
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    run_id = json.loads((root / "runs/train.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["train.resumed_from_step"] == str(resumed_at)
    steps = [m.step for m in client.get_metric_history(run_id, "curves/loss")]
    assert min(steps) < resumed_at < max(steps) == total  # one curve across both processes
    fp = run.data.tags["train.fingerprint"]
    same = client.search_runs([run.info.experiment_id], f"tags.`train.fingerprint` = '{fp}'")
    assert [r.info.run_id for r in same] == [run_id]  # the restart made no second run


@pytest.mark.slow
def test_sigterm_to_the_train_stage_sends_its_metrics_and_ends_the_run_killed(project):
    """A scheduler's SIGTERM mid-training: the stage finishes the step in flight, writes a
    checkpoint of it and exits 143; the buffered telemetry is in MLflow and the run reads KILLED
    (not RUNNING forever); the checkpoint stays to resume."""
    import signal
    import time

    from mlflow.tracking import MlflowClient

    root, env, _ = project
    ckpt = root / "checkpoints/train/last.pt"
    ckpt.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stages.train", "train.epochs=40", "train.checkpoint_every=20", "train.resume=false"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped by SIGTERM" in err
    state = torch_load(ckpt)
    # Written at the stop, not the periodic one of step 20 (unless the signal came right after it).
    assert state["step"] >= 20 and f"stopping at step {state['step']}: checkpoint written" in err
    assert state["rows"][-1]["step"] == state["step"]  # the stopped window's row is in it
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    run = client.get_run(state["extra"]["run_id"])
    assert run.info.status == "KILLED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "curves/loss")]
    assert steps and max(steps) >= state["step"]  # everything up to the checkpoint, at least


def torch_load(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=True)
