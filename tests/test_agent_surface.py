"""What an agent pays for and reads, checked over MCP with the real client: the default tool list (its size as a
client forwards it, titles, clean descriptions that say when to call and what reward to give), the tool profiles
and description overrides, results without output schemas but with structured content and ISO 8601 times, and the
server's logs (ISO 8601 times, no terminal colour codes)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
from mcp import Client
from mcp.types import TextContent
from pydantic import BaseModel, ConfigDict, Field, create_model

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import (
    EvidenceResult,
    ForgetResult,
    MemoryDetail,
    MemoryPage,
    RecallResult,
    ReportResult,
    SearchResult,
    Stats,
    StepAdviceResult,
    StoreResult,
    TrajectoryResult,
)
from memrl_mcp.requests import StatsQuery
from memrl_mcp.settings import TOOL_PROFILES, SettingsError, load_settings
from memrl_mcp.surface.schema import compact_schema
from memrl_mcp.surface.server import create_server
from memrl_mcp.surface.text import UNTRUSTED
from memrl_mcp.validation import CandidateCount, NamespaceName, Outcome, SortKey
from tests.support.mcp import call, hints, prompt_text, text_of
from tests.support.servers import child_env, http_server, run_cli

DEFAULT_LIST_BUDGET = 5 * 1024  # characters of compact JSON: about 1,300 tokens on every turn of the agent
RECALL_TEXT_BUDGET = 1.35  # the text a recall's model reads, against its memories' own experiences
NOISY_NUMBER = re.compile(r"\d\.\d{3,}")  # more than two decimals: float noise, or precision no model needs
JARGON = re.compile(r"Phase [AB]|lambda|λ|z\(|Q_init", re.I)
ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
TASK = "Rotate the logs of a web server every night"

pytestmark = pytest.mark.anyio


async def listed(embedder: Embedder, data_dir: Path, **settings: Any) -> list[dict[str, Any]]:
    """The tools as the client receives them, each as the JSON object a client forwards to its model."""
    service = MemoryService.open(load_settings(data_dir=data_dir, **settings), embedder)
    try:
        async with Client(create_server(service)) as client:
            tools = (await client.list_tools()).tools
    finally:
        service.close()
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools]


def texts(schema: Any) -> list[str]:
    """Every description in a JSON schema."""
    if isinstance(schema, dict):
        own = [schema["description"]] if isinstance(schema.get("description"), str) else []
        return own + [text for value in schema.values() for text in texts(value)]
    if isinstance(schema, list):
        return [text for value in schema for text in texts(value)]
    return []


def compact_size(tools: list[dict[str, Any]]) -> int:
    return len(json.dumps({"tools": tools}, separators=(",", ":")))


@pytest.fixture
async def default_tools(embedder: Embedder, tmp_path: Path) -> list[dict[str, Any]]:
    return await listed(embedder, tmp_path / "data")


async def test_the_default_tool_list_is_small_titled_and_clean(default_tools: list[dict[str, Any]]) -> None:
    assert [tool["name"] for tool in default_tools] == list(TOOL_PROFILES["core"])
    assert compact_size(default_tools) <= DEFAULT_LIST_BUDGET
    for tool in default_tools:
        assert tool["title"] and tool["title"] != tool["name"]
        description = tool["description"]
        assert description == description.strip() and "\n" not in description and "  " not in description, tool
        for text in [description, *texts(tool["inputSchema"])]:
            assert not JARGON.search(text), (tool["name"], text)
        assert "outputSchema" not in tool  # the result's structure is in docs/tools.md
        assert tool["description"].startswith(("Call ", "Keep ")), "say when to call it"


async def test_the_reward_says_what_to_give_even_in_a_chat(embedder: Embedder, tmp_path: Path) -> None:
    for reward_range, expected in (
        ({}, ("in [-1, 1]", "1 success", "-1 failure", "0 no clear outcome")),
        ({"reward_min": 0.0, "reward_max": 1.0}, ("in [0, 1]", "1 success", "0 failure", "0.5 no clear outcome")),
    ):
        tools = await listed(embedder, tmp_path / str(len(reward_range)), **reward_range)
        (report,) = [tool for tool in tools if tool["name"] == "report_outcome"]
        reward = report["inputSchema"]["properties"]["reward"]["description"]
        for words in (*expected, "In a chat", "ask the user", "infer it from their reaction"):
            assert words in reward, (words, reward)


HIDDEN_CALLS: dict[str, dict[str, Any]] = {
    "recall_experience": {"task": TASK},
    "report_outcome": {"recall_id": "3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11", "reward": 1.0},
    "store_experience": {"task": "another task", "experience": "another lesson"},
    "recall_step_advice": {"task": TASK, "observation": "a full disk"},
    "report_trajectory": {
        "task": TASK,
        "steps": [{"observation": "o", "action": "a", "reward": 1.0}],
        "episode_id": "e",
    },
    "search_experience": {"task": TASK},
    "list_memories": {},
    "update_memory": {"memory_id": "3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11", "reset_q": True},
    "forget_experience": {"namespace": "default"},
    "memory_stats": {},
    "record_evidence": {"recall_id": "3f1c2a94-8d55-4c4e-9f0e-0c6b1d2a7e11", "checks": [{"kind": "edit"}]},
}


@pytest.mark.parametrize("profile", sorted(TOOL_PROFILES))
async def test_each_profile_offers_its_tools_teaches_only_those_and_serves_no_other(
    embedder: Embedder, tmp_path: Path, profile: str
) -> None:
    """A profile is enforced, not only a shorter list: a tool it does not offer is an unknown tool, and the call
    changes nothing (``read_only`` is a frozen memory)."""
    writer = MemoryService.open(load_settings(data_dir=tmp_path / "data", tool_profile="full"), embedder)
    async with Client(create_server(writer)) as client:
        await call(client, "store_experience", task=TASK, experience="logrotate, daily, compress")
    writer.close()
    service = MemoryService.open(load_settings(data_dir=tmp_path / "data", tool_profile=profile), embedder)
    try:
        before = service.stats(StatsQuery(), access=EVERYTHING)
        async with Client(create_server(service)) as client:
            tools = (await client.list_tools()).tools
            prompt = prompt_text(await client.get_prompt("memory_loop", {"task": TASK}))
            instructions = client.instructions or ""
            offered = {tool.name for tool in tools}
            assert set(HIDDEN_CALLS) == set(TOOL_PROFILES["full"])
            for hidden in set(HIDDEN_CALLS) - offered:
                result = await client.call_tool(hidden, HIDDEN_CALLS[hidden])
                assert result.is_error and f"Unknown tool: {hidden}" in text_of(result), hidden
        assert service.stats(StatsQuery(), access=EVERYTHING) == before
    finally:
        service.close()
    assert offered == set(TOOL_PROFILES[profile])
    every_tool = set(TOOL_PROFILES["full"])
    assert {name for name in every_tool if name in instructions} == offered  # no tool it cannot call
    assert {name for name in every_tool if name in prompt} <= offered
    if profile == "read_only":
        assert all(hints(tool).read_only_hint for tool in tools)
        assert "search_experience" in prompt


@pytest.mark.slow  # the CLI in a child process
def test_the_old_read_only_setting_is_refused_not_ignored(tmp_path: Path) -> None:
    """``read_only: true`` froze a memory; ignored, it would leave that memory writable. Its old names stop the
    server, naming the new one."""
    config = tmp_path / "memrl.yaml"
    config.write_text("serving:\n  read_only: true\n")
    for args, variables in ((["--config", str(config)], {}), ([], {"MEMRL_READ_ONLY": "true"})):
        refused = run_cli(*args, env=child_env(tmp_path / "data", **variables))
        assert refused.returncode == 2, refused.stderr
        assert "it is now tool_profile: read_only (MEMRL_TOOL_PROFILE=read_only)" in refused.stderr
        assert not (tmp_path / "data").exists()  # refused before any store is opened


@pytest.mark.slow  # the CLI in a child process
async def test_a_description_can_be_replaced_and_an_unknown_tool_is_refused(embedder: Embedder, tmp_path: Path) -> None:
    mine = "Search my team's runbooks before any server change, and report whether the change worked."
    tools = await listed(embedder, tmp_path / "data", tool_descriptions={"recall_experience": mine})
    assert {tool["name"]: tool["description"] for tool in tools}["recall_experience"] == mine
    variable = json.dumps({"recall_experiense": mine})
    with pytest.raises(SettingsError, match="recall_experiense: no such tool; did you mean recall_experience"):
        load_settings(environ={"MEMRL_TOOL_DESCRIPTIONS": variable})
    refused = run_cli("config", env=child_env(tmp_path / "data", MEMRL_TOOL_DESCRIPTIONS=variable))
    assert refused.returncode == 2
    assert "tool_descriptions (from environment MEMRL_TOOL_DESCRIPTIONS): recall_experiense: no such tool" in (
        refused.stderr
    )


def test_the_compact_schema_keeps_every_bound(embedder: Embedder, tmp_path: Path) -> None:
    """The input schemas lose titles and null branches only: each bound pydantic derives from the tools' own types
    (lengths, ranges, patterns, enums, closed objects, nested steps) is still there, at the same place."""
    service = MemoryService.open(load_settings(data_dir=tmp_path / "data"), embedder)
    rules = service.limits
    service.close()
    reward: Any = Annotated[rules.reward.type, Field(description="r")]  # a type made at run time, from the settings
    arguments = create_model(
        "Arguments",
        __config__=ConfigDict(strict=True, extra="forbid"),
        task=(rules.task.type, ...),
        steps=(rules.steps.type, ...),
        reward=(reward, ...),
        experience=(rules.experience.type | None, None),
        namespace=(NamespaceName | None, None),
        k1=(CandidateCount | None, None),
        outcome=(Outcome, "success"),
        sort=(SortKey, "updated_at"),
        metadata=(rules.metadata.type | None, None),
    )
    raw = arguments.model_json_schema()
    compact = compact_schema(raw)
    assert bounds(compact) == bounds(raw) and len(bounds(raw)) > 20
    assert "title" not in json.dumps(compact) and '"null"' not in json.dumps(compact)
    assert len(json.dumps(compact)) < len(json.dumps(raw))


BOUND_KEYWORDS = {
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "enum",
    "type",
    "additionalProperties",
    "required",
    "$ref",
    "default",
}


def bounds(schema: Any, path: tuple[str, ...] = ()) -> set[tuple[tuple[str, ...], str, str]]:
    """Every (where, keyword, value) that constrains a value, the optional arguments' null branch aside."""
    found: set[tuple[tuple[str, ...], str, str]] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in BOUND_KEYWORDS and not (key == "default" and value is None):
                found.add((path, key, json.dumps(value)))
            elif key == "anyOf":
                found |= {bound for branch in value if branch != {"type": "null"} for bound in bounds(branch, path)}
            elif isinstance(value, dict | list):
                found |= bounds(value, (*path, key))
    elif isinstance(schema, list):
        for item in schema:
            found |= bounds(item, path)
    return found


