"""The Claude Desktop bundle (integrations/claude-desktop/): the official validator (npm @anthropic-ai/mcpb, pinned in
that folder's package-lock.json) accepts its manifest; the bundle `build.sh` packs holds what the manifest names, the
server's wheel with its embedding model among it; and unpacked as Claude Desktop unpacks it, started with the
manifest's command, arguments and environment (the user's settings put in), it answers the real MCP client, the
second time with uv offline.

``make desktop-bundle`` builds the bundle; this test builds its own, installing the validator itself when it is
missing (``npm ci``: the lock file's versions). The first start installs the server's dependencies with uv (from its
cache, else the package index), as Claude Desktop's first start does."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from io import BytesIO
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

import memrl_mcp
from memrl_mcp.settings import GROUP_OF, TOOL_PROFILES, load_settings
from tests.support.local import servers_of, stop_all
from tests.support.mcp import call, text_of

pytestmark = pytest.mark.slow  # node, a wheel build, uv and server processes

ROOT = Path(__file__).resolve().parents[1]
BUNDLE_DIR = ROOT / "integrations" / "claude-desktop"
MANIFEST: dict[str, Any] = json.loads((BUNDLE_DIR / "manifest.json").read_text())
PROJECT: dict[str, Any] = tomllib.loads((BUNDLE_DIR / "pyproject.toml").read_text())
BIN = Path(sys.executable).parent  # this virtualenv's: uv comes with the dev extra
WHEEL = f"wheels/memrl_mcp-{memrl_mcp.__version__}-py3-none-any.whl"
MODEL = ROOT / "memrl_mcp" / "embeddings" / "models"
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def mcpb() -> Path:
    tool = BUNDLE_DIR / "node_modules" / ".bin" / "mcpb"
    if not tool.exists():
        npm = shutil.which("npm")
        assert npm is not None, "npm is missing: `make node` (apt-get install -y nodejs npm)"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=BUNDLE_DIR, check=True, timeout=TIMEOUT_S)
    return tool


@pytest.fixture(scope="module")
def bundle(mcpb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = os.environ | {"PYTHON": sys.executable, "UV": str(BIN / "uv")}
    build = subprocess.run(
        [str(BUNDLE_DIR / "build.sh"), str(out)], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out / f"memrl-mcp-{memrl_mcp.__version__}.mcpb"


def validate(mcpb: Path, manifest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(mcpb), "validate", str(manifest)], capture_output=True, text=True, timeout=120)


def test_the_official_validator_accepts_the_manifest_and_refuses_a_broken_one(mcpb: Path, tmp_path: Path) -> None:
    accepted = validate(mcpb, BUNDLE_DIR / "manifest.json")
    assert accepted.returncode == 0 and "Manifest schema validation passes!" in accepted.stdout, accepted.stdout
    broken = json.loads((BUNDLE_DIR / "manifest.json").read_text())
    broken["user_config"]["namespace"]["type"] = "text"  # not one of the types a client knows how to ask for
    (tmp_path / "manifest.json").write_text(json.dumps(broken))
    refused = validate(mcpb, tmp_path / "manifest.json")
    assert refused.returncode != 0 and "user_config.namespace.type" in refused.stdout, refused.stdout


def test_the_manifest_describes_this_server() -> None:
    """Its version is the package's; every variable it sets is a setting of the server, and every default of the
    user's settings is a value the server takes (an empty one: the server's own default, as the entry point has it);
    the tools it lists are the default profile's, and the profile setting names every profile."""
    assert MANIFEST["version"] == PROJECT["project"]["version"] == memrl_mcp.__version__
    for page in ("README.md", "docs/claude-desktop.md"):  # the file they tell the user to open is the one built
        assert f"dist/memrl-mcp-{memrl_mcp.__version__}.mcpb" in (ROOT / page).read_text(), page
    assert PROJECT["project"]["dependencies"] == [f"memrl-mcp=={memrl_mcp.__version__}"]
    assert PROJECT["tool"]["uv"]["sources"]["memrl-mcp"] == {"path": WHEEL}
    server = MANIFEST["server"]
    assert (server["type"], server["entry_point"]) == ("uv", "server/main.py")
    env = server["mcp_config"]["env"]
    assert set(env) <= {f"MEMRL_{name.upper()}" for name in GROUP_OF}
    placeholders = [re.fullmatch(r"\$\{user_config\.(\w+)\}", value) for value in env.values()]
    assert set(MANIFEST["user_config"]) == {found[1] if found else None for found in placeholders}
    defaults = {name: str(MANIFEST["user_config"][value[14:-1]]["default"]) for name, value in env.items()}
    settings = load_settings(environ={name: value for name, value in defaults.items() if value})
    assert (settings.namespaces.namespace, settings.serving.tool_profile) == ("desktop", "core")
    assert [tool["name"] for tool in MANIFEST["tools"]] == list(TOOL_PROFILES["core"])
    assert all(f"{profile}:" in MANIFEST["user_config"]["tool_profile"]["description"] for profile in TOOL_PROFILES)


