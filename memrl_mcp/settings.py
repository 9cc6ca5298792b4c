"""Settings: defaults from the papers, a YAML file, environment variables and explicit values, grouped by concern.

Every setting has one name (``k1``, ``data_dir``, ``step_n``...), unique across the groups, and belongs to one group:
``storage``, ``embeddings``, ``similarity``, ``retrieval``, ``learning``, ``steps``, ``limits``, ``namespaces``,
``serving``. Each part of the server takes its own group (the store its :class:`StorageSettings`, the embedder its
:class:`EmbeddingSettings`...), never the whole configuration.

Where a value comes from, highest first:

1. an explicit value: ``load_settings(k1=3)``, or the command line's ``--data-dir``;
2. the environment: ``MEMRL_<NAME>`` (``MEMRL_K1=3``; lists and objects as JSON), and for three settings the names
   the Qdrant ecosystem uses (``QDRANT_URL``, ``QDRANT_API_KEY``, ``COLLECTION_NAME``), which ``MEMRL_*`` overrides;
3. the YAML file (``--config FILE``, else ``MEMRL_CONFIG``), where each setting sits under its group
   (``retrieval: {k1: 3}``);
4. the default.

A bad value is refused with its name and where it came from; so is an unknown name (a ``MEMRL_*`` variable, a YAML
key, an argument), with the closest known one: a typo must not silently leave a default in place.
:meth:`Settings.origin` says where each value came from (``memrl-mcp config`` prints them all).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import platformdirs
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from memrl_mcp.errors import MemoryRequestError, MemrlError
from memrl_mcp.validation import MAX_K, NAMESPACE, NAMESPACE_PATTERN, NamespaceName

ALL_NAMESPACES = "*"
MIN_TOKEN_CHARS = 16
ENV_PREFIX = "MEMRL_"
ECOSYSTEM_VARIABLES = {"qdrant_url": "QDRANT_URL", "qdrant_api_key": "QDRANT_API_KEY", "collection": "COLLECTION_NAME"}
"""The Qdrant ecosystem's names for three settings (the official Qdrant MCP server reads them); ``MEMRL_*`` wins."""
OTHER_VARIABLES = frozenset(
    {
        "MEMRL_LLM_BASE_URL",
        "MEMRL_LLM_MODEL",
        "MEMRL_LLM_API_KEY",
        "MEMRL_MEMORY_TOKEN",
        "MEMRL_SHARED_DATA",
        "MEMRL_LLB_ROOTFS",
        "MEMRL_JUDGE_BASE_URL",
        "MEMRL_JUDGE_MODEL",
        "MEMRL_JUDGE_API_KEY",
        "MEMRL_PEER",
    }
)
"""``MEMRL_*`` variables that are not settings of the server: memrl-harness's own and the peer benchmark's, which the
environment of a harness run or a test holds when it starts a server."""
RENAMED = {"read_only": "tool_profile: read_only (MEMRL_TOOL_PROFILE=read_only)"}
"""Settings that were renamed: their old name is refused with the new one."""


class SettingsError(MemrlError, ValueError):
    """A setting has a bad value, or a name that is no setting; the message names it and where it came from."""