@pytest.fixture
async def default_client(embedder: Embedder, tmp_path: Path) -> AsyncIterator[Client]:
    service = MemoryService.open(load_settings(data_dir=tmp_path / "data"), embedder)
    try:
        async with Client(create_server(service)) as client:
            yield client
    finally:
        service.close()


LOG_TASKS = [f"Rotate the logs of the {name} server every night" for name in ("web", "mail", "database")]
LOG_EXPERIENCES = [
    f"For the {name} server: install logrotate, add a file under /etc/logrotate.d with daily, rotate 14, compress, "
    "missingok and notifempty, then run logrotate -d to check it before the first night; "
    f"{extra}"
    for name, extra in (
        ("web", "reload nginx in postrotate so it reopens its files."),
        ("mail", "keep postfix's own maillog rotation out of the way."),
        ("database", "never rotate the live binary logs this way."),
    )
]


async def test_a_recall_reads_in_little_more_than_its_memories(default_client: Client) -> None:
    """The text the model reads of a recall: each experience, whether it worked, how far to trust it, the recall
    id, numbers rounded, within RECALL_TEXT_BUDGET of the experiences' own length besides the one line that says
    they are data (UNTRUSTED: a fixed cost per recall); every field stays structured."""
    for task, experience in zip(LOG_TASKS, LOG_EXPERIENCES, strict=True):
        await call(default_client, "store_experience", task=task, experience=experience)
    for reward in (1.0, 0.7, -0.3):  # q values with float noise
        recall = await call(default_client, "recall_experience", task=LOG_TASKS[0])
        await call(default_client, "report_outcome", recall_id=recall["recall_id"], reward=reward)
    result = await default_client.call_tool("recall_experience", {"task": LOG_TASKS[0]})
    (content,) = result.content
    assert isinstance(content, TextContent), content
    memories = result.structured_content["memories"]
    assert len(memories) == 3 and all(200 <= len(m["experience"]) <= 250 for m in memories)
    own = sum(len(m["experience"]) for m in memories)
    text = content.text
    assert len(text) <= RECALL_TEXT_BUDGET * own + len(UNTRUSTED), (len(text) / own, text)
    assert result.structured_content["recall_id"] in text
    for memory in memories:
        assert memory["experience"] in text and f"q {round(memory['q'], 2):g}" in text
        assert memory["q"] != round(memory["q"], 2)  # the exact value is structured
    assert not NOISY_NUMBER.search(text), text
    report = await default_client.call_tool(
        "report_outcome",
        {"recall_id": result.structured_content["recall_id"], "reward": 1.0, "experience": LOG_EXPERIENCES[0]},
    )
    said = text_of(report)
    assert said.startswith("reported reward 1: q of the recalled memories ") and "memory" in said, said
    assert len(said) < 300 and not NOISY_NUMBER.search(said), said


