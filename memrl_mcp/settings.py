"""Settings: environment variables (``MEMRL_*``), an optional YAML file, defaults from the paper.

Precedence, highest first: explicit arguments, environment, YAML file (``MEMRL_CONFIG`` or
``--config``), defaults. Every value is validated; a bad one is reported with its name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Literal

import platformdirs
import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from memrl_mcp.errors import MemoryRequestError, MemrlError
from memrl_mcp.validation import MAX_K, NAMESPACE, NAMESPACE_PATTERN, NamespaceName

ALL_NAMESPACES = "*"
MIN_TOKEN_CHARS = 16


class SettingsError(MemrlError, ValueError):
    """A setting has a bad value; the message names the setting."""


class TokenGrant(BaseModel):
    """One bearer token of the HTTP transports and the namespaces it may use (its tenant).

    The first namespace listed is the one a call that names none uses; ``"*"`` grants every namespace.
    Give the token itself, or only its SHA-256 (hex) to keep it out of the config file."""

    model_config = ConfigDict(extra="forbid")

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


def _aliases(name: str, ecosystem: str) -> AliasChoices:
    """A setting read as ``MEMRL_<NAME>`` first, then under the ecosystem's usual environment variable; ``name``
    itself keeps working in YAML files and as an argument."""
    return AliasChoices(f"MEMRL_{name.upper()}", ecosystem, name)


class Settings(BaseSettings):
    """All knobs of the memory server. Environment variable: ``MEMRL_`` + the upper-case name."""

    model_config = SettingsConfigDict(env_prefix="MEMRL_", extra="forbid", validate_default=True)

    # Storage
    data_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir("memrl-mcp")),
        description="Folder of the embedded store (and nothing else).",
    )
    embedded_engine: Literal["edge", "qdrant-local"] = Field(
        "edge",
        description="Embedded engine when no qdrant_url is set: qdrant-edge (default) or qdrant-client's local mode.",
    )
    # The Qdrant ecosystem's usual variables (mcp-server-qdrant's) work too; MEMRL_* wins when both are set.
    qdrant_url: str | None = Field(
        None,
        validation_alias=_aliases("qdrant_url", "QDRANT_URL"),
        description="A Qdrant server URL; when set, the embedded store is not used. Env: also QDRANT_URL.",
    )
    qdrant_api_key: SecretStr | None = Field(
        None,
        validation_alias=_aliases("qdrant_api_key", "QDRANT_API_KEY"),
        description="API key of the Qdrant server. Env: also QDRANT_API_KEY.",
    )
    collection: str = Field(
        "memrl",
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        validation_alias=_aliases("collection", "COLLECTION_NAME"),
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
        "background (0: always exact). An exact filtered search of 10,000 costs ~5% of the query's embedding, "
        "of 20,000 ~22%, of 50,000 ~74% (measured side by side).",
    )
    hnsw_ef: int = Field(
        128,
        ge=1,
        le=4096,
        description="qdrant-edge: candidates an HNSW search keeps (higher: closer to exact, slower). Measured in "
        "benchmarks/scale.py.",
    )

    # Embeddings
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

    # Retrieval (MEMRL.md, Phase A and B)
    k1: int = Field(5, ge=1, le=MAX_K, description="Phase A: candidates recalled by similarity.")
    k2: int = Field(3, ge=1, le=MAX_K, description="Phase B: memories returned after re-ranking (<= k1).")
    q_weight: float = Field(0.5, ge=0.0, le=1.0, description="lambda: weight of utility vs similarity (0 = RAG).")
    delta: float | None = Field(
        None, ge=-1.0, le=1.0, description="Phase A similarity threshold; default: the embedder's documented one."
    )
    sim_normalization: Literal["corpus", "pool"] = Field(
        "corpus", description="z(sim) with the embedder's corpus mean/std (paper's code) or the pool's own."
    )
    sim_mean: float | None = Field(None, ge=-1.0, le=1.0, description="Corpus mean similarity; default: embedder's.")
    sim_std: float | None = Field(None, gt=0.0, le=2.0, description="Corpus similarity std; default: embedder's.")
    epsilon: float = Field(0.0, ge=0.0, le=1.0, description="Probability of picking k2 candidates uniformly.")
    seed: int | None = Field(None, description="Seed of the exploration draws (None: not reproducible).")

    # Update (MEMRL.md, Monte-Carlo utility)
    alpha: float = Field(0.3, gt=0.0, le=1.0, description="Learning rate of Q <- Q + alpha (R - Q).")
    q_init_success: float = Field(0.0, description="Initial Q of a stored success.")
    q_init_failure: float = Field(0.0, description="Initial Q of a stored failure.")
    reward_min: float = Field(-1.0, description="Lowest accepted reward.")
    reward_max: float = Field(1.0, description="Highest accepted reward.")
    merge_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Task similarity at which a new memory merges into a twin; default: embedder's.",
    )
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
    max_reported_episodes: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Reported trajectories whose episode_id a namespace remembers, so that a retry is told it was "
        "already applied; beyond, the oldest are forgotten (a report of one of those ids is applied as a new "
        "episode). A client retries within minutes; the bound keeps a client that reports under ever new ids from "
        "growing the store without limit.",
    )

    # Step memory (Rememberer, arXiv 2306.07929; defaults from its code, OpenDFM/Rememberer, where it has them)
    step_n: int = Field(
        1,
        ge=1,
        le=100,
        description="n of the n-step bootstrapped target (the code's --n-step-flatten; its "
        "WebShop and WikiHow runs use 1, its ALFWorld run 5).",
    )
    step_gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount gamma of the target (the code's default).")
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
        description="w of the match (1 - w) sim(task) + w sim(observation): the code's ALFWorld "
        "matcher weighs the instruction 0.4 and the observation 0.6.",
    )
    step_k: int = Field(2, ge=1, le=MAX_K, description="Records recall_step_advice matches (the code shows 2).")
    step_delta: float | None = Field(
        None, ge=-1.0, le=1.0, description="Lowest match for recall_step_advice; default: the embedder's delta."
    )
    step_match_threshold: float = Field(
        0.9,
        ge=-1.0,
        le=1.0,
        description="Lowest match of the record whose max Q is the tail of a target when no "
        "record has o_{t+n} exactly (the code takes the nearest at any distance; ours, so an unrelated record "
        "cannot lend its value).",
    )
    step_advice_threshold: float = Field(
        0.0, description="Actions with Q above it are encouraged, at or below it discouraged (the code: Q > 0)."
    )
    step_max_records: int = Field(
        500,
        ge=2,
        le=10_000_000,
        description="Step records per namespace (the code's runs: 500); eviction rule in the README.",
    )
    step_max_actions: int = Field(
        10, ge=1, le=1000, description="Actions per record (the code's runs: 10); beyond, the lowest mean reward goes."
    )
    step_embed_chars: int = Field(
        512,
        ge=16,
        le=100_000,
        description="An observation longer than this is embedded as its head and tail, "
        "half each (MiniLM reads 128 tokens, about 512 characters); the whole text still keys the record.",
    )
    max_observation_chars: int = Field(8000, ge=1, description="Longest accepted observation text.")
    max_action_chars: int = Field(1000, ge=1, description="Longest accepted action text.")
    max_trajectory_steps: int = Field(200, ge=1, le=10_000, description="Most steps in one reported trajectory.")
    q_history_size: int = Field(
        50,
        ge=0,
        le=1000,
        description="Changes of Q each memory keeps (reward, Q before and after, time, recall); the oldest go first. "
        "About 160 characters each as JSON.",
    )

    # Input limits
    max_task_chars: int = Field(4000, ge=1, description="Longest accepted task text.")
    max_experience_chars: int = Field(20000, ge=1, description="Longest accepted experience text.")
    max_metadata_chars: int = Field(4000, ge=2, description="Longest accepted metadata, as JSON.")
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
    max_list_page: int = Field(100, ge=1, le=1000, description="Most memories one list_memories page returns.")

    # Serving over HTTP
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
    log_format: Literal["json", "text"] = Field("json", description="Logs on stderr: JSON lines or plain text.")
    log_calls: bool | None = Field(
        None,
        description="One log line per tool call (an access log for an operator). null: over HTTP only; a stdio "
        "client shows the server's stderr to its user, for whom a line per call is noise.",
    )
    read_only: bool = Field(
        False,
        description="Offer lookups only (search_experience, memory_stats, list_memories, resources): a frozen "
        "memory, e.g. for a transfer evaluation. Nothing is written, not even at open: an embedded store is read "
        "from a private copy in TMPDIR (so it may sit on a read-only volume), a store that needs a schema "
        "migration is refused, and an interrupted report is left for a writable server to finish.",
    )
    ui_runs: list[Path] = Field(
        default_factory=list,
        description="Harness run folders, or folders of run folders, whose learning curves the /ui inspector draws.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.k2 > self.k1:
            raise ValueError(f"k2 ({self.k2}) must not exceed k1 ({self.k1})")
        if not self.reward_min < self.reward_max:
            raise ValueError(f"reward_min ({self.reward_min}) must be below reward_max ({self.reward_max})")
        for name in ("q_init_success", "q_init_failure"):
            if not self.reward_min <= getattr(self, name) <= self.reward_max:
                raise ValueError(f"{name} must lie in [reward_min, reward_max]")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        config_file = os.environ.get("MEMRL_CONFIG")
        if config_file:
            sources += (YamlConfigSettingsSource(settings_cls, yaml_file=config_file),)
        return sources


def load_grants(settings: Settings) -> list[TokenGrant]:
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


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning pydantic's errors into one message that names each bad setting."""
    config_file = os.environ.get("MEMRL_CONFIG")
    if config_file and not Path(config_file).is_file():
        raise SettingsError(f"MEMRL_CONFIG: file not found: {config_file}")
    try:
        return Settings(**overrides)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'settings'}: {e['msg']}" for e in error.errors()
        )
        raise SettingsError(f"invalid settings: {problems}") from None