def test_the_packed_bundle_holds_what_the_manifest_names(bundle: Path) -> None:
    with zipfile.ZipFile(bundle) as archive:
        names = set(archive.namelist())
        assert names == {"manifest.json", "pyproject.toml", "uv.lock", MANIFEST["server"]["entry_point"], WHEEL}
        assert json.loads(archive.read("manifest.json")) == MANIFEST
        assert archive.read("server/main.py") == (BUNDLE_DIR / "server" / "main.py").read_bytes()
        lock = tomllib.loads(archive.read("uv.lock").decode())
        with zipfile.ZipFile(BytesIO(archive.read(WHEEL))) as wheel:
            shipped = {name for name in wheel.namelist() if name.startswith("memrl_mcp/embeddings/models/")}
    # The embedding model travels inside the server's wheel: nothing to download at run time.
    model = {
        f"memrl_mcp/{path.relative_to(ROOT / 'memrl_mcp').as_posix()}" for path in MODEL.rglob("*") if path.is_file()
    }
    assert shipped == model and any(name.endswith("model.onnx") for name in shipped)
    # The lock pins the server to the bundled wheel, and its native dependencies to versions of the package index.
    packages = {package["name"]: package for package in lock["package"]}
    assert packages["memrl-mcp"]["source"] == {"path": WHEEL}
    for native in ("onnxruntime", "qdrant-edge-py", "tokenizers"):
        assert packages[native]["source"] == {"registry": "https://pypi.org/simple"}, native


def test_the_bundle_is_unsigned_as_the_docs_say(bundle: Path, mcpb: Path) -> None:
    """docs/claude-desktop.md says the bundle is not signed (Claude Desktop shows it as unverified): the official
    verifier agrees, so the page changes when the build does."""
    verified = subprocess.run([str(mcpb), "verify", str(bundle)], capture_output=True, text=True, timeout=120)
    assert verified.returncode != 0 and "Extension is not signed" in verified.stdout + verified.stderr, verified
    assert "is not signed" in (ROOT / "docs" / "claude-desktop.md").read_text()


def desktop_launch(extension: Path, user_values: dict[str, str]) -> tuple[str, list[str], dict[str, str]]:
    """The manifest's mcp_config as Claude Desktop fills it in: ``${__dirname}`` is the unpacked extension, and
    ``${user_config.KEY}`` the user's value, else the option's default."""
    values = {key: user_values.get(key, str(option["default"])) for key, option in MANIFEST["user_config"].items()}

    def fill(text: str) -> str:
        text = text.replace("${__dirname}", str(extension))
        return re.sub(r"\$\{user_config\.(\w+)\}", lambda match: values[match[1]], text)

    config = MANIFEST["server"]["mcp_config"]
    env = {name: fill(value) for name, value in config["env"].items()}
    return config["command"], [fill(arg) for arg in config["args"]], env