async def test_results_are_structured_with_iso_times_without_an_output_schema(default_client: Client) -> None:
    stored = await call(default_client, "store_experience", task=TASK, experience="logrotate, daily, compress")
    recall = await call(default_client, "recall_experience", task=TASK)
    (memory,) = recall["memories"]
    assert memory["created_at"] == memory["updated_at"] == stored["memory"]["created_at"]
    assert ISO_TIME.match(memory["created_at"]), memory["created_at"]
    report = await call(default_client, "report_outcome", recall_id=recall["recall_id"], reward=1.0)
    assert [change["id"] for change in report["updated"]] == [stored["id"]]


@pytest.mark.slow  # a server process
async def test_log_lines_have_iso_times_and_no_colour_codes(tmp_path: Path) -> None:
    """Through the real HTTP server (uvicorn's own lines included, which carry a coloured copy of their message),
    in both log formats; a refused argument is logged by its name, without the value."""
    for log_format in ("json", "text"):
        folder = tmp_path / log_format
        folder.mkdir()
        with http_server(folder / "data", folder, MEMRL_LOG_FORMAT=log_format) as server, anyio.fail_after(60):
            async with Client(server.url) as client:
                await call(client, "store_experience", task=TASK, experience="logrotate, daily, compress")
                refused = await client.call_tool("store_experience", {"task": TASK, "experience": "x", "q": "4242x"})
                assert refused.is_error and "q: Input should be a valid number, got '4242x'" in text_of(refused)
        log = server.log_path.read_text()
        assert "Uvicorn running on" in log and "tool call" in log
        assert "rejected arguments: ['q']" in log and "4242x" not in log  # the field, never the caller's value
        assert "\x1b" not in log and "\\u001b" not in log
        lines = log.splitlines()
        if log_format == "json":
            times = [json.loads(line)["time"] for line in lines]
        else:
            times = [line.split(" ", 1)[0] for line in lines]
        assert times and all(ISO_TIME.match(time) for time in times), times