class Group(BaseModel):
    """A group of settings: closed (an unknown name is an error, not ignored) and read-only once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StorageSettings(Group):
    """Where the memories live: an embedded Qdrant engine under ``data_dir``, or a Qdrant server."""

    data_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir("memrl-mcp")),
        description="Folder of the embedded store (and nothing else).",
    )
    embedded_engine: Literal["edge", "qdrant-local"] = Field(
        "edge",
        description="Embedded engine when no qdrant_url is set: qdrant-edge (default) or qdrant-client's local mode.",
    )
    qdrant_url: str | None = Field(
        None, description="A Qdrant server URL; when set, the embedded store is not used. Env: also QDRANT_URL."
    )
    qdrant_api_key: SecretStr | None = Field(
        None, description="API key of the Qdrant server. Env: also QDRANT_API_KEY."
    )
    collection: str = Field(
        "memrl",
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="Collection name prefix (tables are <collection>_memories, ...). Env: also COLLECTION_NAME.",
    )
    min_free_disk_mb: int = Field(
        64,
        ge=0,
        le=1 << 20,
        description="Free disk space (MB) under the embedded store below which writes are refused (0: no check).",
    )
    namespace_quota_mb: int = Field(
        1024,
        ge=0,
        le=1 << 30,
        description="Storage quota (MB) of each namespace: what its memories, recalls, step and episode records "
        "may take (payload JSON and vectors), so that no tenant fills the disk the others share (0: none; a "
        "token's namespace_quota_mb overrides it). Embedded engines only. 1 GB holds ~300,000 memories of a "
        "typical 1.9 KB payload, or ~48,000 with 20,000-character experiences.",
    )
    index_min_memories: int = Field(
        10_000,
        ge=0,
        le=1 << 40,
        description="qdrant-edge: memories searched exactly before an HNSW index is built for them, in the "
        "background (0: always exact).",
    )
    hnsw_ef: int = Field(
        128, ge=1, le=4096, description="qdrant-edge: candidates an HNSW search keeps (higher: closer to exact)."
    )


class EmbeddingSettings(Group):
    """Which model turns task texts into vectors."""

    embedder: Literal["minilm", "fastembed", "openai"] = Field(
        "minilm",
        description="minilm: all-MiniLM-L6-v2 int8 shipped in the package, offline. fastembed: any FastEmbed model "
        "(pip install 'memrl-mcp[fastembed]'). openai: any OpenAI-compatible API.",
    )
    embedding_model: str | None = Field(
        None,
        description="Model name: fastembed's (default sentence-transformers/all-MiniLM-L6-v2) or the openai "
        "embedder's (default text-embedding-3-small).",
    )
    embedding_model_path: Path | None = Field(
        None, description="fastembed: load this local model folder instead of downloading the model (offline)."
    )
    embedding_dimensions: int | None = Field(None, ge=1, le=8192, description="Output size for the openai embedder.")
    openai_base_url: str | None = Field(None, description="Base URL of the OpenAI-compatible embeddings API.")
    openai_api_key: SecretStr | None = Field(None, description="API key of the OpenAI-compatible embeddings API.")
    embedding_cache: int = Field(
        10_000, ge=0, le=10_000_000, description="Task texts whose vectors are kept in memory (1.5 KB each at 384-d)."
    )


class SimilaritySettings(Group):
    """The embedder's similarity scale; unset, the embedder's own measured constants (``memrl-mcp calibrate``)."""

    delta: float | None = Field(
        None, ge=-1.0, le=1.0, description="Phase A similarity threshold; default: the embedder's documented one."
    )
    sim_mean: float | None = Field(None, ge=-1.0, le=1.0, description="Corpus mean similarity; default: embedder's.")
    sim_std: float | None = Field(None, gt=0.0, le=2.0, description="Corpus similarity std; default: embedder's.")
    merge_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Task similarity at which a new memory merges into a twin; default: embedder's.",
    )


class RetrievalSettings(Group):
    """MemRL's two phases (MEMRL.md): Phase A by similarity, Phase B by similarity and learned utility."""

    k1: int = Field(5, ge=1, le=MAX_K, description="Phase A: candidates recalled by similarity.")
    k2: int = Field(3, ge=1, le=MAX_K, description="Phase B: memories returned after re-ranking (<= k1).")
    q_weight: float = Field(0.5, ge=0.0, le=1.0, description="lambda: weight of utility vs similarity (0 = RAG).")
    sim_normalization: Literal["corpus", "pool"] = Field(
        "corpus", description="z(sim) with the embedder's corpus mean/std (paper's code) or the pool's own."
    )
    epsilon: float = Field(0.0, ge=0.0, le=1.0, description="Probability of picking k2 candidates uniformly.")
    seed: int | None = Field(None, description="Seed of the exploration draws (None: not reproducible).")

    @model_validator(mode="after")
    def _k2_within_k1(self) -> RetrievalSettings:
        if self.k2 > self.k1:
            raise ValueError(f"k2 ({self.k2}) must not exceed k1 ({self.k1})")
        return self