def app_env(home: Path, **variables: str) -> dict[str, str]:
    """What Claude Desktop's process hands its servers beside mcp_config.env: the user's environment, with uv on the
    PATH (here this virtualenv's), and none of this checkout (no PYTHONPATH: the server must be the bundle's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return env | {"PATH": f"{BIN}{os.pathsep}{env['PATH']}", "XDG_DATA_HOME": str(home / "xdg")} | variables


@asynccontextmanager
async def serve_as_desktop(
    extension: Path, env: dict[str, str], user_values: dict[str, str], log: Path
) -> AsyncIterator[Client]:
    command, args, config_env = desktop_launch(extension, user_values)
    server = StdioServerParameters(command=command, args=args, env=env | config_env)
    with log.open("a") as errlog:
        async with Client(stdio_client(server, errlog=errlog)) as client:
            yield client


@pytest.mark.anyio
async def test_the_bundle_runs_as_claude_desktop_starts_it_and_then_offline(
    bundle: Path, mcpb: Path, tmp_path: Path
) -> None:
    extension = tmp_path / "Claude Extensions" / "local.mcpb.memrl-mcp"
    subprocess.run([str(mcpb), "unpack", str(bundle), str(extension)], check=True, capture_output=True, timeout=120)
    log = tmp_path / "servers.log"
    task = "Rotate the web server's logs every night"

    # The user's own settings: a namespace, a data folder, every tool.
    chosen = {"namespace": "desk", "data_dir": str(tmp_path / "memories"), "tool_profile": "full"}
    with anyio.fail_after(TIMEOUT_S):  # the first start installs the dependencies
        async with serve_as_desktop(extension, app_env(tmp_path), chosen, log) as client:
            assert client.server_info is not None and client.server_info.version == memrl_mcp.__version__
            assert {tool.name for tool in (await client.list_tools()).tools} == set(TOOL_PROFILES["full"])
            stored = await call(client, "store_experience", task=task, experience="logrotate -f, then check the cron")
            assert stored["memory"]["namespace"] == "desk"
            recalled = await call(client, "recall_experience", task=task)
            assert [memory["id"] for memory in recalled["memories"]] == [stored["id"]]
    assert (tmp_path / "memories").is_dir()

    # The defaults, offline: uv may not reach the index, and nothing else is fetched (the model is in the wheel).
    offline = app_env(tmp_path, UV_OFFLINE="1", HF_HUB_OFFLINE="1")
    with anyio.fail_after(120):
        async with serve_as_desktop(extension, offline, {}, log) as client:
            assert [tool.name for tool in (await client.list_tools()).tools] == list(TOOL_PROFILES["core"])
            stored = await call(client, "store_experience", task=task, experience="logrotate -f")
            assert stored["memory"]["namespace"] == "desktop"
            recalled = await call(client, "recall_experience", task=task)
            assert [memory["id"] for memory in recalled["memories"]] == [stored["id"]]  # not the other folder's
    # The data folder left empty is the platform's folder for memrl-mcp, never the extension's own.
    assert (tmp_path / "xdg" / "memrl-mcp").is_dir()
    with zipfile.ZipFile(bundle) as archive:
        unpacked = {name.split("/")[0] for name in archive.namelist()}
    assert {path.name for path in extension.iterdir()} == {".venv", *unpacked}


@pytest.fixture(scope="module")
def extension(bundle: Path, mcpb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle unpacked as Claude Desktop unpacks it, for the tests of its settings (the first start installs)."""
    folder = tmp_path_factory.mktemp("extensions") / "local.mcpb.memrl-mcp"
    subprocess.run([str(mcpb), "unpack", str(bundle), str(folder)], check=True, capture_output=True, timeout=120)
    return folder


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A runtime folder of the test's own for the local servers the bundle's sessions start, stopped at the end."""
    folder = Path(tempfile.mkdtemp(prefix="mrl", dir="/tmp"))
    try:
        yield folder
    finally:
        stop_all(folder)
        shutil.rmtree(folder, ignore_errors=True)


async def desktop_refusal(extension: Path, env: dict[str, str], user_values: dict[str, str], log: Path) -> str:
    """The reason Claude Desktop is given for settings that are refused: the error of the handshake (settings the
    session itself cannot read), or the tool error of each call when the local server refuses them (the handshake
    completes whatever becomes of the memory: issue 40.2)."""
    served = None
    try:
        async with serve_as_desktop(extension, env, user_values, log) as client:
            served = await client.call_tool("memory_stats", {})
    except Exception as error:
        cause: BaseException = error
        while isinstance(cause, BaseExceptionGroup):
            cause = cause.exceptions[0]
        assert isinstance(cause, MCPError), repr(cause)
        return str(cause)
    if served is None or not served.is_error:
        pytest.fail(f"the settings {user_values} were served")
    return text_of(served)


@pytest.mark.anyio
async def test_the_data_folder_and_namespace_are_taken_as_the_user_means_them(
    extension: Path, bundle: Path, runtime: Path, tmp_path: Path
) -> None:
    """``~/mem`` is in the user's home; a relative folder, which would live inside the extension's own folder (replaced
    at each update), and the namespace ``..``, which the server's own rule refuses, are answered with the reason."""
    home, log = tmp_path / "home", tmp_path / "servers.log"
    home.mkdir()
    env = app_env(tmp_path, HOME=str(home), MEMRL_RUNTIME_DIR=str(runtime))
    task = "Renew the TLS certificate of the intranet"
    with anyio.fail_after(TIMEOUT_S):  # the first start of this extension installs its dependencies
        async with serve_as_desktop(extension, env, {"data_dir": "~/mem"}, log) as client:
            stored = await call(client, "store_experience", task=task, experience="certbot renew, then reload nginx")
            assert [m["id"] for m in (await call(client, "recall_experience", task=task))["memories"]] == [stored["id"]]
        assert (home / "mem" / "memrl" / "edge").is_dir()

        relative = await desktop_refusal(extension, env, {"data_dir": "mem"}, log)
        assert "data folder (MEMRL_DATA_DIR): 'mem' is a relative path" in relative, relative
        dots = await desktop_refusal(extension, env, {"namespace": ".."}, log)
        assert "namespace" in dots and "'..' is a path segment, not a name" in dots, dots
    with zipfile.ZipFile(bundle) as archive:
        unpacked = {name.split("/")[0] for name in archive.namelist()}
    assert {path.name for path in extension.iterdir()} == {".venv", *unpacked}  # no "~", no "mem"