# -- the results' structure, documented in docs/tools.md ---------------------------------------------------------

TOOLS_MD = Path(__file__).resolve().parents[1] / "docs" / "tools.md"
RESULTS: dict[str, type[BaseModel]] = {
    "recall_experience": RecallResult,
    "report_outcome": ReportResult,
    "store_experience": StoreResult,
    "recall_step_advice": StepAdviceResult,
    "report_trajectory": TrajectoryResult,
    "search_experience": SearchResult,
    "list_memories": MemoryPage,
    "update_memory": MemoryDetail,
    "forget_experience": ForgetResult,
    "memory_stats": Stats,
    "record_evidence": EvidenceResult,
}
BEGIN, END = "<!-- results: generated by `python -m tests.test_agent_surface` -->", "<!-- /results -->"


def type_of(schema: dict[str, Any]) -> str:
    """A JSON schema's type in words: ``string``, ``list of RecalledMemory``, ``number or null``..."""
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in schema:
        return " or ".join(type_of(branch) for branch in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f'"{value}"' for value in schema["enum"])
    if schema.get("type") == "array":
        return f"list of {type_of(schema['items'])}"
    return {"object": "JSON object", "null": "null"}.get(schema.get("type", ""), schema.get("type", "any"))


def model_table(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"**`{name}`**: {(schema.get('description') or '').replace('``', '`')}", "", "| field | type | |"]
    lines.append("|---|---|---|")
    for field, part in schema["properties"].items():
        lines.append(f"| `{field}` | {type_of(part)} | {part.get('description', '')} |")
    return [*lines, ""]


