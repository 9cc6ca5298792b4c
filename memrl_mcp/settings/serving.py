"""The serving group: the HTTP transports' tokens and quotas, the tool profiles, logs; and the token grants.

Kept apart from the memory's groups because it is the one that names callers (tokens, their namespaces and quotas)
and what they are offered (tool profiles and descriptions).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.settings.groups import ALL_NAMESPACES, MIN_TOKEN_CHARS, Group, SettingsError, unknown_name
from memrl_mcp.validation import NAMESPACE, NAMESPACE_PATTERN


class TokenGrant(BaseModel):
    """One bearer token of the HTTP transports and the namespaces it may use (its tenant).

    The first namespace listed is the one a call that names none uses; ``"*"`` grants every namespace.
    Give the token itself, or only its SHA-256 (hex) to keep it out of the config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAMESPACE_PATTERN, description="Who holds the token (logs, metrics).")
    token: SecretStr | None = Field(None, min_length=MIN_TOKEN_CHARS, description="The bearer token.")
    token_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the bearer token.")
    namespaces: list[str] = Field(min_length=1, description='Namespaces this token may use; "*": all.')
    namespace_quota_mb: int | None = Field(
        None,
        ge=0,
        le=1 << 30,
        description="Storage quota (MB) of each namespace this token names, instead of the namespace_quota_mb "
        "setting (0: none); a namespace several tokens name gets the largest.",
    )

    @model_validator(mode="after")
    def _one_secret(self) -> TokenGrant:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError(f"token {self.name!r}: give exactly one of token or token_sha256")
        if self.namespace_quota_mb is not None and ALL_NAMESPACES in self.namespaces:
            raise ValueError(
                f'token {self.name!r}: namespace_quota_mb applies to the namespaces a token names, and "*" names '
                "none: set the namespace_quota_mb setting instead"
            )
        for namespace in self.namespaces:
            if namespace != ALL_NAMESPACES:
                try:
                    NAMESPACE.check("namespace", namespace)
                except MemoryRequestError as error:
                    raise ValueError(f"token {self.name!r}: {error}") from None
        return self


ToolProfile = Literal["core", "steps", "full", "read_only", "hooks"]
CORE_TOOLS = ("recall_experience", "report_outcome", "store_experience")
STEP_TOOLS = ("recall_step_advice", "report_trajectory")
TOOL_PROFILES: dict[str, tuple[str, ...]] = {
    "core": CORE_TOOLS,
    "steps": CORE_TOOLS + STEP_TOOLS,
    "full": CORE_TOOLS
    + STEP_TOOLS
    + ("search_experience", "list_memories", "update_memory", "forget_experience", "memory_stats", "record_evidence"),
    "read_only": ("search_experience", "recall_step_advice", "list_memories", "memory_stats"),
    "hooks": ("recall_experience", "report_outcome", "record_evidence"),
}
"""The tools each ``tool_profile`` offers (``full``: every tool the server has). ``core`` is the default: it is the
loop an agent learns with, and each tool offered costs every turn its description and input schema. ``hooks``: what
a client's hooks use (they recall, hand in the evidence of what happened, and close a recall with it); the model is
never offered it."""


