"""MariaDB for LLM-written SQL: one database and one unprivileged user per episode.

:class:`MariaDBAdmin` gives the episodes of any MariaDB reached over a unix socket as its administrator (the
Docker backend uses it on a container's bind-mounted socket); :class:`LocalMariaDB` starts a private server from
Debian's ``mariadb-server`` (``make mariadb``) and uses it.

What an episode's SQL can do (each line an attack in ``tests/harness/test_attacks_llb_db.py``):

- It reaches the server through PyMySQL, statements only: there is no client program, so the ``mariadb``
  client's commands (``\\! cmd``, ``system cmd``, ``source file``) are SQL syntax errors.
- It runs as ``llb_<random>`` (random password, ``localhost`` only) with :data:`EPISODE_PRIVILEGES` on its own
  database and nothing else: no FILE (``LOAD_FILE`` gives NULL; ``INTO OUTFILE`` / ``DUMPFILE`` and
  ``LOAD DATA`` are refused), no SUPER, PROCESS, RELOAD, SHUTDOWN (``SET GLOBAL``, ``SHUTDOWN``, ``KILL`` of
  another session's connection are refused), no CREATE USER, GRANT OPTION or right on ``mysql.*``
  (``INSTALL SONAME``, ``CREATE FUNCTION ... SONAME``, ``SET PASSWORD`` for root are refused), no routines,
  events, triggers or temporary tables. ``SHOW DATABASES`` lists its own database (and information_schema)
  only. ``MAX_USER_CONNECTIONS 2``.
- Time: the user is created ``WITH MAX_STATEMENT_TIME`` (a statement stops at the limit with MariaDB's error),
  but MariaDB 10.11 lets any session lift that (``SET SESSION max_statement_time=0``, or
  ``SET STATEMENT max_statement_time=0 FOR ...``). So the limit that holds
  is the harness's: a watchdog kills the action's connection as the administrator once the action (all its
  statements) has run ``statement_timeout`` seconds.
- Size: an action's result past :class:`ResultLimit` (10,000 rows in a result set, 64 MB of cells) is an error
  (rows are streamed, the session killed there), so a huge ``SELECT`` cannot fill the harness's memory.

The server (:class:`LocalMariaDB`): its own datadir in a temporary folder, a unix socket only
(``--skip-networking``), run as the ``mysql`` system user when the harness is root; ``--secure-file-priv`` on
an empty read-only folder, ``--local-infile=0``, ``--symbolic-links=0`` (``DATA DIRECTORY`` is ignored),
``--event-scheduler=DISABLED``, ``--enforce-storage-engine=InnoDB`` (no MEMORY tables filling RAM),
:data:`SESSION_MEMORY` (256 MB per session, which a session cannot raise), no binary log; root gets a random
password at start, and the other root accounts are dropped.

Not guaranteed: disk and CPU are bounded by time only (an action may insert rows for ``statement_timeout``
seconds: an ``INSERT ... SELECT`` of long rows grows the datadir by hundreds of MB before the watchdog stops it
and InnoDB rolls it back, docs/security.md; each episode's database holds what it committed until the episode
ends); server memory is bounded per
session (two per episode), not per server; episodes share the server's CPU, buffer pool and global named locks
(``GET_LOCK``); an episode may spoil its own database or lock itself out (``SET PASSWORD``), which fails that
episode only.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import pymysql
from pymysql.constants import CLIENT
from pymysql.cursors import SSCursor

from memrl_harness.backends.sql import ResultSet, Row, SQLResult, SQLServerError

#: What an episode's user may do, on its own database only: the statements of LLB's tasks and the tables, views
#: and indexes an agent may build to get there.
EPISODE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, CREATE VIEW, SHOW VIEW"
#: Server memory one session may hold, a ceiling it cannot raise (without it, `SET SESSION
#: tmp_memory_table_size` lets one GROUP BY take the server's memory: docs/security.md).
SESSION_MEMORY = ("--max-session-mem-used=256M", "--maximum-max-session-mem-used=256M")
#: The server options an episode's safety rests on, besides ``--secure-file-priv=<an empty folder>`` (see the
#: module's docstring); any server given to :class:`MariaDBAdmin` should run with them.
HARDENING = (
    "--skip-networking",
    "--local-infile=0",
    "--symbolic-links=0",
    "--event-scheduler=DISABLED",
    "--enforce-storage-engine=InnoDB",
    *SESSION_MEMORY,
)
ADMIN_TIMEOUT = 60.0  # the administrator's statements: set-up, checker, clean-up

_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+")


def cell(value: str | bytes | None) -> Any:
    """A text-protocol cell as the agent sees it: NULL as ``None``, integers and decimals as numbers (``007`` stays
    text), the rest as text."""
    if value is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    digits = text.lstrip("-")
    if _INT.fullmatch(text) and (len(digits) == 1 or not digits.startswith("0")):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def _message(error: Exception) -> str:
    if isinstance(error, pymysql.MySQLError) and len(error.args) == 2:
        return f"ERROR {error.args[0]}: {error.args[1]}"
    return str(error) or type(error).__name__


@dataclass(frozen=True)
class ResultLimit:
    """How much of one action's result sets the harness reads (LLB's largest gold answer has 30 rows); past it
    the action is an error, so a huge ``SELECT`` cannot fill the harness's memory."""

    rows: int = 10_000
    bytes: int = 64 << 20  # of cell text, over all the action's result sets


