"""The memory's loop run by an agent's own hooks, whichever agent: the client-neutral core that each client's module
(:mod:`memrl_mcp.clients.claude_code`, ...) adapts to its hook format.

``memrl-mcp hook EVENT`` reads the event's JSON on stdin and answers in the client's JSON on stdout. Each hook is a
step of the loop:

- ``prompt``: recalls for the prompt and, when memories of similar tasks were found, adds the recall's own text (what
  ``recall_experience`` answers a model) and one line on how to report it to the model's context.
- ``stop``: when a recall this hook made in this session still waits for its report, holds the stop once, with a
  reason that names ``report_outcome``, the recall id and the reward to give. Never while a stop it caused is under
  way (``stop_hook_active``), never twice for one recall. A recall that found nothing is held too: its report is
  the only way a new kind of task enters the memory (docs/claude-code.md says why).
- ``end``: forgets the session's record.

The hooks reach the memory the session's MCP server uses: the same store through the user's local server
(:mod:`memrl_mcp.local.attach`), and the same project namespace: they hand the server the project folder as the
very root URI Claude Code sends (:func:`~memrl_mcp.projects.folder_uri`), from which it derives the namespace as
for any session, and the plugin's MCP server names the same folder (its ``project_dir``). Each hook runs as a fresh
process per event, so it imports the standard library and the attach path only.

A hook never fails or blocks a prompt: whatever goes wrong (no memory, a server that cannot start, bad input), it
says why on stderr, answers nothing and exits 0. Nor does it outlive the timeout the client gives it, whatever the
server does (stopped, overloaded, answering a byte at a time): each step that reaches the server keeps to one
deadline from its budget (:data:`BUDGET_SECONDS`, below the client's timeouts), which bounds every connection,
greeting, server start and call. A prompt that is not valid Unicode (a lone surrogate, which JSON can escape) is
cleaned before it is sent.

The recalls a session's hook made are kept in a record per session and project, in the store's private runtime
folder (``hooks/<digest>.json``, 0600; the digest of the session id and the project, so no input names a path),
each read and written through the folder's checked descriptor as the server's socket is
(:meth:`~memrl_mcp.local.place.Place.opened`).
Whether a recall still waits for its report is asked of the server (``memrl://recalls/{recall_id}``), never
guessed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TextIO

from memrl_mcp.errors import MemrlError
from memrl_mcp.local.attach import Target, attach, target_of
from memrl_mcp.local.client import LocalClient, ToolCallError
from memrl_mcp.local.place import HOOKS, AttachError, Place, place_of
from memrl_mcp.projects import folder_uri
from memrl_mcp.rewards import RewardScale

TASK_CHARS = 4000  # the server's default max_task_chars: a longer prompt is recalled by its head
RECORD_RECALLS = 64  # the newest recalls a session's record keeps
RECORD_DAYS = 7.0  # a record untouched this long belongs to a session that ended without SessionEnd
Step = Literal["prompt", "stop", "end"]
BUDGET_SECONDS: Mapping[Step, float] = {"prompt": 25.0, "stop": 12.0}
"""How long each step that reaches the server may take in all (the first prompt may wait for the server's cold
start; a running server answers in milliseconds): each at least 2 s below its hook's timeout in Claude Code's
hooks.json (30 and 15 s; tests/test_claude_code.py reads it), for the interpreter's start and the answer. ``end``
reaches no server: it forgets the session's record only."""
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str from JSON: half of a UTF-16 pair, no character at all


class HookInputError(MemrlError, ValueError):
    """The event's JSON is not what the client sends; the message names the field."""


@dataclass(frozen=True)
class HookEvent:
    """What the loop needs of a hook event, whichever client sent it: the session, its project folder, the prompt
    and whether it is a task (typed by the user, not injected by the client), and whether a stop the hook caused is
    under way."""

    session_id: str
    project: Path
    prompt: str = ""
    is_task: bool = True
    stop_hook_active: bool = False

    @classmethod
    def checked(
        cls, session_id: Any, folder: Any, prompt: Any = "", is_task: bool = True, stop_hook_active: bool = False
    ) -> HookEvent:
        """The event of these fields as the client sent them; :class:`HookInputError` naming the first that is not
        what the loop needs (``folder`` is named ``cwd``: where every client's event carries it)."""
        if not isinstance(session_id, str) or not session_id:
            raise HookInputError("session_id: a non-empty string is required")
        if not isinstance(folder, str) or not os.path.isabs(folder):
            raise HookInputError("cwd: an absolute folder is required (or the client's project variable)")
        if not isinstance(prompt, str):
            raise HookInputError("prompt: a string is required")
        prompt = LONE_SURROGATE.sub("\ufffd", prompt)  # no text to send as UTF-8: the server would refuse it
        return cls(session_id, Path(folder), prompt, is_task, stop_hook_active)


