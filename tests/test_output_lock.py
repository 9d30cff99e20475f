"""One writer per output: a second writer fails at once, naming the first; a killed holder's lock
is taken over; no lock file stays behind a writer that ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pipeline.core import output_lock
from pipeline.core.output_lock import HELD_ENV, OutputBusy, lock_path, writing

pytestmark = pytest.mark.unit


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/shards until it is killed."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from pipeline.core.output_lock import writing
        with writing([(Path({str(tmp_path / "shards")!r}), "data/shards")]):
            print("held", flush=True)
            time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_writer_fails_at_once_naming_the_holder(tmp_path, holder):
    with pytest.raises(OutputBusy) as raised:
        with writing([(tmp_path / "shards", "data/shards")]):
            pytest.fail("the lock was taken twice")
    message = str(raised.value)
    assert message.startswith(f"data/shards is being written by pid {holder.pid} (python")
    assert "started " in message and message.endswith("wait for it or stop it")


def test_a_busy_output_releases_the_locks_taken_before_it(tmp_path, holder):
    first = tmp_path / "a_first"  # sorts before shards: taken, then let go when shards is busy
    with pytest.raises(OutputBusy):
        with writing([(first, "a_first"), (tmp_path / "shards", "data/shards")]):
            pass
    assert not lock_path(first).exists()
    with writing([(first, "a_first")]):
        pass


def test_a_killed_holders_lock_is_taken_over_and_removed_after(tmp_path, holder):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert lock_path(tmp_path / "shards").exists()  # SIGKILL: nothing ran to remove it
    with writing([(tmp_path / "shards", "data/shards")]):
        assert str(os.getpid()) in lock_path(tmp_path / "shards").read_text()
    assert not lock_path(tmp_path / "shards").exists()
    assert os.listdir(tmp_path) == []


def test_a_lock_variable_not_set_by_an_ancestor_is_ignored(tmp_path, holder, monkeypatch):
    monkeypatch.setenv(HELD_ENV, str(holder.pid))  # exported by something that is not our launcher
    with pytest.raises(OutputBusy):
        with writing([(tmp_path / "shards", "data/shards")]):
            pass


def test_ranks_started_by_the_holder_take_no_lock(tmp_path):
    code = (
        "from pathlib import Path; from pipeline.core.output_lock import writing\n"
        f"with writing([(Path({str(tmp_path / 'shards')!r}), 'data/shards')]): print('rank wrote')"
    )
    with writing([(tmp_path / "shards", "data/shards")]), output_lock.held_for_ranks():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "rank wrote"
    assert HELD_ENV not in os.environ