def run_script(
    connection: pymysql.Connection, sql: str, limit: ResultLimit, stop_query: Callable[[int], None]
) -> tuple[SQLResult, bool]:
    """Run ``sql`` (one or more statements) on ``connection``, streaming each result set; stops at the first
    error. A result past ``limit`` is cut by ``stop_query`` (a ``KILL QUERY`` from another session: the server
    then ends the stream with an error, so the rest is never read). Returns the result and whether the session
    is clean (if not, end it)."""
    results: list[ResultSet] = []
    cursor = connection.cursor(SSCursor)
    size = 0
    try:
        cursor.execute(sql)
        while True:
            if cursor.description is not None:
                rows: list[Row] = []
                for row in iter(cursor.fetchone, None):
                    size += sum(len(v) for v in row if v is not None)
                    if len(rows) == limit.rows or size > limit.bytes:
                        stop_query(connection.thread_id())
                        with contextlib.suppress(pymysql.MySQLError, OSError):
                            cursor.close()  # reads what is already sent, up to the server's error
                        error = (
                            f"the result is too large (more than {limit.rows} rows or {limit.bytes >> 20} MB); "
                            "ask for less (LIMIT, aggregates)"
                        )
                        return SQLResult(results, error), False
                    rows.append(tuple(cell(v) for v in row))
                results.append(ResultSet([str(d[0]) for d in cursor.description], rows))
            if not cursor.nextset():
                return SQLResult(results), True
    except pymysql.MySQLError as error:  # the server's errors leave the connection clean, the client's (2xxx) not
        code = error.args[0] if error.args and isinstance(error.args[0], int) else 2000
        return SQLResult(results, _message(error)), not 2000 <= code < 3000
    except OSError as error:  # the socket broke
        return SQLResult(results, _message(error)), False


@dataclass(frozen=True)
class Login:
    """A MariaDB account on ``localhost``."""

    user: str
    password: str


