"""The keeper of a server's process group: `python -m tools.server_keeper PARENT_PID [GRACE]`.

tools/servers.py starts it first, as the leader of a new process group, then the server in that
group. The MLflow CLI runs uvicorn as a child of its own, so a signal to the CLI alone leaves
uvicorn serving, and a server started in a group of its own is out of reach of the terminal's
Ctrl-C and of the caller's end: killed outright (SIGKILL, a memory limit, a test's timeout), the
caller cannot end the group, and the server would serve on under init. The keeper can: it asks
for SIGTERM when the caller dies (pipeline/core/lifetime.py: the parent-death signal), and on
SIGTERM, SIGINT or SIGHUP, from there or from anyone, it ends the whole group: SIGTERM, then
SIGKILL to whatever is left after GRACE seconds. It prints one line, "ready", once the signal is
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


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (zombies, which are only waiting to be reaped, not counted)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def end_group(grace: float) -> None:
    """SIGTERM to this keeper's group, then SIGKILL to what is left after `grace` seconds (the
    keeper, a member too, ignores the SIGTERM and goes with the SIGKILL, or exits when alone)."""
    pgid = os.getpgid(0)
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if group_members(pgid) == [os.getpid()]:
            return
        time.sleep(0.05)
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
