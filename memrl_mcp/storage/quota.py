"""The bytes each namespace holds, kept up to date write by write: what the storage quotas of
:mod:`memrl_mcp.memory.admission` admit calls against, so that one tenant cannot fill the disk all tenants share.

**What is measured.** A record's size is its payload as compact JSON (each top-level field: key, value, colon and
comma) plus its vector (4 bytes a dimension): what the engine stores of it, the engine's own indexes and files
aside. Sizes add up per field, so an update's change of size is the change of the fields it writes.

**Rewrites.** qdrant-edge writes a rewritten record's whole payload anew and keeps the version it replaced (and
the write in its log) until its next flush, which lets it reuse that room; so a namespace's usage also counts the
payloads its writes replaced since the last flush of their table. A table is flushed once :data:`FLUSH_BYTES` of
records were written to it, which bounds what the replaced versions and the log hold whoever writes; and a
namespace at its quota has the tables holding its replaced versions flushed (at most every
:data:`GIVE_BACK_EVERY` seconds for the whole store, as a flush stops every request), so a tenant who rewrites
one memory in a loop is slowed by its own quota, never given more than it. qdrant-client's local mode writes
through SQLite, which reuses a replaced version's pages at once: nothing is counted there.

**How it is kept.** :class:`MeteredStore`, a layer over an embedded store (every write of this process goes
through it, the store being locked to one process), reads the record before each write and knows the fields it
writes, under one lock, and moves each namespace's count by the difference; so the counts of records always equal a
full recount, whatever the order of concurrent writes. They are saved at a clean close and read back at open; the saved
file is deleted as it is read, so a store not closed cleanly is counted again (a full read of the store:
docs/performance.md). A namespace forgotten whole drops its counts without reading anything. On
a Qdrant server several replicas write and no process sees every write: no usage is measured there, and quotas are
not enforced.

"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic_core

from memrl_mcp.storage.disk import MB
from memrl_mcp.storage.files import sync_folder, write_atomically
from memrl_mcp.storage.layers import StoreLayer
from memrl_mcp.storage.store import EXPIRY, TABLES, Point, Range, Store, Table, Where, as_set, vector_size

SAVED = "usage.json"  # the counts, saved at a clean close
RECORD_BYTES = 600
"""A record's fields besides its texts (ids, times, Q, status, field names): measured with empty texts, 205 bytes
for a memory, 309 for a recall of 3 memories, 227 for a step record with one action, 226 for an episode record
(and 154 for a report kept in its recall); the rest covers a step's share of its episode record (~60 bytes)."""
UPDATE_BYTES = 256
"""What one Q update adds at most to a memory: its event in the Q history (160 bytes measured), its operation's
token in ``applied`` (13), and its share of the point its tail moves to (98 bytes besides the events, per 8 events)."""
DEAD_SHARE = 0.2  # of a table's live bytes: deleted bytes that start a compaction at once (Qdrant's vacuum default)
RECLAIM_SHARE = 0.02  # ... that start one at the hourly check, so that smaller deletions are given back too
RECLAIM_EVERY = 3600.0  # seconds between two such checks (the first at open)
DEAD_MIN = 1 * MB  # and never for less: each compaction rewrites the whole table
FLUSH_BYTES = 4 * MB  # of records written to a table between two flushes (each stops every request for a moment)
GIVE_BACK_EVERY = 1.0  # seconds between two flushes made for a namespace at its quota
log = logging.getLogger(__name__)


def json_bytes(value: Any) -> int:
    """``value`` as compact JSON in UTF-8 bytes, as serde_json writes it (the engines' own JSON library; Python's
    json module gave the same lengths but for a float's exponent: ``2.5e-07`` against ``2.5e-7``). A Q update counts
    a memory's fields twice, a full Q history and ``applied`` included, so the encoder's speed counts: serde_json
    takes a third of Python's time (docs/performance.md)."""
    return len(pydantic_core.to_json(value))


def payload_bytes(payload: Mapping[str, Any]) -> int:
    """The payload's fields, each counted as its key, value, colon and comma: the compact JSON of the payload less
    its closing brace, so that the fields of any part of it add up to the whole."""
    return json_bytes(payload) - 1 if payload else 0


def text_bytes(*values: Any) -> int:
    """What the given texts (a task, an experience, metadata...) take in a record."""
    return sum(json_bytes(value) for value in values)


def record_bytes(payload: Mapping[str, Any], dims: int) -> int:
    """A record's size: its payload and a vector of ``dims`` components."""
    return payload_bytes(payload) + 4 * dims


def new_record_bytes(*texts: Any, dims: int) -> int:
    """At most what a record holding ``texts`` and a vector of ``dims`` components takes, before it is built."""
    return text_bytes(*texts) + RECORD_BYTES + 4 * dims


