"""Nothing outlives the command that started it: a stage on 2 ranks under torchrun (train.nproc=2,
embed.nproc=2) and a server started through tools/servers.py (and `./dev ui`) are stopped with
their parent by SIGKILL, SIGTERM, SIGINT or a timeout's kill, and no process of the tree lives
on, not even a child the server started in a session of its own (as sshd does for each
connection); no torchrun directory is left in the temp directory, and what a killed launcher left there
is removed by the next stage run. Real processes, so slow (`./dev test -m slow`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from pipeline.core.paths import REPO_ROOT
from stages.startup import TEMP_DIR_PREFIX
from tests.helpers.shards import fake_shards
from tools.fault_matrix import clean_env, project_copy
from tools.servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLS = ("SIGKILL", "SIGTERM", "SIGINT", "timeout")
# Far above a clean stop on a loaded 2-core machine: the stop bound (pipeline/core/lifetime.py),
# and the server keeper's grace before its SIGKILL (tools/server_keeper.py), come well within it.
LIMIT = 120.0


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie (an orphan's, waiting for an init that may not reap)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def survivors(pids: set[int]) -> list[str]:
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        alive = [p for p in pids if not gone(p)]
        if not alive:
            return []
        time.sleep(0.2)
    out = []
    for p in alive:
        try:
            out.append(f"{p}: {' '.join(psutil.Process(p).cmdline())[:200]}")
        except psutil.NoSuchProcess:
            pass
    return out


def reap(proc: subprocess.Popen) -> None:
    """A test's own child ended, whatever the test found."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def tree(pid: int) -> set[int]:
    try:
        return {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
    except psutil.NoSuchProcess:
        return {pid}


def wait_for(predicate, what: str, proc: subprocess.Popen, log: Path, limit: float = 300.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        assert proc.poll() is None, f"exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {limit:g} s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen, how: str) -> None:
    """Stop `proc` as `how` says; "timeout" as subprocess.run does when its timeout passes."""
    if how == "timeout":
        try:
            proc.communicate(timeout=0.5)
        except subprocess.TimeoutExpired:
            proc.kill()
    else:
        proc.send_signal(getattr(signal, how))
    proc.wait(timeout=LIMIT)


def ranks_of(launcher: int, stage: str) -> set[int]:
    """The launcher's rank processes, once both have started."""
    ranks = {p for p in tree(launcher) - {launcher} if not gone(p) and f"stages.{stage}" in _cmdline(p)}
    return ranks if len(ranks) == 2 else set()


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.NoSuchProcess:
        return ""


def assert_temp_dir_left_clean(tmp: Path, launcher: int, killed_outright: bool, env: dict) -> None:
    """No torchrun directory; nothing at all after a stop the launcher saw; after SIGKILL, only
    the launcher's own directory, which the next stage run removes."""
    assert not [p for p in tmp.rglob("torchelastic_*")]
    left = sorted(p.name for p in tmp.iterdir())
    if not killed_outright:
        assert left == []
        return
    assert all(name.startswith(f"{TEMP_DIR_PREFIX}{launcher}-") for name in left), left
    proc = subprocess.run(
        [sys.executable, "-m", "stages.train", "--help"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0
    assert list(tmp.iterdir()) == []


@pytest.fixture
def project(tmp_path):
    root = project_copy(tmp_path / "project")
    fake_shards(root / "data" / "shards", dim=16, rows=(4000, 32, 32))  # 125 steps an epoch
    (tmp_path / "tmp").mkdir()
    env = {**clean_env(), "TMPDIR": str(tmp_path / "tmp"), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    env.pop("ENERGY_FLOW_RUNS_DIR", None)
    return root, env, tmp_path


def sigint_as_from_a_terminal() -> None:
    """preexec_fn: SIGINT back to its default in the child. A process started in the background of
    a non-interactive shell (as CI may start this suite) inherits SIGINT ignored, and Python then
    keeps ignoring it, so a SIGINT test would hang there; a person's Ctrl-C reaches a process whose
    SIGINT is not ignored, which is what is tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_stage(root: Path, env: dict, log: Path, *args: str) -> subprocess.Popen:
    with open(log, "w") as out:  # a file, not a pipe: nobody reads a pipe while the test waits
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=sigint_as_from_a_terminal,
        )


@pytest.mark.parametrize("how", KILLS)
def test_no_rank_outlives_a_stopped_train_launcher(project, how):
    root, env, tmp_path = project
    log = tmp_path / "train.log"
    proc = start_stage(
        root, env, log, "stages.train", "preset=smoke", "train.nproc=2", "train.epochs=50", "run.tracking=disabled"
    )
    try:
        ranks = wait_for(lambda: ranks_of(proc.pid, "train"), "2 ranks", proc, log)
        wait_for(lambda: "epoch 1/50" in log.read_text(), "a trained epoch", proc, log)
        pids = tree(proc.pid) | ranks
        stop(proc, how)
        assert survivors(pids) == [], log.read_text()[-4000:]
    finally:
        reap(proc)
    out = log.read_text()
    assert "Traceback" not in out, out[-4000:]
    if how in ("SIGTERM", "SIGINT"):
        assert f"[train] stopped by {how}: the 2 ranks were stopped" in out, out[-4000:]
    else:  # the ranks got the parent-death signal: rank 0 stops as for SIGTERM, and says so
        assert "[train] stopped by SIGTERM" in out, out[-4000:]
    assert_temp_dir_left_clean(tmp_path / "tmp", proc.pid, how in ("SIGKILL", "timeout"), env)


def test_no_rank_outlives_a_killed_embed_launcher(project):
    root, env, tmp_path = project
    log = tmp_path / "embed.log"
    out_dir = tmp_path / "shards"
    proc = start_stage(
        root, env, log, "stages.embed", "preset=smoke", "embed.nproc=2", "run.tracking=disabled",
        f"embed.out_dir={out_dir}", "run.allow_external_paths=true",
    )  # fmt: skip
    try:
        ranks = wait_for(lambda: ranks_of(proc.pid, "embed"), "2 ranks", proc, log)
        time.sleep(3)  # into the ranks' work (or their start: either way they must go)
        pids = tree(proc.pid) | ranks
        stop(proc, "SIGKILL")
        assert survivors(pids) == [], log.read_text()[-4000:]
    finally:
        reap(proc)
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
    assert_temp_dir_left_clean(tmp_path / "tmp", proc.pid, True, env)


SERVER = """
import sys, time
from tools.servers import start_mlflow_server
with start_mlflow_server(sys.argv[1], sys.argv[2]) as url:
    print(url, flush=True)
    time.sleep(600)
"""


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("how", KILLS)
def test_no_server_outlives_the_process_that_started_it(tmp_path, how):
    log = tmp_path / "server.log"
    env = {**clean_env(), "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "artifacts")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=sigint_as_from_a_terminal,
        )
    try:
        url = wait_for(lambda: next(iter(log.read_text().split()), ""), "server URL", proc, log)
        assert answers(url)
        pids = tree(proc.pid)
        assert any("uvicorn" in _cmdline(p) for p in pids)  # the CLI's child, which used to outlive it
        stop(proc, how)
        assert survivors(pids) == [], log.read_text()[-4000:]
        assert not answers(url)
    finally:
        reap(proc)


def test_no_server_outlives_a_killed_dev_ui(tmp_path):
    port = free_port()
    log = tmp_path / "ui.log"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(REPO_ROOT / "dev"), "ui", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=sigint_as_from_a_terminal,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(url), "the UI", proc, log)
        pids = tree(proc.pid)
        stop(proc, "SIGKILL")
        assert survivors(pids) == [], log.read_text()[-4000:]
        assert not answers(url)
    finally:
        reap(proc)


# A server that starts a child in a session of its own (as sshd does per connection): a signal to
# the server's group misses that child, so the keeper finds it first (tools/server_keeper.py).
ESCAPING_SERVER = """
import subprocess, sys, time
from tools.servers import kept_group
with kept_group() as keeper:
    server = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
'''], process_group=keeper.pid, stdout=sys.stdout)
    time.sleep(600)
"""


@pytest.mark.parametrize("how", ("SIGKILL", "SIGTERM"))
def test_a_servers_child_in_a_session_of_its_own_ends_with_it(tmp_path, how):
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", ESCAPING_SERVER],
            env={**clean_env(), "PYTHONPATH": str(REPO_ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        child = int(wait_for(lambda: next(iter(log.read_text().split()), ""), "the child's pid", proc, log))
        assert os.getsid(child) == child != os.getsid(proc.pid)  # out of the server's group and session
        pids = tree(proc.pid) | {child}
        stop(proc, how)
        assert survivors(pids) == [], log.read_text()[-4000:]
    finally:
        reap(proc)
