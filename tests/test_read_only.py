"""A read-only server offers lookups only, and every server says which constants it runs with."""

import json
from pathlib import Path

import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.serving.tools import create_server
from tests.conftest import call, make_service


@pytest.mark.anyio
async def test_a_read_only_server_offers_no_tool_that_writes(embedder: Embedder, tmp_path: Path) -> None:
    writer = make_service(embedder, tmp_path / "data")
    async with Client(create_server(writer)) as client:
        stored = await call(client, "store_experience", task="water the plants", experience="use the blue can")
    writer.close()

    reader = make_service(embedder, tmp_path / "data", tool_profile="read_only")
    try:
        async with Client(create_server(reader)) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert names == {"search_experience", "memory_stats", "recall_step_advice", "list_memories"}
            for tool, arguments in {
                "recall_experience": {"task": "water the plants"},  # it would log a recall
                "store_experience": {"task": "a new task", "experience": "a new lesson"},
                "report_outcome": {"recall_id": stored["id"], "reward": 1.0},
                "forget_experience": {"memory_id": stored["id"]},
                "report_trajectory": {
                    "task": "water the plants",
                    "steps": [{"observation": "a dry plant", "action": "water it", "reward": 1.0}],
                    "episode_id": "e1",
                },
            }.items():
                result = await client.call_tool(tool, arguments)
                assert result.is_error, tool
            found = await call(client, "search_experience", task="water the plants")
            assert [m["id"] for m in found["memories"]] == [stored["id"]]
            stats = await call(client, "memory_stats")
            assert (stats["memories"], stats["recalls_pending"]) == (1, 0)
    finally:
        reader.close()


@pytest.mark.anyio
async def test_the_settings_resource_gives_the_effective_constants(embedder: Embedder, tmp_path: Path) -> None:
    service = make_service(embedder, tmp_path / "data", k1=10, k2=5, epsilon=0.01, q_init_success=0.5)
    try:
        async with Client(create_server(service)) as client:
            resource = await client.read_resource("memrl://settings")
            settings = json.loads(resource.contents[0].text)
    finally:
        service.close()
    assert (settings["k1"], settings["k2"], settings["epsilon"], settings["q_init_success"]) == (10, 5, 0.01, 0.5)
    # The embedder's own thresholds, since none was set.
    profile = embedder.similarity
    assert (settings["delta"], settings["sim_mean"], settings["sim_std"]) == (profile.delta, profile.mean, profile.std)
    assert settings["merge_threshold"] == profile.merge and settings["tool_profile"] == "full"