def results_reference() -> str:
    """The section of docs/tools.md that lists what each tool answers, from the models the tools return (as JSON:
    ``mode="serialization"``, where times are ISO 8601 strings)."""
    lines = ["| tool | answers |", "|---|---|"]
    lines += [f"| `{tool}` | `{model.__name__}` |" for tool, model in RESULTS.items()]
    lines.append("")
    parts: dict[str, dict[str, Any]] = {}
    for model in dict.fromkeys(RESULTS.values()):
        schema = model.model_json_schema(mode="serialization")
        parts.update(schema.pop("$defs", {}))
        lines += model_table(model.__name__, schema)
    for name in sorted(set(parts) - {model.__name__ for model in RESULTS.values()}):
        lines += model_table(name, parts[name])
    return "\n".join([BEGIN, "", *lines, END])


def test_the_results_structure_is_documented_as_the_tools_answer_it() -> None:
    text = TOOLS_MD.read_text()
    documented = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert documented == results_reference(), "docs/tools.md is stale: run `python -m tests.test_agent_surface`"


async def test_each_tool_answers_the_documented_fields(client: Client) -> None:
    """Every tool's structured content holds exactly the fields docs/tools.md lists for it."""
    stored = await call(client, "store_experience", task=TASK, experience="logrotate, daily, compress")
    recall = await call(client, "recall_experience", task=TASK)
    steps = [{"observation": "a full disk", "action": "logrotate -f", "reward": 1.0}]
    answers = {
        "store_experience": stored,
        "recall_experience": recall,
        "report_outcome": await call(client, "report_outcome", recall_id=recall["recall_id"], reward=1.0),
        "recall_step_advice": await call(client, "recall_step_advice", task=TASK, observation="a full disk"),
        "report_trajectory": await call(client, "report_trajectory", task=TASK, steps=steps, episode_id="e-1"),
        "search_experience": await call(client, "search_experience", task=TASK),
        "list_memories": await call(client, "list_memories"),
        "update_memory": await call(client, "update_memory", memory_id=stored["id"], experience="logrotate -f"),
        "memory_stats": await call(client, "memory_stats"),
        "forget_experience": await call(client, "forget_experience", memory_id=stored["id"]),
        "record_evidence": await call(
            client, "record_evidence", recall_id=recall["recall_id"], checks=[{"kind": "tests", "passed": True}]
        ),
    }
    assert set(answers) == set(RESULTS)
    for tool, answer in answers.items():
        assert set(answer) == set(RESULTS[tool].model_fields), tool


if __name__ == "__main__":  # rewrite docs/tools.md's generated section
    text = TOOLS_MD.read_text()
    TOOLS_MD.write_text(text[: text.index(BEGIN)] + results_reference() + text[text.index(END) + len(END) :])
