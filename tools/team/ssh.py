"""The stack's DVC remote over SSH, for the members' machines (`./dev team up --ssh`; on by default
beyond loopback): Debian's OpenSSH server, run by the supervisor (tools/team/stack.py) with a
config of its own in DIR, not the machine's sshd. docs/team.md ("The DVC remote from other
machines") is the user's side.

What it lets in, and only that: the stack's own Unix account (AllowUsers), by public key only
(each member's key in DIR/secrets/ssh/authorized_keys, `./dev team user key NAME FILE`; no
password, no keyboard-interactive), SFTP only (ForceCommand internal-sftp: no shell, no command, no
forwarding, no terminal), inside DIR/dvc-remote only (ChrootDirectory: a member's key reads none of
the stack's secrets, databases or artifacts, which the same account owns). ChrootDirectory is why
it needs root and a remote folder whose every parent is root's and writable by no one else; that is
checked before anything starts (`problems`), with what to do instead.

DVC's SSH client does not check the server's host key (dvc-ssh leaves asyncssh's known_hosts
off); members' remotes therefore get `verify = true` (every pulled file's hash recomputed), and the
host key's fingerprint is printed for those who check it with OpenSSH's own client.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

from pipeline.core.errors import PipelineError
from tools.team.layout import Layout, local_address, write_secret

START_TIMEOUT = 30.0  # s until sshd answers with its banner
MEMBER_TAG = "energy-flow-member:"  # the comment that names a key's member in authorized_keys
SSHD_SEARCH = "/usr/sbin:/usr/local/sbin:/sbin"
# sshd, run by root, drops privileges into this folder; Debian's package makes it at boot only
# (systemd's RuntimeDirectory), so a machine that never ran the system's sshd has none.
PRIVSEP_DIR = Path("/run/sshd")
INSTALL_HINT = (
    "install Debian's OpenSSH server (`apt-get install openssh-server`), or start the stack without SSH (--no-ssh)"
)


def sshd_path() -> str | None:
    return shutil.which("sshd", path=f"{SSHD_SEARCH}:{os.environ.get('PATH', '')}")


def account() -> str:
    """The Unix account members log in as: the stack's own (every member, told apart by key)."""
    return getpass.getuser()


def problems(layout: Layout) -> list[str]:
    """Why this stack cannot serve its remote over SSH here ([] when it can), each with what to do."""
    found = []
    if sshd_path() is None:
        found.append(f"no sshd found (in {SSHD_SEARCH} or PATH): {INSTALL_HINT}")
    if os.geteuid() != 0:
        found.append(
            "sshd confines each member to the DVC remote's folder with ChrootDirectory, which only root can do, "
            f"and `{account()}` is not root: start the stack as root, serve the remote with the machine's own "
            "sshd and an account of its own (docs/team.md), or start it without SSH (--no-ssh)"
        )
    for folder in (layout.dvc_remote, *layout.dvc_remote.parents):
        if not folder.exists():
            continue
        st = folder.stat()
        if st.st_uid != 0 or st.st_mode & 0o022:
            found.append(
                f"{folder}: owned by uid {st.st_uid}, mode {st.st_mode & 0o7777:o}; sshd chroots members into "
                f"{layout.dvc_remote} only when it and every folder above it are root's and writable by no one "
                "else: choose a --dir whose parents are (the default, ~/.energy-flow-team, of root is)"
            )
            break
    return found


def check(layout: Layout) -> None:
    found = problems(layout)
    if found:
        raise PipelineError("cannot serve the DVC remote over SSH: " + "; ".join(found))


def ensure_host_key(layout: Layout) -> None:
    """The server's own ed25519 key, made once (a member's client remembers it: it must not change
    between starts, and a restored backup brings it back)."""
    layout.ssh_dir.mkdir(mode=0o700, exist_ok=True)
    layout.ssh_dir.chmod(0o700)
    if not layout.ssh_host_key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"energy-flow-team@{socket.gethostname()}",
              "-f", str(layout.ssh_host_key)])  # fmt: skip
    if not layout.authorized_keys.exists():
        write_secret(layout.authorized_keys, "")


def host_key_fingerprint(layout: Layout) -> str:
    """`SHA256:...` of the host key, as OpenSSH's client shows it on a first connection."""
    if not layout.ssh_host_key.with_suffix(".pub").exists():
        return "(no host key yet)"
    return _run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(layout.ssh_host_key.with_suffix(".pub"))]).split()[1]