class MariaDBAdmin:
    """The episodes of a MariaDB server reached over the unix socket ``socket`` as ``user`` / ``password``, its
    administrator (whose credentials never reach an episode)."""

    def __init__(self, socket: str, user: str = "root", password: str = "", limit: ResultLimit = ResultLimit()) -> None:
        self.socket = socket
        self._admin = Login(user, password)
        self.limit = limit

    def connect(
        self, login: Login | None = None, database: str | None = None, timeout: float = ADMIN_TIMEOUT
    ) -> pymysql.Connection:
        """A connection as ``login`` (default: the administrator): multi-statement, autocommit, text cells, no
        ``LOAD DATA LOCAL``."""
        login = login or self._admin
        return pymysql.connect(
            unix_socket=self.socket,
            user=login.user,
            password=login.password,
            database=database,
            charset="utf8mb4",
            autocommit=True,
            client_flag=CLIENT.MULTI_STATEMENTS,
            conv={},  # cells as text, typed by ``cell``, the same whatever the column's type
            local_infile=False,
            connect_timeout=10,
            read_timeout=timeout,
            write_timeout=timeout,
        )

    @contextlib.contextmanager
    def session(self, database: str | None = None) -> Iterator[Callable[[str], SQLResult]]:
        """One administrator's connection, as a function that runs a script on it and raises
        :class:`SQLServerError` on an error (also when the server cannot be reached)."""
        try:
            connection = self.connect(database=database)
        except (pymysql.MySQLError, OSError) as error:
            raise SQLServerError(f"cannot reach MariaDB at {self.socket}: {_message(error)}") from error

        def run(sql: str) -> SQLResult:
            result, _ = run_script(connection, sql, self.limit, self.stop_query)
            if result.error:
                raise SQLServerError(f"{sql.split()[0]} ... as the administrator failed: {result.error}")
            return result

        try:
            yield run
        finally:
            with contextlib.suppress(pymysql.MySQLError, OSError):
                connection.close()

    def admin(self, sql: str, database: str | None = None) -> SQLResult:
        """Run ``sql`` as the administrator; errors are in the result."""
        try:
            with self.session(database) as run:
                return run(sql)
        except SQLServerError as error:
            return SQLResult(error=str(error))

    def ping(self) -> None:
        """Raise :class:`SQLServerError` unless the administrator can run a statement."""
        with self.session() as run:
            run("SELECT 1")

    def kill(self, thread_id: int, query_only: bool = False) -> None:
        """End one connection, or only its statement; an unknown id is fine: it ended already."""
        result = self.admin(f"KILL {'QUERY' if query_only else 'CONNECTION'} {int(thread_id)}")
        if result.error and "1094" not in result.error:  # 1094: unknown thread id
            raise SQLServerError(f"cannot kill connection {thread_id}: {result.error}")

    def stop_query(self, thread_id: int) -> None:
        """Stop the statement a connection runs (the connection stays)."""
        self.kill(thread_id, query_only=True)

    @contextlib.contextmanager
    def episode(self, setup_sql: str, statement_timeout: float) -> Iterator[MariaDBEpisode]:
        """A fresh database ``llb_<random>`` holding ``setup_sql``'s tables and a user of the same name with
        :data:`EPISODE_PRIVILEGES` on it only; both dropped when the context exits."""
        if not statement_timeout > 0:
            raise ValueError(f"statement_timeout must be > 0, not {statement_timeout}")
        name = f"llb_{secrets.token_hex(8)}"
        login = Login(name, secrets.token_hex(16))
        try:
            with self.session() as run:
                run(
                    f"CREATE DATABASE `{name}`;"
                    f"CREATE USER '{name}'@'localhost' IDENTIFIED BY '{login.password}'"
                    f" WITH MAX_USER_CONNECTIONS 2 MAX_STATEMENT_TIME {statement_timeout:.3f};"
                    f"GRANT {EPISODE_PRIVILEGES} ON `{name}`.* TO '{name}'@'localhost';"
                    f"USE `{name}`"
                )
                run(setup_sql)
            episode = MariaDBEpisode(self, name, login, statement_timeout)
            try:
                yield episode
            finally:
                episode.close()
        finally:
            self._drop(name)

    def _drop(self, name: str) -> None:
        """Drop the user first (no new connection), end its connections and wait until they are gone, then drop
        the database."""
        with self.session() as run:
            run(f"DROP USER IF EXISTS '{name}'@'localhost'")
            deadline = time.monotonic() + ADMIN_TIMEOUT
            while alive := run(f"SELECT id FROM information_schema.processlist WHERE user = '{name}'").rows:
                if time.monotonic() > deadline:
                    raise SQLServerError(f"the connections of {name} outlived {ADMIN_TIMEOUT:g} s of KILL")
                for (thread_id,) in alive:
                    self.kill(thread_id)
                time.sleep(0.01)
            run(f"DROP DATABASE IF EXISTS `{name}`")


