"""A run's folder: its settings, one JSON line per finished episode, and the summaries.

``episodes.jsonl`` is appended (and flushed to disk) as each episode finishes, so a killed run
loses at most the episodes in flight and resumes from the rest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

Mode = Literal["none", "rag", "memrl"]
Q_VALUES_FILE = "q_values.json"  # memory id -> final Q of every injected memory (memrl runs)


class RunConfig(BaseModel):
    """What a run is: enough to resume it, and to tell runs apart in a report."""

    benchmark: str
    mode: Mode
    epochs: int = Field(ge=1)
    tasks: int | None = Field(None, ge=1, description="First K tasks of the benchmark; None: all.")
    seed: int = 0
    workers: int = Field(1, ge=1)
    memory_config: str | None = Field(None, description="memrl-mcp YAML settings file.")
    memory_url: str | None = Field(None, description="A running memrl-mcp over HTTP instead of a fresh one.")
    model: str | None = None
    benchmark_options: dict[str, Any] = Field(default_factory=dict)


class EpisodeRecord(BaseModel):
    """One finished episode, as the metrics read it."""

    epoch: int = Field(ge=1)
    position: int = Field(ge=0, description="Place of the task in this epoch's seeded order.")
    task_id: str
    success: bool
    reward: float
    steps: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float
    recall_id: str | None = None
    memory_ids: list[str] = Field(default_factory=list, description="Memories injected into the prompt.")
    stored_id: str | None = None
    task_type: str | None = Field(None, description="Benchmark-specific group for per-type results.")


class RunDir:
    """The files of one run under ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config_file = path / "run.json"
        self.episodes_file = path / "episodes.jsonl"
        self.summary_json = path / "summary.json"
        self.summary_csv = path / "summary.csv"
        self.memory_dir = path / "memory"
        self.server_log = path / "memory-server.log"  # stderr of the run's own memrl-mcp

    def write_config(self, config: RunConfig) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(config.model_dump_json(indent=2) + "\n")

    def read_config(self) -> RunConfig:
        return RunConfig.model_validate_json(self.config_file.read_text())

    def append(self, record: EpisodeRecord) -> None:
        with self.episodes_file.open("a") as out:
            out.write(record.model_dump_json() + "\n")
            out.flush()
            os.fsync(out.fileno())

    def episodes(self) -> list[EpisodeRecord]:
        """Finished episodes, in the order they finished."""
        if not self.episodes_file.exists():
            return []
        return [EpisodeRecord.model_validate(json.loads(line)) for line in self.episodes_file.read_text().splitlines()]

    def drop_torn_tail(self) -> None:
        """Cut a last line that a kill left half-written (that episode runs again on resume)."""
        if not self.episodes_file.exists():
            return
        data = self.episodes_file.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            with self.episodes_file.open("r+b") as out:
                out.truncate(keep)
