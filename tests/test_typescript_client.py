"""memrl-mcp with the official TypeScript SDK (npm @modelcontextprotocol/sdk, pinned in tests/ts_client/) as its
client, over stdio: the flow of issue 26 (a reward from the user, an experience from the client's model) through
another implementation of MCP, which speaks the handshake protocol. ``make node`` installs node and the SDK; this
test installs the SDK itself when it is missing (``npm ci``: the lock file's versions), and fails without node."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.node import CLIENT, node_with_sdk
from tests.support.servers import CLI, child_env

pytestmark = pytest.mark.slow  # node and a server process

TIMEOUT_S = 300


@pytest.fixture(scope="module")
def node() -> str:
    return node_with_sdk()


def test_a_typescript_client_gives_the_users_reward_and_its_models_experience(node: str, tmp_path: Path) -> None:
    env = child_env(tmp_path / "data", MCP_TEST_SERVER=json.dumps(CLI))
    done = subprocess.run([node, "report.mjs"], cwd=CLIENT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["tools"] == ["recall_experience", "report_outcome", "store_experience"]  # the default profile
    (question,) = out["asked"]["user"]
    assert "Rotate the logs of the web server every night" in question["message"]
    assert question["requestedSchema"]["required"] == ["succeeded"]
    (request,) = out["asked"]["model"]
    assert "$ logrotate -f" in request["text"] and "<<<EPISODE" in request["systemPrompt"]
    report = out["report"]
    assert (report["reported"], report["reward"], report["reward_source"]) == (True, 1.0, "user")
    assert report["message"] == "the user said the task succeeded: reward 1 (note: checked from TypeScript)"
    (change,) = report["updated"]
    assert change["id"] == out["stored"]["id"] and change["q_after"] == pytest.approx(0.3)
    memory = report["stored"]["memory"]
    assert (memory["experience"], memory["experience_source"]) == ("1. Write the rule. 2. Rotate.", "client_model")