class LearningSettings(Group):
    """MemRL's Monte-Carlo utility (Q <- Q + alpha (R - Q)) and what a recall promises until it is reported."""

    alpha: float = Field(0.3, gt=0.0, le=1.0, description="Learning rate of Q <- Q + alpha (R - Q).")
    q_init_success: float = Field(0.0, description="Initial Q of a stored success.")
    q_init_failure: float = Field(0.0, description="Initial Q of a stored failure.")
    reward_min: float = Field(-1.0, description="Lowest accepted reward.")
    reward_max: float = Field(1.0, description="Highest accepted reward.")
    recall_ttl_seconds: float = Field(
        24 * 3600.0,
        gt=0,
        description="How long a recall can be reported. An agent reports its episode within minutes (hours for "
        "a long coding task); a day also covers an overnight batch or a reward that waits for a human review.",
    )
    max_pending_recalls: int = Field(
        1000,
        ge=1,
        le=10_000_000,
        description="Unreported recalls a namespace keeps; beyond it the oldest are dropped (a report of one is "
        "refused as expired). Agents have a few episodes in flight each; 1000 is ~3 MB of disk per namespace.",
    )
    q_history_size: int = Field(
        50,
        ge=0,
        le=1000,
        description="Changes of Q each memory keeps (reward, Q before and after, time, recall); the oldest go first. "
        "About 160 characters each as JSON.",
    )

    user_success_reward: float | None = Field(
        None,
        description="The reward of a task the user says succeeded, when the agent reported none and the server asked "
        "the user (MCP elicitation); default: reward_max.",
    )
    user_failure_reward: float | None = Field(
        None, description="The reward of a task the user says failed, when asked; default: reward_min."
    )
    elicitation_timeout_seconds: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="How long a report waits for the user's answer (a client that never answers must not hold the "
        "call forever); then nothing is reported and the recall stays reportable.",
    )
    distill_base_url: str | None = Field(
        None,
        description="An OpenAI-compatible endpoint (e.g. http://127.0.0.1:8080/v1) that writes the experience from a "
        "trajectory when the client cannot (it offers no MCP sampling); unset: such a report is refused.",
    )
    distill_model: str | None = Field(None, description="The model of distill_base_url.")
    distill_api_key: SecretStr | None = Field(None, description="The API key of distill_base_url (a local one: none).")
    distill_max_tokens: int = Field(
        400, ge=16, le=8192, description="The longest experience the model may write from a trajectory, in tokens."
    )
    distill_timeout_seconds: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="How long the client's model (or distill_base_url) may take to write an experience; then nothing "
        "is reported.",
    )

    @model_validator(mode="after")
    def _rewards(self) -> LearningSettings:
        if not self.reward_min < self.reward_max:
            raise ValueError(f"reward_min ({self.reward_min}) must be below reward_max ({self.reward_max})")
        for name in ("q_init_success", "q_init_failure", "user_success_reward", "user_failure_reward"):
            value = getattr(self, name)
            if value is not None and not self.reward_min <= value <= self.reward_max:
                raise ValueError(f"{name} must lie in [reward_min, reward_max]")
        if not self.user_reward(False) < self.user_reward(True):
            raise ValueError("user_failure_reward must be below user_success_reward")
        if (self.distill_base_url is None) != (self.distill_model is None):
            raise ValueError("distill_base_url and distill_model go together: give both, or neither")
        return self

    def q_init(self, outcome: str) -> float:
        """Q_init of a new memory of this outcome."""
        return self.q_init_success if outcome == "success" else self.q_init_failure

    def user_reward(self, succeeded: bool) -> float:
        """The reward of a task the user, asked, says succeeded or failed."""
        if succeeded:
            return self.reward_max if self.user_success_reward is None else self.user_success_reward
        return self.reward_min if self.user_failure_reward is None else self.user_failure_reward


class StepSettings(Group):
    """Rememberer's step memory (arXiv 2306.07929); defaults from its code (OpenDFM/Rememberer) where it has them."""

    max_reported_episodes: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Reported trajectories whose episode_id a namespace remembers, so that a retry is told it was "
        "already applied; beyond, the oldest are forgotten (a report of one of those ids is applied as a new "
        "episode). A client retries within minutes; the bound keeps a client that reports under ever new ids from "
        "growing the store without limit.",
    )
    step_n: int = Field(
        1,
        ge=1,
        le=100,
        description="n of the n-step bootstrapped target (the code's --n-step-flatten; its WebShop and WikiHow runs "
        "use 1, its ALFWorld run 5).",
    )
    step_gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount gamma of the target (the code's default).")
    step_order: Literal["backward", "forward"] = Field(
        "backward",
        description="backward: a trajectory's steps are credited last to first, each target's tail read from the "
        "record as the episode's later steps leave it, so its final reward reaches every step in one report; "
        "forward: the tail is the memory as it stood before the episode (Rememberer's code, which updates each step "
        "online), so a winning early step's first target misses the reward it led to.",
    )
    step_update: Literal["mean", "const"] = Field(
        "mean",
        description="mean: Q is the running mean of its targets (the code's default); const: Q <- Q + "
        "step_learning_rate (G - Q).",
    )
    step_learning_rate: float = Field(
        0.1, gt=0.0, le=1.0, description="Learning rate of the const rule (the code's default)."
    )
    step_observation_weight: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="w of the match (1 - w) sim(task) + w sim(observation): the code's ALFWorld matcher weighs the "
        "instruction 0.4 and the observation 0.6.",
    )
    step_k: int = Field(2, ge=1, le=MAX_K, description="Records recall_step_advice matches (the code shows 2).")
    step_delta: float | None = Field(
        None, ge=-1.0, le=1.0, description="Lowest match for recall_step_advice; default: the embedder's delta."
    )
    step_match_threshold: float = Field(
        0.9,
        ge=-1.0,
        le=1.0,
        description="Lowest match of the record whose max Q is the tail of a target when no record has o_{t+n} "
        "exactly (the code takes the nearest at any distance; ours, so an unrelated record cannot lend its value).",
    )
    step_advice_threshold: float = Field(
        0.0, description="Actions with Q above it are encouraged, at or below it discouraged (the code: Q > 0)."
    )
    step_max_records: int = Field(
        500, ge=2, le=10_000_000, description="Step records per namespace (the code's runs: 500)."
    )
    step_max_actions: int = Field(
        10, ge=1, le=1000, description="Actions per record (the code's runs: 10); beyond, the lowest mean reward goes."
    )
    step_embed_chars: int = Field(
        512,
        ge=16,
        le=100_000,
        description="An observation longer than this is embedded as its head and tail, half each (MiniLM reads 128 "
        "tokens, about 512 characters); the whole text still keys the record.",
    )


class LimitSettings(Group):
    """The largest inputs accepted (every refusal names the field and the limit)."""

    max_task_chars: int = Field(4000, ge=1, description="Longest accepted task text.")
    max_experience_chars: int = Field(20000, ge=1, description="Longest accepted experience text.")
    max_metadata_chars: int = Field(4000, ge=2, description="Longest accepted metadata, as JSON.")
    max_observation_chars: int = Field(8000, ge=1, description="Longest accepted observation text.")
    max_action_chars: int = Field(1000, ge=1, description="Longest accepted action text.")
    max_trajectory_steps: int = Field(200, ge=1, le=10_000, description="Most steps in one reported trajectory.")
    max_trajectory_chars: int = Field(
        20000,
        ge=1,
        le=1_000_000,
        description="Longest episode text (trajectory) from which the client's model writes the experience.",
    )
    max_list_page: int = Field(100, ge=1, le=1000, description="Most memories one list_memories page returns.")


class NamespaceSettings(Group):
    """Which namespace a call that names none uses."""

    namespace: NamespaceName = Field(
        "default",
        description="Default namespace of a call that names none and whose token names none. Left unset, a client "
        "that offers MCP roots gets one derived from its project root instead (namespace_from_roots).",
    )
    namespace_from_roots: bool = Field(
        True,
        description="When the client offers MCP roots and neither the call, the token nor the namespace setting "
        "names a namespace, use one derived from the first root (<folder name>-<hash of its URI>), so one server "
        "shared by several projects keeps their memories apart.",
    )


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


ToolProfile = Literal["core", "steps", "full", "read_only"]
CORE_TOOLS = ("recall_experience", "report_outcome", "store_experience")
STEP_TOOLS = ("recall_step_advice", "report_trajectory")
TOOL_PROFILES: dict[str, tuple[str, ...]] = {
    "core": CORE_TOOLS,
    "steps": CORE_TOOLS + STEP_TOOLS,
    "full": CORE_TOOLS
    + STEP_TOOLS
    + ("search_experience", "list_memories", "update_memory", "forget_experience", "memory_stats"),
    "read_only": ("search_experience", "recall_step_advice", "list_memories", "memory_stats"),
}
"""The tools each ``tool_profile`` offers (``full``: every tool the server has). ``core`` is the default: it is the
loop an agent learns with, and each tool offered costs every turn its description and input schema."""


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
        description="Experiences one token (or all tokenless clients) may have written from trajectories per minute, "
        "by the client's model or distill_base_url (0: none); each costs a model's answer.",
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


