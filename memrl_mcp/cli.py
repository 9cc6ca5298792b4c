"""``memrl-mcp``: the memory server over stdio (default: attached to the user's local memory server of the store,
started if none runs), streamable HTTP or SSE; backups, settings and the local server's controls.

The stdio entry imports nothing heavy before it knows it must serve in this process: a session that attaches is a
relay of bytes (:mod:`memrl_mcp.local.relay`) and starts in tens of milliseconds."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from memrl_mcp import __version__
from memrl_mcp.errors import MemrlError

if TYPE_CHECKING:
    from memrl_mcp.local.attach import Target
    from memrl_mcp.local.place import Place
    from memrl_mcp.memory.service import MemoryService
    from memrl_mcp.settings import Settings

log = logging.getLogger("memrl_mcp")
TRANSPORT_HELP = (
    "stdio (default): the MCP client starts this command and talks over its stdin and stdout; the session attaches "
    "to the user's local memory server of the store, shared by every session, started if none runs (--no-attach: "
    "this process opens the store itself). streamable-http: an HTTP server at http://HOST:PORT/mcp for many clients "
    "(bearer tokens, tenants), with the inspector at /ui. sse: the legacy SSE transport at /sse."
)
EPILOG = (
    "The inspector, a page showing what the memory learned and why it hands out a memory, is at /ui of an HTTP "
    "server (--transport streamable-http: http://127.0.0.1:8765/ui); the local server's own is printed by "
    "`memrl-mcp local ui`."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="memrl-mcp", description="MemRL episodic memory as an MCP server.", epilog=EPILOG
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--transport", choices=("stdio", "streamable-http", "sse"), default="stdio", help=TRANSPORT_HELP
    )
    parser.add_argument("--host", help="HTTP bind address (default: the host setting, 127.0.0.1).")
    parser.add_argument("--port", type=int, help="HTTP port (default: the port setting, 8765).")
    parser.add_argument(
        "--no-attach",
        action="store_true",
        help="stdio: open the store in this process, one process per session (the attach setting, false).",
    )
    parser.add_argument(
        "--project",
        metavar="DIR",
        help="The folder of this session's project, for a client that sends no MCP roots (the MCP Inspector, a "
        "script): its git repository's memory is the session's, as for a client opened in that folder (the "
        "project_dir setting, MEMRL_PROJECT_DIR).",
    )
    _store_options(parser, default=None)
    commands = parser.add_subparsers(
        dest="command", title="commands (instead of serving)", metavar="{export,import,calibrate,config,local,hook}"
    )
    export = commands.add_parser(
        "export", help="Write the memories as JSON Lines.", description="Write the memories as JSON Lines."
    )
    export.add_argument(
        "--out", type=Path, metavar="FILE", help="File to write, replaced only once complete (default: stdout)."
    )
    export.add_argument(
        "--namespace", action="append", default=[], metavar="NS", help="Only this namespace (repeatable)."
    )
    _store_options(export, default=argparse.SUPPRESS)
    restore = commands.add_parser(
        "import",
        help="Restore memories from an export.",
        description="Check every line of an export, then restore its memories (same ids). Resumable: run it again.",
    )
    restore.add_argument("file", type=Path, metavar="FILE", help="A file written by `memrl-mcp export`.")
    _store_options(restore, default=argparse.SUPPRESS)
    calibrate = commands.add_parser(
        "calibrate",
        help="Measure delta, sim_mean, sim_std and merge_threshold for the configured embedder.",
        description="Measure the similarity constants of the configured embedder on your own task texts and "
        "print them as YAML settings (see memrl_mcp/embeddings/calibrate.py for the method).",
    )
    source = calibrate.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--tasks", type=Path, metavar="FILE", help="One task per line, or JSON Lines with a task field (an export)."
    )
    source.add_argument("--namespace", metavar="NS", help="The tasks of this namespace's memories in the store.")
    calibrate.add_argument("--out", type=Path, metavar="FILE", help="Write the YAML here (default: stdout).")
    _store_options(calibrate, default=argparse.SUPPRESS)
    config = commands.add_parser(
        "config",
        help="Print the effective settings and where each came from.",
        description="Print the effective settings as YAML, each with where its value came from (default, the "
        "config file, an environment variable, an argument); secrets are masked. An unknown MEMRL_* variable or "
        "config key is an error naming the closest setting.",
    )
    config.add_argument(
        "--defaults", action="store_true", help="Print the annotated defaults instead (a config file to start from)."
    )
    _store_options(config, default=argparse.SUPPRESS)
    local = commands.add_parser(
        "local",
        help="The local memory server of the store: status, ui, stop.",
        description="The user's local memory server of the store, which every stdio session attaches to: status "
        "(the default) says whether it runs, its sessions and its inspector's address; ui prints the inspector's "
        "address (starting the server if none runs); stop stops it (attached sessions start a new one at their next "
        "call); run runs it in the foreground (what a session starts); serve has it serve streamable HTTP at "
        "http://HOST:PORT/mcp (and the inspector at /ui) on the same memory as every stdio session, starting it if "
        "none runs, until this command ends (Ctrl-C): loopback only, without tokens.",
    )
    local.add_argument("action", nargs="?", choices=("status", "ui", "stop", "run", "serve"), default="status")
    local.add_argument("--host", default=argparse.SUPPRESS, help="serve: the loopback address (the host setting).")
    local.add_argument("--port", type=int, default=argparse.SUPPRESS, help="serve: the HTTP port (the port setting).")
    _store_options(local, default=argparse.SUPPRESS)
    hook = commands.add_parser(
        "hook",
        help="A Claude Code hook (the plugin in integrations/claude-code): the event's JSON on stdin.",
        description="Run one of the Claude Code plugin's hooks: read the event's JSON on stdin, answer in Claude "
        "Code's JSON on stdout, always exit 0. user-prompt-submit reads the prompt as feedback on the task before "
        "and recalls for a new task; post-tool-use and post-tool-use-failure record the tests, builds, type checks, "
        "lints and edits the session ran; stop hands that evidence to the memory and holds the session once while "
        "a recall of it waits for its report; stop-failure (an API error) records nothing; session-end closes the "
        "session's recalls with their evidence (docs/claude-code.md).",
    )
    hook.add_argument(
        "--client",
        metavar="NAME",
        help="The agent whose hook this is (claude-code, ...); default: the one the environment names, else Claude "
        "Code (agents that run Claude Code's plugins run its hook commands as they are).",
    )
    hook.add_argument(
        "event",
        metavar="EVENT",
        help="user-prompt-submit, post-tool-use, post-tool-use-failure, stop, stop-failure or session-end",
    )
    _store_options(hook, default=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _store_options(parser: argparse.ArgumentParser, default: str | None) -> None:
    """Given before or after the subcommand (a subcommand's SUPPRESS default keeps the value given before it)."""
    parser.add_argument(
        "--config",
        default=default,
        help="YAML settings file (else MEMRL_CONFIG); `memrl-mcp config --defaults` prints one.",
    )
    parser.add_argument("--data-dir", default=default, help="Folder of the embedded store (same as MEMRL_DATA_DIR).")


def _settings(args: argparse.Namespace) -> Settings:
    """The settings, with the options given on the command line as explicit values (they win)."""
    from memrl_mcp.settings import load_settings

    given = {name: getattr(args, name, None) for name in ("data_dir", "host", "port")}
    if getattr(args, "no_attach", False):
        given["attach"] = False
    return load_settings(args.config, **{name: value for name, value in given.items() if value is not None})


STOPS = (signal.SIGTERM, signal.SIGINT)


def _stop_on_signals() -> None:
    """SIGTERM (service managers, uvicorn raising it again after its own shutdown) and SIGINT stop a server as Ctrl-C
    does: the KeyboardInterrupt its serving code ends on, then the close of its store, which must run to its end."""
    for signum in STOPS:
        signal.signal(signum, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """The first stop: from now on the stop signals are ignored. A stop repeated while the store closes (a service
    manager's second SIGTERM, Ctrl-C pressed twice) would raise in the middle of the close and cut its flush short;
    nothing acknowledged would be lost (the write-ahead log has it), but the next start would find a store to replay
    and count again. Ignored rather than handled in Python: an ignored signal stays ignored through the interpreter's
    own shutdown, where a Python handler is dropped and the signal would kill the process that has just closed
    cleanly."""
    for stop in STOPS:
        signal.signal(stop, signal.SIG_IGN)
    raise KeyboardInterrupt


PRIVATE_UMASK = 0o077
"""Every file and folder a command makes (a store's, as its engine makes them, in this process or a rebuild's child;
a backup; a log) is its user's alone: memories hold secrets (memrl_mcp/storage/private.py)."""


def main(argv: list[str] | None = None) -> int:
    """``memrl-mcp``; a reader that stops reading early (``memrl-mcp local status | head -1``) ends it quietly."""
    try:
        return _main(argv)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 0


def _main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    previous = os.umask(PRIVATE_UMASK)
    try:
        return _command(args)
    finally:
        os.umask(previous)  # a command run inside another program (a test) gives it its umask back


def _command(args: argparse.Namespace) -> int:
    if args.project is not None:  # as the variable: a session of the local server reads its settings from it too
        os.environ["MEMRL_PROJECT_DIR"] = os.path.abspath(args.project)
    if args.command is None and args.transport == "stdio" and not args.no_attach:
        from memrl_mcp.local import attach, relay

        try:
            target = attach.target_of(args.data_dir, args.config)
        except MemrlError as error:  # a bad setting
            return relay.refuse(str(error))
        if target is not None:
            return relay.main(target)
    if args.command == "calibrate":
        return run_calibrate(args)
    if args.command == "config":
        return run_config(args)
    if args.command == "local":
        return run_local(args)
    if args.command == "hook":
        from memrl_mcp.clients import client_named, core

        try:
            client = client_named(args.client, os.environ)
        except ValueError as error:  # a hook never fails: it says why, and the agent goes on
            print(f"memrl-mcp hook: {error}", file=sys.stderr)
            return 0
        return core.run(client, args.event, args.data_dir, args.config)
    return serve(args) if args.command is None else run_backup(args)


def serve(args: argparse.Namespace) -> int:
    from memrl_mcp.settings import SettingsError
    from memrl_mcp.surface.observability import configure_logging
    from memrl_mcp.transports import http  # the MCP and HTTP stack: not loaded by export / import

    try:
        settings = _settings(args)
        serving = settings.serving
        log_calls = serving.log_calls if serving.log_calls is not None else args.transport != "stdio"
        configure_logging(serving.log_format, log_calls)
        tokens = http.tokens_for(serving, args.transport, serving.host)
        service = _open(settings)
    except (SettingsError, MemrlError) as error:  # a locked store, a full disk, a tampered or uncalibrated model
        reason = f"{error}{_held_by_local_server(args)}"
        if args.transport == "stdio":  # the client gets the reason as its answer, not a closed pipe
            from memrl_mcp.local.relay import refuse

            return refuse(reason)
        print(f"memrl-mcp: {reason}", file=sys.stderr)
        return 2
    where = settings.storage.qdrant_url or settings.storage.data_dir
    log.info(
        "memory open: %s (embedder %s, %s transport%s)",
        where,
        service.embedder.name,
        args.transport,
        ""
        if args.transport == "stdio"
        else f" on {serving.host}:{serving.port}, {'bearer tokens' if tokens else 'no token'}",
    )
    _stop_on_signals()  # a KeyboardInterrupt, which the finally clause below turns into a close
    try:
        http.serve(service, args.transport, serving.host, serving.port, tokens)
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
    return 0


def _open(settings: Settings) -> MemoryService:
    """The service of a server. A read-only server reads a copy of the store, which it cannot take while a server
    writes the store: the user's local server of the store lingers ``local_idle_seconds`` after its last session,
    so one that serves no session is stopped first (a session that comes later starts it again); one that serves
    sessions keeps the store, and the refusal says so."""
    from memrl_mcp.memory.service import MemoryService
    from memrl_mcp.storage import StoreLockedError

    try:
        return MemoryService.open(settings)
    except StoreLockedError:
        if not settings.serving.read_only or not _stop_idle_local_server(settings):
            raise
    return MemoryService.open(settings)


def _stop_idle_local_server(settings: Settings) -> bool:
    """Stop the user's local server of the store if it serves no session; whether it is gone."""
    from memrl_mcp.local import attach
    from memrl_mcp.local.place import place_of

    target = attach.Target(settings.storage.data_dir, settings.serving.runtime_dir, Path.cwd())
    try:
        place = place_of(target.data_dir, target.runtime_dir)
        status = attach.attach(target, "status", start=False)
        status.connection.close()
        if status.answer.sessions:
            return False
        attach.attach(target, "stop", start=False).connection.close()
    except (MemrlError, OSError):
        return False
    log.info("stopping the idle local memory server of %s (pid %d) to copy its store", target.data_dir,
             status.answer.pid)  # fmt: skip
    return _gone(place)


def _gone(place: Place) -> bool:
    """Wait for the local server of ``place`` to end (a stop asked of it) for as long as a start may take; whether it
    has."""
    from memrl_mcp.local.attach import POLL_SECONDS, START_SECONDS
    from memrl_mcp.local.place import owner_running

    deadline = time.monotonic() + START_SECONDS
    while owner_running(place) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    return not owner_running(place)


def run_backup(args: argparse.Namespace) -> int:
    """``export`` or ``import``: a refusal (bad settings or file, a store held by a server) is a message, status 2."""
    from memrl_mcp.memory import archive
    from memrl_mcp.surface.observability import configure_logging

    try:
        settings = _settings(args)
        configure_logging(settings.serving.log_format)
        if args.command == "export":
            summary = archive.export_memories(settings, args.out, args.namespace, sys.stdout.buffer)
        else:
            summary = archive.import_memories(settings, args.file, Progress(f"memrl-mcp {args.command}", sys.stderr))
    except (MemrlError, OSError) as error:  # bad settings or file, a locked or damaged store, no room for the copy
        print(f"memrl-mcp {args.command}: {error}{_held_by_local_server(args)}", file=sys.stderr)
        return 2
    print(f"memrl-mcp {args.command}: {summary}", file=sys.stderr)
    return 0


class Progress:
    """``done/total`` on stderr as an import goes: rewritten in place on a terminal (at most twice a second), a
    line every ``LOG_EVERY`` seconds into a log. Hand-written instead of tqdm: the server's install stays lean."""

    LOG_EVERY = 10.0

    def __init__(self, label: str, stream: TextIO) -> None:
        self._label = label
        self._stream = stream
        self._terminal = stream.isatty()
        self._started = time.monotonic()
        self._shown_at = -float("inf")

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._shown_at < (0.5 if self._terminal else self.LOG_EVERY):
            return
        self._shown_at = now
        elapsed = now - self._started
        rate = done / elapsed if elapsed > 0 else 0.0
        left = f", {(total - done) / rate:.0f} s left" if rate and done < total else ""
        line = f"{self._label}: {done}/{total} records ({rate:.1f}/s{left})"
        end = "\n" if done >= total or not self._terminal else ""
        self._stream.write(("\r" if self._terminal else "") + line + end)
        self._stream.flush()


def run_calibrate(args: argparse.Namespace) -> int:
    """``calibrate``: bad settings or input, or a store held by a server, is a message and status 2."""
    from memrl_mcp.embeddings import calibrate  # numpy work and the model: not loaded by the other commands
    from memrl_mcp.storage.files import write_atomically
    from memrl_mcp.surface.observability import configure_logging

    try:
        settings = _settings(args)
        configure_logging(settings.serving.log_format)
        text = calibrate.calibrate(settings, args.tasks, args.namespace).to_yaml()
        if args.out:
            write_atomically(args.out, lambda stream: stream.write(text.encode()))
        else:
            sys.stdout.write(text)
    except (MemrlError, ValueError, OSError) as error:  # ValueError: SettingsError, an unknown FastEmbed model
        print(f"memrl-mcp calibrate: {error}", file=sys.stderr)
        return 2
    if args.out:
        print(f"memrl-mcp calibrate: wrote {args.out}", file=sys.stderr)
    return 0


def run_config(args: argparse.Namespace) -> int:
    """``config``: the settings as YAML on stdout; bad settings are a message and status 2."""
    from memrl_mcp.settings import SettingsError, as_yaml

    if args.defaults:
        sys.stdout.write(as_yaml())
        return 0
    try:
        sys.stdout.write(as_yaml(_settings(args)))
    except SettingsError as error:
        print(f"memrl-mcp config: {error}", file=sys.stderr)
        return 2
    return 0


def run_local(args: argparse.Namespace) -> int:
    """``local``: the store's local server (``run``, ``status``, ``ui``, ``stop``); a refusal is a message, status 2."""
    from memrl_mcp.local import attach
    from memrl_mcp.local.place import AttachError, place_of

    try:
        if args.action == "run":
            return _run_local_server(args)
        target = attach.target_of(args.data_dir, args.config)
        if target is None:
            raise AttachError("these settings run memrl-mcp in a process of its own (attach: false, read_only, "
                              "qdrant_url): no local server serves them")  # fmt: skip
        if args.action == "serve":
            return _serve_http_locally(args, target)
        if args.action == "ui":
            print(attach.attach(target, "status").answer.ui)
            return 0
        place = place_of(target.data_dir, target.runtime_dir)
        try:
            answer = attach.attach(target, "stop" if args.action == "stop" else "status", start=False).answer
        except attach.NotRunningError:
            print(f"local memory server of {target.data_dir}: not running (socket: {place.socket})")
            return 0 if args.action == "stop" else 1
    except BrokenPipeError:
        raise  # the reader stopped reading (main)
    except (MemrlError, OSError) as error:
        print(f"memrl-mcp local {args.action}: {error}", file=sys.stderr)
        return 2
    if args.action == "status":
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(answer.started))
        print(f"local memory server of {answer.data_dir}: running, pid {answer.pid}, memrl-mcp {answer.version}, "
              f"{answer.sessions} session(s), since {since}")  # fmt: skip
        print(f"inspector: {answer.ui}\nsocket: {place.socket}")
        return 0
    _gone(place)
    print(f"local memory server of {target.data_dir}: stopped (pid {answer.pid})")
    return 0


def _serve_http_locally(args: argparse.Namespace, target: Target) -> int:
    """``local serve``: the local server of the store (started if none runs) serves streamable HTTP on the host and
    port of this command's settings for as long as this command's connection to it is open; this command's
    settings are its HTTP clients' as a stdio session's are its client's. Ctrl-C or SIGTERM ends it; so does the
    server's stop (the message says so, status 1)."""
    from memrl_mcp.local import attach
    from memrl_mcp.settings import load_grants
    from memrl_mcp.surface.auth import is_loopback

    settings = _settings(args)
    serving = settings.serving
    if load_grants(serving) or not is_loopback(serving.host):
        has = "tokens" if load_grants(serving) else f"the host {serving.host}"
        raise MemrlError(
            f"the local memory server serves HTTP without tokens, on loopback only; these settings have {has}: run a "
            "server of their own instead (`memrl-mcp --transport streamable-http --no-attach`, on a store no local "
            "server holds)"
        )
    _stop_on_signals()  # a KeyboardInterrupt, which closes the connection and so ends the HTTP server
    try:
        attached = attach.attach(target, "http", http=(serving.host, serving.port))
    except KeyboardInterrupt:
        return 0
    host = f"[{serving.host}]" if ":" in serving.host else serving.host
    try:
        print(f"memrl-mcp: serving http://{host}:{serving.port}/mcp (the inspector at /ui) on the local memory "
              f"server of {attached.answer.data_dir} (pid {attached.answer.pid}), shared with every stdio session of "
              "the store; Ctrl-C stops it", file=sys.stderr, flush=True)  # fmt: skip
        while attached.connection.recv(1 << 16):  # the server says nothing more: only its end is awaited
            pass
    except KeyboardInterrupt:
        return 0
    except OSError:
        pass
    finally:
        attached.connection.close()
    print(f"memrl-mcp: the local memory server of {attached.answer.data_dir} stopped: HTTP is no longer served on "
          f"port {serving.port}", file=sys.stderr)  # fmt: skip
    return 1


def _run_local_server(args: argparse.Namespace) -> int:
    from memrl_mcp.local import server as local
    from memrl_mcp.surface.observability import configure_logging

    settings = _settings(args)
    configure_logging(settings.serving.log_format, bool(settings.serving.log_calls))
    _stop_on_signals()  # a stop by signal ends the sessions as the stop command does, then closes the store
    return local.run(settings)


def _held_by_local_server(args: argparse.Namespace) -> str:
    """A hint for an error of a store in use, when the user's local server of that store is what holds it."""
    from memrl_mcp.local.place import owner_running, place_of

    try:
        settings = _settings(args)
        running = owner_running(place_of(settings.storage.data_dir, settings.serving.runtime_dir))
    except (MemrlError, OSError):
        return ""
    if not running:
        return ""
    if settings.serving.read_only:
        return (
            " The local memory server of this store holds it for the sessions attached to it: a read-only server "
            "reads a copy of the store, which it cannot take while another server writes it. Offer a profile that "
            "writes (core), whose sessions share that server's memory, or stop the sessions first (`memrl-mcp local "
            "stop` stops the server; they start it again at their next call)."
        )
    return " The local memory server of this store holds it: `memrl-mcp local stop` stops it."


if __name__ == "__main__":
    sys.exit(main())
