"""The memory's loop run by an agent's own hooks, whichever agent: the client-neutral core that each client's module
(:mod:`memrl_mcp.clients.claude_code`, ...) adapts to its hook format.

``memrl-mcp hook EVENT`` reads the event's JSON on stdin and answers in the client's JSON on stdout. Each hook is a
step of the loop:

- ``prompt``: first reads the prompt as what it may say of the task before it (:mod:`~memrl_mcp.clients.followups`:
  "works now, thanks", "still failing", a follow-up of the same work, or a new task): the user's verdict becomes
  evidence of that task's recall. Feedback, and a prompt that asks nothing (thanks, a greeting, a remark), recall
  nothing and are held for nothing. Otherwise it recalls, and adds the recall's own text (what ``recall_experience``
  answers a model, found or not) and how to report it to the model's context; the recall before stays open when the
  prompt goes on with its work, and is closed with what its evidence says when the prompt is a new task.
- ``tool``: records what a tool call showed, while a recall is open: a run of a test runner, a build, a type checker
  or a linter, passed or failed, with its counts (:mod:`~memrl_mcp.clients.checks`), or an edit of the files. Kept in
  the session's record until the next stop; never the output.
- ``stop``: hands the open recalls' evidence to the server (``record_evidence``), then, when a recall this hook made
  still waits for its report, holds the stop once, with a reason that names ``report_outcome``, the recall id, what
  the evidence says and the reward to give. Never while a stop it caused is under way (``stop_hook_active``), never
  twice for one recall. A recall that found nothing is held too: its report is the only way a new kind of task
  enters the memory (docs/claude-code.md says why). The model may not report (the task goes on): the recall stays
  open, gathering evidence, until a new task, the session's end, or its report closes it.
- ``failed-stop``: a turn that died of an API error or a rate limit is no failure of the task: nothing is recorded.
- ``end``: closes the open recalls with what their evidence says, and forgets the session's record.

The evidence decides a recall's reward on the server (:mod:`memrl_mcp.memory.evidence`), whatever the model reports.

The hooks reach the memory the session's MCP server uses: the same store through the user's local server
(:mod:`memrl_mcp.local.attach`), and the same project namespace: they hand the server the project folder as the
very root URI Claude Code sends (:func:`~memrl_mcp.projects.folder_uri`), from which it derives the namespace as
for any session, and the plugin's MCP server names the same folder (its ``project_dir``). Their session is offered
the ``hooks`` profile (recall, record the evidence, report). Each hook runs as a fresh process per event, so it
imports the standard library and the attach path only.

A hook never fails or blocks a prompt: whatever goes wrong (no memory, a server that cannot start, bad input), it
says why on stderr, answers nothing and exits 0. Nor does it outlive the timeout the client gives it, whatever the
server does (stopped, overloaded, answering a byte at a time) or another hook of the session holding its record:
each step keeps to one deadline from its budget (:data:`BUDGET_SECONDS`, below the client's timeouts), which bounds
the wait for the record's lock and every connection, greeting, server start and call. A prompt that is not valid
Unicode (a lone surrogate, which JSON can escape) is cleaned before it is sent.

The recalls a session's hook made, with their evidence not yet handed in, are kept in a record per session and
project, in the store's private runtime folder (``hooks/<digest>.json``, 0600; the digest of the session id and the
project, so no input names a path), updated under a lock (an agent may run several tools at once), each read and
written through the folder's checked descriptor as the server's socket is
(:meth:`~memrl_mcp.local.place.Place.opened`). Whether a recall still waits for its report is asked of the server
(``memrl://recalls/{recall_id}``), never guessed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TextIO

from memrl_mcp.clients.checks import recognise
from memrl_mcp.clients.followups import is_chat, read_followup
from memrl_mcp.errors import MemrlError
from memrl_mcp.local.attach import Target, attach, target_of
from memrl_mcp.local.client import LocalClient, ToolCallError
from memrl_mcp.local.place import HOOKS, AttachError, Place, place_of
from memrl_mcp.projects import folder_uri
from memrl_mcp.rewards import RewardScale
from memrl_mcp.surface.quoting import quoted

TASK_CHARS = 4000  # the server's default max_task_chars: a longer prompt is recalled by its head
RECORD_RECALLS = 64  # the newest recalls a session's record keeps
RECORD_CHECKS = 64  # the newest checks a recall keeps until they are handed in (the server keeps as many)
RECORD_DAYS = 7.0  # a record untouched this long belongs to a session that ended without SessionEnd
SAID_CHARS = 200  # of the user's words kept with their verdict (the server's limit)
Step = Literal["prompt", "permit", "tool", "stop", "failed-stop", "end"]
RECALLED = "memrl-mcp, the memory's hook, recalled for this prompt (no need to call recall_experience)."
HOLD_OPENING = "The memory waits for a report:"  # how a held stop's reason begins (SessionRecord.echoes)
PROFILE = {"MEMRL_TOOL_PROFILE": "hooks"}  # what the hooks' session is offered: recall, record_evidence, report
BUDGET_SECONDS: Mapping[Step, float] = {"prompt": 25.0, "tool": 7.0, "stop": 12.0, "end": 7.0}
"""How long each step may take in all (the first prompt may wait for the server's cold start; a running server
answers in milliseconds): each at least 2 s below its hook's timeout in the plugin's hooks.json (30 s for the prompt,
15 s for the stop, 10 s for the others; tests/test_claude_code.py reads it), for the interpreter's start and the
answer. ``permit`` and ``failed-stop`` read nothing and ask no one."""
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str from JSON: half of a UTF-16 pair, no character at all
LOCK_POLL_SECONDS = 0.01


class HookInputError(MemrlError, ValueError):
    """The event's JSON is not what the client sends; the message names the field."""