class MariaDBEpisode:
    """One episode's database (``name``) and its user; see :class:`MariaDBAdmin`. The agent's actions share one
    session (its variables persist, as in LLB), reopened after a kill; used by one thread at a time."""

    def __init__(self, server: MariaDBAdmin, name: str, login: Login, statement_timeout: float) -> None:
        self.name = name
        self.statement_timeout = statement_timeout
        self._server = server
        self._login = login
        self._connection: pymysql.Connection | None = None

    def execute(self, sql: str) -> SQLResult:
        """Run ``sql`` as the episode's user; a watchdog kills the session after ``statement_timeout`` seconds
        (the limit a session cannot lift)."""
        limit = self.statement_timeout
        if self._connection is None:
            try:
                self._connection = self._server.connect(self._login, self.name, timeout=limit + 30)
            except (pymysql.MySQLError, OSError) as error:
                return SQLResult(error=_message(error))
        thread_id = self._connection.thread_id()
        fired = threading.Event()

        def stop() -> None:
            fired.set()
            self._server.kill(thread_id)

        watchdog = threading.Timer(limit, stop)
        watchdog.daemon = True
        watchdog.start()
        try:
            result, finished = run_script(self._connection, sql, self._server.limit, self._server.stop_query)
        finally:
            watchdog.cancel()
        if fired.is_set():
            watchdog.join()
            result = SQLResult(result.results, f"the SQL was stopped: the action ran longer than {limit:g} s")
        if fired.is_set() or not finished:
            self.close()
        return result

    def inspect(self, sql: str) -> SQLResult:
        return self._server.admin(sql, self.name)

    def close(self) -> None:
        """End the agent's session, killing whatever it still runs."""
        if self._connection is not None:
            connection, self._connection = self._connection, None
            self._server.kill(connection.thread_id())
            with contextlib.suppress(pymysql.MySQLError, OSError):
                connection.close()


# --- a private server --------------------------------------------------------------------------


def _which(tool: str) -> str:
    """A MariaDB program on the PATH or in the sbin folders Debian puts the server in."""
    found = shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if found is None:
        raise SQLServerError(f"{tool} not found: install MariaDB (`make mariadb`: apt-get install mariadb-server)")
    return found


def _stop_server(process: subprocess.Popen[bytes] | None, folder: str) -> None:
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    shutil.rmtree(folder, ignore_errors=True)


