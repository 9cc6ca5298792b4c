"""A memory's Q history: its newest events in the memory's payload (the tail), the older ones in the history table.

Why not all of it in the memory: qdrant-edge reads and rewrites a point's whole payload at every write, so with the
history in the memory each Q update cost more as the history filled (a write of five fields: 43 us of CPU on a
memory of 200 bytes, 108 us on one holding a full history and ``applied``, 11 KB; docs/performance.md). The payload
keeps at most :data:`HISTORY_TAIL` events (``history``: JSON text, one event per line), and ``history_moved`` counts
the events that left it. When the tail is full, the next Q update first copies the tail's events into the history
table (one upsert), then writes the memory with its new event alone in the tail: conditionally, as every Q update
(:meth:`~memrl_mcp.memory.ledger.Ledger.update_once`).

What a reader sees is still the history of the memory's Q (a Q and its event exist together):

- an event reaches the history table only from a memory as read, that is from a write that applied: an event of an
  attempt that lost its race, or of a report cut off by a crash before its redo, was never in a tail, so it is
  never copied;
- a reader takes from the table only the events below ``history_moved``, which the memory's own write advances. A
  crash (or a lost race) between the copy and the memory's write leaves the events in the tail and, unread, in the
  table; the next update, or the redo, copies them again onto the same points.

Event number ``n`` of a memory (counted from its first) is the point ``uuid5(memory, n mod q_history_size)``: the
table keeps at most ``q_history_size`` events per memory (a ring), and a repeated copy writes the same points. Each
point records its ``n``, so a slot holding another event (written with another ``q_history_size``, or before the
memory was replaced by an import) is not shown. Deleting a memory deletes its events (by ``memory``, whatever ring
they were written in); forgetting a namespace deletes the namespace's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memrl_mcp.models import QEvent
from memrl_mcp.storage import PLACEHOLDER, Point, Store

HISTORY_TAIL = 8
"""Events the memory's payload keeps before they move to the history table: the copy (an upsert of this many points)
is paid once per this many updates, and the payload stays under ~1.5 KB of history."""


def event_id(memory_id: str, number: int, capacity: int) -> str:
    """The point of a memory's event number ``number`` in its ring of ``capacity`` slots."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"memrl-q-event:{memory_id}:{number % capacity}"))


def tail_texts(payload: Mapping[str, Any]) -> list[str]:
    """The events of the memory's tail, oldest first, each as its JSON text. A history written in one line (before
    schema version 4) or as a list (before version 2) is decoded once."""
    history = payload.get("history") or "[]"
    if isinstance(history, str) and ("\n" in history or history == "[]"):
        return [] if history == "[]" else history[1:-1].split(",\n")
    events = json.loads(history) if isinstance(history, str) else list(history)
    return [json.dumps(event) for event in events]


@dataclass(frozen=True)
class QHistory:
    """The Q histories of a store's memories, each keeping its last ``capacity`` events (``q_history_size``)."""

    store: Store
    capacity: int

    def append(self, memory_id: str, memory: Mapping[str, Any], event: QEvent) -> dict[str, Any]:
        """The history fields of the update that records ``event`` in ``memory`` (as read). A full tail is first
        copied into the history table (module docstring): call it just before the memory's write, once per attempt.

        Appending one event to the text, without decoding the others: 17 us of CPU for 50 events, against 143 us
        decoded and encoded again (docs/performance.md)."""
        tail, moved = tail_texts(memory), int(memory.get("history_moved", 0))
        if self.capacity > HISTORY_TAIL and len(tail) >= HISTORY_TAIL:
            kept = tail[-self.capacity :]  # a tail written before the history table may hold up to capacity
            first = moved + len(tail) - len(kept)
            points = [
                Point(
                    event_id(memory_id, first + i, self.capacity),
                    PLACEHOLDER,
                    {"namespace": memory["namespace"], "memory": memory_id, "number": first + i, "event": text},
                )
                for i, text in enumerate(kept)
            ]
            self.store.upsert("history", points)
            moved, tail = moved + len(tail), []
        tail.append(json.dumps(event.model_dump()))
        dropped = max(0, len(tail) - self.capacity)  # only when the ring is no larger than the tail
        return {"history": "[" + ",\n".join(tail[dropped:]) + "]", "history_moved": moved + dropped}

    def events(self, memory_id: str, memory: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The memory's last ``capacity`` events, oldest first: the table's below ``history_moved``, then the tail."""
        if not self.capacity:
            return []
        tail = [json.loads(text) for text in tail_texts(memory)]
        moved = int(memory.get("history_moved", 0))
        numbers = range(max(0, moved - (self.capacity - len(tail))), moved)
        ids = [event_id(memory_id, number, self.capacity) for number in numbers]
        found = self.store.get("history", ids) if ids else {}
        older = [
            json.loads(point["event"])
            for point_id, number in zip(ids, numbers, strict=True)
            if (point := found.get(point_id)) is not None and point.get("number") == number
        ]
        return [*older, *tail][-self.capacity :]

    def forget(self, memory_ids: Sequence[str]) -> None:
        """Delete the events of these memories (deleted, or gone while an update copied their tail)."""
        if memory_ids:
            events = [point_id for point_id, _ in self.store.scroll("history", {"memory": list(memory_ids)}, ())]
            self.store.delete("history", events)
