"""Shared fixtures. `smoke_experiments` is what a researcher's repository looks like after a few
experiments: the project in a fresh git repo, and three smoke-preset experiments made the three
ways DVC runs them, all tracked in the repo's one MLflow store (mlflow.db at its root):

- `smoke-a`: `dvc exp run` in the workspace (train.lr 0.003, the preset's);
- `smoke-b`: `dvc exp run --temp` (train.lr 0.01), in a copy under .dvc/tmp/exps;
- `smoke-c`: `dvc exp run --queue`, then `dvc queue start` (train.lr 0.001), in a queue worker.

`smoke_workspace` is the first of them alone (one smoke run): what the default suite's
end-to-end checks read (tests/test_e2e.py). The other two come with `smoke_experiments` (two runs
more), for the slow tier's checks that compare experiments (test_compare.py, test_experiments.py,
test_verdict_e2e.py). Each is made once per session. Tests that change the
workspace (a plain `dvc repro` after an edit, a killed train stage) come last in test_e2e.py; the
experiments themselves live in git refs and the store, which those tests only add to."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools import reference as smoke_reference
from tools.fault_matrix import project_copy

EXPERIMENTS = {"smoke-a": "0.003", "smoke-b": "0.01", "smoke-c": "0.001"}  # name -> train.lr
TIERS = ("unit", "integration", "e2e")  # pyproject.toml says what each holds
# A test's rough cost by its tier, on 2 cores (the default suite's durations: unit tests take
# tenths of a second, integration a few seconds, e2e tens), for the scheduler's order only.
TIER_SECONDS = {"unit": 0.2, "integration": 5.0, "e2e": 20.0}


# pytest-xdist workers write which tests share a fixture here (a file each, all the same), and the
# controller's scheduler reads it: the controller collects nothing itself.
GROUPS_FILE = "ENERGY_FLOW_TEST_GROUPS"


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may use (affinity and cgroup quota, as the
    stages count them), not psutil's physical cores (1 on a 2-vCPU machine with hyper-threads)."""
    from pipeline.core.resources import usable_cores

    return usable_cores().usable


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER") and getattr(config.option, "tx", None):  # -n N: N workers
        folder = tempfile.mkdtemp(prefix="energy-flow-test-groups-")
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        os.environ[GROUPS_FILE] = os.path.join(folder, "groups")  # (the workers start after this)


def pytest_xdist_make_scheduler(config, log):
    """Tests that share a module- or session-scoped fixture of ours run on one worker, in their
    order, the others one by one wherever a worker is free. (pytest-xdist's own `--dist loadgroup`
    renames the test to group it, which pytest 9 ignores.) The heaviest work goes out first (by
    the tiers' weights, `TIER_SECONDS`), so the smoke experiments' group starts at once and the
    quick unit tests fill the end, not the other way round (xdist orders by test count, which put
    that group third, behind two cheap groups). Another --dist given is left to xdist."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        groups: dict[str, str] = {}
        weights: dict[str, float] = {}  # test id -> its tier's seconds, for the tests not unit
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if not self.groups and GROUPS_FILE in os.environ:
                for path in glob.glob(os.environ[GROUPS_FILE] + ".*"):
                    found = json.loads(Path(path).read_text())
                    self.groups.update(found["groups"])
                    self.weights.update(found["weights"])
                    break
            return self.groups.get(nodeid, nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the whole queue is known by the first assignment

                def weight(scope: str) -> float:
                    return sum(self.weights.get(nodeid, TIER_SECONDS["unit"]) for nodeid in self.workqueue[scope])

                for scope in sorted(self.workqueue, key=weight, reverse=True):  # stable: equals keep their order
                    self.workqueue.move_to_end(scope)
                self.ordered = True
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Each test belongs to exactly one tier (its module's `pytestmark`), so that `./dev unit`
    (-m "unit and not slow") selects the quick tier and nothing else. Under pytest-xdist (./dev
    passes -n auto), the tests that share a fixture are grouped for the scheduler above: the
    fixture (a project copy with its experiments, a trained model, a server) is built once, and
    tests that rely on their order in a module (test_e2e.py's last ones change the workspace)
    keep it."""
    wrong = []
    for item in items:
        tiers = _tiers(item)
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: tiers {sorted(tiers) or 'none'}")
    if wrong:
        raise pytest.UsageError(
            "every test needs exactly one tier marker of " + ", ".join(TIERS) + ":\n  " + "\n  ".join(wrong[:20])
        )
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and os.environ.get(GROUPS_FILE):
        weights = {item.nodeid: TIER_SECONDS[tier] for item in items for tier in _tiers(item) if tier != "unit"}
        Path(f"{os.environ[GROUPS_FILE]}.{worker}").write_text(
            json.dumps({"groups": shared_fixture_groups(items), "weights": weights})
        )


def _tiers(item) -> set[str]:
    return {m.name for m in item.iter_markers() if m.name in TIERS}


def shared_fixture_groups(items) -> dict[str, str]:
    """{test id: its group} for the tests linked through a module- or session-scoped fixture of
    tests/ (a test with two joins their groups)."""
    group: dict[str, str] = {}  # union-find over the shared fixtures: each one's representative

    def find(key: str) -> str:
        while group.setdefault(key, key) != key:
            key = group[key]
        return key

    shared = {item.nodeid: _shared_fixtures(item) for item in items}
    for keys in shared.values():
        for key in keys[1:]:
            a, b = sorted((find(keys[0]), find(key)))
            group[b] = a
    return {nodeid: find(keys[0]) for nodeid, keys in shared.items() if keys}