@dataclass(frozen=True)
class ToolRun:
    """What one tool call showed, whichever client ran it: a shell command with its output and exit code (None
    where the client gives none), or an edit of the project's files."""

    command: str | None = None
    output: str = ""
    exit_code: int | None = None
    edited: bool = False


@dataclass(frozen=True)
class HookEvent:
    """What the loop needs of a hook event, whichever client sent it: the session, its project folder, the prompt
    and whether it is a task (typed by the user, not injected by the client), whether a stop the hook caused is
    under way, and what a tool call showed."""

    session_id: str
    project: Path
    prompt: str = ""
    is_task: bool = True
    stop_hook_active: bool = False
    tool: ToolRun | None = None

    @classmethod
    def checked(
        cls,
        session_id: Any,
        folder: Any,
        prompt: Any = "",
        is_task: bool = True,
        stop_hook_active: bool = False,
        tool: ToolRun | None = None,
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
        return cls(session_id, Path(folder), prompt, is_task, stop_hook_active, tool)


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

    def permit(self) -> dict[str, Any]:
        """The answer that lets the model report without a permission prompt (its report writes to the memory
        only; without it, a headless session denies it silently and nothing learns)."""

    def memory_environ(self, environ: Mapping[str, str]) -> Mapping[str, str]:
        """Of the hook's environment ``environ``, what the agent gives the session's MCP server: the hooks read the
        memory's settings from it, so both reach the same local server with the same settings."""


@dataclass
class SessionRecall:
    """A recall the hook made in a session: whether the stop hook has settled it (held the stop for it, or found it
    reported: it is never held twice), whether its task goes on (``open``: it gathers evidence), and the checks not
    yet handed to the server."""

    recall_id: str
    settled: bool = False
    open: bool = True
    checks: list[dict[str, Any]] = field(default_factory=list)


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
    @contextlib.contextmanager
    def held(cls, target: Target, event: HookEvent, deadline: float) -> Iterator[SessionRecord]:
        """The session's record, read and kept under its lock until the block ends, then saved; the lock is waited
        for until ``deadline`` (``time.monotonic()``), then :class:`AttachError`."""
        key = hashlib.sha256(f"{event.session_id}\0{folder_uri(event.project)}".encode()).hexdigest()[:32]
        record = cls(place_of(target.data_dir, target.runtime_dir), f"{key}.json")
        with record.place.opened(HOOKS) as folder:
            fd = folder.open(f"{key}.lock", os.O_RDWR | os.O_CREAT)
        try:
            _lock(fd, deadline)
            record._load()
            yield record
            record._save()
        finally:
            os.close(fd)  # closing the only descriptor of the file drops its lock

    def _load(self) -> None:
        try:
            with self.place.opened(HOOKS) as folder, open(folder.open(self.name, os.O_RDONLY)) as stream:
                saved = json.load(stream)
            self.recalls = [SessionRecall(**recall) for recall in saved["recalls"]]
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, KeyError) as error:  # a damaged record: start a new one
            print(f"memrl-mcp hook: {self.path} was unreadable ({error}), started anew", file=sys.stderr)

    def _save(self) -> None:
        """Replace the record in one step (a reader sees the old or the new one), 0600 like its folder."""
        with self.place.opened(HOOKS) as folder:
            if not self.recalls:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.name, dir_fd=folder.fd)
                return
            text = json.dumps({"recalls": [asdict(recall) for recall in self.recalls]})
            temporary = f".record.{secrets.token_hex(8)}"
            with os.fdopen(folder.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w") as stream:
                stream.write(text)
            os.replace(temporary, self.name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)

    def add(self, recall_id: str) -> None:
        self.recalls = [*self.recalls, SessionRecall(recall_id)][-RECORD_RECALLS:]

    def current(self) -> SessionRecall | None:
        """The newest recall whose task goes on."""
        return next((recall for recall in reversed(self.recalls) if recall.open), None)

    def waiting(self) -> list[SessionRecall]:
        return [recall for recall in self.recalls if not recall.settled]

    def echoes(self, text: str) -> bool:
        """Whether ``text`` is a hold of this session's hook handed back as a prompt (Gemini CLI, Copilot CLI and
        Codex send a held stop's reason to the model as the user's next prompt): no task, no feedback."""
        return HOLD_OPENING in text and any(f'recall_id "{recall.recall_id}"' in text for recall in self.recalls)

    def forget(self) -> None:
        """Empty this record, and remove the records of sessions that ended without saying so."""
        self.recalls = []
        oldest = time.time() - RECORD_DAYS * 86400
        with self.place.opened(HOOKS) as folder:
            for entry in os.scandir(folder.fd):
                with contextlib.suppress(FileNotFoundError):
                    if entry.name.endswith(".json") and entry.stat(follow_symlinks=False).st_mtime < oldest:
                        os.unlink(entry.name, dir_fd=folder.fd)


def _lock(fd: int, deadline: float) -> None:
    """Take the record's lock, waiting for another hook of the session until ``deadline``."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise AttachError("another hook of this session held its record past this hook's deadline") from None
            time.sleep(LOCK_POLL_SECONDS)


@contextlib.contextmanager
def memory(target: Target, event: HookEvent, start: bool, deadline: float) -> Iterator[LocalClient]:
    """An MCP session with the store's local server, in the event's project (its root), offered the hooks'
    profile, every part of it by ``deadline`` (``time.monotonic()``); the server is started first when none runs
    and ``start``."""
    hooks = dataclasses.replace(target, environ={**target.environ, **PROFILE})
    connection = attach(hooks, start=start, timeout=max(0.0, deadline - time.monotonic())).connection
    roots = [folder_uri(event.project)]
    with LocalClient(connection, roots=roots, name="memrl-mcp-hook", deadline=deadline) as client:
        yield client


def prompt(target: Target, event: HookEvent, deadline: float) -> str | None:
    """Read the prompt as what it says of the task before it, then recall for a new task (module docstring); the
    memories found and how to report them, as context for the model."""
    if not event.is_task or not event.prompt.strip():
        return None
    said, chat = read_followup(event.prompt), is_chat(event.prompt)
    with SessionRecord.held(target, event, deadline) as record:
        if record.echoes(event.prompt):
            return None
        before = record.current()
        if before is not None and said.verdict is not None:
            user = {"kind": "user", "passed": said.verdict, "said": " ".join(event.prompt.split())[:SAID_CHARS]}
            before.checks = [*before.checks, user][-RECORD_CHECKS:]
        if said.verdict is not None or chat:  # feedback on the task before, or no task: nothing to recall
            if before is not None:
                with memory(target, event, True, deadline) as client:
                    hand_in(client, before, close=False)
            return None
        with memory(target, event, True, deadline) as client:
            if before is not None and not said.continues:
                before.open = False  # a new task: the one before is over, and its evidence says how it went
                hand_in(client, before, close=True)
            found = client.call("recall_experience", {"task": event.prompt[:TASK_CHARS]})
        recall_id = str(found.structured["recall_id"])
        record.add(recall_id)
    return f"{RECALLED}\n{found.text}\n{reporting(recall_id)}"  # found or not: the model need not recall again


def hand_in(client: LocalClient, recall: SessionRecall, close: bool) -> None:
    """Give the server the checks of ``recall`` recorded since the last time (``close``: its task is over), and
    forget them here; a recall the server no longer takes evidence for (reported long ago, expired) is let go."""
    if not recall.checks and not close:
        return
    try:
        client.call("record_evidence", {"recall_id": recall.recall_id, "checks": recall.checks, "close": close})
    except ToolCallError as error:
        print(f"memrl-mcp hook: the evidence of recall {recall.recall_id} was not taken ({error})", file=sys.stderr)
    recall.checks = []


def reporting(recall_id: str) -> str:
    """The context's last line: how to report the recall (what no memory can write: each is one quoted line)."""
    return (
        f'When the task is over, call report_outcome once with recall_id "{recall_id}": a reward for what happened '
        "(the tests, the build, the user's words), never for what a memory says, and an experience."
    )


def tool(target: Target, event: HookEvent, deadline: float) -> None:
    """Record what a tool call showed for the open recall (module docstring): no server is asked."""
    run = event.tool
    if run is None:
        return
    check: Mapping[str, Any] | None = {"kind": "edit"} if run.edited else None
    if check is None and run.command is not None:
        check = recognise(run.command, run.output, run.exit_code, target.check_commands)
    if check is None:
        return
    with SessionRecord.held(target, event, deadline) as record:
        current = record.current()
        if current is not None:
            current.checks = [*current.checks, dict(check)][-RECORD_CHECKS:]


def hold(target: Target, event: HookEvent, deadline: float) -> str | None:
    """Hand in the open recalls' evidence; the reason to hold the stop once, when a recall of this session still
    waits for its report."""
    with SessionRecord.held(target, event, deadline) as record:
        opened = [recall for recall in record.recalls if recall.open and recall.checks]
        waiting = [] if event.stop_hook_active else record.waiting()
        if not opened and not waiting:
            return None
        with memory(target, event, False, deadline) as client:
            for recall in opened:
                hand_in(client, recall, close=False)
            states = [_state(client, recall.recall_id) for recall in waiting]
            pending = [state for state in states if state["status"] == "pending"]
            scale = json.loads(client.read_resource("memrl://settings")) if pending else {}
        for recall in waiting:
            recall.settled = True
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


def hold_reason(pending: Sequence[Mapping[str, Any]], scale: RewardScale) -> str:
    """What the model reads when its stop is held: which recall to report, what its evidence says, with what, and
    when not to."""
    tasks = "; ".join(
        f'recall_id "{state["recall_id"]}" (task: {quoted(_head(state["task"]))}{_evidence(state)})'
        for state in pending
    )
    return (
        f"{HOLD_OPENING} {tasks}. For each task that is over, call report_outcome once with its "
        f"recall_id, followed (the numbers of the recalled memories you followed), a reward ({scale}; what the "
        "evidence says decides it; unsure: leave it out), and an experience: on success the 3-5 steps that worked, "
        "on failure what went wrong and what to avoid. If this turn was not a task or the task goes on, stop without "
        "reporting."
    )


def _evidence(state: Mapping[str, Any]) -> str:
    """What the recall's evidence says of its task, in words (nothing when it says nothing clear)."""
    says, source = state.get("evidence_says"), state.get("evidence_source")
    if says is None:
        return ""
    who = "the user" if source == "user" else f"its {source} run"
    return f"; {who} said it {'succeeded' if says == 'success' else 'failed'}"


def _head(task: str, chars: int = 120) -> str:
    line = " ".join(task.split())
    return line if len(line) <= chars else line[: chars - 3] + "..."


def end(target: Target, event: HookEvent, deadline: float) -> None:
    """Close the open recalls with their evidence, and forget the session's record."""
    with SessionRecord.held(target, event, deadline) as record:
        opened = [recall for recall in record.recalls if recall.open]
        if opened:
            with memory(target, event, False, deadline) as client:
                for recall in opened:
                    hand_in(client, recall, close=True)
        record.forget()


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
    deadline = time.monotonic() + BUDGET_SECONDS.get(client.steps.get(hook, "permit"), 0.0)
    try:
        event = client.event(read_event(sys.stdin), os.environ)
        target = target_of(data_dir, config, client.memory_environ(os.environ))
        if target is None:
            raise AttachError("these settings run memrl-mcp in a process of its own (attach: false, read_only, "
                              "qdrant_url): the hooks reach the memory through the local server only")  # fmt: skip
        if hook not in client.steps:
            raise HookInputError(f"no hook {hook!r} here: one of {', '.join(client.steps)}")
        step = client.steps[hook]
        answer = None
        if step == "prompt":
            text = prompt(target, event, deadline)
            answer = None if text is None else client.context(text)
        elif step == "permit":
            answer = client.permit()
        elif step == "tool":
            tool(target, event, deadline)
        elif step == "stop":
            reason = hold(target, event, deadline)
            answer = None if reason is None else client.hold(reason)
        elif step == "end":
            end(target, event, deadline)
    except Exception as error:  # whatever fails, the prompt and the stop go on (module docstring)
        print(f"memrl-mcp hook {hook}: the memory is unavailable, nothing done ({error})", file=sys.stderr)
        return 0
    if answer is not None:
        sys.stdout.write(json.dumps(answer))
    return 0
