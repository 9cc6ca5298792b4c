"""``memrl-mcp``: run the memory server over stdio (default), streamable HTTP or SSE."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from memrl_mcp.memory import MemoryService
from memrl_mcp.server import create_server
from memrl_mcp.settings import SettingsError, load_settings
from memrl_mcp.storage import StoreLockedError

log = logging.getLogger("memrl_mcp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="memrl-mcp", description="MemRL episodic memory as an MCP server.")
    parser.add_argument("--transport", choices=("stdio", "streamable-http", "sse"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1).")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765).")
    parser.add_argument("--config", help="YAML settings file (same as MEMRL_CONFIG); see configs/default.yaml.")
    parser.add_argument("--data-dir", help="Folder of the embedded store (same as MEMRL_DATA_DIR).")
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # stdout is the protocol's wire under stdio: everything else goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.config:
        os.environ["MEMRL_CONFIG"] = args.config
    overrides = {"data_dir": args.data_dir} if args.data_dir else {}
    try:
        settings = load_settings(**overrides)
        service = MemoryService.open(settings)
    except (SettingsError, StoreLockedError) as error:
        print(f"memrl-mcp: {error}", file=sys.stderr)
        return 2
    where = settings.qdrant_url or settings.data_dir
    log.info("memory open: %s (embedder %s, %s transport)", where, service.embedder.name, args.transport)
    # SIGTERM (service managers, uvicorn re-raising it after its own shutdown) must still close the
    # store cleanly: turn it into the KeyboardInterrupt that the finally clause below handles.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server = create_server(service)
        if args.transport == "stdio":
            server.run()
        else:
            server.run(args.transport, host=args.host, port=args.port)
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
