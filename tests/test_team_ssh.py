"""The team stack's DVC remote over SSH (`./dev team up --ssh`, tools/team/ssh.py), on loopback as
another machine would use it: one member's checkout pushes with `dvc push`, a colleague's clone
pulls it back with their own key; and, tried as an attacker would, nothing else gets in: no key,
a password, an unknown key or another account are refused; a member's key opens SFTP inside the
remote's folder and nothing more (no command, shell, terminal or forwarding, no file outside the
folder, not even through a symlink of their own); `down` ends every session and leaves no process.

sshd confines members with ChrootDirectory, which needs root and a stack folder whose parents are
root's alone: the stack folder is made under ~/.cache (not the world-writable /tmp, which `up`
refuses, tested here too). Without root the one check is that `up --ssh` says so before it starts
anything."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.team import team
from tools.server_keeper import group_members
from tools.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a stack's start, ~15 s on 2 cores

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="sshd's ChrootDirectory needs root (checked: up --ssh refuses)")


def keygen(path: Path, comment: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path


def dvc(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert not check or done.returncode == 0, f"dvc {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done


def git(project: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=project, check=True,
                   capture_output=True, timeout=60)  # fmt: skip


def member_remote(project: Path, url: str, keyfile: Path) -> None:
    """A member's remote, as `up` tells them to set it (tools/team/ssh.py, member_commands)."""
    for command in (
        ["remote", "add", "--local", "--force", "--default", "team", url],
        ["remote", "modify", "--local", "team", "keyfile", str(keyfile)],
        ["remote", "modify", "--local", "team", "verify", "true"],
    ):
        dvc(project, *command)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not ROOT:
        pytest.skip("sshd's ChrootDirectory needs root")
    base = Path.home() / ".cache" / "energy-flow-tests"
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    parent = Path(tempfile.mkdtemp(prefix="team-ssh-", dir=base))  # 0700, root's: sshd may chroot below it
    folder = parent / "team"
    keys = tmp_path_factory.mktemp("keys")
    ssh_port = free_port()
    try:
        done = team("up", "--ssh", "--ssh-port", str(ssh_port), "--port", str(free_port()), "--no-dvc-remote",
                    folder=folder)  # fmt: skip
        assert done.returncode == 0, done.stderr[-6000:]
        url = f"ssh://root@127.0.0.1:{ssh_port}/"
        assert url in done.stderr and "host key SHA256:" in done.stderr, done.stderr
        members = {name: keygen(keys / name, f"{name}@laptop") for name in ("alice", "bob")}
        for name, key in members.items():
            added = team("user", "key", name, f"{key}.pub", folder=folder)
            assert added.returncode == 0, added.stderr[-3000:]
        yield {"folder": folder, "port": ssh_port, "url": url, "keys": members, "outsider": keygen(keys / "eve", "eve")}
    finally:
        team("down", folder=folder, timeout=180)
        shutil.rmtree(parent, ignore_errors=True)


async def _connect(port: int, **options):
    import asyncssh

    return await asyncssh.connect("127.0.0.1", port, known_hosts=None, agent_path=None, config=[], **options)


def refused(port: int, **options) -> str:
    """Why a login with `options` fails ('' if it gets in)."""
    import asyncssh

    async def attempt():
        try:
            async with await _connect(port, **options):
                return ""
        except (asyncssh.PermissionDenied, asyncssh.DisconnectError) as e:
            return f"{type(e).__name__}: {e}"

    return asyncio.run(attempt())


def as_member(port: int, key: Path, session):
    """`session(conn)` run in a connection logged in with `key`."""

    async def go():
        async with await _connect(port, username="root", client_keys=[str(key)]) as conn:
            return await session(conn)

    return asyncio.run(go())


