"""The memory learns: where the most similar memories lead to failure, MemRL (lambda = 0.5 with Q
updates) comes to hand out the less similar memory that succeeds; similarity alone (lambda = 0) never does."""

from pathlib import Path

import pytest
from mcp import Client

from memrl_mcp.embeddings import Embedder
from memrl_mcp.surface.server import create_server
from tests.support.mcp import make_service

pytestmark = pytest.mark.anyio

QUERY = "heat a mug of water in the microwave and put it on the dining table"
DISTRACTORS = [  # paraphrases of the query (cosine 0.90-0.96 with MiniLM) whose advice fails
    "put a hot mug of water from the microwave on the dining table",
    "warm a mug of water in the microwave then put it on the table",
    "microwave a mug of water, then set the mug down on the table",
]
HELPFUL = "heat water with the microwave, carry the mug to the table"  # cosine 0.89
EPISODES = 16


async def run_episodes(client: Client, q_weight: float, helpful_id: str) -> list[bool]:
    """Each episode: recall one memory; the agent succeeds exactly when it was given the helpful one."""
    successes = []
    for _ in range(EPISODES):
        recall = await client.call_tool("recall_experience", {"task": QUERY, "k2": 1, "q_weight": q_weight})
        chosen = recall.structured_content["memories"]
        success = [m["id"] for m in chosen] == [helpful_id]
        await client.call_tool(
            "report_outcome",
            {"recall_id": recall.structured_content["recall_id"], "reward": 1.0 if success else -1.0},
        )
        successes.append(success)
    return successes


@pytest.mark.parametrize("q_weight", [0.5, 0.0])
async def test_utility_overturns_misleading_similarity(
    embedder: Embedder, tmp_path: Path, engine: str, q_weight: float
) -> None:
    service = make_service(embedder, tmp_path, engine, k1=5, delta=0.3)
    try:
        async with Client(create_server(service)) as client:
            helpful_id = ""
            for task in [*DISTRACTORS, HELPFUL]:
                experience = "put the mug on the table first" if task in DISTRACTORS else "heat, then place"
                stored = await client.call_tool("store_experience", {"task": task, "experience": experience})
                assert not stored.structured_content["merged"], task
                helpful_id = stored.structured_content["id"]

            # The setting is as claimed: every distractor is more similar to the query than the helpful memory.
            recall = await client.call_tool("recall_experience", {"task": QUERY, "k2": 4, "q_weight": 0.0})
            pool = recall.structured_content["memories"]
            assert len(pool) == 4 and pool[-1]["id"] == helpful_id
            assert pool[-2]["similarity"] > pool[-1]["similarity"]

            successes = await run_episodes(client, q_weight, helpful_id)
    finally:
        service.close()

    late = successes[EPISODES // 2 :]
    if q_weight > 0:
        assert sum(late) == len(late), successes  # learned, and keeps choosing it
    else:
        assert not any(successes)