class LocalMariaDB:
    """A private MariaDB server on a unix socket in its own temporary folder (see the module's docstring). It
    starts on the first episode and stops on :meth:`stop`, when collected, or at interpreter exit."""

    engine = "MariaDB"

    def __init__(self, ready_timeout: float = 60.0) -> None:
        self.ready_timeout = ready_timeout
        self._lock = threading.RLock()
        self._process: subprocess.Popen[bytes] | None = None
        self._folder: str | None = None
        self._finalizer: weakref.finalize | None = None
        self._admin: MariaDBAdmin | None = None

    @property
    def socket(self) -> str:
        if self._folder is None:
            raise SQLServerError("the MariaDB server is not started")
        return os.path.join(self._folder, "sock")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def admin(self) -> MariaDBAdmin:
        """The server's administrator (for the harness and its tests; never given to an episode)."""
        if self._admin is None:
            raise SQLServerError("the MariaDB server is not started")
        return self._admin

    def episode(self, setup_sql: str, statement_timeout: float) -> contextlib.AbstractContextManager[MariaDBEpisode]:
        return self.start().admin.episode(setup_sql, statement_timeout)

    def start(self) -> Self:
        """Start the server (once; thread-safe) and wait until it answers, at most ``ready_timeout``."""
        with self._lock:
            if self.running:
                return self
            if self._process is not None:
                status = self._process.returncode
                self.stop()
                raise SQLServerError(f"the MariaDB server exited (status {status}); it is restarted on the next call")
            server, install = _which("mariadbd"), _which("mariadb-install-db")
            folder = tempfile.mkdtemp(prefix="llbdb")
            run_as: list[str] = []
            if os.geteuid() == 0:  # mariadbd refuses root unless told; give it the package's system user instead
                try:
                    mysql = pwd.getpwnam("mysql")
                except KeyError:
                    shutil.rmtree(folder)
                    raise SQLServerError("no `mysql` user to run mariadbd as (make mariadb)") from None
                os.chown(folder, mysql.pw_uid, mysql.pw_gid)
                run_as = ["--user=mysql"]
            datadir, files = os.path.join(folder, "data"), os.path.join(folder, "files")
            os.mkdir(files, 0o555)  # secure_file_priv: empty, and not writable by the server
            root_login = "--auth-root-authentication-method=normal"  # a password, set by _secure
            installed = subprocess.run(
                [install, "--no-defaults", f"--datadir={datadir}", *run_as, "--skip-test-db", root_login],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if installed.returncode != 0:
                shutil.rmtree(folder, ignore_errors=True)
                raise SQLServerError(f"mariadb-install-db failed: {(installed.stderr or installed.stdout)[-1500:]}")
            argv = [server, "--no-defaults", f"--datadir={datadir}", *run_as, f"--socket={folder}/sock"]
            argv += [f"--pid-file={folder}/pid", f"--secure-file-priv={files}", *HARDENING, "--skip-log-bin"]
            argv += ["--max-connections=500", "--innodb-buffer-pool-size=64M", "--character-set-server=utf8mb4"]
            log = os.path.join(folder, "server.log")
            with open(log, "wb") as out:
                self._process = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            self._folder = folder
            self._finalizer = weakref.finalize(self, _stop_server, self._process, folder)
            self._admin = self._secure(log)
            return self

    def _secure(self, log: str) -> MariaDBAdmin:
        """Wait for the server, then give root@localhost a random password and drop every other account but the
        server's own ``mariadb.sys``."""
        assert self._process is not None
        bootstrap = MariaDBAdmin(self.socket)
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self._process.poll() is not None:
                status = self._process.returncode
                tail = Path(log).read_text(errors="replace")[-1500:]
                self.stop()
                raise SQLServerError(f"mariadbd exited with status {status}: {tail}")
            if os.path.exists(self.socket) and bootstrap.admin("SELECT 1").error is None:
                break
            if time.monotonic() > deadline:
                self.stop()
                raise SQLServerError(f"mariadbd not ready after {self.ready_timeout:g} s")
            time.sleep(0.05)
        password = secrets.token_hex(24)
        with bootstrap.session() as run:
            others = run(
                "SELECT user, host FROM mysql.user WHERE NOT (user = 'root' AND host = 'localhost')"
                " AND user <> 'mariadb.sys'"
            ).rows
            for user, host in others:
                run(f"DROP USER '{user}'@'{host}'")
            run(f"ALTER USER 'root'@'localhost' IDENTIFIED BY '{password}'")
        admin = MariaDBAdmin(self.socket, "root", password)
        admin.ping()
        return admin

    def stop(self) -> None:
        """Stop the server and remove its folder (idempotent; a later episode starts a new one)."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()
            self._finalizer = self._process = self._folder = self._admin = None