@needs_root
def test_a_push_from_one_checkout_is_pulled_by_a_colleagues_clone(stack, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    git(mine, "init", "-q")
    dvc(mine, "init", "-q")
    (mine / "data").mkdir()
    (mine / "data" / "shard.bin").write_bytes(os.urandom(2_000_000))
    (mine / "data" / "notes.txt").write_text("a small file\n")
    dvc(mine, "add", "-q", "data")
    git(mine, "add", "-A")
    git(mine, "commit", "-qm", "data")
    member_remote(mine, stack["url"], stack["keys"]["alice"])
    pushed = dvc(mine, "push")
    assert "3 files pushed" in pushed.stdout, pushed.stdout
    assert list((stack["folder"] / "dvc-remote" / "files" / "md5").rglob("*.dir")), "nothing in the remote's folder"

    theirs = tmp_path / "theirs"
    git(tmp_path, "clone", "-q", str(mine), str(theirs))
    assert not (theirs / ".dvc" / "config.local").exists()  # a clone has no remote of its own yet
    member_remote(theirs, stack["url"], stack["keys"]["bob"])
    dvc(theirs, "pull")
    for name in ("shard.bin", "notes.txt"):
        assert (theirs / "data" / name).read_bytes() == (mine / "data" / name).read_bytes()
    assert dvc(theirs, "status", "--cloud").stdout.strip().endswith("Cache and remote 'team' are in sync.")

    # an outsider's key (one never added) pulls nothing, and says so
    outsider = tmp_path / "outsider"
    git(tmp_path, "clone", "-q", str(mine), str(outsider))
    member_remote(outsider, stack["url"], stack["outsider"])
    denied = dvc(outsider, "pull", check=False)
    assert denied.returncode != 0 and not (outsider / "data" / "shard.bin").exists()
    assert "Permission denied" in denied.stdout + denied.stderr, denied.stdout + denied.stderr


@needs_root
def test_nothing_but_a_members_key_gets_in(stack):
    port, alice = stack["port"], stack["keys"]["alice"]
    assert refused(port, username="root", client_keys=None, password=None), "a login with no key got in"
    assert refused(port, username="root", client_keys=None, password="root"), "a password got in"
    assert refused(port, username="root", client_keys=[str(stack["outsider"])]), "an unknown key got in"
    for other in ("postgres", "nobody", "alice"):  # a member's key opens the stack's own account only
        assert refused(port, username=other, client_keys=[str(alice)]), f"alice's key got in as {other}"
    assert not refused(port, username="root", client_keys=[str(alice)])
    log = (stack["folder"] / "logs" / "sshd.log").read_text()
    assert "Accepted publickey for root" in log and "Accepted password" not in log


@needs_root
def test_a_members_key_opens_the_remote_folder_over_sftp_and_nothing_more(stack):
    import asyncssh

    folder = stack["folder"]
    secret = (folder / "secrets" / "postgres.password").read_text().strip()
    postgres_port = json.loads((folder / "team.json").read_text())["postgres_port"]

    async def probe(conn):
        found = {}
        ran = await conn.run("cat /etc/passwd; id", check=False)  # ForceCommand: SFTP, never a shell command
        found["command"] = f"{ran.stdout}{ran.stderr}"
        for name, opener in (
            ("forward", lambda: conn.open_connection("127.0.0.1", postgres_port)),  # a tunnel to the database
            ("pty", lambda: conn.create_process(term_type="xterm")),
        ):
            try:
                chan = await opener()
                if name == "pty":
                    found[name] = await asyncio.wait_for(chan.stdout.read(), 10)
                else:
                    found[name] = "opened"
            except (asyncssh.Error, OSError) as e:
                found[name] = f"refused: {type(e).__name__} {getattr(e, 'code', '')}: {e}"
        async with conn.start_sftp_client() as sftp:
            found["root"] = sorted(await sftp.listdir("/"))
            outside = {}
            for path in ("/../secrets/postgres.password", "../secrets/postgres.password", "/etc/passwd",
                         str(folder / "secrets" / "postgres.password")):  # fmt: skip
                try:
                    async with sftp.open(path) as f:
                        outside[path] = await f.read()
                except asyncssh.SFTPError as e:
                    outside[path] = f"refused: {e}"
            found["outside"] = outside
            await sftp.symlink(str(folder / "secrets"), "/peek")  # a link of their own, out of the folder
            try:
                found["link"] = await sftp.listdir("/peek")
            except asyncssh.SFTPError as e:
                found["link"] = f"refused: {e}"
            await sftp.remove("/peek")
            async with sftp.open("/probe.txt", "w") as f:  # inside the folder: a member writes
                await f.write("ok")
            found["written"] = (folder / "dvc-remote" / "probe.txt").read_text()
            await sftp.remove("/probe.txt")
        return found

    found = as_member(stack["port"], stack["keys"]["alice"], probe)
    assert "root:x:0" not in found["command"] and "uid=" not in found["command"], found["command"]
    # refused by the server (administratively prohibited), not for want of a listener
    assert found["forward"].startswith(f"refused: ChannelOpenError {asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED}:"), found

    assert "uid=" not in str(found["pty"]) and "#" not in str(found["pty"]), found["pty"]
    assert "secrets" not in found["root"] and "postgres" not in found["root"], found["root"]
    for path, got in found["outside"].items():
        assert str(got).startswith("refused") and secret not in str(got), (path, got)
    assert str(found["link"]).startswith("refused"), found["link"]
    assert found["written"] == "ok"


@needs_root
def test_a_members_new_key_replaces_the_old_and_no_private_key_is_taken(stack, tmp_path):
    folder = stack["folder"]
    carol_old, carol_new = keygen(tmp_path / "carol_old", "carol"), keygen(tmp_path / "carol_new", "carol")
    assert team("user", "key", "carol", f"{carol_old}.pub", folder=folder).returncode == 0
    assert not refused(stack["port"], username="root", client_keys=[str(carol_old)])
    assert team("user", "key", "carol", f"{carol_new}.pub", folder=folder).returncode == 0
    assert refused(stack["port"], username="root", client_keys=[str(carol_old)]), "carol's old key still gets in"
    assert not refused(stack["port"], username="root", client_keys=[str(carol_new)])
    private = team("user", "key", "dave", str(carol_new), folder=folder)
    assert private.returncode == 1 and "is a private key" in private.stderr, private.stderr
    keys = (folder / "secrets" / "ssh" / "authorized_keys").read_text()
    assert "PRIVATE" not in keys and "dave" not in keys
    assert (folder / "secrets" / "ssh" / "authorized_keys").stat().st_mode & 0o777 == 0o600
    assert (folder / "secrets" / "ssh" / "host_ed25519").stat().st_mode & 0o777 == 0o600


@contextlib.contextmanager
def open_session(stack, known_hosts: Path):
    """A member's sftp session left open, as a slow transfer would be; yields the processes that
    serve it (sshd's listener and its children) and the client's ssh process."""
    held = subprocess.Popen(
        ["sftp", "-q", "-i", str(stack["keys"]["alice"]), "-P", str(stack["port"]), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={known_hosts}", "root@127.0.0.1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        held.stdin.write(b"pwd\n")
        held.stdin.flush()
        assert held.stdout.readline().strip(), held.stderr.read1() if held.poll() is not None else ""
        config = str(stack["folder"] / "run" / "sshd_config")  # sshd shows it in its process title
        listener = next(p for p in psutil.process_iter(["cmdline"]) if config in " ".join(p.info["cmdline"] or []))
        sessions = listener.children(recursive=True)
        assert sessions, "no sshd process serves the open session"
        yield [listener, *sessions], psutil.Process(held.pid).children()  # sftp talks through an ssh child
    finally:
        held.kill()
        held.wait()


def assert_all_ended(servers, clients, groups) -> None:
    _, alive = psutil.wait_procs(servers, timeout=15)
    assert not alive, f"sshd processes outlive the stack: {alive}"
    deadline = time.monotonic() + 60  # PostgreSQL's own shutdown, on a busy machine
    while any(group_members(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(group_members(g) for g in groups), "a server's process group lives on"
    _, connected = psutil.wait_procs(clients, timeout=30)
    assert not connected, "the member's connection stayed open after the stack stopped"


@needs_root
def test_no_session_outlives_the_stack_and_a_restored_stack_lets_the_same_keys_in(stack, tmp_path):
    """Last in the module: it stops the stack (the fixture's `down` then finds none). sshd runs
    each connection in a session of its own, outside the group the stack ends: killed with
    SIGKILL, the supervisor's keepers end those too. Then the folder is wiped and restored from a
    backup: the server has the same host key, lets the same keys in and serves the same files;
    `down` ends an open session as well."""
    folder, status = stack["folder"], team("status", folder=stack["folder"]).stdout
    (folder / "dvc-remote" / "files" / "md5" / "ab").mkdir(parents=True, exist_ok=True)
    (folder / "dvc-remote" / "files" / "md5" / "ab" / "cdef").write_bytes(b"a pushed output")
    remote_files = files_of(folder / "dvc-remote")
    assert team("backup", str(tmp_path / "backup"), folder=folder).returncode == 0
    state = json.loads((folder / "run" / "stack.json").read_text())
    with open_session(stack, tmp_path / "known_hosts") as (servers, clients):
        os.kill(state["pid"], signal.SIGKILL)
        assert_all_ended(servers, clients, state["groups"])

    shutil.rmtree(folder)  # the wipe
    restored = team("restore", str(tmp_path / "backup"), folder=folder)
    assert restored.returncode == 0, restored.stderr[-3000:]
    again = team("up", "--no-dvc-remote", folder=folder)
    assert again.returncode == 0, again.stderr[-4000:]
    assert host_key(team("status", folder=folder).stdout) == host_key(status)
    assert files_of(folder / "dvc-remote") == remote_files
    assert not refused(stack["port"], username="root", client_keys=[str(stack["keys"]["alice"])])
    assert refused(stack["port"], username="root", client_keys=[str(stack["outsider"])])
    state = json.loads((folder / "run" / "stack.json").read_text())
    with open_session(stack, tmp_path / "known_hosts") as (servers, clients):
        done = team("down", folder=folder, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        assert_all_ended(servers, clients, state["groups"])


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def host_key(status: str) -> str:
    return status.split("host key ", 1)[1].split(";", 1)[0]


def test_up_with_ssh_refuses_a_folder_sshd_cannot_confine_before_starting_anything(tmp_path):
    folder = tmp_path / "team"  # under /tmp, world-writable: sshd's chroot would refuse it (and without root, all)
    done = team("up", "--ssh", "--ssh-port", str(free_port()), "--port", str(free_port()), folder=folder)
    assert done.returncode == 1, done.stderr
    assert "cannot serve the DVC remote over SSH" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "writable by no one else" in done.stderr or "is not root" in done.stderr, done.stderr
    assert not folder.exists(), "up made the folder before refusing"