class Usage:
    """Bytes per namespace and table: of the records, and of the versions their writes replaced since the table
    was last flushed; and per table the bytes deleted since it was last compacted."""

    def __init__(self, live: Mapping[str, Mapping[str, int]] | None = None, dead: Mapping[str, int] | None = None):
        self.live: dict[str, Counter[str]] = {ns: Counter(tables) for ns, tables in (live or {}).items()}
        self.dead: Counter[str] = Counter(dead or {})
        self.replaced: dict[str, Counter[Table]] = {}

    def add(self, namespace: Any, table: Table, size: int) -> None:
        """Count ``size`` more bytes (fewer, if negative) for the namespace (records without one are not a
        tenant's: the schema marker)."""
        if isinstance(namespace, str) and size:
            counts = self.live.setdefault(namespace, Counter())
            counts[table] += size
            if not any(counts.values()):
                del self.live[namespace]

    def delete(self, namespace: Any, table: Table, size: int) -> None:
        """Uncount deleted records: their bytes stay on disk until the table is compacted."""
        self.add(namespace, table, -size)
        self.dead[table] += size

    def replace(self, namespace: Any, table: Table, size: int) -> None:
        """Count a version of ``size`` bytes that a write replaced, held until the table's next flush."""
        if isinstance(namespace, str) and size:
            self.replaced.setdefault(namespace, Counter())[table] += size

    def flushed(self, table: Table) -> None:
        """The table was flushed: the versions its writes replaced are reused."""
        for namespace in list(self.replaced):
            self.replaced[namespace].pop(table, None)
            if not self.replaced[namespace]:
                del self.replaced[namespace]

    def held(self, namespace: str) -> int:
        """Bytes of the versions the namespace's writes replaced, not reused yet."""
        return sum(self.replaced.get(namespace, Counter()).values())

    def of(self, namespace: str) -> int:
        return sum(self.live.get(namespace, Counter()).values()) + self.held(namespace)

    def table(self, table: Table) -> int:
        return sum(counts[table] for counts in self.live.values())

    def to_json(self) -> bytes:
        return json.dumps({"live": self.live, "dead": self.dead}).encode()

    @classmethod
    def from_json(cls, text: str) -> Usage:
        saved = json.loads(text)
        return cls(saved["live"], saved["dead"])