class ServingSettings(Group):
    """The HTTP transports (tokens, sessions, hosts), logs, and what the server offers."""

    host: str = Field("127.0.0.1", description="HTTP bind address (the --host option wins).")
    port: int = Field(8765, ge=1, le=65535, description="HTTP port (the --port option wins).")
    tokens: list[TokenGrant] = Field(
        default_factory=list,
        description="Bearer tokens of the HTTP transports, each with its namespaces (env: a JSON list).",
    )
    tokens_file: Path | None = Field(None, description="YAML or JSON file with more tokens: {tokens: [...]}.")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host headers accepted besides loopback and the bound address (DNS-rebinding protection), "
        "e.g. memory.example.com:*",
    )
    max_sessions_per_token: int = Field(
        64,
        ge=1,
        le=100_000,
        description="Open streamable-HTTP sessions, or legacy SSE streams, one token (or all tokenless clients) may "
        "hold.",
    )
    session_idle_seconds: float = Field(
        600.0, gt=0, le=86_400, description="A streamable-HTTP session with no request for this long is closed."
    )
    max_samplings_per_minute: int = Field(
        10,
        ge=0,
        le=100_000,
        description="Experiences one token (without tokens: each session of the local server, else every client "
        "together) may have written from trajectories per minute, by the client's model or distill_base_url (0: "
        "none); each costs a model's answer.",
    )
    max_open_questions_per_token: int = Field(
        8,
        ge=1,
        le=10_000,
        description="Reports one token (without tokens: each session of the local server, else every client "
        "together) may have waiting at once for the client's answer: its user asked for the reward, or its model for "
        "the experience. Beyond, a report that would ask is refused "
        "(one that gives both asks nobody). Whatever this is, one recall or episode_id is asked about by one report at "
        "a time: only one report of it can apply.",
    )
    check_commands: list[str] = Field(
        default_factory=list,
        description="A project's own check commands (the start of each, e.g. ./run-checks), which the clients' "
        "hooks count as evidence of how a task went beside the test runners, builds, type checkers and linters they "
        "know (env: a JSON list).",
    )
    max_recall_chars: int = Field(
        6000,
        ge=100,
        le=1_000_000,
        description="Characters of experience one recall or search shows the model, all its memories together: a "
        "longer experience is shown shortened to its head (the whole memory: memrl://memories/{id}). What a recall "
        "shows enters the model's context, every turn of the conversation; the plugin's hooks add it to the prompt "
        "(Claude Code cuts a hook's context above 10,000 characters to a preview).",
    )
    max_message_mb: int = Field(
        16,
        ge=1,
        le=1024,
        description="The longest JSON-RPC message (one line) a stdio session may send, in its own process or "
        "attached to the local server (MB); a longer one is skipped unread and answered with an error naming this "
        "setting. The longest report the default limits accept (200 steps of 9,000 characters) takes under 11 MB.",
    )
    max_requests_in_flight: int = Field(
        256,
        ge=1,
        le=100_000,
        description="Requests a stdio session (in its own process or attached to the local server) may have sent and "
        "not yet had answered; one more is answered at once with an error naming this setting, and while that "
        "answer waits for the client to read it, nothing more is read.",
    )
    log_format: Literal["json", "text"] = Field("json", description="Logs on stderr: JSON lines or plain text.")
    log_calls: bool | None = Field(
        None,
        description="One log line per tool call (an access log for an operator). null: over HTTP only; a stdio "
        "client shows the server's stderr to its user, for whom a line per call is noise.",
    )
    tool_profile: ToolProfile = Field(
        "core",
        description="The tools an agent is offered: core (recall_experience, report_outcome, store_experience: the "
        "learning loop), steps (core + the step memory), full (steps + search and curation: search_experience, "
        "list_memories, update_memory, forget_experience, memory_stats), read_only (look-ups only, nothing can "
        "change the memory: a frozen memory, e.g. for a transfer evaluation; nothing is written, not even at open: an "
        "embedded store is read from a private copy in TMPDIR, a store that needs a schema migration is refused, "
        "and an interrupted report is left for a writable server to finish). Every tool listed costs the agent "
        "tokens on every turn.",
    )
    tool_descriptions: dict[str, str] = Field(
        default_factory=dict,
        description="Tool descriptions that replace the server's: {tool name: text} (env: a JSON object), e.g. to "
        "say what this memory holds. An unknown tool name is an error.",
    )
    ui_runs: list[Path] = Field(
        default_factory=list,
        description="Harness run folders, or folders of run folders, whose learning curves the /ui inspector draws.",
    )
    attach: bool = Field(
        True,
        description="stdio: attach to the user's local memory server of this store, started if none runs and shared "
        "by every session (one live memory for all of them); false: this process opens the store itself, one process "
        "per session as before (the store admits one; the --no-attach option too). A read_only profile, a qdrant_url "
        "and the HTTP transports always run in their own process.",
    )
    local_idle_seconds: float = Field(
        900.0,
        gt=0,
        le=7 * 86_400,
        description="The local memory server exits after this long without any session attached.",
    )
    local_max_sessions: int = Field(
        256,
        ge=1,
        le=100_000,
        description="Sessions the local memory server serves at once (each stdio session, each hook or script "
        "connected); one more is refused, naming this setting.",
    )
    local_session_threads: int = Field(
        4,
        ge=1,
        le=64,
        description="Worker threads the calls of one session of the local memory server may keep busy at once; its "
        "further calls wait for one, so that one session's flood of calls leaves the others the rest of the machine.",
    )
    runtime_dir: Path | None = Field(
        None,
        description="Folder of the local memory servers' sockets and locks, one subfolder per store; default: "
        "$XDG_RUNTIME_DIR/memrl-mcp, on macOS $TMPDIR/memrl-mcp, else /tmp/memrl-mcp-<uid> (made private, 0700).",
    )

    @field_validator("tool_descriptions")
    @classmethod
    def _known_tools(cls, descriptions: dict[str, str]) -> dict[str, str]:
        for name, text in descriptions.items():
            if name not in TOOL_PROFILES["full"]:
                raise ValueError(unknown_name(name, frozenset(TOOL_PROFILES["full"]), "tool"))
            if not text.strip():
                raise ValueError(f"{name}: the description is empty")
        return descriptions

    @property
    def read_only(self) -> bool:
        """Nothing may change the memory: no tool that writes is offered, and the inspector refuses edits."""
        return self.tool_profile == "read_only"


def load_grants(settings: ServingSettings) -> list[TokenGrant]:
    """The tokens of the settings and of ``tokens_file``; a bad file or entry is named in the error."""
    grants = list(settings.tokens)
    if settings.tokens_file is not None:
        grants += _grants_from_file(settings.tokens_file)
    names = [grant.name for grant in grants]
    for name in names:
        if names.count(name) > 1:
            raise SettingsError(f"tokens: the name {name!r} is given twice")
    digests = [grant_digest(grant) for grant in grants]
    if len(set(digests)) < len(digests):
        raise SettingsError("tokens: one token is given twice")
    return grants


def _grants_from_file(path: Path) -> list[TokenGrant]:
    try:
        content: Any = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SettingsError(f"tokens_file: cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise SettingsError(f"tokens_file: {path} is not YAML or JSON: {error}") from None
    if not isinstance(content, dict) or set(content) != {"tokens"}:
        raise SettingsError(f"tokens_file: {path} must hold one key, tokens: a list of tokens")
    try:
        return TypeAdapter(list[TokenGrant]).validate_python(content["tokens"])
    except ValidationError as error:
        problems = "; ".join(f"tokens.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise SettingsError(f"tokens_file {path}: {problems}") from None


def grant_digest(grant: TokenGrant) -> str:
    """The SHA-256 (hex) of the grant's token: what is kept of it in memory."""
    if grant.token is not None:
        return hashlib.sha256(grant.token.get_secret_value().encode()).hexdigest()
    assert grant.token_sha256 is not None
    return grant.token_sha256
