"""The sandbox protocol: a throwaway Linux system that runs shell scripts an LLM wrote.

Backends: :mod:`memrl_harness.backends.bwrap` (bubblewrap over a Debian root, the default) and
:mod:`memrl_harness.backends.docker` (a container of a locally built image).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Self


class SandboxError(RuntimeError):
    """The sandbox could not start, or it died under the agent."""


@dataclass(frozen=True)
class CommandResult:
    """One command's exit status (negative: killed by that signal), output and whether it timed out."""

    exit_code: int
    output: str
    timed_out: bool = False
    seconds: float = 0.0


class Sandbox(Protocol):
    """One episode's system. Every script of an episode runs in the same system (files, users and background
    jobs persist between them); nothing of it survives :meth:`close`."""

    def run(self, script: str, timeout: float | None = None) -> CommandResult:
        """Run ``script`` as the agent (``bash -c``), with the sandbox's own timeout unless one is given."""
        ...

    def check(self, script: str, timeout: float | None = None) -> CommandResult:
        """Run a checker's ``script`` (a task's evaluation) with a shell and tools the agent cannot have
        replaced, in the agent's system."""
        ...

    def close(self) -> None:
        """Kill everything in the sandbox and remove it (idempotent)."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...
