"""The keeper of a server's process group: `python -m tools.server_keeper PARENT_PID [GRACE]`.

tools/servers.py starts it first, as the leader of a new process group, then the server in that
group. The MLflow CLI runs uvicorn as a child of its own, so a signal to the CLI alone leaves
uvicorn serving, and a server started in a group of its own is out of reach of the terminal's
Ctrl-C and of the caller's end: killed outright (SIGKILL, a memory limit, a test's timeout), the
caller cannot end the group, and the server would serve on under init. The keeper can: it asks
for SIGTERM when the caller dies (pipeline/core/lifetime.py: the parent-death signal), and on
SIGTERM, SIGINT or SIGHUP, from there or from anyone, it ends the whole group: SIGTERM, then
SIGKILL to whatever is left after GRACE seconds, together with the processes the group's members
started in sessions of their own (sshd starts one per connection): those would outlive the group.
It prints one line, "ready", once the signal is
set, and does nothing else; the caller starts the server only after that line.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from pipeline.core import lifetime

SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
GRACE = 10.0  # s between SIGTERM and SIGKILL of the group (tools/servers.KILL_GRACE)


def _processes() -> dict[int, tuple[str, int, int]]:
    """{pid: (state, ppid, pgrp)} of every process, read from /proc."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except OSError:
            continue
        found[int(entry.name)] = (fields[0], int(fields[1]), int(fields[2]))
    return found


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (zombies, which are only waiting to be reaped, not counted)."""
    return [pid for pid, (state, _, pgrp) in _processes().items() if pgrp == pgid and state != "Z"]


def escaped_descendants(pgid: int) -> list[int]:
    """The live descendants of group `pgid`'s members that are in another group: started in a
    session of their own (as sshd starts each connection's), out of reach of a signal to the group."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = [pid for pid, (_, _, pgrp) in table.items() if pgrp == pgid]
    found = []
    while todo:
        for child in children.get(todo.pop(), []):
            if table[child][2] != pgid and table[child][0] != "Z":
                found.append(child)
            todo.append(child)
    return found


def signal_all(pids: list[int], sig: int) -> list[int]:
    """`sig` to each of `pids` (0: none, only asked whether it lives); those that are still there,
    zombies left out."""
    table = _processes()
    alive = []
    for pid in pids:
        if pid not in table or table[pid][0] == "Z":
            continue
        try:
            os.kill(pid, sig)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def end_group(grace: float) -> None:
    """SIGTERM to this keeper's group and to its members' escaped descendants (found before the
    members die: then they are init's), then SIGKILL to what is left after `grace` seconds (the
    keeper, a member too, ignores the SIGTERM and goes with the SIGKILL, or exits when alone)."""
    pgid = os.getpgid(0)
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    escaped = signal_all(escaped_descendants(pgid), signal.SIGTERM)
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        escaped = signal_all(escaped, 0)
        if group_members(pgid) == [os.getpid()] and not escaped:
            return
        time.sleep(0.05)
    signal_all(escaped, signal.SIGKILL)
    os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    parent = int(argv[0])
    grace = float(argv[1]) if len(argv) > 1 else GRACE
    # Blocked, the signals wait for sigwait: none is lost between the check and the wait.
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    lifetime.die_with_parent(parent)  # a parent already gone: SIGTERM is pending now
    print("ready", flush=True)
    signal.sigwait(SIGNALS)
    end_group(grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
