"""No secret is ever stored, and ``<private>`` stays private (memrl_mcp/redaction.py): the detector's recall on a
corpus of realistic secrets of many formats (tests/support/secrets.py), what it leaves alone, and the attack itself:
secrets and private text sent through every write path of the real MCP client and server (store, report with an
experience, with a trajectory the client's model distils, with the user's note, record_evidence, report_trajectory,
update_memory, the import of a backup), then looked for in everything that comes back (the recall's text and
structured content, the listings and resources, the step advice, an export) and in the bytes of the store's own
files once it is closed. The plugin's hooks: tests/test_claude_code.py."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, types

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.archive import export_memories, import_memories
from memrl_mcp.memory.records import step_id
from memrl_mcp.redaction import WITHHELD, redacted, without_private
from memrl_mcp.settings import load_settings
from memrl_mcp.surface.server import create_server
from tests.support.mcp import make_service, read_json
from tests.support.secrets import NOT_SECRETS, Leak, leaks

LEAKS = leaks()
PRIVATE = "the vault combination is 31-07-88, said in confidence"
MARKER = "quokka"  # a word of every dirty text: found on disk, so the texts are there to be read


def leaked(text: str, corpus: Iterable[Leak] = LEAKS) -> list[str]:
    """The kinds of the secrets of ``corpus`` that ``text`` shows, whole or any of their head, middle or tail 12
    characters (a secret redacted in part shows one of them)."""
    found = []
    for leak in corpus:
        secret, middle = leak.secret, max(0, len(leak.secret) // 2 - 6)
        windows = [secret] if len(secret) < 12 else [secret[:12], secret[middle : middle + 12], secret[-12:]]
        if any(window in text for window in windows):
            found.append(leak.kind)
    return found


def test_every_secret_of_the_corpus_is_redacted_and_what_looks_like_one_is_kept() -> None:
    assert len(LEAKS) >= 40 and len({leak.kind for leak in LEAKS}) == len(LEAKS)
    missed = {leak.kind: redacted(leak.text) for leak in LEAKS if leaked(redacted(leak.text), [leak])}
    assert missed == {}
    assert "export OPENAI_API_KEY=[REDACTED:" in redacted(LEAKS[0].text)  # what was there is said
    assert "python scripts/embed.py --batch 64" in redacted(LEAKS[0].text)  # the rest of the text is kept
    assert [text for text in NOT_SECRETS if redacted(text) != text] == []


def test_private_parts_are_dropped_whole() -> None:
    cases = {
        "deploy <private>with hunter2</private> now": f"deploy {WITHHELD} now",
        "a <PRIVATE >b</ Private> c": f"a {WITHHELD} c",
        "a <private>b <private>c</private> d</private> e": f"a {WITHHELD} e",  # nested
        "a <private>the rest, never closed": f"a {WITHHELD}",
        "a </private> b": "a  b",  # a stray closing tag
        "privately held, no tag": "privately held, no tag",
    }
    assert {text: without_private(text) for text in cases} == cases
    assert redacted(f"ok <private>{LEAKS[2].text}</private>") == f"ok {WITHHELD}"


def test_a_redacted_text_stays_within_its_limit() -> None:
    """``[REDACTED:kind]`` may be longer than the secret it replaces: the text is kept within the limit it passed."""
    text = "DB_PASSWORD=hunter2\n" * 20
    assert len(redacted(text)) > len(text) and len(redacted(text, len(text))) == len(text)


def dirty(group: Sequence[Leak]) -> str:
    """A text an agent would send: its leaks' texts, and something the user marked private."""
    return f"{MARKER}: " + "\n".join(leak.text for leak in group) + f"\n<private>{PRIVATE}</private>"


def short(leak: Leak, chars: int) -> str:
    """A leak's text within ``chars`` (a check's command, the user's words)."""
    assert len(leak.text) <= chars - 12, leak.kind
    return f"{MARKER} {leak.text}"