class Client(Protocol):
    """One agent's hook format: which of its hooks is which step of the loop, its event as a :class:`HookEvent`,
    and the loop's answers in the JSON it reads."""

    @property
    def steps(self) -> Mapping[str, Step]:
        """Its hooks' names, as ``memrl-mcp hook`` takes them, and the step each is."""

    def event(self, data: Mapping[str, Any], environ: Mapping[str, str]) -> HookEvent:
        """The event of its JSON ``data``, in the hook's environment."""

    def context(self, text: str) -> dict[str, Any]:
        """The answer that adds ``text`` to the model's context for this prompt."""

    def hold(self, reason: str) -> dict[str, Any]:
        """The answer that holds the stop, with the ``reason`` the model reads."""


@dataclass
class SessionRecall:
    """A recall the hook made in a session, and whether the stop hook has settled it (held the stop for it, or
    found it reported): it is never held twice."""

    recall_id: str
    settled: bool = False


@dataclass
class SessionRecord:
    """The recalls the hooks made in one session of one project (module docstring)."""

    place: Place
    name: str
    recalls: list[SessionRecall] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.place.folder / HOOKS / self.name

    @classmethod
    def of(cls, target: Target, event: HookEvent) -> SessionRecord:
        key = hashlib.sha256(f"{event.session_id}\0{folder_uri(event.project)}".encode()).hexdigest()[:32]
        record = cls(place_of(target.data_dir, target.runtime_dir), f"{key}.json")
        try:
            with record.place.opened(HOOKS) as folder, open(folder.open(record.name, os.O_RDONLY)) as stream:
                saved = json.load(stream)
            record.recalls = [SessionRecall(**recall) for recall in saved["recalls"]]
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, KeyError) as error:  # a damaged record: start a new one
            print(f"memrl-mcp hook: {record.path} was unreadable ({error}), started anew", file=sys.stderr)
        return record

    def add(self, recall_id: str) -> None:
        self.recalls = [*self.recalls, SessionRecall(recall_id)][-RECORD_RECALLS:]
        self.save()

    def waiting(self) -> list[SessionRecall]:
        return [recall for recall in self.recalls if not recall.settled]

    def save(self) -> None:
        """Replace the record in one step (a reader sees the old or the new one), 0600 like its folder."""
        text = json.dumps({"recalls": [asdict(recall) for recall in self.recalls]})
        with self.place.opened(HOOKS) as folder:
            temporary = f".record.{secrets.token_hex(8)}"
            with os.fdopen(folder.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w") as stream:
                stream.write(text)
            os.replace(temporary, self.name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)

    def forget(self) -> None:
        """Remove this record, and the records of sessions that ended without saying so."""
        oldest = time.time() - RECORD_DAYS * 86400
        with self.place.opened(HOOKS) as folder:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.name, dir_fd=folder.fd)
            for entry in os.scandir(folder.fd):
                with contextlib.suppress(FileNotFoundError):
                    if entry.name.endswith(".json") and entry.stat(follow_symlinks=False).st_mtime < oldest:
                        os.unlink(entry.name, dir_fd=folder.fd)


@contextlib.contextmanager
def memory(target: Target, event: HookEvent, start: bool, deadline: float) -> Iterator[LocalClient]:
    """An MCP session with the store's local server, in the event's project (its root), every part of it by
    ``deadline`` (``time.monotonic()``); the server is started first when none runs and ``start``."""
    connection = attach(target, start=start, timeout=max(0.0, deadline - time.monotonic())).connection
    with LocalClient(connection, roots=[folder_uri(event.project)], name="memrl-mcp-hook", deadline=deadline) as client:
        yield client


