"""The team stack's folder before anything runs (tools/team/layout.py): private modes from the
first byte, one generated password kept across calls and put in no URI, ports chosen once and
kept, a broken settings file named with its key."""

from __future__ import annotations

import os
import stat

import pytest

from pipeline.core.errors import PipelineError
from tools.team import postgres
from tools.team.layout import DEFAULT_MLFLOW_PORT, password, port_in_use, prepare, write_pgpass
from tools.team.stack import backend_store_uri

pytestmark = pytest.mark.unit


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_folder_and_its_secrets_are_its_owners_alone(tmp_path):
    layout, _ = prepare(tmp_path / "team")
    assert mode(layout.root) == 0o700 and mode(layout.secrets) == 0o700 and mode(layout.logs) == 0o700
    assert mode(layout.password_file) == 0o600
    assert layout.artifacts.is_dir() and layout.dvc_remote.is_dir()


def test_the_password_is_generated_once_strong_and_kept(tmp_path):
    layout, _ = prepare(tmp_path / "team")
    first = password(layout)
    assert len(first) >= 40 and first.replace("-", "").replace("_", "").isalnum()  # nothing pgpass must escape
    prepare(tmp_path / "team")
    assert password(layout) == first
    other, _ = prepare(tmp_path / "other")
    assert password(other) != first


def test_ports_are_chosen_once_and_kept_and_port_moves_mlflow(tmp_path):
    _, first = prepare(tmp_path / "team")
    assert first["mlflow_port"] == DEFAULT_MLFLOW_PORT and 1 <= first["postgres_port"] <= 65535
    _, again = prepare(tmp_path / "team")
    assert again == first
    _, moved = prepare(tmp_path / "team", mlflow_port=5999)
    assert moved == {**first, "mlflow_port": 5999}
    _, kept = prepare(tmp_path / "team")
    assert kept["mlflow_port"] == 5999


def test_a_bad_port_in_the_settings_is_refused_naming_the_file_and_key(tmp_path):
    layout, _ = prepare(tmp_path / "team")
    layout.settings.write_text('{"mlflow_port": "5050", "postgres_port": 5432}')
    with pytest.raises(PipelineError, match=r"team\.json: mlflow_port = '5050'; expected a port 1-65535"):
        prepare(tmp_path / "team")


def test_the_pgpass_file_is_private_and_the_backend_uri_holds_no_password(tmp_path):
    layout, settings = prepare(tmp_path / "team")
    write_pgpass(layout, settings["postgres_port"])
    assert mode(layout.pgpass) == 0o600  # libpq ignores a password file others can read
    assert layout.pgpass.read_text() == f"127.0.0.1:{settings['postgres_port']}:*:*:{password(layout)}\n"
    uri = backend_store_uri(settings["postgres_port"])
    assert uri == f"postgresql+psycopg2://mlflow@127.0.0.1:{settings['postgres_port']}/mlflow"
    assert password(layout) not in uri


def test_a_file_where_the_folder_should_be_is_refused(tmp_path):
    (tmp_path / "team").write_text("")
    with pytest.raises(PipelineError, match="exists and is not a folder"):
        prepare(tmp_path / "team")


def test_root_runs_postgres_in_a_user_namespace_and_anyone_else_as_themselves():
    command = postgres.as_server_user(["postgres", "-D", "x"])
    if os.geteuid() == 0:
        assert command[0].endswith("unshare") and "--user" in command and command[-3:] == ["postgres", "-D", "x"]
    else:
        assert command == ["postgres", "-D", "x"]


def test_the_wheel_ships_the_server_binaries():
    for name in ("postgres", "initdb"):
        assert os.access(postgres.bin_dir() / name, os.X_OK)


def test_port_in_use_sees_a_listener(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert port_in_use(s.getsockname()[1])


def test_up_refuses_a_taken_port_naming_it_and_the_setting_and_starts_nothing(tmp_path, capsys):
    import socket

    from tools.team.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["up", "--dir", str(tmp_path / "team"), "--port", str(port), "--no-dvc-remote"]) == 1
    err = capsys.readouterr().err
    assert f"MLflow's port 127.0.0.1:{port} ({tmp_path / 'team' / 'team.json'}: mlflow_port) is taken" in err
    assert not (tmp_path / "team" / "run" / "stack.json").exists() and not (tmp_path / "team" / "postgres").exists()
