"""The inspector's test server: seeded namespaces, hostile texts, harness run folders."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import yaml
from mcp import types
from mcp.types import Implementation

from tests.support.mcp import call
from tests.support.servers import HttpServer, base_url, http_server, mcp_client

ALICE, BOB = "alice-inspector-0123456789", "bob-inspector-abcdefghijkl"


ROOT = Path(__file__).resolve().parents[2]


VERBS = ("Sort", "Compress", "Rename", "Count the lines of", "Back up", "Encrypt")


OBJECTS = ("the CSV export", "the nginx log folder", "the holiday photo album", "the invoice PDFs", "a git branch")


CLOSEST = "Sort a CSV file by its second column"


FARTHER = "Sort the rows of a CSV table by one of its columns and save it"


UNRELATED = "Sort a Python list of numbers in place"


HOSTILE_TASKS = (
    "<script>window.__pwned = 'script'</script> fix the build",
    "<img src=x onerror=\"window.__pwned = 'img'\"> resize images",
)


HOSTILE_EXPERIENCE = "<a href=\"javascript:window.__pwned='link'\">click here</a> then javascript:window.__pwned='t'"


HOSTILE_METADATA = {"html": "<svg onload=\"window.__pwned='svg'\">", "url": "javascript:window.__pwned='meta'"}


SECRET = "Bob's payroll deployment checklist"


@dataclass
class Seeded:
    """A running server and what was stored in it."""

    server: HttpServer
    base: str
    ids: dict[str, str]  # task -> memory id
    runs: Path | None


def write_tokens(path: Path) -> Path:
    grants = [
        {"name": "alice", "token": ALICE, "namespaces": ["alice", "preview", "hostile", "sources"]},
        {"name": "bob", "token_sha256": hashlib.sha256(BOB.encode()).hexdigest(), "namespaces": ["bob"]},
    ]
    path.write_text(yaml.safe_dump({"tokens": grants}))
    return path


def harness_runs(folder: Path) -> Path:
    """Real run folders of the LLM-free controlled benchmark, as `memrl-harness run` writes them (~10 s)."""
    command = [sys.executable, "-m", "memrl_harness.cli", "run", "controlled", "--mode", "none", "memrl"]
    command += ["--epochs", "3", "--tasks", "10", "--runs", str(folder)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return folder


SAMPLED = "Rotate the nginx logs every night"
AGENT = "codex-mcp-client"  # the name the client of the provenance memories gives itself (clientInfo.name)


SAMPLED_EXPERIENCE = "1. Write the logrotate rule. 2. Force a rotation. 3. Check the files."


USER_NOTE = "checked the rotated files by hand"


async def user_says_yes(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"succeeded": True, "note": USER_NOTE})


async def model_writes(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    text = types.TextContent(type="text", text=SAMPLED_EXPERIENCE)
    return types.CreateMessageResult(role="assistant", content=text, model="client-model")


async def seed(server: HttpServer, token: str | None) -> dict[str, str]:
    """30 memories to page through, Q learned by recall/report, a preview scene, hostile texts, bob's secret."""
    ids: dict[str, str] = {}
    async with mcp_client(server, token) as client:

        async def store(task: str, namespace: str, **extra: object) -> None:
            stored = await call(client, "store_experience", task=task, namespace=namespace, **extra)
            assert not stored["merged"], task
            ids[task] = stored["id"]

        for i, (verb, thing) in enumerate((v, o) for v in VERBS for o in OBJECTS):
            outcome = "failure" if i % 3 == 0 else "success"
            await store(f"{verb} {thing}", "alice", experience=f"Steps for {verb.lower()} {thing}.", outcome=outcome)
        for reward in (1.0, 1.0, -1.0, 1.0):  # Q history: four rewards on the memories "sort the CSV export" recalls
            recall = await call(client, "recall_experience", task="Sort the CSV export", namespace="alice")
            await call(client, "report_outcome", recall_id=recall["recall_id"], reward=reward)
        await store(CLOSEST, "preview", experience="csv.reader, sorted by row[1], csv.writer", q=-0.8)
        await store(FARTHER, "preview", experience="pandas: read_csv, sort_values, to_csv", q=0.9)
        await store(UNRELATED, "preview", experience="list.sort()", q=0.0)
        for task in HOSTILE_TASKS:
            await store(task, "hostile", experience=HOSTILE_EXPERIENCE, metadata=HOSTILE_METADATA)
    helpers = {"elicitation_callback": user_says_yes, "sampling_callback": model_writes}
    async with mcp_client(server, token, client_info=Implementation(name=AGENT, version="1"), **helpers) as helped:
        # Provenance: an experience the client's model wrote, and a reward the user gave, with a note.
        stored = await call(helped, "store_experience", task=SAMPLED, trajectory="$ logrotate -f", namespace="sources")
        ids[SAMPLED] = stored["id"]
        recall = await call(helped, "recall_experience", task=SAMPLED, namespace="sources")
        await call(helped, "report_outcome", recall_id=recall["recall_id"])
        # A report the evidence contradicts: the tests failed, the agent claims success.
        recall = await call(helped, "recall_experience", task=SAMPLED, namespace="sources")
        failed = {"kind": "tests", "command": "pytest -q", "passed": False, "failed_count": 1}
        await call(helped, "record_evidence", recall_id=recall["recall_id"], checks=[failed])
        await call(helped, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    if token is not None:
        async with mcp_client(server, BOB) as bob:
            stored = await call(bob, "store_experience", task=SECRET, experience="secret steps", namespace="bob")
            ids[SECRET] = stored["id"]
    return ids


@contextmanager
def seeded_server(tmp: Path, *, tokens: bool, runs: Path | None = None) -> Iterator[Seeded]:
    variables = {"MEMRL_TOKENS_FILE": str(write_tokens(tmp / "tokens.yaml"))} if tokens else {}
    if runs is not None:
        variables["MEMRL_UI_RUNS"] = json.dumps([str(runs)])
    with http_server(tmp / "data", tmp, **variables) as server:
        with ThreadPoolExecutor(1) as thread:  # an event loop of its own (Playwright's sync API runs one here)
            ids = thread.submit(anyio.run, seed, server, ALICE if tokens else None).result()
        yield Seeded(server, base_url(server), ids, runs)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


JSON_WRITE = {"Content-Type": "application/json"}
