"""A missing or wrong static token is answered as a token problem, and what MCP clients then show.

Every route that needs a token answers a request without a valid one with 401 and ``WWW-Authenticate: Bearer
realm="memrl-mcp", error="invalid_token", error_description="..."`` (RFC 6750, which the MCP authorization spec builds
on), the description saying what is wrong (no token, another scheme, a token the server does not have) and how to
send one, and the same in the JSON body. The server offers no OAuth, so it publishes no protected-resource metadata.
Then the official TypeScript SDK client (tests/ts_client/token.mjs) and the MCP Inspector's CLI (npm
@modelcontextprotocol/inspector, pinned in tests/ts_client) are run against it; ``GET /`` says where things are."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.node import CLIENT, inspector, node_with_sdk
from tests.support.servers import ALICE, INITIALIZE, MCP_HEADERS, base_url, child_env, http_server, tokens_file

pytestmark = pytest.mark.slow  # server processes and node

NONE = "a bearer token is required, and the request has none"
OTHER_SCHEME = "a bearer token is required, and the Authorization header holds another scheme"
UNKNOWN = "a bearer token is required, and this one is not one of this server's tokens"
HOW = "send 'Authorization: Bearer <token>' with a token from this server's operator (static tokens; no OAuth)"
WRONG = "not-one-of-the-tokens-0123"
ATTEMPTS = {NONE: {}, OTHER_SCHEME: {"Authorization": f"Basic {ALICE}"}, UNKNOWN: {"Authorization": f"Bearer {WRONG}"}}
TIMEOUT_S = 120


def challenge(header: str) -> dict[str, str]:
    """A ``Bearer`` challenge's parameters (RFC 6750 section 3: quoted strings, no quote or backslash inside)."""
    scheme, _, parameters = header.partition(" ")
    assert scheme == "Bearer", header
    return dict(re.findall(r'(\w+)="([^"\\]*)"', parameters))


def assert_token_problem(response: httpx.Response, problem: str) -> None:
    assert response.status_code == 401, (response.request.method, response.request.url, response.text)
    described = f"{problem}: {HOW}"
    assert challenge(response.headers["www-authenticate"]) == {
        "realm": "memrl-mcp",
        "error": "invalid_token",
        "error_description": described,
    }
    assert response.json() == {"error": "invalid_token", "error_description": described}


def test_every_route_that_needs_a_token_says_what_is_wrong_with_it(tmp_path: Path) -> None:
    variables = {"MEMRL_TOKENS_FILE": str(tokens_file(tmp_path))}
    with http_server(tmp_path / "data", tmp_path, **variables) as server:
        routes = [
            ("POST", "/mcp", INITIALIZE),
            ("GET", "/mcp", None),
            ("DELETE", "/mcp", None),
            ("GET", "/stats", None),
            ("GET", "/metrics", None),
            ("GET", "/ui/api/session", None),
            ("POST", "/ui/api/preview", {"task": "anything"}),
        ]
        with httpx.Client(base_url=base_url(server), timeout=TIMEOUT_S) as http:
            for problem, headers in ATTEMPTS.items():
                for method, path, body in routes:
                    assert_token_problem(
                        http.request(method, path, json=body, headers={**MCP_HEADERS, **headers}), problem
                    )
            ok = http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": f"Bearer {ALICE}"})
            assert ok.status_code == 200
            # No OAuth is offered, so no metadata points a client to an authorization server.
            assert http.get("/.well-known/oauth-protected-resource").status_code == 404
            assert http.get("/.well-known/oauth-protected-resource/mcp").status_code == 404
            # The server's address opened in a browser says where things are, with no token and nothing private.
            home = http.get("/")
            assert home.status_code == 200 and home.headers["content-type"].startswith("text/plain")
            assert "MCP endpoint (streamable-http): /mcp" in home.text and "/ui" in home.text
            assert "alice" not in home.text and ALICE not in home.text
    with (
        http_server(tmp_path / "sse-data", tmp_path, transport="sse", **variables) as server,
        httpx.Client(base_url=base_url(server), timeout=TIMEOUT_S) as http,
    ):
        for problem, headers in ATTEMPTS.items():
            assert_token_problem(http.get("/sse", headers=headers), problem)
            assert_token_problem(http.post("/messages/?session_id=0", json=INITIALIZE, headers=headers), problem)
        assert "MCP endpoint (sse): /sse" in http.get("/").text


def test_what_the_typescript_sdk_client_and_the_mcp_inspector_show(tmp_path: Path) -> None:
    """The TypeScript SDK's client (a static token in its headers) raises the 401 with the body's words; the
    Inspector's CLI (2.12) takes any 401 of an HTTP server for an OAuth server and starts OAuth, which a run without a
    terminal refuses: with ``--stored-auth-only`` (no interactive OAuth) it shows the body's words too."""
    node = node_with_sdk()
    with http_server(tmp_path / "data", tmp_path, MEMRL_TOKENS_FILE=str(tokens_file(tmp_path))) as server:
        env = child_env(MCP_TEST_URL=server.url, MCP_TEST_TOKEN=ALICE)
        done = subprocess.run(
            [node, "token.mjs"], cwd=CLIENT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)
        for case, problem in (("missing", NONE), ("wrong", UNKNOWN)):
            assert shown[case]["code"] == 401
            assert shown[case]["error"].startswith("Error: Streamable HTTP error: Error POSTing to endpoint: ")
            assert f"{problem}: {HOW}" in shown[case]["error"]
        assert "recall_experience" in shown["right"]["tools"]  # the right token lists the tools

        def inspect(token: str | None, *options: str) -> tuple[int, dict[str, Any]]:
            header = [] if token is None else ["--header", f"Authorization: Bearer {token}"]
            command = [*inspector(), "--cli", server.url, *header, *options, "--method", "tools/list"]
            env = child_env(HOME=str(tmp_path / "inspector-home"))  # where the Inspector keeps its OAuth state
            run = subprocess.run(
                command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S
            )
            return run.returncode, json.loads(run.stdout or run.stderr)

        for token, problem in ((None, NONE), (WRONG, UNKNOWN)):
            code, answer = inspect(token, "--stored-auth-only")
            assert code == 3 and answer["error"]["code"] == "auth_required"
            assert f"{problem}: {HOW}" in answer["error"]["message"]
            code, answer = inspect(token)  # the Inspector's default: OAuth on any 401, whatever it says
            assert code == 3 and "Interactive OAuth requires a TTY" in answer["error"]["message"]
        code, answer = inspect(ALICE)
        assert code == 0 and [tool["name"] for tool in answer["tools"]] == shown["right"]["tools"]
