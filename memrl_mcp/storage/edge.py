"""The embedded engine: qdrant-edge, Qdrant's Rust engine in process (one shard folder per table), with the HNSW
index of the memories built in a child process and swapped in while serving (:mod:`memrl_mcp.storage.edge_index`)."""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memrl_mcp.storage.disk import RECALL_SHARE, DiskFullError, DiskRoom
from memrl_mcp.storage.edge_index import RESCORE_OVERSAMPLING, IndexParams, payload_schema
from memrl_mcp.storage.files import sync_folder, write_atomically
from memrl_mcp.storage.numbers import kept
from memrl_mcp.storage.store import (
    EXPIRY,
    INDEXES,
    LARGE_FIELDS,
    SCROLL_PAGE,
    TABLES,
    Condition,
    Hit,
    Point,
    Range,
    StoreLockedError,
    Table,
    Where,
    Words,
    is_dot,
    optional_vector,
    vector_size,
)
from memrl_mcp.storage.tally import FIELDS as TALLY_FIELDS
from memrl_mcp.storage.tally import Counts, Tally

log = logging.getLogger(__name__)

# The embedded engine's HNSW index (EdgeStore)
CURRENT = "memories.current"  # names the memories' generation folder in use
TALLY = "memories.tally.json"  # the counts of memory_stats, saved at a clean close
# Rebuild once the memories outside the index (new ones: payload updates stay in it) reach this share of the indexed
# ones: at 1M, 20,000 searched exactly, ~3 ms (perf/scale.py, settings.index_min_memories).
REBUILD_SHARE = 0.02
FULL_SCAN_KB = 10_000  # Qdrant's default: a filter matching fewer vectors than this (6,500 at 384-d) is scanned
# Memories streamed to the builder per page. A page holds the GIL while it is read and pickled (1,000 points with
# vectors: ~15 ms to read), and the stream gets the GIL between two searches: at 1M unindexed memories, where an
# exact search holds it for 90-270 ms, a stream in pages of 256 crawled (the child had grown by 113 MB after 8 min).
BUILD_PAGE = 1024
FINAL_REPLAY = 64  # logged writes few enough to replay with writers held back
CHECK_EVERY = 1000  # memories writes between two checks of whether a build is due
# Writes to a table between two flushes. qdrant-edge writes a changed point's whole payload anew, and frees the old
# copy and truncates its write-ahead log only at a flush, which it never runs by itself: a server running for days
# kept every payload it had replaced since it started (issue 22). At most this many replaced payloads wait.
FLUSH_EVERY = 1000