def config_text(layout: Layout, listen: str, port: int) -> str:
    """sshd_config for the stack (every setting that matters spelled out, nothing left to the
    compiled-in defaults). StrictModes is off because sshd would also refuse a stack folder under
    a world-writable folder such as /tmp; the files it guards are the stack's own, made 0600 in
    0700 folders (layout.prepare, write_secret), and the chroot check above is sshd's own and stays."""
    remote = layout.dvc_remote
    return "\n".join(
        [
            f"# made by `./dev team up` for {layout.root}; remade at every start (edit tools/team/ssh.py instead)",
            f"ListenAddress {listen}",
            f"Port {port}",
            f"HostKey {layout.ssh_host_key}",
            f"AuthorizedKeysFile {layout.authorized_keys}",
            "AuthorizedPrincipalsFile none",
            "PidFile none",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "PermitEmptyPasswords no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "GSSAPIAuthentication no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",  # the account may be root; never with a password
            f"AllowUsers {account()}",
            "StrictModes no",
            "AllowTcpForwarding no",
            "AllowStreamLocalForwarding no",
            "AllowAgentForwarding no",
            "X11Forwarding no",
            "PermitTunnel no",
            "PermitTTY no",
            "PermitUserEnvironment no",
            "PermitUserRC no",
            "MaxAuthTries 3",
            "LoginGraceTime 30",
            "LogLevel VERBOSE",  # logs each login's key fingerprint: which member it was
            f"ChrootDirectory {remote}",
            "ForceCommand internal-sftp",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


@contextlib.contextmanager
def serving(layout: Layout, listen: str, port: int, log_path: Path) -> Iterator[subprocess.Popen]:
    """sshd in the foreground in a kept process group (tools/servers.py) until the block ends;
    enters once it answers with its banner. sshd starts each connection in a session of its own,
    outside that group: kill_group, or the group's keeper if this process is killed outright, ends
    those too (tools/server_keeper.py), so that no member's transfer outlives the stack."""
    from tools.servers import kept_group, kill_group

    check(layout)
    ensure_host_key(layout)
    layout.dvc_remote.chmod(0o755)  # the chroot's own folder: writable by its owner only
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    config = layout.run / "sshd_config"
    config.write_text(config_text(layout, listen, port))
    sshd = sshd_path()
    test = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True, timeout=60)
    if test.returncode != 0:
        raise PipelineError(f"sshd refuses {config}: {test.stderr.strip()}")
    with open(log_path, "ab") as log, kept_group() as keeper:
        # -D: no daemon (it stays in the group), -e: its log to the file; an absolute path: sshd re-executes itself
        proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=keeper.pid,
        )
        try:
            _wait_for_banner(proc, local_address(listen), port, log_path)
            yield proc
        finally:
            kill_group(keeper, reap=(proc,))


def _wait_for_banner(proc: subprocess.Popen, host: str, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    last = "no answer"
    while proc.poll() is None:
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                banner = s.recv(64)
            if banner.startswith(b"SSH-2.0-"):
                return
            last = f"answered {banner!r}"
        except OSError as e:
            last = str(e)
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not answer on {host}:{port} within {START_TIMEOUT:g} s ({last})")
        time.sleep(0.2)
    raise RuntimeError(f"sshd exited with status {proc.returncode} before answering on {host}:{port} (see {log_path})")


def read_public_key(path: Path):
    """The one OpenSSH public key in `path`, parsed by asyncssh (an SSHKey); a private key, or
    anything else, is refused with what was expected."""
    import asyncssh

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise PipelineError(
            f"{path}: unreadable ({e}); expected an OpenSSH public key file such as ~/.ssh/id_ed25519.pub"
        )
    if "PRIVATE KEY" in text:
        raise PipelineError(
            f"{path} is a private key: never hand that over. Give its public half (the .pub file next to it)"
        )
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != 1:
        raise PipelineError(
            f"{path}: {len(lines)} key lines; expected one OpenSSH public key (`ssh-ed25519 AAAA... you@host`)"
        )
    try:
        key = asyncssh.import_public_key(lines[0])
    except (asyncssh.KeyImportError, ValueError) as e:
        raise PipelineError(
            f"{path}: not an OpenSSH public key ({e}); expected a line such as `ssh-ed25519 AAAA... you@host`"
        )
    return key


def add_key(layout: Layout, name: str, path: Path) -> str:
    """`name`'s public key in `path` let in (`restrict`: no forwarding, terminal or rc file, on top
    of the server's own settings); returns its fingerprint. A member's new key replaces their
    old one; a key another member has is refused."""
    key = read_public_key(path)
    algorithm, blob = key.export_public_key("openssh").decode().split()[:2]
    line = f"restrict {algorithm} {blob} {MEMBER_TAG}{name}"
    ensure_host_key(layout)
    kept = []
    for old in layout.authorized_keys.read_text().splitlines():
        fields = old.split()
        if blob in fields:
            owner = next((f.removeprefix(MEMBER_TAG) for f in fields if f.startswith(MEMBER_TAG)), "someone")
            if owner != name:
                raise PipelineError(f"{path}: that key is already {owner}'s; each member needs a key of their own")
            continue
        if f"{MEMBER_TAG}{name}" in fields:
            continue  # their previous key
        kept.append(old)
    write_secret(layout.authorized_keys, "\n".join([*kept, line]) + "\n")
    return key.get_fingerprint("sha256")


def remote_url(host: str, port: int) -> str:
    """The remote as a member's DVC names it: the chroot makes the remote's folder `/`."""
    host = f"[{host}]" if ":" in host else host
    return f"ssh://{account()}@{host}:{port}/"


def member_commands(url: str, name: str) -> list[str]:
    """What a member runs in their checkout to make `url` their default remote `name` (their key's
    path in place of KEYFILE)."""
    return [
        f"dvc remote add --local --force --default {name} {url}",
        f"dvc remote modify --local {name} keyfile KEYFILE",
        f"dvc remote modify --local {name} verify true",
    ]


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise PipelineError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout
