"""The store's schema: which shape of records a store holds, and the steps that bring an older store up to date.

A store records its schema version in one point of the recalls table, :data:`SCHEMA_POINT` (payload
``{"schema_version": n}``). The point has no namespace, status or expiry, so no filter of the service matches it,
and it lives in the store itself: replicas on one Qdrant server, and a data folder copied elsewhere, read the same
version. A store without it predates versioning (version 0); a fresh store gets it at its first open.

:func:`migrate` runs at every open, before anything else reads the store. Each step is idempotent and conditional:
it changes only records still in the old shape, with a write that holds only while they are (so replicas migrating
at once, or a rerun after a crash, cannot overwrite a newer write). The version is recorded only once every step
is done: a process killed mid-migration leaves the old version, and the next open runs the rest. A store whose
version is newer than this code knows is refused before anything is written to it: its records may mean
something this code would corrupt.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from memrl_mcp.errors import MemrlError
from memrl_mcp.storage.store import Point, Store

SCHEMA_VERSION = 5
SCHEMA_POINT = str(uuid.uuid5(uuid.NAMESPACE_URL, "memrl-schema"))
PROGRESS_EVERY = 1000  # records per progress line of a long migration
MISSING = object()

log = logging.getLogger("memrl_mcp.storage.migrations")


class SchemaTooNewError(MemrlError):
    """The store was written by a newer memrl-mcp, whose records this one does not know."""


class SchemaMarkerError(MemrlError):
    """The store's schema marker holds no readable version: which shape its records have cannot be known."""


class MigrationNeededError(MemrlError):
    """A read-only server was given a store that needs a migration, which is a write."""


def bookkeeping(memory: Mapping[str, Any]) -> dict[str, Any]:
    """Every memory carries the bookkeeping of optimistic writes (``version``, ``applied``).

    A memory stored without them (by early versions, or a hand-made preload) could never be updated: every write
    of a memory is conditional on the version it read, and no version matches an absent field."""
    if memory.get("version") is not None:
        return {}
    return {"version": 0, "applied": list(memory.get("applied") or [])}


def history_as_text(memory: Mapping[str, Any]) -> dict[str, Any]:
    """Every memory's Q history becomes JSON text (:mod:`memrl_mcp.memory.history` says why); the
    version this step records makes older code, which reads a list, refuse the store instead of misreading it."""
    history = memory.get("history")
    return {"history": json.dumps(history)} if isinstance(history, list) else {}


STEPS: tuple[tuple[int, Callable[[Mapping[str, Any]], dict[str, Any]]], ...] = (
    (1, bookkeeping),
    (2, history_as_text),
)
"""(the version a step brings the store to, the step: a memory's fields as read -> the fields it changes), oldest
first.

Versions 3, 4 and 5 convert nothing; older code would misread what they add, so the version makes it refuse the
store instead. 3: step records gained their nearest neighbour (``nearest*``, looked up when a namespace at its capacity
first needs them) and a claimed episode its progress point (an episode claimed before resumes from its own ``done``).
4: a record's applied operations are written as text (:func:`memrl_mcp.memory.records.applied_text`; a list is
still read, and becomes text at the record's next update), and a Q history one event per line. 5: a memory's older
Q events live in the history table (:mod:`memrl_mcp.memory.history`), which older code would not read: its history
of 50 events kept whole in the memory is the tail of version 5, copied to the table at the memory's next update."""
FIELDS = ("version", "applied", "history")  # what the steps read


def convert(store: Store, steps: Sequence[Callable[[Mapping[str, Any]], dict[str, Any]]]) -> int:
    """Run ``steps`` on every memory in one pass (a full read of the memories, not one per step), each memory
    written once, conditional on the ``version`` it was read with: a report that changed it meanwhile wrote it in
    the new shape. Returns the memories changed."""
    done = 0
    for memory_id, payload in store.scroll("memories", None, FIELDS):
        changes: dict[str, Any] = {}
        for step in steps:
            changes |= step(payload | changes)
        if changes:
            store.set_payload_if("memories", memory_id, changes, {"version": payload.get("version")})
            done += 1
            if done % PROGRESS_EVERY == 0:
                log.info("schema migration: %d memories converted", done)
    return done


