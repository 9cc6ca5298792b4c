"""A run's folder: its settings, one JSON line per finished episode, what each episode saw and did, and the
summaries.

``episodes.jsonl`` is appended (and flushed to disk) as each episode finishes, so a killed run
loses at most the episodes in flight and resumes from the rest. ``trajectories.jsonl.gz`` keeps, per
episode, the trajectory (bounded), the memories it was given and what it stored, so that a surprising
number can be traced to the episodes behind it. A transfer run keeps its evaluation on the held-out tasks
in the sub-folder ``transfer/``, laid out the same way.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from memrl_harness.discipline import DEFAULT_LAPSE_RATE, Discipline, RecallBy, ReportBy
from memrl_harness.judgement import Evidence, Judgement

Mode = Literal["none", "rag", "memrl", "memp", "reflexion", "rememberer", "both"]
MODES: tuple[Mode, ...] = ("none", "rag", "memrl", "memp", "reflexion", "rememberer", "both")
MEMORY_MODES: tuple[Mode, ...] = ("rag", "memrl", "memp", "rememberer", "both")  # the modes with a memory server
STEP_MODES: tuple[Mode, ...] = ("rememberer", "both")  # step memory (multi-step benchmarks only)
EPISODE_Q_MODES: tuple[Mode, ...] = ("memrl", "both")  # episode memory recalled with Q, its outcome reported
Q_VALUES_FILE = "q_values.json"  # memory id -> final Q of every injected memory (memrl runs)
MEMORY_EXPORT_FILE = "memory.jsonl"  # the final memory, as `memrl-mcp export` writes it
SIMILARITY_FILE = "task_similarity.json"  # the benchmark's intra-dataset query similarity
TRANSFER_DIR = "transfer"  # the evaluation phase of a transfer run
TRAJECTORY_CHARS = 20_000  # per attempt: a trajectory file stays in the tens of MB for thousands of episodes
DEFAULT_TRIALS = 3  # reflexion's attempts per task, as in the Reflexion paper's ALFWorld/HotpotQA runs


class TransferConfig(BaseModel):
    """The transfer setting: memory built on one task split, then frozen and used on another.

    The evaluation's benchmark is the run's with ``eval_options`` laid over its options (e.g. ALFWorld
    ``split=valid_seen`` after ``split=valid_train``). ``held_out`` splits one task list instead,
    deterministically by a hash of the task id (``runner.split_tasks``): training on the rest, evaluation
    on the held-out share (for benchmarks without shipped splits, such as LLB's).
    """

    eval_options: dict[str, Any] = Field(default_factory=dict)
    held_out: float | None = Field(None, gt=0.0, lt=1.0, description="Share of the tasks held out, by id hash.")

    @model_validator(mode="after")
    def _some_split(self) -> TransferConfig:
        if not self.eval_options and self.held_out is None:
            raise ValueError("transfer needs eval_options or held_out (else it evaluates on the training tasks)")
        return self


class RunConfig(BaseModel):
    """What a run is: enough to resume it, and to tell runs apart in a report."""

    benchmark: str
    mode: Mode
    epochs: int = Field(ge=1)
    tasks: int | None = Field(None, ge=1, description="First K tasks of the benchmark; None: all.")
    seed: int = 0
    workers: int = Field(1, ge=1)
    memory_config: str | None = Field(
        None, description="The run's settings file: memrl-mcp's settings, and the harness's llm: group."
    )
    memory_url: str | None = Field(None, description="A running memrl-mcp over HTTP instead of a fresh one.")
    memory_settings: dict[str, Any] | None = Field(
        None, description="The memory server's effective constants (its memrl://settings), read at the run's start."
    )
    model: str | None = None
    benchmark_options: dict[str, Any] = Field(default_factory=dict)
    trials: int | None = Field(None, ge=1, le=10, description="reflexion: attempts per task.")
    transfer: TransferConfig | None = None
    user_rewards: float | None = Field(
        None,
        ge=0.0,
        le=0.5,
        description="The rewards come from a simulated user: reports leave them out, memrl-mcp asks its client (MCP "
        "elicitation), and the harness answers as a user who is wrong with this probability. None: the harness "
        "passes the checker's reward.",
    )
    client_model: bool = Field(
        False,
        description="The experiences come from the client's model: reports hand over the trajectory, memrl-mcp asks "
        "its client for the experience (MCP sampling), and the harness's LLM writes it.",
    )
    discipline: Discipline = Field(
        "disciplined",
        description="How the agent runs the loop (memrl_harness/discipline.py): every recall and report; forgetful, "
        "forgetting one of them in a share of its tasks; hooked, the same forgetful agent with the plugin's hooks.",
    )
    lapse_rate: float | None = Field(
        None, ge=0.0, le=1.0, description=f"forgetful, hooked: share of the tasks with a lapse ({DEFAULT_LAPSE_RATE})."
    )
    judgement: Judgement = Field(
        "honest",
        description="How the agent judges its own work, which its report's reward claims (memrl_harness/judgement.py): "
        "honest, noisy (wrong in 10% of its tasks), sycophantic (success in 90%, whatever happened).",
    )
    evidence: Evidence = Field(
        "none",
        description="Whether the checker's outcome reaches the memory beside the claim: none; hooks, as a test run in "
        "the agent's Claude Code session, through the plugin's real hooks (memrl_harness/plugin.py).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.trials is not None and self.mode != "reflexion":
            raise ValueError(f"trials: only reflexion retries, not mode {self.mode}")
        if self.discipline == "disciplined" and self.lapse_rate is not None:
            raise ValueError("lapse_rate: only a forgetful or hooked agent has lapses")
        if self.discipline != "disciplined":
            if self.mode != "memrl":
                raise ValueError(f"discipline {self.discipline}: mode memrl recalls and reports, not mode {self.mode}")
            if self.lapse_rate is None:
                self.lapse_rate = DEFAULT_LAPSE_RATE
        if self.transfer is not None and self.memory_url:
            raise ValueError("transfer: the evaluation runs its own read-only memrl-mcp; it cannot use memory_url")
        if (self.judgement != "honest" or self.evidence != "none") and self.mode != "memrl":
            raise ValueError(f"judgement, evidence: mode memrl reports a reward the agent claims, not mode {self.mode}")
        if self.judgement != "honest" and self.user_rewards is not None:
            raise ValueError("judgement: with user_rewards the simulated user gives the rewards, not the agent")
        if self.evidence == "hooks" and self.discipline != "disciplined":
            raise ValueError("evidence hooks: the agent reports when the plugin's stop hook holds it; no discipline")
        if self.uses_plugin and (self.user_rewards is not None or self.client_model):
            raise ValueError("the plugin's hooks: the agent reports its own reward and experience (no user_rewards, "
                             "no client_model)")  # fmt: skip
        if self.uses_plugin and (self.memory_url or self.transfer is not None):
            raise ValueError("the plugin's hooks: the run serves its own store through its local server (no "
                             "memory_url, no transfer)")  # fmt: skip
        return self

    @property
    def uses_plugin(self) -> bool:
        """Whether the agent works in Claude Code sessions with the plugin's real hooks (memrl_harness/plugin.py)."""
        return self.evidence == "hooks" or self.discipline == "hooked"

    @property
    def attempts(self) -> int:
        """Attempts per task: reflexion's trials, else one."""
        return (self.trials or DEFAULT_TRIALS) if self.mode == "reflexion" else 1

    @property
    def mode_label(self) -> str:
        """The mode in a few words, as a legend shows it."""
        label = f"{self.mode} ({self.attempts} trials)" if self.mode == "reflexion" else self.mode
        if self.user_rewards is not None:
            label += f", user rewards ({self.user_rewards:.0%} wrong)"
        if self.client_model:
            label += ", client-model experiences"
        if self.discipline != "disciplined":
            hooks = " with the hooks" if self.discipline == "hooked" else ""
            label += f", forgetful agent ({self.lapse_rate:.0%} lapses){hooks}"
        if self.judgement != "honest" or self.evidence != "none":
            label += f", {self.judgement} agent" + (", evidence from the hooks" if self.evidence == "hooks" else "")
        return f"{label}, transfer" if self.transfer else label

    @property
    def setting(self) -> str:
        """Everything the run is but its seed (and what the server reported): runs of equal setting are seeds of
        one experiment."""
        return self.model_copy(update={"seed": 0, "memory_settings": None}).model_dump_json()


class EpisodeRecord(BaseModel):
    """One finished episode, as the metrics read it."""

    epoch: int = Field(ge=1)
    position: int = Field(ge=0, description="Place of the task in this epoch's seeded order.")
    task_id: str
    success: bool = Field(description="The benchmark checker's verdict (what the success rates count).")
    checker_reward: float = Field(description="The benchmark checker's reward (not always what the memory learned).")
    learned_reward: float | None = Field(
        None,
        description="The reward the memory folded into the recalled memories' Q, as memrl-mcp decided it: the agent's "
        "claim, the simulated user's answer (user_rewards), or what the tests the hooks saw said; None: no Q update.",
    )
    reward_source: str | None = Field(
        None, description="What decided learned_reward (memrl-mcp's reward_source: agent, user, tests, build, ...)."
    )
    claimed_reward: float | None = Field(
        None, description="The reward the agent's report claimed, its judgement of its work (None: it gave none)."
    )
    steps: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float
    recall_id: str | None = None
    memory_ids: list[str] = Field(default_factory=list, description="Memories injected into the prompt.")
    user_said_success: bool | None = Field(
        None, description="user_rewards: whether the simulated user said it succeeded (None: no user was asked)."
    )
    stored_id: str | None = None
    task_type: str | None = Field(None, description="Benchmark-specific group for per-type results.")
    trials: int = Field(1, ge=1, description="Attempts made (reflexion stops at the first success).")
    advised_steps: int = Field(0, ge=0, description="Step-memory modes: decisions that were given some advice.")
    reported_steps: int = Field(0, ge=0, description="Step-memory modes: steps whose Q the trajectory report updated.")
    recall_by: RecallBy | None = Field(None, description="Who called recall_experience (None: no recall was logged).")
    report_by: ReportBy | None = Field(None, description="Who reported that recall (None: it was left unreported).")
    q_updates: int = Field(0, ge=0, description="Memories whose Q the episode's report moved.")


class GivenMemory(BaseModel):
    """A memory put into an episode's context, with the numbers recall chose it by (a reflection of an
    earlier reflexion attempt has id ``reflection-N`` and no recall numbers)."""

    id: str
    outcome: str
    q: float | None = None
    similarity: float | None = None
    score: float | None = None


class Attempt(BaseModel):
    """One attempt at a task; reflexion makes several, with the reflections of the failed ones in context."""

    memories: list[GivenMemory]
    trajectory: str = Field(description=f"Bounded: a longer one keeps its head and tail ({TRAJECTORY_CHARS} chars).")
    success: bool
    checker_reward: float
    steps: int
    reflection: str | None = Field(None, description="What the agent concluded from this failed attempt.")


class TrajectoryRecord(BaseModel):
    """What one episode saw and did, kept beside its ``EpisodeRecord``."""

    epoch: int
    task_id: str
    intent: str
    attempts: list[Attempt]
    experience: str | None = Field(None, description="The experience stored in memory (None: nothing stored).")
    stored_id: str | None = None
    checker_reward: float
    success: bool


def bound(text: str, limit: int | None = None) -> str:
    """``text`` cut to ``limit`` characters in the middle (the start says what was asked, the end how it ended)."""
    limit = TRAJECTORY_CHARS if limit is None else limit
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    head = (limit - len(marker)) // 2
    return text[:head] + marker + text[len(text) - (limit - len(marker) - head) :]


class RunDir:
    """The files of one run under ``path``, a folder only its user may enter (made 0700): its episodes and
    trajectories hold what the agent was asked and did, the memories recalled into its prompts among it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config_file = path / "run.json"
        self.episodes_file = path / "episodes.jsonl"
        self.summary_json = path / "summary.json"
        self.summary_csv = path / "summary.csv"
        self.memory_dir = path / "memory"
        self.server_log = path / "memory-server.log"  # stderr of the run's own memrl-mcp
        self.memory_settings = path / "memory-settings.yaml"  # its --config: the run file without its llm: group
        self.trajectories_file = path / "trajectories.jsonl.gz"
        self.memory_export = path / MEMORY_EXPORT_FILE
        self.similarity_file = path / SIMILARITY_FILE

    @property
    def transfer(self) -> RunDir:
        """The evaluation phase of a transfer run (its episodes, trajectories and summary)."""
        return RunDir(self.path / TRANSFER_DIR)

    def write_config(self, config: RunConfig) -> None:
        self.make()
        self.config_file.write_text(config.model_dump_json(indent=2) + "\n")

    def make(self) -> None:
        """The run's folder, made private if missing (its parents as the umask has them)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(mode=0o700, exist_ok=True)

    def read_config(self) -> RunConfig:
        return RunConfig.model_validate_json(self.config_file.read_text())

    def append(self, record: EpisodeRecord) -> None:
        with self.episodes_file.open("a") as out:
            out.write(record.model_dump_json() + "\n")
            out.flush()
            os.fsync(out.fileno())

    def append_trajectory(self, record: TrajectoryRecord) -> None:
        """One gzip member per episode, appended and synced: a kill tears at most the last one."""
        self.make()
        with self.trajectories_file.open("ab") as out:
            out.write(gzip.compress(record.model_dump_json().encode() + b"\n"))
            out.flush()
            os.fsync(out.fileno())

    def trajectories(self) -> list[TrajectoryRecord]:
        """Every kept trajectory in the order written (an episode run again after a kill appears twice; the last
        one is the one recorded); a torn last member is left out."""
        if not self.trajectories_file.exists():
            return []
        lines, _ = _gzip_members(self.trajectories_file.read_bytes())
        return [TrajectoryRecord.model_validate_json(line) for line in lines]

    def episodes(self) -> list[EpisodeRecord]:
        """Finished episodes, in the order they finished."""
        if not self.episodes_file.exists():
            return []
        return [EpisodeRecord.model_validate(json.loads(line)) for line in self.episodes_file.read_text().splitlines()]

    def drop_torn_tail(self) -> None:
        """Cut a last line or gzip member that a kill left half-written (that episode runs again on resume)."""
        if self.episodes_file.exists():
            data = self.episodes_file.read_bytes()
            _truncate(self.episodes_file, data, data.rfind(b"\n") + 1)
        if self.trajectories_file.exists():
            data = self.trajectories_file.read_bytes()
            _truncate(self.trajectories_file, data, _gzip_members(data)[1])


def _truncate(path: Path, data: bytes, keep: int) -> None:
    if keep < len(data):
        with path.open("r+b") as out:
            out.truncate(keep)


def _gzip_members(data: bytes) -> tuple[list[bytes], int]:
    """The contents of the whole gzip members at the start of ``data``, and the bytes they take."""
    contents, used = [], 0
    while used < len(data):
        member = zlib.decompressobj(wbits=31)  # one gzip member
        try:
            text = member.decompress(data[used:])
        except zlib.error:
            break
        if not member.eof:  # torn by a kill
            break
        contents.append(text)
        used = len(data) - len(member.unused_data)
    return contents, used