GROUPS: dict[str, type[Group]] = {
    "storage": StorageSettings,
    "embeddings": EmbeddingSettings,
    "similarity": SimilaritySettings,
    "retrieval": RetrievalSettings,
    "learning": LearningSettings,
    "steps": StepSettings,
    "limits": LimitSettings,
    "namespaces": NamespaceSettings,
    "serving": ServingSettings,
}
GROUP_OF: dict[str, str] = {name: group for group, model in GROUPS.items() for name in model.model_fields}
"""Every setting's group, by its name (the names are unique across groups: a test checks it)."""


class Settings(BaseModel):
    """Every setting of the server, by group; :func:`load_settings` builds it from its sources."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    storage: StorageSettings = Field(default_factory=StorageSettings)
    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    similarity: SimilaritySettings = Field(default_factory=SimilaritySettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    learning: LearningSettings = Field(default_factory=LearningSettings)
    steps: StepSettings = Field(default_factory=StepSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    namespaces: NamespaceSettings = Field(default_factory=NamespaceSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    def value(self, name: str) -> Any:
        """The value of the setting ``name`` (whatever its group)."""
        return getattr(getattr(self, GROUP_OF[name]), name)

    def origin(self, name: str) -> str:
        """Where the value of ``name`` came from: ``default``, ``argument``, ``environment MEMRL_K1``, ``file ...``."""
        return self._origins.get(name, "default")

    def is_set(self, name: str) -> bool:
        """True when ``name`` was given by some source (not left at its default)."""
        return name in self._origins


def load_settings(
    config_file: Path | str | None = None, environ: Mapping[str, str] | None = None, **values: Any
) -> Settings:
    """The settings from ``values`` (by setting name), the environment (``os.environ`` unless given), the YAML file
    ``config_file`` and the defaults, in that order of precedence (module docstring)."""
    environ = os.environ if environ is None else environ
    config_file = config_file or environ.get("MEMRL_CONFIG") or None
    layers: list[tuple[str, dict[str, Any]]] = []  # lowest precedence first: (where, {name: value})
    if config_file is not None:
        layers.append((f"file {config_file}", _from_file(Path(config_file))))
    layers += _from_environment(environ)
    unknown = [name for name in values if name not in GROUP_OF]
    if unknown:
        raise SettingsError(unknown_name(unknown[0], GROUP_OF, "argument"))
    layers.append(("argument", dict(values)))
    grouped: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    for where, layer in layers:
        for name, value in layer.items():
            grouped.setdefault(GROUP_OF[name], {})[name] = value
            origins[name] = where
    try:
        settings = Settings.model_validate(grouped)
    except ValidationError as error:
        raise SettingsError("invalid settings: " + "; ".join(_problem(e, origins) for e in error.errors())) from None
    settings._origins.update(origins)
    return settings


def _from_file(path: Path) -> dict[str, Any]:
    """The settings of a YAML file, each under its group; a flat or unknown key is refused with the right place."""
    try:
        content = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file {path}: file not found") from None
    except OSError as error:
        raise SettingsError(f"config file {path}: cannot read it ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise SettingsError(f"config file {path}: not YAML ({error})") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise SettingsError(f"config file {path}: must be a mapping of groups ({', '.join(GROUPS)})")
    found: dict[str, Any] = {}
    for group, entries in content.items():
        if group in GROUP_OF:
            raise SettingsError(
                f"config file {path}: {group} goes under {GROUP_OF[group]}: (each setting sits under its group)"
            )
        if group not in GROUPS:
            raise SettingsError(f"config file {path}: " + unknown_name(str(group), GROUPS, "group"))
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise SettingsError(f"config file {path}: {group} must be a mapping of settings")
        for name, value in entries.items():
            if GROUP_OF.get(name) != group:
                where = f" (it belongs under {GROUP_OF[name]}:)" if name in GROUP_OF else _renamed(str(name))
                raise SettingsError(f"config file {path}: {group}.{name}: no such setting in {group}{where}")
            found[name] = value
    return found


def _from_environment(environ: Mapping[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """The settings of the environment: the ecosystem's names first, then ``MEMRL_*`` (which win)."""
    ecosystem = {
        f"environment {variable}": {name: _parse(name, variable, environ[variable])}
        for name, variable in ECOSYSTEM_VARIABLES.items()
        if variable in environ
    }
    layers = [(where, layer) for where, layer in ecosystem.items()]
    known = {ENV_PREFIX + name.upper(): name for name in GROUP_OF}
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or variable == "MEMRL_CONFIG" or variable in OTHER_VARIABLES:
            continue
        if variable not in known:
            raise SettingsError(unknown_name(variable, known, "environment variable"))
        name = known[variable]
        layers.append((f"environment {variable}", {name: _parse(name, variable, environ[variable])}))
    return layers


