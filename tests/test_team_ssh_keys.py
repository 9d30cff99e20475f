"""The members' keys of the DVC remote over SSH (tools/team/ssh.py), before any server runs: only a
public key is taken (a private one is refused, with what to give instead), a member's new key
replaces their old one, one key cannot be two members', the file stays 0600; and a stack folder
that sshd could not confine members to is named with what to do."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from pipeline.core.errors import PipelineError
from tools.team import ssh
from tools.team.layout import prepare

pytestmark = pytest.mark.unit


def keygen(path, comment="someone@laptop"):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path


@pytest.fixture
def layout(tmp_path):
    made, _ = prepare(tmp_path / "team")
    return made


def members(layout) -> dict[str, str]:
    """{member: key blob} as authorized_keys holds them."""
    found = {}
    for line in layout.authorized_keys.read_text().splitlines():
        options, _algorithm, blob, comment = line.split()
        assert options == "restrict"
        found[comment.removeprefix(ssh.MEMBER_TAG)] = blob
    return found


def test_a_public_key_is_let_in_under_its_members_name_in_a_private_file(layout, tmp_path):
    key = keygen(tmp_path / "alice")
    fingerprint = ssh.add_key(layout, "alice", key.with_suffix(".pub"))
    assert fingerprint.startswith("SHA256:")
    assert members(layout) == {"alice": key.with_suffix(".pub").read_text().split()[1]}
    assert stat.S_IMODE(layout.authorized_keys.stat().st_mode) == 0o600
    assert (
        stat.S_IMODE(layout.ssh_host_key.stat().st_mode) == 0o600
        and stat.S_IMODE(layout.ssh_dir.stat().st_mode) == 0o700
    )


def test_a_members_new_key_replaces_their_old_one_and_others_stay(layout, tmp_path):
    old, new, bobs = keygen(tmp_path / "old"), keygen(tmp_path / "new"), keygen(tmp_path / "bob")
    ssh.add_key(layout, "alice", old.with_suffix(".pub"))
    ssh.add_key(layout, "bob", bobs.with_suffix(".pub"))
    ssh.add_key(layout, "alice", new.with_suffix(".pub"))
    assert members(layout) == {
        "alice": new.with_suffix(".pub").read_text().split()[1],
        "bob": bobs.with_suffix(".pub").read_text().split()[1],
    }


def test_one_key_is_never_two_members(layout, tmp_path):
    key = keygen(tmp_path / "shared")
    ssh.add_key(layout, "alice", key.with_suffix(".pub"))
    with pytest.raises(PipelineError, match="already alice's; each member needs a key of their own"):
        ssh.add_key(layout, "bob", key.with_suffix(".pub"))
    assert list(members(layout)) == ["alice"]


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "is a private key: never hand that over"),
        ("not a key at all\n", "not an OpenSSH public key"),
        ("", "0 key lines; expected one OpenSSH public key"),
        ("twice", "2 key lines; expected one"),
        (b"\xff\xfe\x00binary", "unreadable"),
    ],
)
def test_anything_but_one_public_key_is_refused_and_names_the_file(layout, tmp_path, content, expected):
    key = keygen(tmp_path / "k")
    path = tmp_path / "given"
    if content is None:
        path = key  # the private half
    elif content == "twice":
        path.write_text(key.with_suffix(".pub").read_text() * 2)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(PipelineError, match=expected) as e:
        ssh.add_key(layout, "alice", path)
    assert str(path) in str(e.value)
    if layout.authorized_keys.exists():
        assert "PRIVATE" not in layout.authorized_keys.read_text() and not members(layout)


def test_a_folder_sshd_cannot_confine_members_to_is_named(tmp_path):
    loose = tmp_path / "shared-by-all"
    loose.mkdir()
    loose.chmod(0o777)
    layout, _ = prepare(loose / "team")
    found = " ".join(ssh.problems(layout))
    if os.geteuid() == 0:
        assert f"{loose}: owned by uid 0, mode 777;" in found and "writable by no one else" in found, found
    else:  # the remote's own folder is the first that is not root's, and root is needed at all
        assert f"{layout.dvc_remote}: owned by uid {os.geteuid()}" in found and "is not root" in found, found


def test_the_server_takes_keys_only_and_sftp_only_in_the_remotes_folder(layout):
    """What the config says, read back by sshd itself (`sshd -T`), where it is installed."""
    config = layout.run / "sshd_config"
    config.write_text(ssh.config_text(layout, "127.0.0.1", 2222))
    if ssh.sshd_path() is None:
        pytest.skip("no sshd here (./dev test installs Debian's openssh-server)")
    ssh.ensure_host_key(layout)
    done = subprocess.run([ssh.sshd_path(), "-T", "-f", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    effective = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert effective["passwordauthentication"] == "no" and effective["kbdinteractiveauthentication"] == "no"
    assert effective["pubkeyauthentication"] == "yes" and effective["permitrootlogin"] == "without-password"
    assert effective["forcecommand"] == "internal-sftp" and effective["chrootdirectory"] == str(layout.dvc_remote)
    assert effective["allowtcpforwarding"] == "no" and effective["permittty"] == "no"
    assert effective["allowusers"] == ssh.account()
