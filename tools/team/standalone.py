"""The team stack's servers without its supervisor, for tests and benchmarks that need a hand on
each: PostgreSQL alone (the same cluster, role and database `./dev team up` makes, through
tools/team/postgres.py), stopped and started on the same port while an MLflow server on it and a
run logging to that server go on; and an MLflow server on it, as the stack runs one."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from pipeline.core.environment import temporary_env
from tools.servers import start_mlflow_server
from tools.team import postgres
from tools.team.layout import password, prepare, write_pgpass
from tools.team.stack import backend_store_uri


class TeamPostgres:
    def __init__(self, folder: Path):
        self.layout, settings = prepare(folder)
        self.port: int = settings["postgres_port"]
        write_pgpass(self.layout, self.port)
        postgres.initialise(self.layout)
        self.uri = backend_store_uri(self.port)  # no password: libpq reads PGPASSFILE

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The server up for the block (with MLflow's role and database), stopped at its end
        with a fast shutdown: what a restart of the database server does to its clients."""
        with postgres.running(self.layout, self.port, self.layout.logs / "postgres.log"):
            postgres.ensure_database(self.port, password(self.layout))
            yield


@contextlib.contextmanager
def mlflow_on_postgres(folder: Path) -> Iterator[str]:
    """PostgreSQL and an MLflow server on it (proxied artifacts in the folder), as the stack runs
    them, for the block; yields the server's URL. PGPASSFILE is set for the block: the server's
    libpq logs in with it (mlflow_server_env copies this process's environment)."""
    pg = TeamPostgres(folder)
    with temporary_env({"PGPASSFILE": str(pg.layout.pgpass)}):
        with pg.running(), start_mlflow_server(pg.uri, pg.layout.artifacts) as url:
            yield url
