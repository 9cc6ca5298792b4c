"""The harness answering memrl-mcp as its MCP client does: a simulated user for the server's question about an
episode's outcome (elicitation), and the run's LLM for the server's request for an experience (sampling).

``--user-rewards ERROR``: the reports leave the reward out; memrl-mcp asks the client how the task went, and
:class:`SimulatedUser` answers from the checker's verdict, wrong with probability ``ERROR`` (seeded per episode).
``--client-model``: the reports hand over the trajectory; memrl-mcp asks the client's model for the experience, and
:class:`ClientModel` has the run's LLM write it from the server's prompt.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
from mcp import types

from memrl_harness.llm import LLM, Usage


class SimulatedUser:
    """Says whether an episode succeeded, wrong with probability ``error``: when memrl-mcp asks (the callback), and
    when the agent asks in the chat (:meth:`says`: the modes whose tools ask no one, which label what they store).

    The server's question names the task, not the episode: reports that ask go one at a time (:meth:`reporting`),
    so the question that comes is about the report in flight. A question outside a report is declined."""

    def __init__(self, error: float) -> None:
        self.error = error
        self._lock = anyio.Lock()
        self._says: bool | None = None

    def says(self, success: bool, rng: random.Random) -> bool:
        """What the user says of an episode: ``success``, or wrongly not (one draw of ``rng``)."""
        return success != (rng.random() < self.error)

    @asynccontextmanager
    async def reporting(self, says: bool) -> AsyncIterator[None]:
        """While a report that leaves its reward out is made: the user's answer to the server's question."""
        async with self._lock:
            self._says = says
            try:
                yield
            finally:
                self._says = None

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        if self._says is None:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"succeeded": self._says})


class ClientModel:
    """The run's LLM, writing the experience the server asks for from its own prompt (system and user message)."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.usage = Usage()

    async def __call__(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        messages = [{"role": "system", "content": params.system_prompt or ""}]
        messages += [{"role": m.role, "content": getattr(m.content, "text", "")} for m in params.messages]
        reply = await anyio.to_thread.run_sync(lambda: self.llm.chat(messages, max_tokens=params.max_tokens))
        self.usage = self.usage + reply.usage
        text = types.TextContent(type="text", text=reply.text)  # an empty one is refused by the server, by name
        return types.CreateMessageResult(role="assistant", content=text, model=self.llm.model)