def recall(target: Target, event: HookEvent, deadline: float) -> str | None:
    """Recall for the prompt; the memories found and how to report them, as context for the model."""
    if not event.is_task or not event.prompt.strip():
        return None
    with memory(target, event, True, deadline) as client:
        found = client.call("recall_experience", {"task": event.prompt[:TASK_CHARS]})
    recall_id = str(found.structured["recall_id"])
    SessionRecord.of(target, event).add(recall_id)
    if not found.structured.get("memories"):
        return None
    how = (
        f"(Recalled for this prompt by the memory's hook: no need to call recall_experience. When the task is over, "
        f'call report_outcome once with recall_id "{recall_id}", a reward and an experience.)'
    )
    return f"{found.text}\n{how}"


def hold(target: Target, event: HookEvent, deadline: float) -> str | None:
    """The reason to hold the stop once, when a recall of this session still waits for its report."""
    if event.stop_hook_active:
        return None
    record = SessionRecord.of(target, event)
    waiting = record.waiting()
    if not waiting:
        return None
    with memory(target, event, False, deadline) as client:
        pending = [state for recall in waiting if (state := _state(client, recall.recall_id))["status"] == "pending"]
        scale = json.loads(client.read_resource("memrl://settings")) if pending else {}
    for recall in waiting:
        recall.settled = True
    record.save()
    if not pending:
        return None
    return hold_reason(pending, RewardScale(scale["reward_min"], scale["reward_max"]))


def _state(client: LocalClient, recall_id: str) -> dict[str, Any]:
    """The recall's state (``memrl://recalls/{id}``); an unknown one (expired, forgotten) as settled."""
    try:
        state: dict[str, Any] = json.loads(client.read_resource(f"memrl://recalls/{recall_id}"))
    except ToolCallError:
        return {"recall_id": recall_id, "status": "unknown"}
    return state


def hold_reason(pending: list[dict[str, Any]], scale: RewardScale) -> str:
    """What the model reads when its stop is held: which recall to report, with what, and when not to."""
    tasks = "; ".join(f'recall_id "{state["recall_id"]}" (task: {_head(state["task"])})' for state in pending)
    return (
        f"The memory waits for a report: {tasks}. For each task that is over, call report_outcome once with its "
        f"recall_id, a reward ({scale}; unsure: leave the reward out and the user is asked), and an experience: on "
        "success the 3-5 steps that worked, on failure what went wrong and what to avoid. If this turn was not a "
        "task (a question answered, a chat) or the task goes on, stop without reporting."
    )


def _head(task: str, chars: int = 120) -> str:
    line = " ".join(task.split())
    return line if len(line) <= chars else line[: chars - 3] + "..."


def end(target: Target, event: HookEvent) -> None:
    SessionRecord.of(target, event).forget()


def read_event(stream: TextIO) -> dict[str, Any]:
    """The event's JSON object on ``stream``."""
    try:
        data = json.load(stream)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HookInputError(f"the event is not JSON ({error})") from None
    if not isinstance(data, dict):
        raise HookInputError("the event is not a JSON object")
    return data


def run(client: Client, hook: str, data_dir: str | None = None, config: str | None = None) -> int:
    """``memrl-mcp hook HOOK`` for ``client``: the event on stdin, the answer (if any) on stdout; always 0 (module
    docstring)."""
    step = client.steps[hook]
    deadline = time.monotonic() + BUDGET_SECONDS.get(step, 0.0)
    try:
        event = client.event(read_event(sys.stdin), os.environ)
        target = target_of(data_dir, config)
        if target is None:
            raise AttachError("these settings run memrl-mcp in a process of its own (attach: false, read_only, "
                              "qdrant_url): the hooks reach the memory through the local server only")  # fmt: skip
        answer = None
        if step == "prompt":
            text = recall(target, event, deadline)
            answer = None if text is None else client.context(text)
        elif step == "stop":
            reason = hold(target, event, deadline)
            answer = None if reason is None else client.hold(reason)
        else:
            end(target, event)
    except Exception as error:  # whatever fails, the prompt and the stop go on (module docstring)
        print(f"memrl-mcp hook {hook}: the memory is unavailable, nothing done ({error})", file=sys.stderr)
        return 0
    if answer is not None:
        sys.stdout.write(json.dumps(answer))
    return 0
