"""A stage's outputs go in place together or not at all: the previous outputs survive a failure
before the commit, during it (rolled back), and a writer killed mid-commit (undone by the next)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.output_transaction import JOURNAL, outputs, recover_dead_staging

pytestmark = pytest.mark.unit


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def previous(tmp_path):
    """A previous run's outputs: two files in two directories and a directory of files."""
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "train.json").write_text('{"old": 1}')
    (tmp_path / "telemetry").mkdir()
    (tmp_path / "telemetry" / "steps.csv").write_text("step\n1\n")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "a.npy").write_bytes(b"old shard")
    (tmp_path / "last.pt").write_bytes(b"checkpoint")
    return tmp_path


def snapshot(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_new(tx, root) -> None:
    tx.path(root / "metrics" / "train.json").write_text('{"new": 2}')
    tx.path(root / "telemetry" / "steps.csv").write_text("step\n1\n2\n")
    shards = tx.path(root / "shards")
    shards.mkdir()
    (shards / "b.npy").write_bytes(b"new shard")
    tx.remove(root / "last.pt")


def test_commit_puts_every_output_in_place_and_leaves_no_staging(previous):
    with outputs("train", [previous / "metrics" / "train.json"]) as tx:
        write_new(tx, previous)
    assert snapshot(previous) == {
        "metrics/train.json": b'{"new": 2}',
        "telemetry/steps.csv": b"step\n1\n2\n",
        "shards/b.npy": b"new shard",
    }
    assert not list(previous.rglob("*.staging"))


def test_a_failure_before_the_commit_keeps_every_previous_output(previous):
    before = snapshot(previous)
    with pytest.raises(RuntimeError, match="disk said no"):
        with outputs("train") as tx:
            write_new(tx, previous)
            raise RuntimeError("disk said no")
    assert snapshot(previous) == before
    assert not list(previous.rglob("*.staging"))


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4, 5])
def test_a_failure_during_the_commit_rolls_back_what_was_swapped(previous, monkeypatch, fail_at):
    """os.replace fails on its Nth call inside the commit (after 0..4 outputs were put in place)."""
    before = snapshot(previous)
    real_replace, calls = os.replace, []

    def replace(src, dst, *a, **kw):
        if str(src).endswith(".staging") or str(dst).endswith(JOURNAL):  # the journal's own writes
            return real_replace(src, dst, *a, **kw)
        calls.append(dst)
        if len(calls) == fail_at:
            raise OSError(28, "No space left on device", str(src))  # as os.replace names it
        return real_replace(src, dst, *a, **kw)

    wanted = r"^/.*: could not be put in place .*is as it was before this run"
    with pytest.raises(PipelineError, match=wanted) as raised:
        with outputs("train") as tx:
            write_new(tx, previous)
            monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "replace", real_replace)
    assert ".staging" not in str(raised.value).split(":")[0]  # named by the output, not its staged copy
    assert snapshot(previous) == before
    assert not list(previous.rglob("*.staging"))


def test_a_file_where_a_directory_is_written_fails_before_anything_is_replaced(previous):
    (previous / "metrics" / "train.json").unlink()
    (previous / "metrics" / "train.json").mkdir()  # e.g. a directory of someone's
    before = snapshot(previous)
    with pytest.raises(PipelineError, match=r"train.json is a directory where the train stage writes a file"):
        with outputs("train") as tx:
            write_new(tx, previous)
    assert snapshot(previous) == before
    assert (previous / "metrics" / "train.json").is_dir()


def test_a_killed_commit_is_undone_and_its_staging_removed_by_the_next_run(previous):
    """A writer killed between moving the previous shards away and moving the new ones in: the
    next run of the stage finds its staging directory (its pid is dead) and puts the shards back."""
    pid = dead_pid()
    staging = previous / f".train-outputs.{pid}.0a1b2c3d.staging"
    staging.mkdir()
    os.replace(previous / "shards", staging / "shards.previous")
    (staging / "steps.csv").write_text("new, never moved in")
    journal = {"stage": "train", "pid": pid, "host": os.uname().nodename, "state": "committing", "writes": []}
    (staging / JOURNAL).write_text(json.dumps(journal))
    live = previous / f".train-outputs.{os.getpid()}.0a1b2c3d.staging"  # a writer at work now
    live.mkdir()
    (live / JOURNAL).write_text(json.dumps({**journal, "pid": os.getpid()}))
    other = previous / f".evaluate-outputs.{pid}.0a1b2c3d.staging"  # another stage's
    other.mkdir()

    recover_dead_staging(previous, "train")

    assert (previous / "shards" / "a.npy").read_bytes() == b"old shard"
    assert not staging.exists()
    assert live.exists() and other.exists()


def test_a_dead_writers_completed_commit_is_kept(previous):
    pid = dead_pid()
    staging = previous / f".train-outputs.{pid}.0a1b2c3d.staging"
    staging.mkdir()
    (staging / "shards.previous").mkdir()
    (staging / "shards.previous" / "a.npy").write_bytes(b"older")
    journal = {"stage": "train", "pid": pid, "host": os.uname().nodename, "state": "committed", "writes": ["shards"]}
    (staging / JOURNAL).write_text(json.dumps(journal))
    recover_dead_staging(previous, "train")
    assert (previous / "shards" / "a.npy").read_bytes() == b"old shard"
    assert not staging.exists()


def test_opening_a_transaction_removes_a_dead_writers_staging(previous):
    pid = dead_pid()
    staging = previous / "metrics" / f".train-outputs.{pid}.0a1b2c3d.staging"
    staging.mkdir()
    (staging / "train.json").write_text("half")
    (staging / JOURNAL).write_text(
        json.dumps({"stage": "train", "pid": pid, "host": os.uname().nodename, "state": "staging"})
    )
    with outputs("train", [previous / "metrics" / "train.json"]) as tx:
        assert not staging.exists()
        tx.path(previous / "metrics" / "train.json").write_text("{}")
    assert (previous / "metrics" / "train.json").read_text() == "{}"
