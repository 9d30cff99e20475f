"""What a process may spend (pipeline/core/resources.py), read from fake /proc and /sys trees: the
memory limit of the process's own cgroup and its ancestors (v1, v2, nested, "max", none), its
rlimits, and its usable cores (affinity capped by the CPU quota)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from pipeline.core import resources

pytestmark = pytest.mark.unit

GiB = 2**30


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def tree(tmp_path: Path, cgroup: str, mounts: list[str]) -> dict:
    """/proc/self/cgroup and /proc/self/mountinfo as given; the mount points under tmp_path/sys."""
    write(tmp_path / "cgroup", cgroup)
    lines = [f"{30 + i} 23 0:{40 + i} {m.replace('SYS', str(tmp_path / 'sys'))}" for i, m in enumerate(mounts)]
    write(tmp_path / "mountinfo", "\n".join(lines) + "\n")
    return {"proc_cgroup": tmp_path / "cgroup", "mountinfo": tmp_path / "mountinfo", "root": tmp_path / "none"}


V1_MOUNTS = [
    "/ SYS/memory rw,relatime - cgroup cgroup rw,memory",
    "/ SYS/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct",
    "/ SYS/unified rw,relatime - cgroup2 cgroup2 rw",
]
V1_CGROUP = "9:name=systemd:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/job\n0::/\n"


def test_v1_limit_on_the_process_own_cgroup_not_the_root(tmp_path):
    """The root says no limit (v1's huge number); the process's own cgroup holds 3 GiB."""
    paths = tree(tmp_path, V1_CGROUP, V1_MOUNTS)
    mem = tmp_path / "sys" / "memory"
    write(mem / "memory.limit_in_bytes", "9223372036854771712\n")
    write(mem / "process_api" / "memory.limit_in_bytes", "9223372036854771712\n")
    own = mem / "process_api" / "abc"
    write(own / "memory.limit_in_bytes", f"{3 * GiB}\n")
    write(own / "memory.usage_in_bytes", f"{GiB}\n")
    write(own / "memory.stat", f"cache 5\ntotal_inactive_file {GiB // 2}\n")
    limit = resources.cgroup_memory(**paths)
    # 3 GiB - (1 GiB used - 0.5 GiB reclaimable cache) = 2.5 GiB
    assert limit.headroom == 5 * GiB // 2 and limit.limit == 3 * GiB
    assert limit.source == f"{own / 'memory.limit_in_bytes'} limit 3,072 MB"


def test_v2_tightest_of_memory_max_and_high_up_the_tree(tmp_path):
    paths = tree(tmp_path, "0::/user.slice/job/step\n", ["/ SYS rw - cgroup2 cgroup2 rw"])
    sys_ = tmp_path / "sys"
    write(sys_ / "user.slice" / "job" / "step" / "memory.max", "max\n")
    write(sys_ / "user.slice" / "job" / "step" / "memory.current", f"{GiB}\n")
    write(sys_ / "user.slice" / "job" / "memory.max", f"{8 * GiB}\n")
    write(sys_ / "user.slice" / "job" / "memory.high", f"{4 * GiB}\n")
    write(sys_ / "user.slice" / "job" / "memory.current", f"{GiB}\n")
    write(sys_ / "user.slice" / "memory.max", f"{16 * GiB}\n")
    limit = resources.cgroup_memory(**paths)
    assert limit.limit == 4 * GiB and limit.headroom == 3 * GiB
    assert "user.slice/job/memory.high limit 4,096 MB" in limit.source


def test_nested_v1_ancestor_is_tighter(tmp_path):
    paths = tree(tmp_path, V1_CGROUP, V1_MOUNTS)
    mem = tmp_path / "sys" / "memory"
    write(mem / "process_api" / "memory.limit_in_bytes", f"{2 * GiB}\n")
    write(mem / "process_api" / "abc" / "memory.limit_in_bytes", f"{3 * GiB}\n")
    limit = resources.cgroup_memory(**paths)
    assert limit.limit == 2 * GiB and "process_api/memory.limit_in_bytes" in limit.source


def test_container_mount_shows_its_own_cgroup_at_the_root(tmp_path):
    """In a container the mount's root is the container's cgroup: the files are at the mount point."""
    paths = tree(tmp_path, "0::/docker/c1\n", ["/docker/c1 SYS rw - cgroup2 cgroup2 rw"])
    write(tmp_path / "sys" / "memory.max", f"{GiB}\n")
    assert resources.cgroup_memory(**paths).limit == GiB


@pytest.mark.parametrize(
    "cgroup, files",
    [
        ("0::/a\n", {"a/memory.max": "max\n", "memory.max": "max\n"}),  # v2 "max" everywhere
        (V1_CGROUP, {"memory/process_api/abc/memory.limit_in_bytes": "9223372036854771712\n"}),  # v1 "none"
        ("0::/a\n", {}),  # no files at all
    ],
)
def test_no_limit(tmp_path, cgroup, files):
    paths = tree(tmp_path, cgroup, V1_MOUNTS[:1] + ["/ SYS rw - cgroup2 cgroup2 rw"])
    for rel, text in files.items():
        write(tmp_path / "sys" / rel, text)
    assert resources.cgroup_memory(**paths) is None


def test_no_proc_files_means_no_limit(tmp_path):
    assert resources.cgroup_memory(tmp_path / "missing", tmp_path / "missing", tmp_path) is None
    assert resources.own_cgroups(tmp_path / "missing") == {}


def test_own_cgroups_reads_v1_co_mounted_and_v2(tmp_path):
    write(tmp_path / "cgroup", "5:cpu,cpuacct:/job\n4:memory:/process_api/abc\n1:name=systemd:/\n0::/u\n")
    assert resources.own_cgroups(tmp_path / "cgroup") == {
        "cpu": "/job",
        "cpuacct": "/job",
        "memory": "/process_api/abc",
        "": "/u",
    }


def test_rlimit_as_is_per_process():
    class Info:
        vms, data = 3 * GiB, GiB

    class Proc:
        def memory_info(self):
            return Info()

    limits = {resource.RLIMIT_AS: (4 * GiB, resource.RLIM_INFINITY), resource.RLIMIT_DATA: (-1, -1)}
    cap = resources.rlimit_memory(lambda which: limits.get(which, (-1, -1)), Proc())
    assert cap.per_process and cap.headroom == GiB and cap.source == "RLIMIT_AS 4,096 MB (ulimit/prlimit)"
    limits[resource.RLIMIT_DATA] = (GiB + 2**20, -1)  # 1 MB left in the data segment: tighter
    assert resources.rlimit_memory(lambda which: limits.get(which, (-1, -1)), Proc()).source.startswith("RLIMIT_DATA")
    assert resources.rlimit_memory(lambda which: (-1, -1), Proc()) is None


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"cpu,cpuacct/job/cpu.cfs_quota_us": "150000\n", "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n"}, 2),
        ({"cpu,cpuacct/job/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n"}, 8),
        ({"unified/cpu.max": "100000 100000\n"}, 1),  # the process's v2 cgroup is /: its quota applies
        ({"unified/cpu.max": "max 100000\n"}, 8),
        ({}, 8),
    ],
)
def test_usable_cores_capped_by_the_quota(tmp_path, files, expected):
    paths = tree(tmp_path, V1_CGROUP, V1_MOUNTS)
    for rel, text in files.items():
        write(tmp_path / "sys" / rel, text)
    cores = resources.usable_cores(**paths, affinity=lambda: set(range(8)))
    assert cores.usable == expected
    if expected < 8:
        assert "cgroup CPU quota" in cores.source


def test_usable_cores_of_this_process():
    cores = resources.usable_cores()
    assert 1 <= cores.usable <= len(os.sched_getaffinity(0))