def _shared_fixtures(item) -> list[str]:
    """The fixtures of tests/ that `item` uses and whose one value other tests get too, each named
    with the node it is made once for."""
    keys = []
    for name in item.fixturenames:
        defs = item._fixtureinfo.name2fixturedefs.get(name)
        if not defs or not defs[-1].func.__module__.startswith("tests.") or defs[-1].scope == "function":
            continue
        fixture = defs[-1]
        once_for = fixture.baseid if fixture.scope in ("session", "package") else item.nodeid.split("::")[0]
        keys.append(f"{name}@{once_for}")
    return sorted(keys)


@pytest.fixture
def one_intra_op_thread():
    """One intra-op thread, as a stage runs under the portable numerics (PORTABLE_THREADS) and as
    Trainer.run sets it: torch's default (one a core) beside the other pytest-xdist worker made
    small models' steps tens of times slower on 2 busy cores. Function-scoped: a module-scoped
    fixture would hold the whole module on one worker."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _a_tracking_session_of_its_own():
    """Each test tracks in a fresh session (tracking on, no sweep), as each stage does: what a test
    switches (configure, set_sweep) ends with it."""
    from pipeline.tracking import store as tracking

    with tracking.active(tracking.TrackingSession()):
        yield


@pytest.fixture(autouse=True)
def _decisions_kept_out_of_the_project_store(monkeypatch):
    """`./dev compare` and `./dev decide` record each decision in MLflow (pipeline/tracking/
    decisions.py); a test's comparisons would land in the project's own mlflow.db. The tests of
    that logging switch it back on, over a store in tmp_path."""
    monkeypatch.setenv("ENERGY_FLOW_LOG_DECISIONS", "0")


@pytest.fixture(autouse=True)
def _run_files_kept_out_of_the_project(monkeypatch, tmp_path_factory):
    """A stage run in-process writes runs/<stage>.json; in the project's own runs/ it would
    replace the link from the user's model to its MLflow run."""
    from pipeline.tracking import store as tracking

    monkeypatch.setattr(tracking, "RUNS_DIR", tmp_path_factory.mktemp("runs"))


def sh(cmd: list[str], cwd: Path, env: dict, timeout: int = 600) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-6000:]}"
    return out


def dvc(*args: str) -> list[str]:
    return [sys.executable, "-m", "dvc", *args]


@dataclass
class SmokeExperiments:
    root: Path
    env: dict
    workspace_log: str  # output of the workspace `dvc exp run` (smoke-a)
    smoke_a: dict  # smoke-a's loss, eval metrics and shard digests (tools/reference.py), read
    # before any test changes the workspace


def wait_for_queue(root: Path, env: dict, name: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = sh(dvc("queue", "status"), root, env)
        row = next((line for line in status.splitlines() if f" {name} " in f" {line} "), "")
        if "Success" in row:
            return
        if "Failed" in row:
            logs = sh(dvc("queue", "logs", name), root, env)
            raise AssertionError(f"queued experiment {name} failed:\n{logs[-6000:]}")
        time.sleep(1)
    raise AssertionError(f"queued experiment {name} did not finish in {timeout} s:\n{status}")


@pytest.fixture(scope="session")
def smoke_workspace(tmp_path_factory) -> SmokeExperiments:
    root = project_copy(tmp_path_factory.mktemp("project"))
    env = smoke_reference.reference_env()
    log = sh(dvc("exp", "run", "-n", "smoke-a", "-S", "preset=smoke"), root, env)
    return SmokeExperiments(root, env, log, smoke_reference.collect(root))


@pytest.fixture(scope="session")
def smoke_experiments(smoke_workspace) -> SmokeExperiments:
    root, env = smoke_workspace.root, smoke_workspace.env
    # The --temp and the queued experiment run side by side (each its own copy of the project,
    # as a queue with -j 2 runs them): on 2 cores that is about one experiment's time saved.
    sh(
        dvc("exp", "run", "--queue", "-n", "smoke-c", "-S", "preset=smoke", "-S", f"train.lr={EXPERIMENTS['smoke-c']}"),
        root,
        env,
    )
    temp_cmd = dvc(
        "exp", "run", "--temp", "-n", "smoke-b", "-S", "preset=smoke", "-S", f"train.lr={EXPERIMENTS['smoke-b']}"
    )
    temp = subprocess.Popen(temp_cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        sh(dvc("queue", "start", "-j", "1"), root, env)
        try:
            wait_for_queue(root, env, "smoke-c")
        finally:
            subprocess.run(dvc("queue", "stop"), cwd=root, env=env, capture_output=True, timeout=120)
        temp_out = temp.communicate(timeout=600)[0]
    finally:
        if temp.poll() is None:
            temp.kill()
            temp.communicate()
    assert temp.returncode == 0, f"{' '.join(temp_cmd)} failed ({temp.returncode}):\n{temp_out[-6000:]}"
    return smoke_workspace


@pytest.fixture(scope="session")
def answer_project(tmp_path_factory):
    """A project copy with a smoke model trained and logged as the answer model (about 30 s):
    built once for every module that asks it questions (tests/test_serve*.py, bench.serve's)."""
    from tests.helpers.answer_model import make_answer_project

    return make_answer_project(tmp_path_factory.mktemp("serve-project"))
