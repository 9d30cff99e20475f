from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.tracking import datasets, provenance
from pipeline.tracking import store as tracking

pytestmark = pytest.mark.integration


def test_store_resolves_out_of_a_dvc_temp_experiment_copy(tmp_path):
    repo = tmp_path / "proj"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    copy.mkdir(parents=True)
    assert tracking.project_root(copy) == repo.resolve()
    assert tracking.project_root(repo) == repo.resolve()


def test_default_uri_is_sqlite_at_the_repo_root_and_env_overrides(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking.tracking_uri()
    assert uri.startswith("sqlite:///") and Path(uri[len("sqlite:///") :]) == tracking.project_root() / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert tracking.tracking_uri() == "http://127.0.0.1:5999"


def test_provenance_tags_name_commit_dirty_flag_and_preset():
    tags = provenance.provenance("smoke")[0]
    assert tags["preset"] == "smoke"
    assert tags["mlflow.source.git.dirty"] in ("true", "false", "unknown")
    assert len(tags["mlflow.source.git.commit"]) == 40 or tags["mlflow.source.git.commit"] == "unknown"


def test_run_ends_failed_on_error_and_finished_otherwise(tmp_path, monkeypatch):
    import mlflow
    import pytest
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with tracking.mlflow_run("ok", "smoke", experiment="t") as ok:
        tracking.log_metrics({"a/b": 1.0, "nan": float("nan")}, step=1)
    with pytest.raises(RuntimeError):
        with tracking.mlflow_run("bad", "smoke", experiment="t") as bad:
            raise RuntimeError("boom")
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(ok.info.run_id).info.status == "FINISHED"
    assert client.get_run(ok.info.run_id).data.metrics == {"a/b": 1.0}  # non-finite values are not sent
    assert client.get_run(bad.info.run_id).info.status == "FAILED"
    # Resuming adds to the same run (train from its checkpoint does this).
    with tracking.mlflow_run("again", "smoke", run_id=ok.info.run_id):
        tracking.log_metrics({"test/cosine": 0.5})
    assert client.get_run(ok.info.run_id).data.metrics["test/cosine"] == 0.5
    assert mlflow.active_run() is None


def test_a_stage_adding_to_a_finished_run_never_changes_its_status(tmp_path, monkeypatch):
    """Evaluate and report add to the model's run without re-opening it: the run keeps FINISHED
    (or FAILED) whatever they do; their own outcome is the tag stage.<stage>.status, RUNNING while
    they work (what a stage killed outright leaves), then FINISHED, FAILED or KILLED."""
    import mlflow
    import pytest
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with tracking.mlflow_run("model", "smoke", experiment="t") as trained:
        pass
    with pytest.raises(RuntimeError):
        with tracking.mlflow_run("diverged", "smoke", experiment="t") as diverged:
            raise RuntimeError("blew up")
    client = MlflowClient(tracking_uri=uri)
    run_id = trained.info.run_id
    with tracking.adding_to_run(run_id, "evaluate", tags={"extra": "x"}) as run:
        assert run.info.run_id == run_id and mlflow.active_run() is None
        assert client.get_run(run_id).info.status == "FINISHED"
        assert client.get_run(run_id).data.tags["stage.evaluate.status"] == "RUNNING"
        tracking.log_metrics({"eval/test/model/cosine": 0.5})
        tracking.set_tags({"stability.verdict": "stable"})
        tracking.log_params({"evaluate.k": 5})
        (tmp_path / "eval.json").write_text("{}")
        tracking.log_artifact_file(tmp_path / "eval.json", "evaluate")
    after = client.get_run(run_id)
    assert after.info.status == "FINISHED" and after.data.metrics["eval/test_cosine"] == 0.5
    assert after.data.tags["stage.evaluate.status"] == "FINISHED" and after.data.tags["extra"] == "x"
    assert after.data.tags["stability.verdict"] == "stable" and after.data.params["evaluate.k"] == "5"
    assert [f.path for f in client.list_artifacts(run_id, "evaluate")] == ["evaluate/eval.json"]
    for target, status in ((run_id, "FINISHED"), (diverged.info.run_id, "FAILED")):
        with pytest.raises(ValueError):
            with tracking.adding_to_run(target, "report"):
                raise ValueError("the report failed")
        got = client.get_run(target)
        assert got.info.status == status and got.data.tags["stage.report.status"] == "FAILED"
    with pytest.raises(KeyboardInterrupt):
        with tracking.adding_to_run(run_id, "report"):
            raise KeyboardInterrupt
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.data.tags["stage.report.status"] == "KILLED"
    # Afterwards, logging goes to the active run again, not to the one added to.
    with tracking.mlflow_run("next", "smoke", experiment="t") as nxt:
        tracking.log_metrics({"b": 1.0})
    assert client.get_run(nxt.info.run_id).data.metrics == {"b": 1.0}
    assert "b" not in client.get_run(run_id).data.metrics


def test_metric_buffer_sends_what_it_holds_on_error_and_when_its_interval_is_up(tmp_path, monkeypatch):
    """In a run as the train stage opens it (mlflow_run): a Ctrl-C still sends the held rows;
    flush_seconds elapsed, a row is handed to MLflow's queue at once. (Batches, non-finite values
    and refusals: test_metric_buffer.py.)"""
    import pytest
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.metric_buffer import MetricBuffer

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(tracking_uri=uri)
    with tracking.mlflow_run("buffered", "smoke", experiment="t") as run:
        assert tracking.run_exists(run.info.run_id) and not tracking.run_exists("0" * 32)
        with pytest.raises(KeyboardInterrupt):
            with MetricBuffer(run.info.run_id, flush_seconds=3600) as buf:
                buf({"late/metric": 7.0}, 31)
                raise KeyboardInterrupt  # Ctrl-C: what was buffered is still sent
        assert [m.value for m in client.get_metric_history(run.info.run_id, "late/metric")] == [7.0]
        with MetricBuffer(run.info.run_id, flush_seconds=0) as buf:
            buf({"now": 1.0}, 1)  # flush_seconds elapsed: handed to MLflow's queue at once
            assert buf.rows == [] and buf.sent == 1 and len(buf.inflight) == 1
            buf.sync()  # ... and in the store once the queue has written it
            assert len(client.get_metric_history(run.info.run_id, "now")) == 1


def _git(repo: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / "params.yaml").write_text("lr: 0.003\n")
    (repo / "dvc.lock").write_text("schema: '2.0'\n")
    (repo / ".gitignore").write_text("/models\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    return repo


def test_git_provenance_sees_a_dirty_tree_and_ignores_dvc_housekeeping(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    monkeypatch.setattr(provenance, "REPO_ROOT", repo)
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    base = _git(repo, "rev-parse", "HEAD")
    assert provenance.git_provenance() == ({"mlflow.source.git.commit": base, "mlflow.source.git.dirty": "false"}, "")
    # DVC rewrites dvc.lock and .gitignore while the pipeline runs: not the user's change.
    (repo / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (repo / ".gitignore").write_text("/models\n/metrics\n")
    assert provenance.git_provenance()[0]["mlflow.source.git.dirty"] == "false"
    (repo / "params.yaml").write_text("lr: 0.01\n")
    tags, diff = provenance.git_provenance()
    assert tags["mlflow.source.git.dirty"] == "true" and "-lr: 0.003" in diff and "+lr: 0.01" in diff
    assert "dvc.lock" not in diff and len(tags["git.diff.sha256"]) == 16


def test_git_provenance_of_a_dvc_temp_experiment_diffs_against_its_baseline(tmp_path, monkeypatch):
    """`dvc exp run --temp/--queue` commits the changed params onto a private stash commit and
    runs there: `git status` is clean, but the code is not the baseline the user has."""
    repo = _repo(tmp_path)
    monkeypatch.setattr(provenance, "REPO_ROOT", repo)
    baseline = _git(repo, "rev-parse", "HEAD")
    (repo / "params.yaml").write_text("lr: 0.01\n")
    _git(repo, "commit", "-qam", "stash: the experiment's params")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", baseline)
    tags, diff = provenance.git_provenance()
    assert (
        tags["mlflow.source.git.commit"] == baseline
        and tags["mlflow.source.git.dirty"] == "true"
        and "+lr: 0.01" in diff
    )
    monkeypatch.setenv("DVC_EXP_NAME", "lr-b")
    tags = provenance.provenance("smoke")[0]
    assert tags["dvc.exp_name"] == "lr-b" and tags["dvc.exp_baseline"] == baseline
    assert len(tags["dvc.lock.sha256"]) == 16


def test_a_new_run_is_tagged_and_keeps_its_diff_and_device(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    repo = _repo(tmp_path)
    monkeypatch.setattr(provenance, "REPO_ROOT", repo)
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    (repo / "params.yaml").write_text("lr: 0.01\n")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with tracking.mlflow_run("r", "smoke", experiment="t", tags=provenance.device_tags("cpu")) as run:
        pass
    client = MlflowClient(uri)
    tags = client.get_run(run.info.run_id).data.tags
    assert tags["device"] == "cpu" and "cores" in tags["device.name"] and tags["mlflow.source.git.dirty"] == "true"
    assert tags["torch.version"] and tags["host"] and tags["preset"] == "smoke"
    patch = client.download_artifacts(run.info.run_id, provenance.DIFF_ARTIFACT, str(tmp_path))
    assert "+lr: 0.01" in Path(patch).read_text()


def test_runs_carry_mlflows_own_source_tags_and_the_experiment_is_a_training_one(tmp_path, monkeypatch):
    """The commit is MLflow's own tag (its UI shows it on the run page), and under `dvc exp run`
    it is the experiment's baseline, not MLflow's guess (the temp copy's stash commit); the
    source is the stage's script, not the absolute path of a temp copy. The experiment carries
    the kind MLflow 3 tells model training from GenAI with, also one made before the kind was set."""
    import mlflow
    from mlflow.tracking import MlflowClient

    baseline = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", baseline)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    mlflow.set_tracking_uri(uri)
    old = client.create_experiment("before", artifact_location=(tmp_path / "a").as_uri())
    with tracking.mlflow_run("r", "smoke", experiment="t", stage="train") as run:
        pass
    with tracking.mlflow_run("r", "smoke", experiment="before", stage="embed"):
        pass
    tags = client.get_run(run.info.run_id).data.tags
    assert tags["mlflow.source.git.commit"] == baseline and tags["mlflow.source.name"] == "stages/train.py"
    assert "git.commit" not in tags and "git.dirty" not in tags  # no copies under other names
    for exp in (client.get_experiment(run.info.experiment_id), client.get_experiment(old)):
        assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert tracking.embed_experiment("energy-flow") == "energy-flow-embed"


def test_a_new_experiment_keeps_artifacts_next_to_the_database_not_the_working_dir(tmp_path, monkeypatch):
    """A first run from `dvc exp run --temp` works in DVC's temporary copy: MLflow's default
    (./mlruns) would put the artifacts there, to be deleted with it."""
    import mlflow
    from mlflow.tracking import MlflowClient

    store = tmp_path / "store"
    store.mkdir()
    elsewhere = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmp1"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with tracking.mlflow_run("r", "smoke", experiment="t") as run:
        mlflow.log_text("x", "a.txt")
    exp = MlflowClient(uri).get_experiment(run.info.experiment_id)
    assert exp.artifact_location == (store / "mlruns").as_uri()
    assert (store / "mlruns").is_dir() and not (elsewhere / "mlruns").exists()
    assert tracking.artifact_location("http://127.0.0.1:5000") is None  # a server decides


def test_project_root_follows_dvc_root(monkeypatch, tmp_path):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert tracking.project_root() == tmp_path.resolve()
    monkeypatch.delenv("DVC_ROOT")
    assert tracking.project_root() == tracking.REPO_ROOT.resolve()


SIGTERM_WORKER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground (a background job ignores it)
from pathlib import Path
from pipeline.tracking import store as tracking
from pipeline.tracking.metric_buffer import MetricBuffer
from stages._cli import run_stage

def body(cfg):
    with tracking.mlflow_run("sigterm", "smoke", experiment="t") as run:
        with MetricBuffer(run.info.run_id, flush_seconds=3600) as buf:
            for step in range(1, 6):
                buf({"train/loss": 1.0 / step}, step)
            tracking.log_metrics({"direct/async": 1.0})
            # ready: 5 rows buffered, none sent. Written then renamed: the test's SIGTERM can land as soon as the
            # file exists, and a plain write_text could then leave it empty (seen once in CI).
            tmp = Path(sys.argv[1] + ".tmp")
            tmp.write_text(run.info.run_id)
            tmp.replace(sys.argv[1])
            time.sleep(120)

sys.exit(run_stage("worker", "a test worker", "run", body, []))
"""


@pytest.mark.parametrize("signum", [15, pytest.param(2, marks=pytest.mark.slow)], ids=["SIGTERM", "Ctrl-C"])
def test_sigterm_flushes_buffered_metrics_and_ends_the_run_killed(tmp_path, signum):
    import os
    import signal
    import subprocess
    import sys
    import time

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    ready = tmp_path / "ready"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(tracking.REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_WORKER, str(ready)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1][-3000:]
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert f"stopped by {signal.Signals(signum).name}" in err and "KILLED" in err
    client = MlflowClient(uri)
    run_id = ready.read_text()
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "curves/loss")] == [
        (s, 1.0 / s) for s in range(1, 6)
    ]
    assert run.data.metrics["direct/async"] == 1.0


QUIET_WORKER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from stages._cli import run_stage

def body(cfg):
    Path(sys.argv[1]).write_text("ready")
    time.sleep(120)

sys.exit(run_stage("worker", "a test worker", "run", body, ["run.tracking=disabled"]))
"""


def test_a_stop_with_tracking_disabled_claims_no_mlflow_run(tmp_path):
    """The stop message says what happened, nothing more: no metrics were sent, no run ended."""
    import os
    import signal
    import subprocess
    import sys
    import time

    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(tracking.REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", QUIET_WORKER, str(ready)], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert (
        err.strip().splitlines()[-1]
        == "[worker] stopped by SIGTERM: tracking is off (run.tracking), so nothing was sent to MLflow"
    ), err
    assert "KILLED" not in err and "metrics" not in err


def test_ctrl_c_while_a_stage_starts_ends_with_one_line(tmp_path):
    """Importing a stage takes seconds (torch, MLflow): Ctrl-C then is one line, not a traceback of
    whichever import it landed in, and the process ends as Ctrl-C ends it (killed by SIGINT)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "stages.train", "run.tracking=disabled"],
        cwd=tracking.REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(tracking.REPO_ROOT), "TMPDIR": str(tmp_path)},
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Not a fixed delay from the start (a loaded machine, or parallel tests, may not have the
    # interpreter up by then): the stage's private temp dir shows that startup.begin() runs; its
    # imports (torch) then take far longer than the moment it needs to hold Ctrl-C.
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("energy-flow-stage-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert err == "[train] stopped by Ctrl-C while starting: nothing was done\n", err
    assert proc.returncode == -signal.SIGINT


def test_device_tags_name_the_cpu():
    tags = provenance.device_tags("cpu")
    assert tags["device"] == "cpu" and tags["device.name"].endswith("cores)")


def test_stage_lock_tags_digest_what_dvc_lock_records_for_the_stage(tmp_path, monkeypatch):
    lock = tmp_path / "dvc.lock"
    monkeypatch.setattr(provenance, "REPO_ROOT", tmp_path)
    entry = (
        "schema: '2.0'\nstages:\n  train:\n    cmd: python -m stages.train\n    deps:\n    - path: a.py\n"
        "      md5: {md5}\n      size: 3\n    params:\n      params.yaml:\n        train.lr: 0.003\n"
        "    outs:\n    - path: models\n      md5: {out}\n"
    )
    lock.write_text(entry.format(md5="aaa", out="x"))
    monkeypatch.delenv("DVC_STAGE", raising=False)
    assert provenance.stage_lock_tags("train") == {}  # not under DVC: dvc.lock may be stale
    monkeypatch.setenv("DVC_STAGE", "evaluate")
    first = provenance.stage_lock_tags("train")["dvc.train.sha256"]
    lock.write_text(entry.format(md5="aaa", out="y"))  # outputs differ (another run's weights)
    assert provenance.stage_lock_tags("train")["dvc.train.sha256"] == first
    lock.write_text(entry.format(md5="bbb", out="x"))  # a dependency changed
    assert provenance.stage_lock_tags("train")["dvc.train.sha256"] != first
    assert provenance.stage_lock_tags("nope") == {}


def test_secrets_are_never_logged_as_params_nor_written_to_the_run_file(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.redact import REDACTED

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    params = {
        "run.hf_token": "hf_abcdef",
        "db.password": "hunter2",
        "x.api_key": "k-123",
        "x.AWS_SECRET": "s",
        "embed.teacher": "https://alice:pa55word@models.example/minilm",
        "train.lr": 0.003,
        "train.tokenizer_threads": 2,
        "x.HFTOKEN": "t",
        "x.author": "me",
    }
    with tracking.mlflow_run("secrets", "smoke", experiment="t") as run:
        tracking.log_params(params)
    logged = MlflowClient(uri).get_run(run.info.run_id).data.params
    for key in ("run.hf_token", "db.password", "x.api_key", "x.AWS_SECRET", "x.HFTOKEN"):
        assert logged[key] == REDACTED, key
    assert logged["train.tokenizer_threads"] == "2" and logged["x.author"] == "me"
    assert logged["embed.teacher"] == f"https://alice:{REDACTED}@models.example/minilm"
    assert logged["train.lr"] == "0.003"
    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path / "runs")
    tracking.write_run_file("train", {"run_id": "r", "tracking_uri": "https://bob:s3cret@mlflow.example:5000"})
    text = tracking.run_file("train").read_text()
    assert "s3cret" not in text and f"bob:{REDACTED}@mlflow.example" in text


def test_the_run_file_links_a_stage_to_the_run_that_made_this_very_output(tmp_path, monkeypatch):
    """runs/<stage>.json is beside the DVC outputs (not in them, or identical runs would hash
    differently); a reader checks the output's digest so a checked-out other model is not
    credited to the last run."""
    from pipeline.data.shards import sha256_file

    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path / "runs")
    model = tmp_path / "model.pt"
    model.write_bytes(b"weights")
    tracking.write_run_file("train", {"run_id": "r1", "model_sha256": sha256_file(model)})
    assert tracking.read_run_file("train", model)["run_id"] == "r1"
    model.write_bytes(b"other weights")  # e.g. `dvc exp apply` of another experiment
    monkeypatch.setattr(tracking, "enabled", lambda: False)
    with pytest.raises(PipelineError, match=r"is not the file the last train run here made .*dvc repro -f train"):
        tracking.read_run_file("train", model)
    tracking.run_file("train").write_text("{}")  # e.g. edited by hand
    with pytest.raises(PipelineError, match=r"runs/train.json: holds no run_id"):
        tracking.read_run_file("train")


def test_without_a_run_file_the_run_is_found_by_the_outputs_digest(tmp_path, monkeypatch):
    """A `dvc exp run --temp/--queue` copy has no runs/ (it is not in git): the train stage still
    finds the embed run that made its shards, by the manifest digest its run carries as a tag."""
    import mlflow

    from pipeline.data.shards import sha256_file

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path / "runs")
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"rows": 3}')
    with tracking.mlflow_run(
        "embed", "smoke", experiment="t", tags={"embed.manifest_sha256": sha256_file(manifest)}
    ) as run:
        pass
    # As in a new process, before any run: MLflow's own default store is not the project's.
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")  # (set_tracking_uri set it too)
    found = tracking.read_run_file("embed", manifest, "manifest_sha256")
    assert found == {"run_id": run.info.run_id, "manifest_sha256": sha256_file(manifest)}
    manifest.write_text('{"rows": 4}')  # shards no run in the store made
    assert tracking.read_run_file("embed", manifest, "manifest_sha256", required=False) == {}
    with pytest.raises(PipelineError, match=r"runs/embed.json"):
        tracking.read_run_file("embed", manifest, "manifest_sha256")


def test_a_dataset_another_run_inserted_at_the_same_moment_is_linked_on_a_second_try(monkeypatch):
    """Two runs logging the same shards at once against one server: the store's look-up-then-insert
    lets both miss, and the later insert breaks the dataset key. The input is logged once more (it
    then finds the dataset); any other refusal is raised as it is."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import IntegrityError

    calls = []

    def log_input(dataset, context, tags):
        calls.append(context)
        if len(calls) == 1:
            raise MlflowException(
                '(psycopg2.errors.UniqueViolation) duplicate key value violates unique constraint "dataset_pk"'
            )

    monkeypatch.setattr(mlflow, "log_input", log_input)
    datasets._log_input(type("D", (), {"name": "shards"})(), "training", {})
    assert calls == ["training", "training"]

    def local_store(dataset, context, tags):  # a local store raises from SQLAlchemy's error
        calls.append(context)
        if len(calls) == 3:
            raise MlflowException("UNIQUE constraint failed") from IntegrityError("INSERT", {}, Exception())

    monkeypatch.setattr(mlflow, "log_input", local_store)
    datasets._log_input(type("D", (), {"name": "shards"})(), "evaluation", {})
    assert calls[2:] == ["evaluation", "evaluation"]

    def refuse(dataset, context, tags):
        raise MlflowException("RESOURCE_DOES_NOT_EXIST: run not found")

    monkeypatch.setattr(mlflow, "log_input", refuse)
    with pytest.raises(MlflowException, match="run not found"):
        datasets._log_input(type("D", (), {"name": "shards"})(), "training", {})
