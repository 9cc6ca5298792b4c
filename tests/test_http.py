"""Serving for real: bearer tokens, tenants, the operators' routes and logs, through the real server process.

Two tokens share one server: alice may use namespace ``alice``; bob may use ``bob`` and ``shared``. Each
test talks to the server with raw HTTP (status codes) or the MCP SDK's client (tools), as deployments do.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anyio
import httpx
import pytest
import yaml
from mcp import Client
from mcp.client.sse import sse_client

from memrl_mcp.settings import SettingsError, load_grants, load_settings
from tests.support.mcp import call, read_json, refused
from tests.support.servers import (
    ALICE,
    BOB,
    DEADLINE_S,
    INITIALIZE,
    MCP_HEADERS,
    base_url,
    child_env,
    http_server,
    mcp_client,
    run_cli,
    tokens_file,
)

TASK = "Sort a CSV file by its second column"


@pytest.mark.slow  # the CLI in a child process
def test_a_non_loopback_bind_without_a_token_is_refused(tmp_path: Path) -> None:
    result = run_cli(
        "--transport", "streamable-http", "--host", "0.0.0.0", "--data-dir", str(tmp_path), env=child_env()
    )
    assert result.returncode == 2
    assert "refusing to serve on 0.0.0.0 without a token" in result.stderr
    assert not (tmp_path / "memrl").exists()  # refused before the store was opened


@pytest.mark.slow  # a server process
@pytest.mark.anyio
async def test_missing_or_wrong_token_is_401_and_operators_routes_answer(tmp_path: Path) -> None:
    with http_server(tmp_path / "data", tmp_path, MEMRL_TOKENS_FILE=str(tokens_file(tmp_path))) as server:
        async with httpx.AsyncClient(base_url=base_url(server), timeout=10) as http:
            for headers in ({}, {"Authorization": "Bearer not-a-token-at-all"}, {"Authorization": f"Basic {ALICE}"}):
                response = await http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **headers})
                assert response.status_code == 401, headers
                assert response.headers["www-authenticate"].startswith("Bearer")
            ok = await http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": f"Bearer {ALICE}"})
            assert ok.status_code == 200

            # DNS rebinding: a page served from another name is refused even with a valid token.
            evil = {**MCP_HEADERS, "Authorization": f"Bearer {ALICE}", "Host": "evil.example.com"}
            assert (await http.post("/mcp", json=INITIALIZE, headers=evil)).status_code in (400, 403, 421)

            for route in ("/stats", "/metrics"):  # the operators' routes too
                assert (await http.get(route, headers={"Host": "evil.example.com"})).status_code == 421

            health = await http.get("/health")
            assert (health.status_code, health.json()) == (200, {"status": "ok"})
            assert (await http.get("/stats")).status_code == 401
            assert (await http.get("/stats", headers={"Authorization": "Bearer wrong-token-123456"})).status_code == 401


@pytest.mark.slow  # a server process
@pytest.mark.anyio
async def test_a_tenant_never_sees_or_touches_another_tenants_memory(tmp_path: Path) -> None:
    with (
        http_server(tmp_path / "data", tmp_path, MEMRL_TOKENS_FILE=str(tokens_file(tmp_path))) as server,
        anyio.fail_after(DEADLINE_S),
    ):
        async with mcp_client(server, ALICE) as alice, mcp_client(server, BOB) as bob:
            # A call that names no namespace uses the token's first one.
            mine = await call(alice, "store_experience", task=TASK, experience="csv.reader, sorted, csv.writer")
            assert mine["memory"]["namespace"] == "alice"
            alice_recall = await call(alice, "recall_experience", task=TASK)
            assert [m["id"] for m in alice_recall["memories"]] == [mine["id"]]
            await call(bob, "store_experience", task=TASK, experience="pandas sort_values", namespace="shared")

            # Bob's recall of the same task never returns alice's memory.
            for namespace in (None, "bob", "shared"):
                recall = await call(bob, "recall_experience", task=TASK, namespace=namespace)
                assert mine["id"] not in [m["id"] for m in recall["memories"]]
            # Naming alice's namespace is refused, for every tool that takes one.
            for tool, arguments in (
                ("recall_experience", {"task": TASK}),
                ("store_experience", {"task": TASK, "experience": "x"}),
                ("memory_stats", {}),
                ("forget_experience", {}),
            ):
                message = await refused(bob, tool, namespace="alice", **arguments)
                assert "not one of the namespaces this token may use" in message

            # By id, alice's memory and recall look exactly like ids that do not exist.
            guessed = str(uuid.uuid4())
            for memory_id in (mine["id"], guessed):
                message = await refused(bob, "forget_experience", memory_id=memory_id)
                assert message.endswith(f"memory_id: no memory {memory_id!r}")
                with pytest.raises(Exception, match="no memory"):
                    await bob.read_resource(f"memrl://memories/{memory_id}")
            for recall_id in (alice_recall["recall_id"], guessed):
                message = await refused(bob, "report_outcome", recall_id=recall_id, reward=-1.0)
                assert f"recall_id: unknown recall {recall_id!r}" in message
                with pytest.raises(Exception, match=f"recall_id: unknown recall {recall_id!r}"):
                    await bob.read_resource(f"memrl://recalls/{recall_id}")  # whether it waits for its report
            state = await alice.read_resource(f"memrl://recalls/{alice_recall['recall_id']}")
            assert json.loads(state.contents[0].text)["status"] == "pending"  # type: ignore[union-attr]

            # Bob's statistics cover his namespaces only; alice's memory is untouched and hers to report on.
            assert (await call(bob, "memory_stats"))["memories"] == 1
            bob_stats = await read_json(bob, "memrl://stats")
            assert bob_stats["memories"] == 1
            report = await call(alice, "report_outcome", recall_id=alice_recall["recall_id"], reward=1.0)
            assert [c["id"] for c in report["updated"]] == [mine["id"]]
            assert (await call(alice, "memory_stats"))["memories"] == 1

        async with httpx.AsyncClient(base_url=base_url(server), timeout=10) as http:
            stats = (await http.get("/stats", headers={"Authorization": f"Bearer {BOB}"})).json()
            assert (stats["memories"], stats["visits"]) == (1, 0)
            stats = (await http.get("/stats?namespace=alice", headers={"Authorization": f"Bearer {ALICE}"})).json()
            assert (stats["memories"], stats["visits"], stats["recalls_reported"]) == (1, 1, 1)
            denied = await http.get("/stats?namespace=alice", headers={"Authorization": f"Bearer {BOB}"})
            assert denied.status_code == 400

            metrics = (await http.get("/metrics", headers={"Authorization": f"Bearer {BOB}"})).text
            assert 'memrl_tool_calls_total{status="ok",tool="store_experience"} 2.0' in metrics
            assert 'memrl_tool_calls_total{status="refused",tool="report_outcome"} 2.0' in metrics
            assert 'memrl_tool_call_seconds_count{tool="recall_experience"}' in metrics
            assert "memrl_memories 2.0" in metrics
            assert "alice" not in metrics and "shared" not in metrics  # no tenant data in metrics

    calls = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
    tool_calls = [entry for entry in calls if entry["message"] == "tool call"]
    assert {(e["client"], e["tool"], e["status"]) for e in tool_calls} >= {
        ("alice", "store_experience", "ok"),
        ("bob", "report_outcome", "refused"),
    }
    assert all(isinstance(e["ms"], float) and e["level"] == "info" for e in tool_calls)


@pytest.mark.slow  # a server process
@pytest.mark.anyio
async def test_legacy_sse_transport_requires_the_token_too(tmp_path: Path) -> None:
    tokens = json.dumps([{"name": "ci", "token": ALICE, "namespaces": ["*"]}])  # from the environment
    with http_server(tmp_path / "data", tmp_path, transport="sse", MEMRL_TOKENS=tokens) as server:
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(server.url)).status_code == 401
        with anyio.fail_after(DEADLINE_S):
            async with Client(sse_client(server.url, headers={"Authorization": f"Bearer {ALICE}"})) as client:
                stored = await call(client, "store_experience", task=TASK, experience="x", namespace="anything")
                recall = await call(client, "recall_experience", task=TASK, namespace="anything")
                assert [m["id"] for m in recall["memories"]] == [stored["id"]]


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ({"tokens": [{"name": "a", "token": "short", "namespaces": ["a"]}]}, "tokens.0.token"),
        ({"tokens": [{"name": "a", "token": ALICE}]}, "tokens.0.namespaces"),
        ({"tokens": [{"name": "a", "token": ALICE, "token_sha256": "0" * 64, "namespaces": ["a"]}]}, "exactly one"),
        ({"tokens": [{"name": "a", "token": ALICE, "namespaces": ["no spaces"]}]}, "'no spaces'"),
        ({"tokens": [{"name": "a", "token": ALICE, "namespaces": ["a"]}] * 2}, "name 'a' is given twice"),
        ({"keys": []}, "must hold one key, tokens"),
    ],
)
def test_a_bad_tokens_file_is_named(tmp_path: Path, content: object, named: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(SettingsError, match="tokens") as error:
        load_grants(load_settings(data_dir=tmp_path, tokens_file=path).serving)
    assert named in str(error.value)
