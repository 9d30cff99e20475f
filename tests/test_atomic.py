"""Atomic writes: a writer killed mid-write leaves a hidden temp file; the next write of the same
file removes it, and never a temp whose writer is still alive or one of another file."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.core.atomic import atomic_path, write_text

pytestmark = pytest.mark.unit


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_next_write_removes_a_killed_writers_temp_and_keeps_the_rest(tmp_path):
    dest = tmp_path / "grad_norm.png"
    killed = tmp_path / f".grad_norm.png.{dead_pid()}.abcd_123.tmp"  # a SIGKILLed writer's
    live = tmp_path / f".grad_norm.png.{os.getpid()}.zzzz9999.tmp"  # a writer at work right now
    other = tmp_path / f".loss.png.{dead_pid()}.abcd_123.tmp"  # another file's: not this write's to remove
    unlike = tmp_path / ".grad_norm.png.old-format.tmp"  # no writer's pid in it
    for p in (killed, live, other, unlike):
        p.write_text("partial")
    write_text(dest, "whole")
    assert dest.read_text() == "whole"
    assert not killed.exists()
    assert live.exists() and other.exists() and unlike.exists()


def test_the_temp_name_carries_the_writers_pid(tmp_path):
    dest = tmp_path / "report.html"
    with atomic_path(dest) as tmp:
        assert tmp.name.startswith(f".report.html.{os.getpid()}.") and tmp.name.endswith(".tmp")
        tmp.write_text("x")
    assert dest.read_text() == "x" and [p.name for p in tmp_path.iterdir()] == ["report.html"]


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_written_file_has_the_mode_the_umask_gives_and_the_umask_is_left_alone(tmp_path, mask):
    saved = os.umask(mask)
    try:
        write_text(tmp_path / "f.txt", "x")
        assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o666 & ~mask
        assert os.umask(mask) == mask  # (reads it back: unchanged by the write)
    finally:
        os.umask(saved)


def test_importing_the_module_changes_no_umask():
    code = "import os; os.umask(0o027); import pipeline.core.atomic; print(oct(os.umask(0)))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    assert out.strip() == "0o27"
