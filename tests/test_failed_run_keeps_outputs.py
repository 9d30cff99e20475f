"""A failed train run keeps the last good one: the previous model, telemetry and metrics stay
byte for byte, the run's checkpoint stays to resume from; an untracked run leaves the pointer to
the last tracked run (runs/train.json) alone; a second writer of the same outputs is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.shards import fake_shards
from tools.fault_matrix import clean_env, project_copy

pytestmark = pytest.mark.integration

TRAIN = ["preset=smoke", "train.checkpoint_every=4"]
# The train stage in-process, with os.replace failing (a full disk) when it puts metrics/train.json in
# place: after the model and before the telemetry, so the commit has something to roll back.
FAILING_COMMIT = textwrap.dedent(
    """
    import errno, os, sys
    real = os.replace
    def replace(src, dst, *a, **kw):
        if str(dst).endswith(os.path.join("metrics", "train.json")) and ".staging" in str(src):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src), None, str(dst))
        return real(src, dst, *a, **kw)
    os.replace = replace
    from stages.train import main
    sys.exit(main(sys.argv[1:]))
    """
)
KEPT = ("models/model.pt", "metrics/train.json", "telemetry/train_steps.csv", "telemetry/train_events.json")


def snapshot(root, names=KEPT) -> dict:
    return {n: (root / n).read_bytes() for n in names}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = project_copy(tmp_path_factory.mktemp("keeps"))
    fake_shards(root / "data" / "shards", dim=16, rows=(480, 32, 32))
    env = {**clean_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    env.pop("ENERGY_FLOW_RUNS_DIR", None)
    first = train(root, env)
    assert first.returncode == 0, first.stderr[-3000:]
    return root, env


def train(root, env, *extra, code=None):
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "stages.train"]
    return subprocess.run([*cmd, *TRAIN, *extra], cwd=root, env=env, capture_output=True, text=True, timeout=600)


def test_a_run_failing_as_it_puts_its_outputs_in_place_keeps_the_previous_ones(project):
    root, env = project
    before = snapshot(root)
    pointer = (root / "runs" / "train.json").read_bytes()
    failed = train(root, env, "run.seed=7", code=FAILING_COMMIT)
    assert failed.returncode == 1, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert "metrics/train.json: could not be put in place (No space left on device)" in last
    assert "every output of the train stage is as it was before this run" in last
    assert snapshot(root) == before
    assert (root / "runs" / "train.json").read_bytes() == pointer
    assert not list(root.rglob("*.staging")) and not list(root.rglob(".*.lock"))
    # The run's checkpoint stays until a model is in place: the re-run resumes from it.
    assert (root / "checkpoints" / "train" / "last.pt").is_file()
    again = train(root, env, "run.seed=7")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from the checkpoint" in again.stderr
    assert snapshot(root)["models/model.pt"] != before["models/model.pt"]
    assert not (root / "checkpoints" / "train" / "last.pt").exists()


@pytest.mark.slow  # one more training run; the commit's own check is unit-tested (test_output_transaction.py)
def test_a_directory_where_metrics_train_json_goes_fails_and_replaces_nothing(project):
    root, env = project
    names = [n for n in KEPT if n != "metrics/train.json"]
    before = snapshot(root, names)
    metrics = root / "metrics" / "train.json"
    kept = metrics.read_bytes()
    metrics.unlink()
    metrics.mkdir()  # as a read-only metrics/ would for anyone but root: the file cannot be put there
    try:
        failed = train(root, env, "run.seed=8")
        assert failed.returncode == 1, failed.stderr[-3000:]
        assert "metrics/train.json is a directory where the train stage writes a file; nothing was replaced" in (
            failed.stderr
        )
        assert snapshot(root, names) == before
    finally:
        metrics.rmdir()
        metrics.write_bytes(kept)


def test_an_untracked_run_leaves_the_pointer_to_the_last_tracked_run(project):
    root, env = project
    pointer = json.loads((root / "runs" / "train.json").read_text())
    assert pointer["run_id"]
    untracked = train(root, env, "run.seed=9", "run.tracking=disabled")
    assert untracked.returncode == 0, untracked.stderr[-3000:]
    assert json.loads((root / "runs" / "train.json").read_text()) == pointer
    assert "still names the last tracked train run" in untracked.stderr


def test_a_second_train_into_the_same_outputs_is_refused_naming_the_first(project):
    root, env = project
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from pipeline.core.output_lock import writing\n"
            "with writing([(Path('models').resolve(), 'models')]):\n    print('held', flush=True); time.sleep(600)",
        ],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(root)
        second = train(root, env, "run.tracking=disabled")
        assert second.returncode == 1, second.stderr[-3000:]
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith(f"[train] error: models is being written by pid {holder.pid} (python -c ")
        assert last.endswith("wait for it or stop it")
        assert snapshot(root) == before
    finally:
        holder.kill()
        holder.wait()
    assert os.listdir(root / "checkpoints" / "train") in ([], [".energy-flow-output.json"])


@pytest.mark.slow  # two real embed stages (the teacher loads in each)
def test_two_embeds_into_one_directory_the_second_is_refused_naming_the_first(tmp_path):
    import time

    root = project_copy(tmp_path)
    before = sorted(p.name for p in (root / "data").iterdir())
    raw_before = sorted(p.name for p in (root / "data" / "raw").iterdir())
    env = {**clean_env(), "ENERGY_FLOW_RUNS_DIR": str(root / "runs")}
    cmd = [sys.executable, "-m", "stages.embed", "preset=smoke", "run.tracking=disabled"]
    first = subprocess.Popen(cmd, cwd=root, env=env, stderr=subprocess.PIPE, text=True)
    lock = root / "data" / ".shards.lock"
    deadline = time.monotonic() + 300
    while not (lock.exists() and lock.read_text()) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err[-3000:]
    assert second.returncode == 1, second.stderr[-3000:]
    last = second.stderr.strip().splitlines()[-1]
    assert last.startswith(f"[embed] error: data/shards is being written by pid {first.pid} (python -m stages.embed")
    assert last.endswith("wait for it or stop it")
    assert (root / "data" / "shards" / "manifest.json").is_file()
    # The shards and nothing else: no lock, no staging directory.
    assert sorted(p.name for p in (root / "data").iterdir()) == sorted({*before, "shards"})
    assert sorted(p.name for p in (root / "data" / "raw").iterdir()) == raw_before
