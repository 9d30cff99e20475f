"""What this process may spend: memory (the machine's, its own cgroup's, its rlimits) and cores
(its CPU affinity, its cgroup's CPU quota), each with the file or call that said so.

The process's own cgroup, not the root of /sys/fs/cgroup: inside a container or a scheduler's job
the root files say "no limit" while the limit sits on the process's own cgroup or an ancestor
(/proc/self/cgroup names it, v2 and each v1 hierarchy; /proc/self/mountinfo says where each is
mounted). Every cgroup from the process's own up to the mount is read and the tightest limit
wins. Every reader takes its /proc and /sys paths as arguments so that tests build fake trees.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import psutil

MB = 2**20
PROC_CGROUP = Path("/proc/self/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")  # where the hierarchies are when mountinfo cannot be read
# cgroup v1 writes "no limit" as a huge page-rounded number (9223372036854771712): past this is none.
NO_LIMIT = 2**60
V2 = ""  # the key of the unified (v2) hierarchy in `own_cgroups` and `cgroup_mounts`


def _fmt(n_bytes: float) -> str:
    return f"{n_bytes / MB:,.0f} MB"


# --------------------------------------------------------------------------- where the cgroups are


def own_cgroups(proc_cgroup: Path = PROC_CGROUP) -> dict[str, str]:
    """{controller: this process's cgroup path}: "" (V2) for the unified hierarchy, each v1
    controller under its own name (a co-mounted "cpu,cpuacct" line gives both)."""
    out: dict[str, str] = {}
    try:
        text = Path(proc_cgroup).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out[V2] = path
        for c in controllers.split(","):
            if c and not c.startswith("name="):
                out[c] = path
    return out


def cgroup_mounts(mountinfo: Path = MOUNTINFO) -> dict[str, tuple[Path, str]]:
    """{controller: (mount point, the cgroup the mount shows at its root)} from mountinfo; V2 for
    cgroup2. Empty when mountinfo cannot be read."""
    out: dict[str, tuple[Path, str]] = {}
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 4 or sep < 5:
            continue
        root, point = fields[3], fields[4].replace("\\040", " ")
        fstype, options = fields[sep + 1], fields[sep + 3]
        if fstype == "cgroup2":
            out.setdefault(V2, (Path(point), root))
        elif fstype == "cgroup":
            for c in options.split(","):
                if c not in ("rw", "ro") and not c.startswith("name="):
                    out.setdefault(c, (Path(point), root))
    return out


def cgroup_dirs(
    controller: str, proc_cgroup: Path = PROC_CGROUP, mountinfo: Path = MOUNTINFO, root: Path = CGROUP_ROOT
) -> Iterator[Path]:
    """This process's cgroup directory for `controller` (V2 or a v1 controller's name), then each
    ancestor up to the mount point: the directories whose limits apply to this process."""
    own = own_cgroups(proc_cgroup)
    if controller not in own:
        return
    mounts = cgroup_mounts(mountinfo)
    if controller in mounts:
        point, mount_root = mounts[controller]
    else:  # no mountinfo: the usual places
        point = root if controller == V2 else root / controller
        mount_root = "/"
    path = own[controller]
    inside = mount_root == "/" or path == mount_root or path.startswith(mount_root.rstrip("/") + "/")
    rel = os.path.relpath(path, mount_root) if inside else "."
    here = Path(os.path.normpath(point / rel))
    # A path the mount does not show (another cgroup namespace): its root is all there is to read.
    if not str(here).startswith(str(point)) or not here.is_dir():
        here = point
    while True:
        yield here
        if here == point or here == here.parent:
            return
        here = here.parent


def _read_int(path: Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        return None if text in ("", "max") else int(text.split()[0])
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


# --------------------------------------------------------------------------- memory


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


@dataclass(frozen=True)
class MemoryLimit:
    headroom: int  # bytes that can still be allocated under it
    limit: int  # the limit itself, bytes
    source: str  # the file or call that set it, for a message
    per_process: bool = False  # an rlimit: each process has its own


def cgroup_memory(
    proc_cgroup: Path = PROC_CGROUP, mountinfo: Path = MOUNTINFO, root: Path = CGROUP_ROOT
) -> Optional[MemoryLimit]:
    """The tightest memory limit of this process's cgroups (v2 memory.max and memory.high, v1
    memory.limit_in_bytes, from its own cgroup up), with its headroom: the limit less what that
    cgroup uses, the inactive page cache left out (the kernel reclaims it before the OOM killer
    acts, as `docker stats` counts it). None when no cgroup sets one."""
    found: list[MemoryLimit] = []
    candidates = [
        (V2, ("memory.max", "memory.high"), "memory.current", "inactive_file"),
        ("memory", ("memory.limit_in_bytes",), "memory.usage_in_bytes", "total_inactive_file"),
    ]
    for controller, limit_files, usage_file, stat_key in candidates:
        for d in cgroup_dirs(controller, proc_cgroup, mountinfo, root):
            for name in limit_files:
                limit = _read_int(d / name)
                if limit is None or limit >= NO_LIMIT:
                    continue
                used = max(0, (_read_int(d / usage_file) or 0) - _stat(d / "memory.stat", stat_key))
                found.append(MemoryLimit(max(0, limit - used), limit, f"{d / name} limit {_fmt(limit)}"))
    return min(found, key=lambda m: m.headroom, default=None)


def rlimit_memory(
    getrlimit: Callable[[int], tuple[int, int]] = resource.getrlimit, process: Optional[psutil.Process] = None
) -> Optional[MemoryLimit]:
    """The tighter of RLIMIT_AS and RLIMIT_DATA (`ulimit -v`, `prlimit --as`), per process: what
    this process's resident memory can still grow by, taken as the limit less what it has mapped
    (address space for AS, the data segment for DATA). None when neither is set."""
    proc = process or psutil.Process()
    info = proc.memory_info()
    found: list[MemoryLimit] = []
    for name, used in (("RLIMIT_AS", info.vms), ("RLIMIT_DATA", getattr(info, "data", info.vms))):
        soft, _ = getrlimit(getattr(resource, name))
        if soft in (resource.RLIM_INFINITY, -1) or soft >= NO_LIMIT:
            continue
        found.append(MemoryLimit(max(0, soft - used), soft, f"{name} {_fmt(soft)} (ulimit/prlimit)", per_process=True))
    return min(found, key=lambda m: m.headroom, default=None)


@dataclass(frozen=True)
class Memory:
    """What the processes of this node can still allocate, and who said so."""

    free: int  # bytes, all processes together: min(MemAvailable, the cgroups' headroom)
    source: str
    per_process: Optional[MemoryLimit] = None  # an rlimit: each process's own ceiling

    @property
    def free_mb(self) -> float:
        return self.free / MB


def available_memory(proc_cgroup: Path = PROC_CGROUP, mountinfo: Path = MOUNTINFO, root: Path = CGROUP_ROOT) -> Memory:
    free, source = psutil.virtual_memory().available, "MemAvailable"
    cg = cgroup_memory(proc_cgroup, mountinfo, root)
    if cg is not None and cg.headroom < free:
        free, source = cg.headroom, f"cgroup headroom ({cg.source})"
    elif cg is None:
        source += ", no cgroup limit"
    else:
        source += f", under cgroup {cg.source}"
    return Memory(free, source, rlimit_memory())


# --------------------------------------------------------------------------- cores


@dataclass(frozen=True)
class Cores:
    usable: int
    source: str  # how it was found, for a message


def cgroup_cpu_quota(
    proc_cgroup: Path = PROC_CGROUP, mountinfo: Path = MOUNTINFO, root: Path = CGROUP_ROOT
) -> Optional[tuple[float, str]]:
    """(cores the tightest CPU quota of this process's cgroups allows, the file), or None: v2
    cpu.max ("QUOTA PERIOD" or "max PERIOD"), v1 cpu.cfs_quota_us / cpu.cfs_period_us (-1: none)."""
    found: list[tuple[float, str]] = []
    for d in cgroup_dirs(V2, proc_cgroup, mountinfo, root):
        try:
            quota, _, period = (d / "cpu.max").read_text().strip().partition(" ")
        except OSError:
            continue
        if quota != "max" and period:
            found.append((int(quota) / int(period), f"{d / 'cpu.max'} {quota} {period}"))
    for d in cgroup_dirs("cpu", proc_cgroup, mountinfo, root):
        quota, period = _read_int(d / "cpu.cfs_quota_us"), _read_int(d / "cpu.cfs_period_us")
        if quota is not None and quota > 0 and period:
            found.append((quota / period, f"{d / 'cpu.cfs_quota_us'} {quota} / cpu.cfs_period_us {period}"))
    return min((f for f in found if f[0] > 0), key=lambda f: f[0], default=None)


def usable_cores(
    proc_cgroup: Path = PROC_CGROUP,
    mountinfo: Path = MOUNTINFO,
    root: Path = CGROUP_ROOT,
    affinity: Optional[Callable[[], set]] = None,
) -> Cores:
    """The cores this process may run on (its CPU affinity), capped by its cgroups' CPU quota. A
    fractional quota is rounded up: 1.5 cores of quota still run 2 processes, only slower."""
    if affinity is not None:
        n, source = len(affinity()), "CPU affinity"
    elif hasattr(os, "sched_getaffinity"):
        n, source = len(os.sched_getaffinity(0)), "CPU affinity (sched_getaffinity)"
    else:
        n, source = os.cpu_count() or 1, "os.cpu_count"
    quota = cgroup_cpu_quota(proc_cgroup, mountinfo, root)
    if quota is not None and math.ceil(quota[0]) < n:
        return Cores(max(1, math.ceil(quota[0])), f"cgroup CPU quota {quota[0]:g} cores ({quota[1]}); {source} {n}")
    return Cores(max(1, n), f"{source}{', no cgroup CPU quota' if quota is None else ''}")
