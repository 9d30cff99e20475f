"""The preflight as a user meets it: a stage run as `python -m stages.<name>` refuses what cannot fit
before any worker starts, and inside a real memory cgroup it names that cgroup's limit."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipeline.core import resources
from pipeline.core.paths import REPO_ROOT
from tests.helpers.shards import fake_shards

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_watching_children(args: list[str], prefix: list[str] | None = None) -> tuple[int, str, set[str]]:
    """Run a stage; return its exit code, stderr and the command lines of every process it started."""
    proc = subprocess.Popen(
        [*(prefix or []), sys.executable, "-m", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[str] = set()
    me = psutil.Process(proc.pid)
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    seen.add(" ".join(child.cmdline()))
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err, seen


@pytest.mark.parametrize("stage", ["train", "embed"])
def test_more_processes_than_cores_start_no_worker(stage):
    n = resources.usable_cores().usable + 1
    code, err, children = run_watching_children([f"stages.{stage}", f"{stage}.nproc={n}", "run.tracking=disabled"])
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"[{stage}] config error: parameter '{stage}.nproc' = {n}, but this process may use {n - 1} core(s) "
        f"({resources.usable_cores().source}); expected {stage}.nproc <= {n - 1} on {stage}.device=cpu. "
        "Nothing was started"
    ]
    assert not any(f"stages.{stage}" in c or "torch" in c for c in children), children


@contextlib.contextmanager
def memory_cgroup(limit: int):
    """A new memory cgroup under this process's own (v1 or v2), limited to `limit` bytes; yields the
    file a process writes its pid to, and the limit file. Skips where this process may not make one."""
    made = None
    for controller, limit_name in (("memory", "memory.limit_in_bytes"), (resources.V2, "memory.max")):
        own = next(resources.cgroup_dirs(controller), None)
        if own is None or not os.access(own, os.W_OK):
            continue
        if controller == resources.V2 and "memory" not in (own / "cgroup.subtree_control").read_text():
            continue
        target = own / f"energy-flow-test-{os.getpid()}"
        try:
            target.mkdir()
            (target / limit_name).write_text(str(limit))
        except OSError:
            with contextlib.suppress(OSError):
                target.rmdir()
            continue
        made = (target, limit_name)
        break
    if made is None:
        pytest.skip("no memory cgroup can be made here (needs root on cgroup v1, or a delegated v2 subtree)")
    try:
        yield made[0] / "cgroup.procs", made[0] / made[1]
    finally:
        for _ in range(50):  # its process has exited; the kernel frees the cgroup a moment later
            try:
                made[0].rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_lattice_width_100000_is_refused_inside_a_3_gib_cgroup(tmp_path):
    """The default preset with model.lattice_width=100000 (~14 GB a step) fits this machine but not a
    3 GiB cgroup: refused before anything is built, the cgroup's own limit file named."""
    shards = tmp_path / "shards"
    fake_shards(shards, dim=384, rows=(64, 16, 16))
    with memory_cgroup(3 * 2**30) as (procs, limit_file):
        code, err, _ = run_watching_children(
            [
                "stages.train",
                "model.lattice_width=100000",
                "run.allow_external_paths=true",
                f"embed.out_dir={shards}",
                f"train.out_dir={tmp_path / 'models'}",
                f"train.checkpoint_dir={tmp_path / 'ckpt'}",
                "train.device=cpu",
                "run.tracking=disabled",
            ],
            prefix=["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh"],
        )
    assert code == 1, err
    assert err.startswith("[train] error: this config cannot train here: the estimated peak is"), err
    assert f"cgroup headroom ({limit_file} limit 3,072 MB)" in err, err
    assert not (tmp_path / "models").exists() and not (tmp_path / "ckpt").exists()
    assert Path(procs).parent.exists() is False
