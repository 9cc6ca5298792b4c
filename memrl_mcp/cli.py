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
        "call); run runs it in the foreground (what a session starts).",
    )
    local.add_argument("action", nargs="?", choices=("status", "ui", "stop", "run"), default="status")
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


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
        from memrl_mcp.clients import claude_code, core

        return core.run(claude_code.CLIENT, args.event, args.data_dir, args.config)
    return serve(args) if args.command is None else run_backup(args)


def serve(args: argparse.Namespace) -> int:
    from memrl_mcp.memory.service import MemoryService
    from memrl_mcp.settings import SettingsError
    from memrl_mcp.surface.observability import configure_logging
    from memrl_mcp.transports import http  # the MCP and HTTP stack: not loaded by export / import

    try:
        settings = _settings(args)
        serving = settings.serving
        log_calls = serving.log_calls if serving.log_calls is not None else args.transport != "stdio"
        configure_logging(serving.log_format, log_calls)
        tokens = http.tokens_for(serving, args.transport, serving.host)
        service = MemoryService.open(settings)
    except (SettingsError, MemrlError) as error:  # a locked store, a full disk, a tampered or uncalibrated model
        print(f"memrl-mcp: {error}{_held_by_local_server(args)}", file=sys.stderr)
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
    # SIGTERM (service managers, uvicorn re-raising it after its own shutdown) must still close the
    # store cleanly: turn it into the KeyboardInterrupt that the finally clause below handles.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        http.serve(service, args.transport, serving.host, serving.port, tokens)
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
    return 0


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
    from memrl_mcp.local.place import AttachError, owner_running, place_of

    try:
        if args.action == "run":
            return _run_local_server(args)
        target = attach.target_of(args.data_dir, args.config)
        if target is None:
            raise AttachError("these settings run memrl-mcp in a process of its own (attach: false, read_only, "
                              "qdrant_url): no local server serves them")  # fmt: skip
        if args.action == "ui":
            print(attach.attach(target, "status").answer.ui)
            return 0
        place = place_of(target.data_dir, target.runtime_dir)
        try:
            answer = attach.attach(target, "stop" if args.action == "stop" else "status", start=False).answer
        except attach.NotRunningError:
            print(f"local memory server of {target.data_dir}: not running (socket: {place.socket})")
            return 0 if args.action == "stop" else 1
    except (MemrlError, OSError) as error:
        print(f"memrl-mcp local {args.action}: {error}", file=sys.stderr)
        return 2
    if args.action == "status":
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(answer.started))
        print(f"local memory server of {answer.data_dir}: running, pid {answer.pid}, memrl-mcp {answer.version}, "
              f"{answer.sessions} session(s), since {since}")  # fmt: skip
        print(f"inspector: {answer.ui}\nsocket: {place.socket}")
        return 0
    deadline = time.monotonic() + attach.START_SECONDS
    while owner_running(place) and time.monotonic() < deadline:
        time.sleep(attach.POLL_SECONDS)
    print(f"local memory server of {target.data_dir}: stopped (pid {answer.pid})")
    return 0


def _run_local_server(args: argparse.Namespace) -> int:
    from memrl_mcp.local import server as local
    from memrl_mcp.surface.observability import configure_logging

    settings = _settings(args)
    configure_logging(settings.serving.log_format, bool(settings.serving.log_calls))
    signal.signal(signal.SIGTERM, _interrupt)  # a stop by signal ends the sessions as the stop command does
    return local.run(settings)


def _held_by_local_server(args: argparse.Namespace) -> str:
    """A hint for an error of a store in use, when the user's local server of that store is what holds it."""
    from memrl_mcp.local.place import owner_running, place_of

    try:
        settings = _settings(args)
        running = owner_running(place_of(settings.storage.data_dir, settings.serving.runtime_dir))
    except (MemrlError, OSError):
        return ""
    return " The local memory server of this store holds it: `memrl-mcp local stop` stops it." if running else ""


if __name__ == "__main__":
    sys.exit(main())