class EdgeStore:
    """Embedded Qdrant (qdrant-edge): one shard folder per table under ``path``.

    Memories are searched exactly until ``index_min`` of them are not in an HNSW index; then an index is built in a
    child process (:mod:`memrl_mcp.storage.edge_index`) while this one keeps serving, and swapped in: the new shard is a
    generation folder ``memories-<n>`` named by the file ``memories.current`` (replaced atomically, so a crash
    leaves either the old complete generation or the new one; stray folders are removed at the next open). While
    the child builds, every write to the memories is logged, and replayed on the new shard before the swap: the
    stream the child indexed was read while writes went on, but each logged write is an upsert, a delete, or a
    write conditional on a ``version`` it advances, so replaying it on a state that already has it changes nothing.
    Readers hold the shard they started with until they finish; the old one is closed after the last.

    Points written after a build land in an appendable segment of the new shard, searched exactly; the index is
    rebuilt when that part reaches ``max(index_min, REBUILD_SHARE x the indexed ones)``: each rebuild reads every
    memory, so spacing rebuilds in proportion to the store keeps their cost per write constant.

    The counts of ``memory_stats`` are kept up to date write by write (:class:`Tally`: the writes are this
    process's alone, the store being locked), saved at close and read back at open; a store not closed cleanly is
    counted again at open.

    The recalls table keeps its vectors and payload in memory-mapped files (``Memory.Cold``): a pending recall
    is read once, when it is reported, so its bytes need not stay resident (a restarted server holding 50,000
    pending recalls: 164 MB resident instead of 272, perf/recall_rss.py)."""

    def __init__(
        self, path: Path, dim: int, room: DiskRoom | None = None, index_min: int = 0, hnsw_ef: int = 128
    ) -> None:
        import qdrant_edge as edge

        self._edge = edge
        path.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._dim = dim
        self._room = room or DiskRoom(path, 0)
        self._index_min = index_min
        self._hnsw_ef = hnsw_ef
        self._rescore = edge.QuantizationSearchParams(rescore=True, oversampling=RESCORE_OVERSAMPLING)
        self._originals = edge.QuantizationSearchParams(ignore=True)  # exact: every score from the original vector
        self._generations = threading.Condition()  # guards the shards in use and their readers
        self._writing = threading.Lock()  # one memories write at a time: the tally and the replay log follow it
        self._log: list[Any] | None = None  # memories writes since a build started streaming
        self._builder: threading.Thread | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._closing = False
        self._writes_to_check = 0
        self._unflushed: dict[Table, int] = dict.fromkeys(TABLES, 0)
        self.last_build: BuildTimes | None = None
        current = self._current_generation()
        self._live: dict[Table, _Live] = {
            table: _Live(self._open(path / name, dim, table), name)
            for table in TABLES
            for name in [current if table == "memories" else table]
        }
        for stray in path.glob("memories*"):  # a build or a retired generation a crash left behind
            if stray.is_dir() and stray.name != current:
                shutil.rmtree(stray)
        self._tally = self._read_tally()
        self._maybe_build()

    # -- generations ------------------------------------------------------------------------------

    def _current_generation(self) -> str:
        pointer = self._path / CURRENT
        return pointer.read_text().strip() if pointer.exists() else "memories"

    def _config(self, dim: int, table: Table) -> Any:
        edge = self._edge
        size = vector_size(table, dim)
        distance = edge.Distance.Dot if is_dot(table) else edge.Distance.Cosine
        if table != "recalls":
            return edge.EdgeConfig(vectors=edge.EdgeVectorParams(size=size, distance=distance))
        vectors = edge.EdgeVectorParams(size=size, distance=distance, memory=edge.Memory.Cold)
        return edge.EdgeConfig(vectors=vectors, payload_memory=edge.Memory.Cold)

    def _open(self, path: Path, dim: int, table: Table) -> Any:
        edge = self._edge
        config_file = path / "edge_config.json"
        stored = json.loads(config_file.read_text()) if config_file.exists() else None
        if stored is not None:
            stored_dim = int(next(iter(stored["vectors"].values()))["size"])
            if stored_dim != vector_size(table, dim):
                raise ValueError(
                    f"the store at {path} holds {stored_dim}-d vectors; the embedder makes {dim}-d ones "
                    f"({vector_size(table, dim)}-d in this table)"
                )
        try:
            if stored is None:
                shard = edge.EdgeShard.create(str(path), self._config(dim, table))
            elif table == "recalls" and stored.get("payload_memory") != "cold":
                # A store made before recalls were memory-mapped: loading with a config rewrites it (that needs
                # a little room, so it is done only when something changes).
                shard = edge.EdgeShard.load(str(path), self._config(dim, table))
            else:
                shard = edge.EdgeShard.load(str(path))
        except Exception as error:
            if "WouldBlock" in str(error):
                raise StoreLockedError(path, "its write-ahead log is locked") from None
            if "No space left on device" in str(error):  # the engine writes a little at every open
                raise DiskFullError(
                    f"cannot open the memory store at {path}: its disk is full. Free some space"
                ) from None
            raise
        indexed = set(shard.info().payload_schema)
        for key, kind in INDEXES[table].items():
            if key not in indexed:
                shard.update(edge.UpdateOperation.create_field_index(key, payload_schema(edge, key, kind)))
        return shard

    @contextmanager
    def _reading(self, table: Table) -> Iterator[Any]:
        """The table's shard in use now, kept open until the block ends (an index swap waits for it)."""
        with self._generations:
            live = self._live[table]
            live.readers += 1
        try:
            yield live.shard
        finally:
            with self._generations:
                live.readers -= 1
                self._generations.notify_all()

    def index_status(self) -> tuple[int, int]:
        """(memories, of which in an HNSW index)."""
        with self._reading("memories") as shard:
            info = shard.info()
        return int(info.points_count), int(info.indexed_vectors_count)

    def _maybe_build(self) -> None:
        """Start a build when the memories searched exactly have outgrown the bound (see the class)."""
        if self._index_min <= 0 or self._builder is not None or self._closing:
            return
        points, indexed = self.index_status()
        if points - indexed >= max(self._index_min, REBUILD_SHARE * indexed):
            self.build_index()

    def build_index(self, wait: bool = False) -> None:
        """Build an HNSW index of the memories in the background (now, whatever their number); ``wait``: return
        once it is in use (tests, benchmarks)."""
        with self._writing:
            if self._builder is None:
                self._log = []
                self._builder = threading.Thread(target=self._build, name="memrl-index-build", daemon=True)
                self._builder.start()
            builder = self._builder
        if wait:
            builder.join()

    def _build(self) -> None:
        target = self._path / f"memories-{time.time_ns()}"
        times = BuildTimes()
        try:
            new = self._build_shard(target, times)
            if new is not None and self._swap(new, times):
                self.last_build = times
                log.info("memories' HNSW index in use: %s", times)
        except Exception:
            if not self._closing:  # else: the child was killed by close()
                log.exception("building the memories' HNSW index failed; searches stay exact until the next open")
            shutil.rmtree(target, ignore_errors=True)
            self._index_min = 0  # no retry in this process
        finally:
            with self._writing:
                self._log = None
                self._builder = None
                self._child = None

    def _build_shard(self, target: Path, times: BuildTimes) -> _Live | None:
        """Stream every memory to the child, wait for its index; None if the store closed meanwhile."""
        start = time.perf_counter()
        params = IndexParams(self._dim, FULL_SCAN_KB, tuple(INDEXES["memories"].items()))
        self._room.check()
        with tempfile.TemporaryFile() as errors:  # not a pipe: nobody reads it until the child is done
            child = subprocess.Popen(
                [sys.executable, "-m", "memrl_mcp.storage.edge_index", str(target), params.to_json()],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )
            self._child = child
            assert child.stdin is not None
            with child.stdin, self._reading("memories") as shard:
                offset = None
                while not self._closing:
                    request = self._edge.ScrollRequest(
                        offset=offset, limit=BUILD_PAGE, with_payload=True, with_vector=True
                    )
                    records, offset = shard.scroll(request)
                    pickle.dump([(str(r.id), r.vector, r.payload) for r in records], child.stdin)
                    times.memories += len(records)
                    if offset is None:
                        pickle.dump(None, child.stdin)
                        break
            times.stream_s = time.perf_counter() - start
            child.wait()
            times.index_s = time.perf_counter() - start - times.stream_s
            if self._closing:
                shutil.rmtree(target, ignore_errors=True)
                return None
            if child.returncode != 0:
                errors.seek(0)
                detail = errors.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"the index build exited with status {child.returncode}: {detail}")
        start = time.perf_counter()
        new = _Live(self._edge.EdgeShard.load(str(target)), target.name)
        times.load_s = time.perf_counter() - start
        return new

    def _swap(self, new: _Live, times: BuildTimes) -> bool:
        """Replay the writes logged during the build on ``new``, in rounds until one is short enough to finish
        with writers held back, then make ``new`` current (on disk first) and retire the old shard. False if the
        store closed meanwhile."""
        while True:
            with self._writing:
                assert self._log is not None
                replay, self._log = self._log, []
                times.replayed += len(replay)
                if len(replay) <= FINAL_REPLAY or self._closing:
                    held = time.perf_counter()
                    for operation in replay:
                        new.shard.update(operation)
                    if self._closing:
                        new.shard.close()
                        shutil.rmtree(self._path / new.name, ignore_errors=True)
                        return False
                    new.shard.flush()
                    write_atomically(self._path / CURRENT, lambda stream: stream.write(new.name.encode()))
                    with self._generations:
                        old, self._live["memories"] = self._live["memories"], new
                    times.held_s = time.perf_counter() - held
                    break
            for operation in replay:
                new.shard.update(operation)
        with self._generations:
            self._generations.wait_for(lambda: old.readers == 0)
        old.shard.close()
        shutil.rmtree(self._path / old.name, ignore_errors=True)
        return True

    # -- the counts of memory_stats ----------------------------------------------------------------

    def _read_tally(self) -> Tally:
        """The counts saved at the last clean close (the file is removed at once: a crash must not find it), else a
        full count."""
        saved = self._path / TALLY
        if saved.exists():
            text = saved.read_text()
            saved.unlink()
            sync_folder(self._path)
            saved_tally = json.loads(text)
            if saved_tally.get("generation") == self._live["memories"].name:
                return Tally.from_dict(saved_tally["namespaces"])
        return Tally.of(payload for _, payload in self.scroll("memories", fields=TALLY_FIELDS))

    def tally(self, namespaces: Sequence[str] | None = None) -> Counts:
        with self._writing:
            return self._tally.total(namespaces)

    def _fields(self, shard: Any, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        selector = self._edge.PayloadSelector.Include(list(TALLY_FIELDS))
        return {str(r.id): dict(r.payload or {}) for r in shard.retrieve(list(ids), selector, False)} if ids else {}

    def _write_memories(
        self,
        operation: Any,
        ids: Sequence[str] | None,
        room: float | None,
        new: Mapping[str, Mapping[str, Any]] | None = None,
        where: Where | None = None,
    ) -> None:
        """Apply a write to the memories: count its effect (on ``ids``, or on the points matching ``where``, read
        under the lock that orders the writes), log it for a build in flight, and start a build when one is due."""
        with self._writing, self._reading("memories") as shard:
            if room is not None:
                self._room.check(room)
            if ids is None:
                ids = [point_id for point_id, _ in self.scroll("memories", where, ())]
            old = self._fields(shard, ids)
            shard.update(operation)
            self._flush_when_due("memories", shard)
            after = new if new is not None else self._fields(shard, ids)
            for point_id in set(old) | set(after):
                self._tally.apply(old.get(point_id), after.get(point_id))
            if self._log is not None:
                self._log.append(operation)
            self._writes_to_check -= 1
        if self._writes_to_check <= 0:
            self._writes_to_check = CHECK_EVERY
            self._maybe_build()

    # -- the Store primitives ------------------------------------------------------------------------

    def _filter(self, where: Where | None, point_id: str | None = None) -> Any:
        edge = self._edge
        must: list[Any] = []
        for key, value in (where or {}).items():
            if isinstance(key, tuple):
                must.append(edge.Filter(should=[self._condition(field, value) for field in key]))
            else:
                must.append(self._condition(key, value))
        if point_id is not None:
            must.append(edge.HasIdCondition({point_id}))
        return edge.Filter(must=must) if must else None

    def _condition(self, key: str, value: Condition) -> Any:
        edge = self._edge
        if value is None:
            return edge.IsEmptyCondition(key)
        if isinstance(value, Range):
            return edge.FieldCondition(
                key, range=edge.RangeFloat(gte=value.gte, gt=value.gt, lte=value.lte, lt=value.lt)
            )
        if isinstance(value, Words):
            return edge.FieldCondition(key, match=edge.MatchText(value.text))
        if isinstance(value, list | tuple | set | frozenset):
            return edge.FieldCondition(key, match=edge.MatchAny(list(value)))
        return edge.FieldCondition(key, match=edge.MatchValue(value))

    def _apply(self, table: Table, operation: Any, room: float | None = 1.0) -> None:
        """Apply one update to a table other than the memories; ``room``: the share of the free-space margin it
        needs (None: a delete, always let through since it frees room)."""
        if room is not None:
            self._room.check(room)
        with self._reading(table) as shard:
            shard.update(operation)
            self._flush_when_due(table, shard)

    def _flush_when_due(self, table: Table, shard: Any) -> None:
        """Flush a table at every :data:`FLUSH_EVERY`-th write to it in this process (its only writer)."""
        self._unflushed[table] += 1
        if self._unflushed[table] >= FLUSH_EVERY:
            self._unflushed[table] = 0
            shard.flush()

    def _write(self, table: Table, operation: Any, ids: Sequence[str] | None, room: float | None = 1.0) -> None:
        if table == "memories":
            self._write_memories(operation, ids, room)
        else:
            self._apply(table, operation, room)

    def upsert(self, table: Table, points: Sequence[Point]) -> None:
        batch = [self._edge.Point(p.id, p.vector.astype(np.float32).tolist(), p.payload) for p in points]
        operation = self._edge.UpdateOperation.upsert_points(batch)
        if table == "memories":
            self._write_memories(operation, [p.id for p in points], 1.0, {p.id: p.payload for p in points})
        else:
            self._apply(table, operation, RECALL_SHARE if table == "recalls" else 1.0)

    def insert(self, table: Table, point: Point) -> None:
        batch = [self._edge.Point(point.id, point.vector.astype(np.float32).tolist(), point.payload)]
        operation = self._edge.UpdateOperation.upsert_points(batch, update_mode=self._edge.UpdateMode.InsertOnly)
        self._write(table, operation, [point.id])

    def get(self, table: Table, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        with self._reading(table) as shard:
            records = shard.retrieve(list(ids), True, False)
        return {str(r.id): dict(r.payload or {}) for r in records}

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None:
        with self._reading(table) as shard:
            records = shard.retrieve([point_id], False, True)
        return np.asarray(records[0].vector, dtype=np.float32) if records else None

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None:
        self._write(table, self._edge.UpdateOperation.set_payload([point_id], kept(payload)), [point_id])

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> None:
        operation = self._edge.UpdateOperation.set_payload_by_filter(self._filter(where, point_id), kept(payload))
        self._write(table, operation, [point_id])

    def delete(self, table: Table, ids: Sequence[str]) -> None:
        if ids:
            self._write(table, self._edge.UpdateOperation.delete_points(list(ids)), ids, room=None)

    def delete_where(self, table: Table, where: Where) -> None:
        operation = self._edge.UpdateOperation.delete_points_by_filter(self._filter(where))
        if table == "memories":
            self._write_memories(operation, None, None, where=where)
        else:
            self._apply(table, operation, None)

    def purge_recalls(self, expired_before: float) -> None:
        edge = self._edge
        expired = edge.Filter(must=[edge.FieldCondition(EXPIRY, range=edge.RangeFloat(lt=expired_before))])
        self._apply("recalls", edge.UpdateOperation.delete_points_by_filter(expired), None)

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        min_similarity: float,
        where: Where,
        table: Table = "memories",
        with_vectors: bool = False,
        *,
        exact: bool = False,
        hnsw_ef: int | None = None,
    ) -> list[Hit]:
        """``exact``: score every candidate with its original vector, ignoring the index and the int8 copies;
        ``hnsw_ef``: instead of the store's (benchmarks)."""
        edge = self._edge
        request = edge.QueryRequest(
            limit=limit,
            query=edge.Query.Nearest(vector.astype(np.float32).tolist()),
            filter=self._filter(where),
            score_threshold=min_similarity,
            with_payload=edge.PayloadSelector.Exclude(list(LARGE_FIELDS)),
            with_vector=with_vectors,
            params=edge.SearchParams(
                exact=exact, hnsw_ef=hnsw_ef or self._hnsw_ef, quantization=self._originals if exact else self._rescore
            ),
        )
        with self._reading(table) as shard:
            points = shard.query(request)
        return [Hit(str(p.id), float(p.score), dict(p.payload or {}), optional_vector(p.vector)) for p in points]

    def vectors(
        self, table: Table, where: Where, fields: Sequence[str]
    ) -> Iterator[tuple[str, np.ndarray, dict[str, Any]]]:
        offset = None
        with self._reading(table) as shard:
            while True:
                request = self._edge.ScrollRequest(
                    offset=offset,
                    limit=SCROLL_PAGE,
                    filter=self._filter(where),
                    with_payload=self._edge.PayloadSelector.Include(list(fields)),
                    with_vector=True,
                )
                records, offset = shard.scroll(request)
                yield from ((str(r.id), np.asarray(r.vector, dtype=np.float32), dict(r.payload or {})) for r in records)
                if offset is None:
                    return

    def scroll_from(
        self, table: Table, where: Where, offset: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        request = self._edge.ScrollRequest(
            offset=offset,
            limit=limit,
            filter=self._filter(where),
            with_payload=self._edge.PayloadSelector.Exclude(list(LARGE_FIELDS)),
        )
        with self._reading(table) as shard:
            records, next_offset = shard.scroll(request)
        return [(str(r.id), dict(r.payload or {})) for r in records], None if next_offset is None else str(next_offset)

    def ordered(
        self, table: Table, where: Where, key: str, descending: bool, limit: int
    ) -> list[tuple[str, dict[str, Any]]]:
        edge = self._edge
        request = edge.ScrollRequest(
            limit=limit,
            filter=self._filter(where),
            with_payload=edge.PayloadSelector.Exclude(list(LARGE_FIELDS)),
            order_by=edge.OrderBy(key, edge.Direction.Desc if descending else edge.Direction.Asc),
        )
        with self._reading(table) as shard:
            records, _ = shard.scroll(request)
        return [(str(r.id), dict(r.payload or {})) for r in records]

    def scroll(
        self, table: Table, where: Where | None = None, fields: Sequence[str] | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        payload = True if fields is None else self._edge.PayloadSelector.Include(list(fields))
        offset = None
        with self._reading(table) as shard:
            while True:
                request = self._edge.ScrollRequest(
                    offset=offset, limit=SCROLL_PAGE, filter=self._filter(where), with_payload=payload
                )
                records, offset = shard.scroll(request)
                yield from ((str(r.id), dict(r.payload or {})) for r in records)
                if offset is None:
                    return

    def count(self, table: Table, where: Where | None = None) -> int:
        request = self._edge.CountRequest(exact=True, filter=self._filter(where))
        with self._reading(table) as shard:
            return int(shard.count(request))

    def close(self) -> None:
        """Stop a build in flight (its child is killed, its folder removed), then flush, close and save the
        counts."""
        with self._writing:
            self._closing = True
            builder, child = self._builder, self._child
        if child is not None:
            child.kill()
        if builder is not None:
            builder.join()
        with self._writing:
            generation = self._live["memories"].name
            for live in self._live.values():
                live.shard.flush()
                live.shard.close()
            saved = json.dumps({"generation": generation, "namespaces": self._tally.to_dict()}).encode()
            try:
                write_atomically(self._path / TALLY, lambda stream: stream.write(saved))
            except OSError as error:  # a full disk: the next open counts the memories again
                log.warning("could not save the memories' counts (%s); the next open recounts them", error)


@dataclass
class BuildTimes:
    """Where an index build's time went: streaming the memories to the child (the server's share, interleaved
    with its requests), the child's indexing after that, opening the new shard (holds the GIL), and the last
    replay round with writers held back."""

    memories: int = 0
    stream_s: float = 0.0
    index_s: float = 0.0
    load_s: float = 0.0
    replayed: int = 0
    held_s: float = 0.0


@dataclass
class _Live:
    """A table's open shard, its generation folder's name and the readers inside it."""

    shard: Any
    name: str = ""
    readers: int = 0
