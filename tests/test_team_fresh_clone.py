"""Nothing trained twice: a researcher runs the pipeline (smoke preset) against the team stack,
commits and `dvc push`es; a colleague's fresh `git clone` with the stack's remote and
MLFLOW_TRACKING_URI gets the outputs with `dvc pull`, finds every stage up to date, and runs
`./dev compare main workspace`, `./dev ask`, `dvc plots diff main` and `dvc repro` without training,
leaving git clean. The comparison needs nothing pulled at all (the item table is in git); the plots
need the remote set, not pulled."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_team_stack import folder, up  # noqa: F401 - `folder` is the stack fixture
from tools.fault_matrix import clean_env, project_copy
from tools.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # a stack and a smoke pipeline under DVC: about 3 min on 2 cores

DVC = (sys.executable, "-m", "dvc")


def sh(*cmd: str, cwd: Path, env: dict, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if ok:
        assert done.returncode == 0, f"{' '.join(cmd)} ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-4000:]}"
    return done


def compare(cwd: Path, env: dict) -> dict:
    """`./dev compare main workspace --json`, checked: main's table from git, the working copy's."""
    done = sh(sys.executable, "-m", "tools.compare", "main", "workspace", "--json", cwd=cwd, env=env)
    result = json.loads(done.stdout)
    assert [r["kind"] for r in result["a"]["runs"]] == ["git-revision"], result["a"]
    assert [r["kind"] for r in result["b"]["runs"]] == ["workspace"], result["b"]
    assert result["a"]["items"] == result["b"]["items"] > 0
    return result


def test_a_fresh_clone_pulls_the_pushed_run_and_compares_asks_and_plots_without_training(folder, tmp_path):  # noqa: F811
    alice = project_copy(tmp_path / "alice")
    env = clean_env()
    sh("git", "branch", "-M", "main", cwd=alice, env=env)
    uri = up(folder, "--port", str(free_port()), "--project", str(alice))
    env = {**env, "MLFLOW_TRACKING_URI": uri}
    sh(*DVC, "exp", "run", "-S", "preset=smoke", cwd=alice, env=env)
    sh("git", "add", "-A", cwd=alice, env=env)
    sh("git", "commit", "-qm", "the default run (smoke)", cwd=alice, env=env)
    sh(*DVC, "push", cwd=alice, env=env)

    # Without the remote: the comparison reads main's item table from git, nothing pulled.
    started = time.monotonic()
    carol = tmp_path / "carol"
    sh("git", "clone", "-q", str(alice), str(carol), cwd=tmp_path, env=env)
    compare(carol, env)
    without_remote = time.monotonic() - started
    # ... but the plots are in DVC's cache, which a clone with no remote has nothing of: DVC draws
    # none and says so.
    drawn = sh(*DVC, "plots", "diff", "main", "-o", str(tmp_path / "carol-plots"), cwd=carol, env=env)
    assert "failed to load some plots" in drawn.stderr, drawn.stderr
    # With the remote set, `dvc plots diff main` reads main's plots from it, nothing pulled, also
    # from another branch.
    dave = tmp_path / "dave"
    sh("git", "clone", "-q", str(alice), str(dave), cwd=tmp_path, env=env)
    up(folder, "--project", str(dave))
    sh("git", "checkout", "-qb", "feature", cwd=dave, env=env)
    sh(*DVC, "plots", "diff", "main", "-o", str(tmp_path / "dave-plots"), cwd=dave, env=env)
    assert "Training loss" in (tmp_path / "dave-plots" / "index.html").read_text()
    assert not (dave / "models" / "model.pt").exists()

    started = time.monotonic()
    bob = tmp_path / "bob"
    sh("git", "clone", "-q", str(alice), str(bob), cwd=tmp_path, env=env)
    up(folder, "--project", str(bob))  # the stack runs already: sets bob's remote only
    sh(*DVC, "pull", cwd=bob, env=env)
    compare(bob, env)
    with_remote = time.monotonic() - started
    print(f"fresh clone to a finished compare: {without_remote:.1f} s without the remote, "
          f"{with_remote:.1f} s with `dvc pull` from it")  # fmt: skip

    for out in (
        "data/shards",
        "models/model.pt",
        "baselines/mlp.pt",
        "telemetry/train_steps.csv",
        "reports/eval_samples.csv",
    ):
        assert (bob / out).exists(), f"{out} was not pulled"
    assert not (bob / "runs").exists(), "runs/ is not in git: ask must work without it"
    status = sh(*DVC, "status", cwd=bob, env=env).stdout
    # The report stage is always_changed by design (dvc.yaml): every other stage is up to date.
    assert all(f"{stage}:" not in status for stage in ("embed", "train", "baseline", "evaluate")), status
    repro = sh(*DVC, "repro", "evaluate", cwd=bob, env=env).stdout
    assert "Running stage" not in repro, repro
    for stage in ("embed", "train", "baseline", "evaluate"):
        assert f"Stage '{stage}' didn't change, skipping" in repro, repro

    question = "What is the capital of France?"
    asked = sh(sys.executable, "-m", "tools.ask", question, "-k", "2", cwd=bob, env=env)
    lines = asked.stdout.splitlines()
    first = lines.index(f"Q: {question}")
    ranks = [line.split()[0] for line in lines[first + 1 : first + 4] if line.split()[0].endswith(".")]
    assert ranks == ["1.", "2."], asked.stdout  # (a smoke model may say first that it is not confident)

    page = tmp_path / "bob-plots"
    sh(*DVC, "plots", "diff", "main", "-o", str(page), cwd=bob, env=env)
    html = (page / "index.html").read_text()
    assert "Training loss" in html and "main" in html
    assert sh("git", "status", "--porcelain", cwd=bob, env=env).stdout == ""

    # The whole pipeline, the report included (always run): its time, memory and device checks
    # read the model run's copies of telemetry/train_perf.* (no DVC output: neither pushed nor
    # pulled), so bob's report is alice's and nothing committed changes.
    repro = sh(*DVC, "repro", cwd=bob, env=env)
    assert "time and memory: from the model's MLflow run" in repro.stdout + repro.stderr, repro.stderr[-3000:]
    assert sh("git", "status", "--porcelain", cwd=bob, env=env).stdout == ""
    assert "Running stage 'train'" not in repro.stdout
