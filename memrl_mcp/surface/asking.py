"""Asking the client while a tool call runs: its user (MCP elicitation, ``elicitation/create``) and its own model
(MCP sampling, ``sampling/createMessage``), over whichever protocol the connection speaks.

- **Handshake protocols** (2025-11-25 and before: what stdio, SSE and streamable-HTTP clients speak today). The
  server sends the request while the call is open and waits for the answer, at most ``timeout`` seconds: a client
  that never answers must not hold the call. Over stdio and SSE the request goes on the call's own stream; this
  server's streamable HTTP answers each call with plain JSON, so there it goes on the connection's standalone stream
  (the client's GET), if the client opened one.
- **2026-07-28** (multi round-trip requests): no request may be sent mid-call. The call answers an
  ``InputRequiredResult`` naming what it needs; the client asks its user or its model, then calls again with the
  same arguments, the answers and the ``request_state`` it was given. The state records what was asked (a digest of
  each request) and the answers taken in earlier rounds; the SDK seals it (AES-GCM under a key of this process,
  bound to the tool, its arguments and the caller's token), so a client can neither forge it nor carry it to
  another call. An answer counts only for the very request it answers: one to a request never made, or made
  otherwise, is dropped and the request made again. The tool body runs from the start at every round, so what it
  asks must follow from its arguments and the stored state alone.

Whatever the protocol, an answer is what the client says it is: the server validates its shape and its size, never
its truth.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

import anyio
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import CreateMessageRequest, ElicitRequest, InputRequiredResult
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, Field, ValidationError

from memrl_mcp.errors import MemoryRequestError

MULTI_ROUND_VERSION = "2026-07-28"  # the first protocol whose calls ask through InputRequiredResult
STATE_VERSION = 1
Capability = Literal["elicitation", "sampling"]
Answer = TypeVar("Answer", bound=BaseModel)
SESSION: ContextVar[str | None] = ContextVar("memrl_session", default=None)
"""The session a call comes from, where one process serves several sessions without tokens: the local server sets it
in each session's thread, whose event loop and worker threads inherit it. What a token is bounded to (its open
questions, its samplings a minute), each such session is bounded to apart (:class:`Holder`): all of them are one
tokenless caller, and counted together one session's questions refused every other's reports."""


class InputRequiredError(Exception):
    """A call on a 2026-07-28 connection needs what ``result`` asks for: the call answers it, and is made again."""

    def __init__(self, result: InputRequiredResult) -> None:
        super().__init__("input required")
        self.result = result


class NoAnswerError(MemoryRequestError):
    """The client did not answer in time, answered with an error, or could not be asked on this connection."""


class Round(BaseModel):
    """What earlier rounds of a 2026-07-28 call asked (digests by key) and were answered (as the wire gave them), and
    the conversation they belong to (:class:`OpenQuestions`)."""

    v: int = STATE_VERSION
    asked: dict[str, str] = {}
    answers: dict[str, dict[str, Any]] = {}
    conversation: str = Field(default_factory=lambda: uuid.uuid4().hex)


class Asking:
    """One tool call's way to its client (module docstring)."""

    def __init__(self, ctx: Context[Any, Any]) -> None:
        self._ctx = ctx
        version = ctx.protocol_version
        self.multi_round = version is not None and is_version_at_least(version, MULTI_ROUND_VERSION)
        self._round = Round()
        if self.multi_round and ctx.request_state:
            try:  # sealed by the SDK: only a state this server minted gets here
                self._round = Round.model_validate_json(ctx.request_state)
            except ValidationError:
                self._round = Round()
        self._responses = (ctx.input_responses or {}) if self.multi_round else {}
        self.conversation = self._round.conversation
        """This call, or on a 2026-07-28 connection every round of it: the rounds carry it in their sealed state."""

    def lacks(self, capability: Capability) -> str | None:
        """Why the client cannot be asked for ``capability`` (None: it can)."""
        offered = self._ctx.client_capabilities
        if capability == "elicitation":
            form = offered is not None and offered.elicitation is not None
            # A bare `elicitation: {}` (the only shape before modes) is a form; a url-only client has no forms.
            ok = form and (offered.elicitation.form is not None or offered.elicitation.url is None)  # type: ignore[union-attr]
            if not ok:
                return "this client does not let the server ask its user (it offers no MCP elicitation)"
        elif offered is None or offered.sampling is None:
            return "this client does not let the server ask its model (it offers no MCP sampling)"
        return None

    async def ask(
        self,
        key: str,
        request: ElicitRequest | CreateMessageRequest,
        answer: type[Answer],
        timeout: float,
        spend: Callable[[], None] | None = None,
    ) -> Answer:
        """The client's answer to ``request``, as ``answer``; on a 2026-07-28 connection without it yet, raises
        :class:`InputRequiredError`. A pydantic ``ValidationError``: the answer is not of that type. ``spend`` is called
        each time the request is made (not when an earlier round's answer is taken), and may refuse it."""
        if not self.multi_round:
            if spend is not None:
                spend()
            return await self._send(request, answer, timeout)
        digest = hashlib.sha256(request.model_dump_json(by_alias=True, exclude_none=True).encode()).hexdigest()
        if self._round.asked.get(key) == digest:
            kept = self._round.answers.get(key)
            response = self._responses.get(key)
            wire = kept if kept is not None else None if response is None else _wire(response)
            if wire is not None:
                self._round.answers[key] = wire
                return answer.model_validate(wire)
        if spend is not None:
            spend()
        self._round.asked[key] = digest
        self._round.answers.pop(key, None)
        raise InputRequiredError(
            InputRequiredResult(input_requests={key: request}, request_state=self._round.model_dump_json())
        )

    async def _send(
        self, request: ElicitRequest | CreateMessageRequest, answer: type[Answer], timeout: float
    ) -> Answer:
        session, what = self._ctx.session, request.method
        # The call's own stream when it can carry a request (stdio, SSE), else the connection's standalone one.
        related = ServerMessageMetadata(related_request_id=self._ctx.request_id) if session.can_send_request else None
        try:
            with anyio.fail_after(timeout):
                answered: Answer = await session.send_request(request, answer, metadata=related)
                return answered
        except TimeoutError:
            raise NoAnswerError(f"the client did not answer {what} within {timeout:g} s") from None
        except NoBackChannelError:
            raise NoAnswerError(
                f"this connection cannot carry {what} (a streamable-HTTP client without its GET stream)"
            ) from None
        except MCPError as error:
            raise NoAnswerError(f"the client answered {what} with an error: {_clip(error.error.message)}") from None