class Model:
    """The client's model (MCP sampling): it distils a trajectory into an experience that repeats its secrets."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def __call__(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=self.text), model="m"
        )


class User:
    """The user asked how a task went: it worked, with a note that holds a secret."""

    def __init__(self, note: str) -> None:
        self.note = note

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"succeeded": True, "note": self.note})


def backup_lines(group: Sequence[Leak]) -> str:
    """A backup another store exported (or a hand-made one), its texts full of secrets."""
    memory: dict[str, Any] = {"kind": "memory", "id": "6f1c1a52-5f0e-4b8e-9a47-0c1d2e3f4a5b", "namespace": "default"}
    memory |= {"task": dirty(group[:2]), "experience": dirty(group[2:]), "outcome": "success", "q": 0.5}
    memory |= {"visits": 1, "last_reward": 1.0, "merges": 0, "created_at": 1.7e9, "updated_at": 1.7e9}
    memory |= {"metadata": {"pasted": group[0].text}}
    task, observation = dirty(group[:1]), dirty(group[1:3])
    step: dict[str, Any] = {"kind": "step", "id": step_id("default", task, observation), "namespace": "default"}
    step |= {"task": task, "observation": observation, "created_at": 1.7e9, "updated_at": 1.7e9}
    step |= {"actions": [{"action": f"{MARKER} {group[3].text}", "q": 0.5, "visits": 1, "reward": 1.0}]}
    return json.dumps(memory) + "\n" + json.dumps(step) + "\n"


@pytest.mark.anyio
async def test_no_secret_and_nothing_private_is_stored_through_any_write_path(
    embedder: Embedder, tmp_path: Path
) -> None:
    """The attack (module docstring): every leak of the corpus goes through one write path or another; nothing of a
    secret, nothing of the private text, comes back or is on disk. The stored texts are on disk to be found (the
    marker is): so the search of the bytes can see a secret if one were there."""
    data = tmp_path / "data"
    settings = load_settings(data_dir=data, embedded_engine="edge", tool_profile="full")
    groups = [LEAKS[i : i + 4] for i in range(0, 28, 4)]  # 7 groups of 4: the long texts
    small = sorted(LEAKS[28:], key=lambda leak: len(leak.text))  # a check's command, the user's words, a note, ...
    rest = small[8:]  # in the metadata
    backup = tmp_path / "backup.jsonl"
    backup.write_text(backup_lines(groups[6]))
    import_memories(settings, backup)

    service = make_service(embedder, data)
    seen: list[str] = []

    async def kept(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await client.call_tool(tool, arguments)
        assert not result.is_error, result.content
        seen.extend(getattr(block, "text", "") for block in result.content)
        seen.append(json.dumps(result.structured_content))
        assert result.structured_content is not None
        return result.structured_content

    try:
        model, user = Model(dirty(groups[3][2:])), User(short(small[0], 500))
        server = create_server(service)
        async with Client(server, sampling_callback=model, elicitation_callback=user, mode="legacy") as client:
            stored = await kept(
                client, "store_experience", task=dirty(groups[0][:2]), experience=dirty(groups[0][2:]),
                metadata={"pasted": dirty(rest)},
            )  # fmt: skip
            recall = await kept(client, "recall_experience", task=dirty(groups[1][:2]))
            await kept(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0,
                       experience=dirty(groups[1][2:]))  # fmt: skip
            recall = await kept(client, "recall_experience", task=dirty(groups[3][:2]))
            await kept(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0,
                       trajectory=dirty(groups[3]))  # fmt: skip  # the client's model writes the experience
            recall = await kept(client, "recall_experience", task=dirty(groups[4][:1]))
            await kept(client, "report_outcome", recall_id=recall["recall_id"], experience=dirty(groups[4][1:]))
            recall = await kept(client, "recall_experience", task=dirty(groups[5][:2]))
            checks = [
                {"kind": "tests", "passed": True, "command": short(small[1], 200)},
                {"kind": "user", "passed": True, "said": short(small[2], 200)},
            ]
            await kept(client, "record_evidence", recall_id=recall["recall_id"], checks=checks, close=True)
            steps = [
                {"observation": dirty(groups[2][:2]), "action": short(small[3], 1000), "reward": 0.0},
                {"observation": dirty(groups[2][2:]), "action": short(small[4], 1000), "reward": 1.0},
            ]
            await kept(client, "report_trajectory", task=dirty(groups[5][2:]), steps=steps, episode_id="e1")
            await kept(client, "update_memory", memory_id=stored["id"], experience=dirty(small[5:8]))
            # Everything read back: recalls and searches of each dirty task, the listings, the resources.
            for group in groups:
                await kept(client, "recall_experience", task=dirty(group))
                await kept(client, "search_experience", task=dirty(group))
            listed = await kept(client, "list_memories", limit=100)
            assert listed["total"] == 5  # imported, stored, and the experiences of three reports
            for memory in listed["memories"]:
                seen.append(json.dumps(await read_json(client, f"memrl://memories/{memory['id']}")))
            seen.append(json.dumps(await read_json(client, f"memrl://recalls/{recall['recall_id']}")))
            await kept(client, "recall_step_advice", task=dirty(groups[5][2:]), observation=dirty(groups[2][:2]))
            advice = await kept(
                client, "recall_step_advice", task=dirty(groups[6][:1]), observation=dirty(groups[6][1:3])
            )
            assert advice["records"], advice  # the imported step is found, and what it shows is read
    finally:
        service.close()
    exported = tmp_path / "export.jsonl"
    await anyio.to_thread.run_sync(lambda: export_memories(settings, exported, [], io.BytesIO()))
    seen.append(exported.read_text())
    shown = "\n".join(seen)
    assert MARKER in shown and "[REDACTED:" in shown and WITHHELD in shown
    assert leaked(shown) == []
    assert PRIVATE not in shown and "31-07-88" not in shown
    files = [path for path in data.rglob("*") if path.is_file()]
    on_disk = b"\n".join(path.read_bytes().translate(None, b"\0") for path in files)  # their pages are mostly zeros
    assert MARKER.encode() in on_disk  # the texts are stored as text: a secret there would be found
    assert leaked(on_disk.decode("utf-8", "replace")) == [] and b"31-07-88" not in on_disk
