"""``memrl-mcp``: run the memory server over stdio (default), streamable HTTP or SSE; back it up and restore it."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TextIO

from memrl_mcp import __version__
from memrl_mcp.errors import MemrlError
from memrl_mcp.memory import archive
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.serving.observability import configure_logging
from memrl_mcp.settings import Settings, SettingsError, as_yaml, load_settings
from memrl_mcp.storage.files import write_atomically

log = logging.getLogger("memrl_mcp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="memrl-mcp", description="MemRL episodic memory as an MCP server.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--transport", choices=("stdio", "streamable-http", "sse"), default="stdio")
    parser.add_argument("--host", help="HTTP bind address (default: the host setting, 127.0.0.1).")
    parser.add_argument("--port", type=int, help="HTTP port (default: the port setting, 8765).")
    _store_options(parser, default=None)
    commands = parser.add_subparsers(dest="command", title="backups (instead of serving)")
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
    given = {name: getattr(args, name, None) for name in ("data_dir", "host", "port")}
    return load_settings(args.config, **{name: value for name, value in given.items() if value is not None})


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "calibrate":
        return run_calibrate(args)
    if args.command == "config":
        return run_config(args)
    return serve(args) if args.command is None else run_backup(args)


def serve(args: argparse.Namespace) -> int:
    from memrl_mcp.serving import http  # the MCP and HTTP stack: not loaded by export / import

    try:
        settings = _settings(args)
        serving = settings.serving
        log_calls = serving.log_calls if serving.log_calls is not None else args.transport != "stdio"
        configure_logging(serving.log_format, log_calls)
        tokens = http.tokens_for(serving, args.transport, serving.host)
        service = MemoryService.open(settings)
    except (SettingsError, MemrlError) as error:  # a locked store, a full disk, a tampered or uncalibrated model
        print(f"memrl-mcp: {error}", file=sys.stderr)
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
    try:
        settings = _settings(args)
        configure_logging(settings.serving.log_format)
        if args.command == "export":
            summary = archive.export_memories(settings, args.out, args.namespace, sys.stdout.buffer)
        else:
            summary = archive.import_memories(settings, args.file, Progress(f"memrl-mcp {args.command}", sys.stderr))
    except (MemrlError, OSError) as error:  # bad settings or file, a locked or damaged store, no room for the copy
        print(f"memrl-mcp {args.command}: {error}", file=sys.stderr)
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
    if args.defaults:
        sys.stdout.write(as_yaml())
        return 0
    try:
        sys.stdout.write(as_yaml(_settings(args)))
    except SettingsError as error:
        print(f"memrl-mcp config: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