class Subject(NamedTuple):
    """What a report asks its client about, and only one report may at a time: a recall, or an episode (its id is
    the namespace's)."""

    field: str
    value: str
    namespace: str = ""


class Holder(NamedTuple):
    """Who a report's questions count against: a token, or without one a session of the local server
    (:data:`SESSION`), else every tokenless client together; its bound, and its name in a refusal."""

    key: str
    limit: int
    name: str

    @classmethod
    def of(cls, token: str | None, limit: int) -> Holder:
        session = SESSION.get()
        if token is None and session is not None:
            return cls(f"session {session}", limit, "this session")
        return cls(f"token {token or ''}", limit, "this token")


@dataclass(frozen=True)
class Hold:
    holder: str
    subjects: frozenset[Subject]
    until: float


class OpenQuestions:
    """The reports waiting for their client's answer (its user's, or its model's): at most one per :class:`Subject`
    and at most its holder's bound per :class:`Holder` (a token, or a session of the local server).

    Each question holds a request to the client for up to its timeout, and of the reports of one recall only one can
    ever apply: unbounded, a client's concurrent reports of one recall would each send a question. A report holds its
    subjects while it asks, from before its first question until its answers are in. Over the handshake protocols that
    is while its call waits. On a 2026-07-28 connection each question ends the call (an ``InputRequiredResult``) and
    the client calls again with the answer: the hold then stays until the round that brings the last answer, or for
    ``hold_seconds`` (a client may never come back); the rounds of one report carry its conversation id in the state
    the SDK seals, so they pass, and no other call can claim it. Kept by this process (each replica of a server keeps
    its own), under a lock: the local server's sessions share one from event loops of their own threads, whatever MCP
    server (of their own settings) serves each, so that a subject is held across all of them."""

    def __init__(self, hold_seconds: float, clock: Callable[[], float]) -> None:
        self._hold_seconds = hold_seconds
        self._clock = clock
        self._holds: dict[str, Hold] = {}  # by conversation
        self._lock = threading.Lock()

    @contextmanager
    def held(self, client: Asking, holder: Holder, subjects: Sequence[Subject] = ()) -> Iterator[None]:
        """Hold ``subjects`` (and one of the holder's places) while the block asks the client; a refusal names the
        subject another report holds, or the setting."""
        mine = client.conversation
        with self._lock:
            self._take(mine, holder, subjects)
        try:
            yield
        except InputRequiredError:
            raise  # the client comes back with the answer: the hold stays until then, or until it lapses
        except BaseException:
            with self._lock:
                self._holds.pop(mine, None)
            raise
        with self._lock:
            self._holds.pop(mine, None)

    def _take(self, mine: str, holder: Holder, subjects: Sequence[Subject]) -> None:
        now = self._clock()
        self._holds = {key: hold for key, hold in self._holds.items() if hold.until > now and key != mine}
        for hold in self._holds.values():
            taken = next((subject for subject in subjects if subject in hold.subjects), None)
            if taken is not None:
                raise MemoryRequestError(
                    f"{taken.field}: another report of {taken.field} {taken.value!r} is waiting for the client's "
                    "answer, and only one report of it can apply: wait for that one, or pass reward (and experience) "
                    "yourself"
                )
        waiting = sum(hold.holder == holder.key for hold in self._holds.values())
        if waiting >= holder.limit:
            raise MemoryRequestError(
                f"reward: {holder.name} has {waiting} reports waiting for the client's answers "
                f"(max_open_questions_per_token={holder.limit}): wait for them, or pass reward (and experience) "
                "yourself"
            )
        self._holds[mine] = Hold(holder.key, frozenset(subjects), now + self._hold_seconds)


def _wire(response: BaseModel) -> dict[str, Any]:
    wire: dict[str, Any] = json.loads(response.model_dump_json(by_alias=True, exclude_none=True))
    return wire


def _clip(text: str, limit: int = 200) -> str:
    """A client's text in a message: bounded (the client may be hostile)."""
    return text if len(text) <= limit else text[:limit] + "..."
