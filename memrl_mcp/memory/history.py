"""A memory's Q history: its newest events in the memory's payload (the tail), the older ones in the history table.

Why not all of it in the memory: qdrant-edge reads and rewrites a point's whole payload at every write, even of two
fields, so with the history in the memory each Q update cost more as the history filled (docs/performance.md). The
payload keeps at most
:data:`HISTORY_TAIL` events (``history``: JSON text, one event per line), and ``history_chunks`` counts the tails
that left it. When the tail is full, the next Q update first copies the tail into the history table, as one point
(a chunk), then writes the memory with its new event alone in the tail: conditionally, as every Q update
(:meth:`~memrl_mcp.memory.ledger.Ledger.update_once`).

What a reader sees is still the history of the memory's Q (a Q and its event exist together):

- a chunk is copied from a memory as read, that is from a write that applied: an event of an attempt that lost its
  race, or of a report cut off by a crash before its redo, was never in a tail, so it is never copied; and the
  tail copied as chunk ``j`` is the one the memory held with ``history_chunks = j``, whoever copies it;
- a reader takes from the table only the chunks below ``history_chunks``, which the memory's own write advances. A
  crash (or a lost race) between the copy and the memory's write leaves the events in the tail and, unread, in the
  table; the next update, or the redo, copies them again onto the same point.

Chunk ``j`` of a memory is the point ``uuid5(memory, j)``. A reader needs at most ``R = ceil(q_history_size /
HISTORY_TAIL)`` chunks (beside a full tail, ``R - 1`` are enough), so the copy of chunk ``j`` deletes chunk ``j - R``,
which no reader of either state needs. A point per chunk number, rather than a ring of ``R`` slots, keeps a writer
that stalled between its read and its copy from overwriting a newer chunk's slot with its stale one: its late copy
lands on a number no reader asks for any more. Each point records its ``j``, so a point written before the memory
was replaced by an import is not shown. Deleting a memory deletes its chunks (by ``memory``, including any such
late copy); forgetting a namespace deletes the namespace's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memrl_mcp.models import QEvent
from memrl_mcp.storage import PLACEHOLDER, Point, Store

# Events the memory's payload keeps before they move to the history table, as one point (qdrant-edge's price is
# per point, so one point of 8 events, not 8 of one): a copy is paid once per this many updates, and the payload
# keeps a short history to rewrite at each update.
HISTORY_TAIL = 8


def chunk_id(memory_id: str, number: int) -> str:
    """The point of a memory's chunk ``number``."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"memrl-q-history:{memory_id}:{number}"))


def tail_texts(payload: Mapping[str, Any]) -> list[str]:
    """The events of the memory's tail, oldest first, each as its JSON text. A history written in one line (before
    schema version 4) or as a list (before version 2) is decoded once."""
    history = payload.get("history") or "[]"
    if isinstance(history, str) and ("\n" in history or history == "[]"):
        return [] if history == "[]" else history[1:-1].split(",\n")
    events = json.loads(history) if isinstance(history, str) else list(history)
    return [json.dumps(event) for event in events]


def joined(texts: Sequence[str]) -> str:
    """Events as stored: a JSON array, one event per line (JSON escapes the line breaks of a string)."""
    return "[" + ",\n".join(texts) + "]"


@dataclass(frozen=True)
class QHistory:
    """The Q histories of a store's memories, each keeping its last ``capacity`` events (``q_history_size``)."""

    store: Store
    capacity: int

    @property
    def kept(self) -> int:
        """The chunks a reader may need: with the tail, at least ``capacity`` events."""
        return -(-self.capacity // HISTORY_TAIL)

    def append(self, memory_id: str, memory: Mapping[str, Any], event: QEvent) -> dict[str, Any]:
        """The history fields of the update that records ``event`` in ``memory`` (as read). A full tail is first
        copied into the history table (module docstring): call it just before the memory's write, once per attempt.

        The event is appended to the text without decoding the others (docs/performance.md)."""
        tail, chunks = tail_texts(memory), int(memory.get("history_chunks", 0))
        if self.capacity > HISTORY_TAIL and len(tail) >= HISTORY_TAIL:
            chunk = {"namespace": memory["namespace"], "memory": memory_id, "number": chunks, "events": joined(tail)}
            self.store.upsert("history", [Point(chunk_id(memory_id, chunks), PLACEHOLDER, chunk)])
            if chunks >= self.kept:
                self.store.delete("history", [chunk_id(memory_id, chunks - self.kept)])
            chunks, tail = chunks + 1, []
        tail.append(json.dumps(event.model_dump()))
        return {"history": joined(tail[-self.capacity :] if self.capacity else []), "history_chunks": chunks}

    def events(self, memory_id: str, memory: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The memory's last ``capacity`` events, oldest first: its chunks below ``history_chunks``, then the tail."""
        if not self.capacity:
            return []
        chunks = int(memory.get("history_chunks", 0))
        numbers = range(max(0, chunks - self.kept), chunks)
        ids = [chunk_id(memory_id, number) for number in numbers]
        found = self.store.get("history", ids) if ids else {}
        texts = [
            text
            for point_id, number in zip(ids, numbers, strict=True)
            if (chunk := found.get(point_id)) is not None and chunk.get("number") == number
            for text in tail_texts({"history": chunk["events"]})
        ]
        return [json.loads(text) for text in [*texts, *tail_texts(memory)][-self.capacity :]]

    def forget(self, memory_ids: Sequence[str]) -> None:
        """Delete the chunks of these memories (deleted, or gone while an update copied their tail)."""
        if memory_ids:
            chunks = [point_id for point_id, _ in self.store.scroll("history", {"memory": list(memory_ids)}, ())]
            self.store.delete("history", chunks)
