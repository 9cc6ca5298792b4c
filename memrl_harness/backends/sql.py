"""The SQL-server protocol: a server shared by a benchmark's episodes, a private database per episode.

Backends: :mod:`memrl_harness.backends.mariadb` (a private MariaDB on a unix socket, the default; its
:class:`~memrl_harness.backends.mariadb.MariaDBAdmin` gives the episodes of any MariaDB reached over a unix socket) and
:mod:`memrl_harness.backends.docker` (a MariaDB container of a locally built image).

An episode's SQL runs through a database driver (no client program, so no client-side commands) as an
unprivileged user created for that episode, with rights on its own database only and a time limit per action
that it cannot lift. The checker's queries run as the server's administrator.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

Row = tuple[Any, ...]


class SQLServerError(RuntimeError):
    """The SQL server could not be installed, started or reached."""


@dataclass(frozen=True)
class ResultSet:
    """The rows one statement returned. Cells are as the text protocol gives them, typed the way a person reads
    them: NULL as ``None``, integers and decimals as numbers, everything else as text."""

    columns: list[str]
    rows: list[Row]


@dataclass(frozen=True)
class SQLResult:
    """What one SQL script gave: the result sets of its statements up to the first error, and that error."""

    results: list[ResultSet] = field(default_factory=list)
    error: str | None = None

    @property
    def last(self) -> ResultSet | None:
        return self.results[-1] if self.results else None

    @property
    def rows(self) -> list[Row]:
        """The last result set's rows (none without one)."""
        return self.results[-1].rows if self.results else []


class EpisodeDatabase(Protocol):
    """One episode's database and its unprivileged user."""

    name: str

    def execute(self, sql: str) -> SQLResult:
        """Run the agent's SQL script (one or more statements) as the episode's user, within the episode's time
        limit; stops at the first error."""
        ...

    def inspect(self, sql: str) -> SQLResult:
        """Run a checker's query (the table md5) as the administrator, on this database."""
        ...


class SQLServer(Protocol):
    """A server the benchmark shares between its episodes; :meth:`episode` starts it on first use (thread-safe),
    :meth:`stop` ends it."""

    engine: str  # "MariaDB" or "MySQL": the prompt names it

    def start(self) -> Self: ...

    def stop(self) -> None: ...

    def episode(self, setup_sql: str, statement_timeout: float) -> AbstractContextManager[EpisodeDatabase]:
        """A fresh database holding ``setup_sql``'s tables and a user with rights on it only, whose every action
        is stopped after ``statement_timeout`` seconds; both dropped when the context exits."""
        ...
