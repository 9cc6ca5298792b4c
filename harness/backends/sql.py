"""The SQL-server protocol: a server shared by a benchmark's episodes, a private database per episode.

Backends: :mod:`harness.backends.mariadb` (a private MariaDB on a unix socket, the default) and
:mod:`harness.backends.docker` (a MariaDB container of a locally built image).

An episode's SQL runs through a database driver (no client program, so no client-side commands) as an
unprivileged user created for that episode, with rights on its own database only and a statement time
limit it cannot lift. The checker's queries run as the server's administrator.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

Row = tuple[Any, ...]


class SQLServerError(RuntimeError):
    """The SQL server could not be installed, started or reached."""


@dataclass(frozen=True)
class SQLResult:
    """What one SQL script gave: the result sets of its statements (columns, rows) or the error."""

    results: list[tuple[list[str], list[Row]]] = field(default_factory=list)
    error: str | None = None

    @property
    def last(self) -> tuple[list[str], list[Row]] | None:
        return self.results[-1] if self.results else None


class EpisodeDatabase(Protocol):
    """One episode's database and its unprivileged user."""

    name: str

    def execute(self, sql: str, timeout: float) -> SQLResult:
        """Run the agent's SQL script (one or more statements) as the episode's user; stops at the first error."""
        ...

    def inspect(self, sql: str, timeout: float) -> SQLResult:
        """Run a checker's query (the table md5) as the administrator, on this database."""
        ...


class SQLServer(Protocol):
    """A server the benchmark starts once and stops at the end."""

    engine: str  # "MariaDB" or "MySQL": the prompt names it

    def start(self) -> Self: ...

    def stop(self) -> None: ...

    def episode(self, setup_sql: str) -> AbstractContextManager[EpisodeDatabase]:
        """A fresh database holding ``setup_sql``'s tables and a user with rights on it only; both dropped
        when the context exits."""
        ...