class MeteredStore(StoreLayer):
    """An embedded store whose writes are counted per namespace (module docstring), whose tables are flushed by
    the bytes written to them, and compacted (:meth:`Store.compact`) once their deleted bytes reach
    :data:`DEAD_SHARE` of their live ones, or :data:`RECLAIM_SHARE` at the check made at open and then at the first
    write an hour after the last one (and :data:`DEAD_MIN` in both cases). Each compaction rewrites its whole table,
    so tying it to a share of the table bounds its cost per deleted byte; the disk deleted records hold is at most
    20% of the live records' at any time, and 2% (or 1 MB) within an hour of activity or at the next start.
    ``keeps_replaced``: the engine keeps a replaced version until a flush (qdrant-edge)."""

    def __init__(self, inner: Store, folder: Path, dim: int, keeps_replaced: bool = False) -> None:
        super().__init__(inner)
        self._folder = folder
        self._dims = {table: vector_size(table, dim) for table in TABLES}
        self._keeps_replaced = keeps_replaced
        self._lock = threading.Lock()  # one write at a time: each is counted from what it changed
        saved = self._saved()
        if saved is None:
            saved = self._recount()
            if saved.live:  # what a clean close leaves is missing: the operator's sign of a stop cut short
                log.warning(
                    "no counts were saved at the last close of the memory store at %s (it was not closed cleanly, "
                    "or by an older version): its records were counted again",
                    folder,
                )
        self._usage = saved
        self._written: Counter[str] = Counter()  # bytes of records written to each table since its last flush
        self._checked_at = -RECLAIM_EVERY
        self._given_back_at = -GIVE_BACK_EVERY
        with self._lock:
            self._check_deleted()

    def _saved(self) -> Usage | None:
        """The counts saved at the last clean close, removed at once (a crash must not find them); None if there
        are none, or none readable."""
        saved = self._folder / SAVED
        if not saved.exists():
            return None
        text = saved.read_text()
        saved.unlink()
        sync_folder(self._folder)
        try:
            return Usage.from_json(text)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("the saved usage is unreadable (%s); counting it again", error)
            return None

    def _recount(self) -> Usage:
        usage = Usage()
        for table in TABLES:
            for _, payload in self._inner.scroll(table):
                usage.add(payload.get("namespace"), table, self._size(table, payload))
        return usage

    def _size(self, table: Table, payload: Mapping[str, Any]) -> int:
        return record_bytes(payload, self._dims[table])

    def usage(self, namespace: str) -> int | None:
        with self._lock:
            return self._usage.of(namespace)

    def reclaim(self, namespace: str) -> int:
        """Flush the tables holding versions the namespace's writes replaced, unless the store flushed for a
        namespace less than :data:`GIVE_BACK_EVERY` seconds ago; the bytes of such versions it still holds."""
        with self._lock:
            tables = [table for table, size in self._usage.replaced.get(namespace, Counter()).items() if size]
            now = time.monotonic()
            if tables and now - self._given_back_at >= GIVE_BACK_EVERY:
                self._given_back_at = now
                for table in tables:
                    self._flush(table)
            return self._usage.held(namespace)

    def flush(self, table: Table) -> None:
        with self._lock:
            self._flush(table)

    def _flush(self, table: Table) -> None:
        self._inner.flush(table)
        self._written[table] = 0
        self._usage.flushed(table)

    # -- writes, counted ---------------------------------------------------------------------------

    def upsert(self, table: Table, points: Sequence[Point]) -> None:
        with self._lock:
            old = self._inner.get(table, [p.id for p in points])
            self._inner.upsert(table, points)
            for point in points:
                self._replaced(table, old.get(point.id), point.payload)
            self._after_write(table)

    def insert(self, table: Table, point: Point) -> None:
        with self._lock:
            existed = bool(self._inner.get(table, [point.id], ()))
            self._inner.insert(table, point)
            if not existed:
                self._replaced(table, None, point.payload)
            self._after_write(table)

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None:
        with self._lock:
            before = self._inner.get(table, [point_id]).get(point_id)
            self._inner.set_payload(table, point_id, payload)
            self._updated(table, payload, before)
            self._after_write(table)

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> bool:
        with self._lock:
            before = self._inner.get(table, [point_id]).get(point_id)
            applied = self._inner.set_payload_if(table, point_id, payload, where)
            if applied:
                self._updated(table, payload, before)
            self._after_write(table)
            return applied

    def delete(self, table: Table, ids: Sequence[str]) -> None:
        with self._lock:
            old = self._inner.get(table, ids)
            self._inner.delete(table, ids)
            for payload in old.values():
                self._usage.delete(payload.get("namespace"), table, self._size(table, payload))
            self._compact_if_due(table)
            self._check_deleted()

    def delete_namespace(self, table: Table, namespace: str) -> None:
        with self._lock:
            self._inner.delete_namespace(table, namespace)
            self._usage.delete(namespace, table, self._usage.live.get(namespace, Counter())[table])
            self._compact_if_due(table)
            self._check_deleted()

    def purge_recalls(self, expired_before: float) -> None:
        with self._lock:
            expired = list(self._inner.scroll("recalls", {EXPIRY: Range(lt=expired_before)}))
            self._inner.purge_recalls(expired_before)
            for _, payload in expired:
                self._usage.delete(payload.get("namespace"), "recalls", self._size("recalls", payload))
            self._compact_if_due("recalls")
            self._check_deleted()

    def _updated(self, table: Table, payload: Mapping[str, Any], before: Mapping[str, Any] | None) -> None:
        """Count a payload update from the record before it (read whole: the engine writes it anew whole, and
        keeps the version it replaces) and the fields it wrote, as the engine keeps them
        (:func:`~memrl_mcp.storage.store.as_set`): reading them back cost a store read per write, three per
        report."""
        if before is None:
            return
        old = {key: before[key] for key in payload if key in before}
        change = payload_bytes(as_set(payload)) - payload_bytes(old)
        self._usage.add(before.get("namespace"), table, change)
        if self._keeps_replaced:
            replaced = payload_bytes(before)
            self._usage.replace(before.get("namespace"), table, replaced)
            self._written[table] += replaced + change

    def _replaced(self, table: Table, old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> None:
        """A point written whole (its payload as stored: a :class:`Point`'s floats are the kept ones)."""
        if old is not None:
            self._usage.add(old.get("namespace"), table, -self._size(table, old))
            if self._keeps_replaced:
                self._usage.replace(old.get("namespace"), table, payload_bytes(old))
        size = self._size(table, new)
        self._usage.add(new.get("namespace"), table, size)
        self._written[table] += size

    def _after_write(self, table: Table) -> None:
        """Flush the table once :data:`FLUSH_BYTES` were written to it; the hourly check (see the class)."""
        if self._written[table] >= FLUSH_BYTES:
            self._flush(table)
        self._check_deleted()

    def _compact_if_due(self, table: Table, share: float = DEAD_SHARE) -> None:
        dead = self._usage.dead[table]
        if dead >= max(DEAD_MIN, share * self._usage.table(table)):
            log.info("compacting the %s table: %.1f MB of deleted records", table, dead / MB)
            self._usage.dead[table] = 0
            self._inner.compact(table)

    def _check_deleted(self) -> None:
        """The hourly check of the deleted bytes (see the class), made after a write (the lock held)."""
        now = time.monotonic()
        if now - self._checked_at >= RECLAIM_EVERY:
            self._checked_at = now
            for table in TABLES:
                self._compact_if_due(table, RECLAIM_SHARE)

    def close(self) -> None:
        with self._lock:
            self._inner.close()
            try:
                write_atomically(self._folder / SAVED, lambda stream: stream.write(self._usage.to_json()))
            except OSError as error:  # a full disk: the next open counts again
                log.warning("could not save the namespaces' usage (%s); the next open recounts it", error)