def schema_version(store: Store) -> int:
    """The version the store records; 0 without a marker. A marker whose version is not an integer from 0 up (text,
    null, a fraction, a negative number, a number written as a decimal: a damaged or hand-edited point) is refused,
    never rounded: ``"2"`` or ``2.9`` read as 2 would let this code misread, then rewrite, records of another shape."""
    payload = store.get("recalls", [SCHEMA_POINT]).get(SCHEMA_POINT)
    if payload is None:
        return 0
    found = payload.get("schema_version", MISSING)
    problem = marker_problem(found)
    if problem is not None:
        raise SchemaMarkerError(
            f"the memory store's schema marker (point {SCHEMA_POINT} of the recalls table) holds {problem}: the "
            "store is damaged or was edited by hand, and the shape of its records cannot be known. Nothing was "
            "changed; restore the data folder from a backup (or `memrl-mcp import` an export into a new one)"
        )
    return found  # type: ignore[no-any-return]


def marker_problem(found: Any) -> str | None:
    """What is wrong with a marker's ``schema_version`` (None: a version, an integer from 0 up), in the marker's own
    words: the value as stored, and why it is no version."""
    if found is MISSING:
        return "no schema_version"
    shown = f"schema_version {json.dumps(found)}"
    if type(found) is int:
        return f"{shown}, a negative number (versions count up from 0)" if found < 0 else None
    if type(found) is not float:
        return f"{shown}, which is not a number (a version is an integer: 0, 1, 2, ...)"
    if not found.is_integer():
        return f"{shown}, a fraction (a version is an integer: 0, 1, 2, ...)"
    return f"{shown}, a decimal number where a version is written as an integer (0, 1, 2, ...)"


def migrate(store: Store, dim: int, read_only: bool = False) -> None:
    """Bring the store to :data:`SCHEMA_VERSION`, or refuse it if it is newer (module docstring); ``read_only``:
    refuse a store that would need a migration, naming it, instead of writing it."""
    found = schema_version(store)
    if found > SCHEMA_VERSION:
        raise SchemaTooNewError(
            f"the memory store has schema version {found}, written by a newer memrl-mcp; this one reads versions up "
            f"to {SCHEMA_VERSION}. Upgrade memrl-mcp to open it (nothing was changed)"
        )
    if found == SCHEMA_VERSION:
        return
    pending = [(version, step) for version, step in STEPS if version > found]
    if read_only and found == 0 and store.count("memories") == 0:
        return  # a fresh store, never opened for writing: no record to migrate (every step is the memories')
    if read_only and not pending:
        return  # only versions that convert nothing (3, 4) stand between: the records already read as they are
    if read_only:
        needed = ", ".join(f"{step.__name__} (to version {version})" for version, step in pending)
        raise MigrationNeededError(
            f"the memory store has schema version {found} and needs a migration to version {SCHEMA_VERSION} "
            f"({needed}) before this memrl-mcp can read it, and a read-only server writes nothing. Open it once "
            "without read_only (a writable memrl-mcp migrates it at start-up), then serve it read-only (nothing "
            "was changed)"
        )
    if pending:
        changed = convert(store, [step for _, step in pending])
        names = ", ".join(step.__name__ for _, step in pending)
        log.info("schema migration to version %d: %d memories changed (%s)", SCHEMA_VERSION, changed, names)
    marker = np.zeros(dim, dtype=np.float32)
    marker[0] = 1.0  # the recalls table is cosine: any unit vector; nothing searches it
    store.upsert("recalls", [Point(SCHEMA_POINT, marker, {"schema_version": SCHEMA_VERSION})])
