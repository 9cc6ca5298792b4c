"""The groups of settings that shape the memory: where it lives, how it embeds, recalls, learns and what it accepts.

Each part of the server takes its own group, never the whole configuration (:mod:`memrl_mcp.settings` says where
the values come from). The serving group lives beside this module, in :mod:`memrl_mcp.settings.serving`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from memrl_mcp.errors import MemrlError
from memrl_mcp.folders import default_data_dir
from memrl_mcp.rewards import RewardScale
from memrl_mcp.validation import MAX_K, NamespaceName
from memrl_mcp.variables import ENV_PREFIX

ALL_NAMESPACES = "*"
MIN_TOKEN_CHARS = 16
RENAMED = {"read_only": "tool_profile: read_only (MEMRL_TOOL_PROFILE=read_only)"}
"""Settings that were renamed: their old name is refused with the new one."""


class SettingsError(MemrlError, ValueError):
    """A setting has a bad value, or a name that is no setting; the message names it and where it came from."""


class Group(BaseModel):
    """A group of settings: closed (an unknown name is an error, not ignored) and read-only once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def unknown_name(name: str, known: Mapping[str, Any] | frozenset[str], kind: str, prefix: str = "") -> str:
    """``name: no such <kind>``, with the closest known name (or its new name, when it was renamed). Names are
    compared without ``prefix``, which all of them share: it alone would make any two look close."""
    stems = {candidate.removeprefix(prefix): candidate for candidate in known}
    close = difflib.get_close_matches(name.removeprefix(prefix), list(stems), n=1, cutoff=0.6)
    hint = renamed_hint(name) or (f"; did you mean {stems[close[0]]}?" if close else "")
    return f"{name}: no such {kind}{hint}"


def renamed_hint(name: str) -> str:
    """The hint for a setting that has a new name (``MEMRL_READ_ONLY``, ``read_only``)."""
    renamed = RENAMED.get(name.lower().removeprefix(ENV_PREFIX.lower()))
    return f"; it is now {renamed}" if renamed else ""


class StorageSettings(Group):
    """Where the memories live: an embedded Qdrant engine under ``data_dir``, or a Qdrant server."""

    data_dir: Path = Field(
        default_factory=default_data_dir,
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
    embedding_threads: int | None = Field(
        None,
        ge=1,
        le=64,
        description="minilm: onnxruntime threads per model run; default 2 where 2 CPUs are usable, else 1 (the "
        "vectors are the same for any number).",
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
    """MemRL's two phases (docs/algorithm.md): Phase A by similarity, Phase B by similarity and learned utility."""

    k1: int = Field(5, ge=1, le=MAX_K, description="Phase A: candidates recalled by similarity.")
    k2: int = Field(3, ge=1, le=MAX_K, description="Phase B: memories returned after re-ranking (<= k1).")
    q_weight: float = Field(0.5, ge=0.0, le=1.0, description="lambda: weight of utility vs similarity (0 = RAG).")
    sim_normalization: Literal["corpus", "pool"] = Field(
        "corpus", description="z(sim) with the embedder's corpus mean/std (paper's code) or the pool's own."
    )
    epsilon: float = Field(0.0, ge=0.0, le=1.0, description="Probability of picking k2 candidates uniformly.")
    seed: int | None = Field(None, description="Seed of the exploration draws (None: not reproducible).")
    fade_after_days: float | None = Field(
        None,
        gt=0,
        description="A memory unused for longer (not stored, recalled, rewarded or edited) is ranked lower in Phase B: "
        "one standard deviation of score per this many days more, up to three (docs/algorithm.md). None: no fading. "
        "Off by default: whether old lessons still hold depends on how fast a project's code changes; 90 suits one "
        "that changes every week.",
    )

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

    max_task_variants: int = Field(
        3,
        ge=1,
        le=100,
        description="Experiences of one outcome a task keeps (its near-twin tasks, similarity >= merge_threshold): a "
        "different procedure is a memory of its own with its own utility, and beyond this many the new one replaces "
        "the variant of lowest utility. An identical experience merges into its twin instead.",
    )
    model_reward_weight: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="How far a reward decided by the model's word alone moves utility, as a share of alpha (a reward "
        "the evidence or the user decided moves it by alpha): models over-report success. 0: the model's word alone "
        "teaches nothing.",
    )
    correction_window_seconds: float = Field(
        900.0,
        ge=0,
        le=7 * 86_400,
        description="How long after its report a recall may still take evidence (the user's next words, a later test "
        "run) that corrects its reward: the recalled memories' utility is moved as if the corrected reward had been "
        "reported.",
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

    @property
    def reward_scale(self) -> RewardScale:
        """The rewards of a success, a failure and no clear outcome, as the model is told them."""
        return RewardScale(self.reward_min, self.reward_max)

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
        "names a namespace, use its project's, derived from the first root: the git repository of that folder, shared "
        "by its subfolders and worktrees, else the folder (<top folder name>-<hash of its URI>), so one server shared "
        "by several projects keeps their memories apart.",
    )
    other_namespaces: list[NamespaceName | Literal["*"]] = Field(
        default_factory=list,
        description="Namespaces a session of a project may use besides its project's own (a session without a token "
        'whose namespace comes from its roots or project_dir), e.g. one a team shares; ["*"]: every namespace. A '
        "recall runs for every prompt: a namespace another project could reach would carry that project's files into "
        "this one's prompts (env: a JSON list).",
    )
    project_dir: Path | None = Field(
        None,
        description="The folder of this session's project, for a client that sends no MCP roots (one of the "
        "2026-07-28 protocol cannot be asked for them; the MCP Inspector): with namespace_from_roots, such a session's "
        "namespace is the one this folder's root would give. Claude Code names it to every MCP server it starts "
        "(CLAUDE_PROJECT_DIR, read as this setting); memrl-mcp --project DIR sets it.",
    )