def _parse(name: str, variable: str, text: str) -> Any:
    """An environment value: JSON for a list or an object (``MEMRL_TOKENS``), else the text (pydantic converts it)."""
    annotation = GROUPS[GROUP_OF[name]].model_fields[name].annotation
    if get_origin(annotation) in (list, dict) or any(get_origin(arg) in (list, dict) for arg in get_args(annotation)):
        try:
            return json.loads(text)
        except ValueError:
            raise SettingsError(f'{variable}: {name} is a list; give it as JSON, e.g. ["..."]') from None
    return text


def unknown_name(name: str, known: Mapping[str, Any] | frozenset[str], kind: str) -> str:
    """``name: no such <kind>``, with the closest known name (or its new name, when it was renamed)."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = _renamed(name) or (f"; did you mean {close[0]}?" if close else "")
    return f"{name}: no such {kind}{hint}"


def _renamed(name: str) -> str:
    """The hint for a setting that has a new name (``MEMRL_READ_ONLY``, ``read_only``)."""
    renamed = RENAMED.get(name.lower().removeprefix(ENV_PREFIX.lower()))
    return f"; it is now {renamed}" if renamed else ""


def _problem(error: Any, origins: Mapping[str, str]) -> str:
    """One validation error as ``name (from where): message``."""
    location = [str(part) for part in error["loc"]]
    name = next((part for part in reversed(location) if part in GROUP_OF), location[-1] if location else "settings")
    inner = ".".join(location[location.index(name) + 1 :]) if name in location else ""
    where = f" (from {origins[name]})" if name in origins else ""
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{name}{'.' + inner if inner else ''}{where}: {message}"


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


def as_yaml(settings: Settings | None = None) -> str:
    """The settings as a YAML file of groups. Without ``settings``: the defaults, each with its description above it
    (the annotated file shipped as ``memrl_mcp/defaults.yaml``); with them: their values, each with where it came
    from (``memrl-mcp config``). Secrets are shown as ``"***"``."""
    lines = [
        "# memrl-mcp settings: memrl-mcp --config FILE (or MEMRL_CONFIG=FILE). Each setting can also be set as an",
        "# environment variable, MEMRL_ + its name in upper case (the environment wins over this file).",
    ]
    for group, model in GROUPS.items():
        lines += ["", f"# {(model.__doc__ or group).splitlines()[0].replace('``', '')}", f"{group}:"]
        for name, field in model.model_fields.items():
            if settings is None:
                lines += ["  # " + line for line in textwrap.wrap((field.description or "").replace("``", ""), 110)]
                if name == "data_dir":  # its default is the platform's folder, not a constant
                    lines.append(f"  # {name}: ~/.local/share/memrl-mcp")
                    continue
                lines.append(f"  {name}: {_yaml_value(getattr(getattr(Settings(), group), name))}")
            else:
                value = _yaml_value(settings.value(name))
                lines.append(f"  {name}: {value}  # {settings.origin(name)}")
    return "\n".join(lines) + "\n"


def _yaml_value(value: Any) -> str:
    """One value as YAML flow text, secrets masked."""
    if isinstance(value, SecretStr):
        return '"***"'
    if isinstance(value, list):
        value = [_plain(item) for item in value]
    return (
        yaml.safe_dump(_plain(value), default_flow_style=True, width=1 << 20).removesuffix("\n").removesuffix("\n...")
    )


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        dumped = value.model_dump(mode="json")
        return {key: "***" if key == "token" and item else item for key, item in dumped.items()}
    return str(value) if isinstance(value, Path) else value
