"""A real PostgreSQL 15 for the production-stack tests: Debian's ``postgresql-15`` binaries,
a throwaway cluster on a free loopback port, run as an unprivileged user (``nobody`` when the
tests run as root: PostgreSQL refuses to run as root), stopped and deleted afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from echomq_core.server import free_port

BIN = Path(os.environ.get("ECHOMQ_PG_BIN", "/usr/lib/postgresql/15/bin"))
#: Who runs the server when the tests run as root.
UNPRIVILEGED = (65534, 65534)


def available() -> bool:
    return (BIN / "initdb").exists() and (BIN / "pg_ctl").exists()


class Postgres:
    """``with Postgres() as pg: pg.url`` - a SQLAlchemy URL (psycopg2) of database
    ``airflow`` owned by user ``airflow`` (trust authentication on loopback only)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="echomq-pg-"))
        self.data = self.dir / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/airflow"

    @property
    def dsn(self) -> str:
        """For psycopg2 itself (the tests' own reads)."""
        return f"host=127.0.0.1 port={self.port} user=airflow dbname=airflow"

    def _run(self, *command: str) -> None:
        as_root = os.geteuid() == 0
        prefix = (
            [
                "setpriv",
                f"--reuid={UNPRIVILEGED[0]}",
                f"--regid={UNPRIVILEGED[1]}",
                "--clear-groups",
            ]
            if as_root
            else []
        )
        done = subprocess.run([*prefix, *command], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stdout[-2000:]}{done.stderr[-2000:]}")

    def start(self) -> None:
        if os.geteuid() == 0:
            os.chown(self.dir, *UNPRIVILEGED)
        self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", "airflow", "--auth=trust",
                  "-E", "UTF8")  # fmt: skip
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c max_connections=300"
        )
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "pg.log"),
                  "-o", options, "-w", "start")  # fmt: skip
        self._run(str(BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "airflow",
                  "airflow")  # fmt: skip

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Postgres:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