@pytest.mark.anyio
async def test_the_read_only_profile_answers_beside_the_local_server(
    extension: Path, runtime: Path, tmp_path: Path
) -> None:
    """``read_only`` runs in a process of its own, which reads a copy of the store. The local server that the other
    profiles' sessions attach to lingers after them, idle: it is stopped for the copy, and read_only serves. While
    it serves a session, read_only is answered with the reason, and that session goes on."""
    log, chosen = tmp_path / "servers.log", {"data_dir": str(tmp_path / "memories")}
    env = app_env(tmp_path, MEMRL_RUNTIME_DIR=str(runtime))
    task = "Rebuild the search index after the schema change"
    with anyio.fail_after(TIMEOUT_S):
        async with serve_as_desktop(extension, env, chosen, log) as client:
            stored = await call(client, "store_experience", task=task, experience="reindex with zero downtime")
        assert servers_of(runtime), "no local server lingers after the session"

        async with serve_as_desktop(extension, env, chosen | {"tool_profile": "read_only"}, log) as reader:
            assert {tool.name for tool in (await reader.list_tools()).tools} == set(TOOL_PROFILES["read_only"])
            found = await call(reader, "search_experience", task=task)
            assert [memory["id"] for memory in found["memories"]] == [stored["id"]]
        assert servers_of(runtime) == []

        async with serve_as_desktop(extension, env, chosen, log) as writer:
            await call(writer, "recall_experience", task=task)  # now its server holds the store
            refused = await desktop_refusal(extension, env, chosen | {"tool_profile": "read_only"}, log)
            assert "a read-only server reads a copy of the store" in refused and "(core)" in refused, refused
            recalled = await call(writer, "recall_experience", task=task)
            assert [memory["id"] for memory in recalled["memories"]] == [stored["id"]]
