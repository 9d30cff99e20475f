"""The team stack's PostgreSQL alone (tools/team/postgres.py, the same cluster, role and database
`./dev team up` makes), in a folder of the test's own, so that a test can stop and start it on
the same port while an MLflow server on it and a run logging to that server go on."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

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
