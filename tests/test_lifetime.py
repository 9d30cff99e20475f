"""pipeline/core/lifetime.py on small real processes: a child that asked for the parent-death
signal dies with its parent however the parent dies, a stop ends within its bound even when the
process ignores it, and a private temp directory goes with its owner (or with the next owner,
when it was killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipeline.core import lifetime
from pipeline.core.paths import REPO_ROOT

pytestmark = pytest.mark.unit

PREFIX = "lifetime-test-"


def python(code: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **kw.pop("env", {})}
    return subprocess.Popen([sys.executable, "-c", code], env=env, text=True, **kw)


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for a parent that is not this test to reap it."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], limit: float = 60.0) -> list[int]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        alive = [p for p in pids if not gone(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


# A parent that starts a child which asks to die with it, prints the child's pid, then waits.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import os, sys, time
from pipeline.core import lifetime
lifetime.die_with_parent(int(sys.argv[1]))
print("ready", flush=True)
time.sleep(600)
''', str(__import__("os").getpid())], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_child_that_asked_dies_with_its_parent_however_the_parent_dies(sig):
    parent = python(PARENT, stdout=subprocess.PIPE)
    try:
        child = int(parent.stdout.readline())
        assert not gone(child)
        parent.send_signal(sig)
        parent.wait(timeout=60)
        assert wait_gone([child]) == [], "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_child_whose_parent_is_already_gone_gets_the_signal_at_once():
    # The parent it names is not its parent: as when the parent died before the child's call.
    code = f"from pipeline.core import lifetime; import time; lifetime.die_with_parent({dead_pid()}); time.sleep(600)"
    proc = python(code)
    assert proc.wait(timeout=60) == -signal.SIGTERM


PDEATHSIG = """
import ctypes, json, os, signal
from pipeline.core import lifetime
asked = lifetime.follow_parent()
value = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
print(json.dumps({"asked": asked, "signal": value.value, "left": os.environ.get(lifetime.PARENT_ENV)}))
"""


@pytest.mark.parametrize(
    "env",
    [{lifetime.PARENT_ENV: str(os.getpid())}, {"TORCHELASTIC_RUN_ID": "run"}, {"DVC_STAGE": "train"}],
    ids=["named", "torchrun", "dvc"],
)
def test_a_stage_follows_the_launcher_that_started_it_and_takes_the_name_out_of_its_environment(env):
    proc = python(PDEATHSIG, stdout=subprocess.PIPE, env=env)
    out, _ = proc.communicate(timeout=60)
    assert out.strip() == f'{{"asked": true, "signal": {int(signal.SIGTERM)}, "left": null}}'


def test_a_process_started_by_a_person_is_left_to_live_on_its_own():
    launchers = (lifetime.PARENT_ENV, "TORCHELASTIC_RUN_ID", "DVC_STAGE")
    env = {k: v for k, v in os.environ.items() if k not in launchers}
    proc = subprocess.Popen(
        [sys.executable, "-c", PDEATHSIG], env={**env, "PYTHONPATH": str(REPO_ROOT)}, stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=60)
    assert out.strip() == '{"asked": false, "signal": 0, "left": null}'


# A process that ignores SIGTERM (its handler does nothing), after arming the bound, with a
# private temp directory holding a file.
STUCK = f"""
import signal, tempfile, time
from pipeline.core import lifetime
lifetime.use_private_temp_dir("{PREFIX}")
tempfile.mkstemp()
lifetime.bound_stops("probe", grace=1.0)
signal.signal(signal.SIGTERM, lambda *a: None)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def test_a_process_that_ignores_its_stop_ends_within_the_bound_and_removes_its_temp_dir(tmp_path):
    proc = python(STUCK, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"TMPDIR": str(tmp_path)})
    assert proc.stdout.readline().strip() == "ready"
    assert [p.name.startswith(f"{PREFIX}{proc.pid}-") for p in tmp_path.iterdir()] == [True]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip() == "[probe] still running 1 s after SIGTERM: ended without finishing its stop"
    assert list(tmp_path.iterdir()) == []


def test_a_killed_owners_temp_dir_is_removed_by_the_next_owner(tmp_path):
    code = f"from pipeline.core import lifetime; lifetime.use_private_temp_dir({PREFIX!r}); input()"
    first = python(code, stdin=subprocess.PIPE, env={"TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 60
    while not list(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    [left] = tmp_path.iterdir()
    first.kill()  # no atexit: its directory stays
    first.wait()
    assert left.is_dir()
    second = python(code, stdin=subprocess.PIPE, env={"TMPDIR": str(tmp_path)})
    second.communicate("\n", timeout=60)  # ends normally: its own directory goes too
    assert second.returncode == 0
    assert list(tmp_path.iterdir()) == []


def test_only_dead_owners_directories_are_swept(tmp_path):
    dead = dead_pid()
    (tmp_path / f"{PREFIX}{dead}-abcd1234").mkdir()
    (tmp_path / f"{PREFIX}{os.getpid()}-abcd1234").mkdir()  # alive: this test
    (tmp_path / f"{PREFIX}{dead}-abcd1234.txt").write_text("not a directory of ours")
    (tmp_path / f"other-{dead}-abcd1234").mkdir()
    removed = lifetime.remove_dead_owners_dirs(tmp_path, PREFIX)
    assert [p.name for p in removed] == [f"{PREFIX}{dead}-abcd1234"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{PREFIX}{os.getpid()}-abcd1234", f"{PREFIX}{dead}-abcd1234.txt", f"other-{dead}-abcd1234"]
    )


def test_a_private_temp_dir_goes_when_its_block_fails(tmp_path):
    with pytest.raises(RuntimeError), lifetime.private_temp_dir(PREFIX, tmp_path) as d:
        (Path(d) / "f").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


# What a stage process does first (stages/startup.py), then a stop it ignores.
STAGE_START = """
import signal, tempfile, time
from stages import startup
from pipeline.core import lifetime
startup.begin()
tempfile.mkstemp()
lifetime.set_stop_grace(1.0)
signal.signal(signal.SIGTERM, lambda *a: None)
print(tempfile.gettempdir(), flush=True)
while True:
    time.sleep(1)
"""


def test_a_stage_process_takes_a_temp_dir_of_its_own_and_its_stop_is_bounded(tmp_path):
    proc = python(STAGE_START, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"TMPDIR": str(tmp_path)})
    own = Path(proc.stdout.readline().strip())
    assert own.parent == tmp_path and own.name.startswith(f"energy-flow-stage-{proc.pid}-")
    assert len(list(own.iterdir())) == 1
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "still running 1 s after SIGTERM: ended without finishing its stop" in err
    assert list(tmp_path.iterdir()) == []
