"""Two researchers at once on one team stack: two clones of the project each run a smoke
experiment with `dvc exp run`, at the same time, logging to the stack's one MLflow server, then
both `dvc push` to its one remote at the same time (the embed outputs are the same bytes in both:
the same objects written twice at once). Both runs end FINISHED with every telemetry row as a
metric point (none lost, none twice), their artifacts and model; both clones read `dvc status -c`
in sync and every object in the remote is whole."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers.team import team
from tests.test_team_faults import remote_objects
from tools.fault_matrix import clean_env, project_copy
from tools.servers import free_port
from tools.team.layout import Layout

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # two smoke experiments side by side: ~4 min on 2 cores

RESEARCHERS = {"alice": "0.003", "bob": "0.001"}  # the experiment's name and its train.lr


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "team"
    yield path
    team("down", folder=path)


def side_by_side(commands: dict[str, tuple[list[str], Path]], env: dict) -> None:
    """Each command started at once, all waited for; any failure shown with its output."""
    procs = {
        who: subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for who, (cmd, cwd) in commands.items()
    }
    outputs = {who: proc.communicate(timeout=900)[0] for who, proc in procs.items()}
    for who, proc in procs.items():
        assert proc.returncode == 0, f"{who}: {' '.join(commands[who][0])} failed:\n{outputs[who][-5000:]}"


def expected_losses(root: Path) -> list[tuple[int, float]]:
    """The loss curve the clone's own files say its run logged: (step, train/loss) of each row of
    its telemetry table, and the run's summary (metrics/train.json) once more at the last step
    (the train stage logs the totals there, so MLflow's table shows them: the same loss)."""
    with open(root / "telemetry" / "train_steps.csv", newline="") as f:
        rows = [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(f) if r["train/loss"]]
    summary = json.loads((root / "metrics" / "train.json").read_text())
    return sorted([*rows, (int(summary["train/steps"]), float(summary["train/loss"]))])


def test_two_concurrent_smoke_experiments_lose_nothing(folder, tmp_path_factory):
    clones = {who: project_copy(tmp_path_factory.mktemp(who)) for who in RESEARCHERS}
    port = free_port()
    for root in clones.values():
        done = team("up", "--port", str(port), "--project", str(root), folder=folder)
        assert done.returncode == 0, done.stderr[-4000:]
    uri = f"http://127.0.0.1:{port}"
    env = {**clean_env(), "MLFLOW_TRACKING_URI": uri}
    dvc = (sys.executable, "-m", "dvc")

    side_by_side(
        {
            who: ([*dvc, "exp", "run", "-n", who, "-S", "preset=smoke", "-S", f"train.lr={lr}"], clones[who])
            for who, lr in RESEARCHERS.items()
        },
        env,
    )
    side_by_side({who: ([*dvc, "push", "-q"], root) for who, root in clones.items()}, env)

    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    for who, root in clones.items():
        found = client.search_runs(experiments, f"tags.stage = 'train' and tags.`dvc.exp_name` = '{who}'")
        assert len(found) == 1, f"{who}: {len(found)} model runs on the server"
        run = found[0]
        assert run.info.status == "FINISHED" and run.data.params["train.lr"] == RESEARCHERS[who], who
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "curves/loss"))
        expected = expected_losses(root)
        assert [s for s, _ in history] == [s for s, _ in expected], f"{who}: a step lost or stored twice"
        assert all(math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(history, expected)), who
        reports = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
        assert "report/stability.html" in reports, f"{who}: {sorted(reports)}"
        assert len(run.outputs.model_outputs) == 1, f"{who}: its logged model is missing"
        status = subprocess.run([*dvc, "status", "-c"], cwd=root, env=env, capture_output=True, text=True)
        assert "Cache and remote 'team' are in sync" in status.stdout, f"{who}: {status.stdout}{status.stderr}"
    for path in remote_objects(Layout(folder.resolve()).dvc_remote):
        name = path.parent.name + path.name.removesuffix(".dir")
        assert hashlib.md5(path.read_bytes()).hexdigest() == name, f"{path}: a truncated or mixed object"
    assert team("down", folder=folder).returncode == 0
