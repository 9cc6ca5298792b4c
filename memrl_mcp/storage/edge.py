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
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from memrl_mcp.storage.disk import RECALL_SHARE, DiskRoom
from memrl_mcp.storage.edge_filter import edge_filter
from memrl_mcp.storage.edge_index import (
    RESCORE_OVERSAMPLING,
    BuildTimes,
    Rebuild,
    ShardParams,
    open_shard,
    release,
    warm_up,
)
from memrl_mcp.storage.files import sync_folder, write_atomically
from memrl_mcp.storage.numbers import kept
from memrl_mcp.storage.private import seal
from memrl_mcp.storage.store import (
    EXPIRY,
    INDEXES,
    LARGE_FIELDS,
    SCROLL_PAGE,
    TABLES,
    Hit,
    Point,
    Table,
    Where,
    as_set,
    fields_of,
    is_dot,
    matches,
    optional_vector,
    vector_size,
)
from memrl_mcp.storage.tally import FIELDS as TALLY_FIELDS
from memrl_mcp.storage.tally import Counts, Tally

log = logging.getLogger(__name__)

CURRENT = "memories.current"  # names the memories' generation folder in use
TALLY = "memories.tally.json"  # the counts of memory_stats, saved at a clean close
# Rebuild once the memories outside the index (new ones: payload updates stay in it) reach this share of the indexed
# ones: few enough that the exact search of the rest stays cheap (docs/performance.md; settings.index_min_memories).
REBUILD_SHARE = 0.02
FULL_SCAN_KB = 10_000  # Qdrant's default: a filter matching fewer vectors than this (6,500 at 384-d) is scanned
# Memories streamed to the builder per page. A page holds the GIL while it is read and pickled, and the stream gets the
# GIL only between two searches: with 1M unindexed memories, whose exact searches hold the GIL long, smaller pages made
# the stream crawl (docs/performance.md).
BUILD_PAGE = 1024
RECORD = attrgetter("id", "vector", "payload")  # a scrolled record as the child takes it, read in C
FINAL_REPLAY = 64  # logged writes few enough to replay with writers held back
RELEASE_EVERY = 32_768  # records a full read returns between two releases of the pages it mapped
CHECK_EVERY = 1000  # memories writes between two checks of whether a build is due
# Writes to a table between two flushes. qdrant-edge writes a changed point's whole payload anew, and frees the old
# copy and truncates its write-ahead log only at a flush, which it never runs by itself: a server running for days
# kept every payload it had replaced since it started. At most this many replaced payloads wait.
FLUSH_EVERY = 1000


class EdgeStore:
    """Embedded Qdrant (qdrant-edge): one shard folder per table under ``path``.

    A table's shard can be rebuilt while this process keeps serving: its points are streamed to a child process
    (:mod:`~memrl_mcp.storage.edge_index`) that writes them into a new generation folder ``<table>-<n>``, named by
    ``<table>.current`` (replaced atomically: a crash leaves the old complete generation or the new one; strays are
    removed at the next open). Writes to the table meanwhile are logged and replayed on the new shard before the
    swap: each is an upsert, a delete, or a write conditional on a state it changes (a ``version`` it advances, a
    status it leaves), so replaying it on a state that already has it changes nothing. Readers keep the shard they
    started with; the old one is closed after the last. One rebuild runs at a time (:meth:`compact`,
    :meth:`build_index`).

    Rebuilds serve two ends. Memories are searched exactly until ``index_min`` of them are outside an HNSW index;
    then they are rebuilt with one, and again when the new ones reach ``max(index_min, REBUILD_SHARE x the indexed
    ones)``, so that the cost of rebuilds per write stays constant. And a table whose deleted points hold too much
    disk is compacted: qdrant-edge only marks deleted points, a new generation holds the live ones only.

    The counts of ``memory_stats`` are kept write by write (:class:`Tally`: this process is the store's only writer),
    saved at close and read back at open; a store not closed cleanly is counted again. The recalls table is
    memory-mapped (``Memory.Cold``): a pending recall is read once, when reported, so pending recalls stay out
    of resident memory (perf/recall_rss.py; docs/performance.md)."""

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
        self._writing = threading.Lock()  # one write at a time: the tally and the replay log follow them
        self._jobs: list[Rebuild] = []  # rebuilds to run, the first one running
        self._log: list[Any] | None = None  # writes to the table being rebuilt since its stream started
        self._builder: threading.Thread | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._closing = False
        self._writes_to_check = 0
        self._unflushed: dict[Table, int] = dict.fromkeys(TABLES, 0)
        self._unreleased: dict[Table, int] = dict.fromkeys(TABLES, 0)
        self.last_build: BuildTimes | None = None
        names = {table: self._current_generation(table) for table in TABLES}
        self._room.check_open([path / name for name in names.values() if (path / name / "edge_config.json").exists()])
        self._live = {table: _Live(self._open(path / name, dim, table), name) for table, name in names.items()}
        self._warm_up(self._live["memories"])
        for table, name in names.items():
            # A rebuild or a retired generation a crash left behind. The child of a server just killed may still be
            # writing in its folder for a moment (it is killed with its parent): what it adds goes at the next open.
            for stray in path.glob(f"{table}*"):
                if stray.is_dir() and stray.name != name:
                    shutil.rmtree(stray, ignore_errors=True)
        self._tally = self._read_tally()
        self._maybe_build()

    # -- generations ------------------------------------------------------------------------------

    def _current_generation(self, table: Table) -> str:
        pointer = self._path / f"{table}.current"
        return pointer.read_text().strip() if pointer.exists() else table

    def _params(self, table: Table, hnsw: bool) -> ShardParams:
        size = vector_size(table, self._dim)
        indexes = tuple(INDEXES[table].items())
        return ShardParams(size, is_dot(table), table == "recalls", hnsw, FULL_SCAN_KB, indexes, self._room.min_free)

    def _open(self, path: Path, dim: int, table: Table) -> Any:
        return open_shard(self._edge, path, self._params(table, hnsw=False), dim)

    @contextmanager
    def _reading(self, table: Table) -> Iterator[Any]:
        """The table's shard in use now, kept open until the block ends (a swap waits for it)."""
        with self._generations:
            live = self._live[table]
            live.readers += 1
        try:
            yield live.shard
        finally:
            with self._generations:
                live.readers -= 1
                self._generations.notify_all()

    def _warm_up(self, live: _Live) -> None:
        """Make the memories' search files resident, in the background (:func:`warm_up`)."""
        folder = self._path / live.name
        threading.Thread(target=warm_up, args=(folder,), name="memrl-warm-up", daemon=True).start()

    def index_status(self) -> tuple[int, int]:
        """(memories, of which in an HNSW index)."""
        with self._reading("memories") as shard:
            info = shard.info()
        return int(info.points_count), int(info.indexed_vectors_count)

    def _maybe_build(self) -> None:
        """Index the memories when those searched exactly have outgrown the bound (see the class)."""
        if self._index_min <= 0 or self._closing or any(job.table == "memories" for job in self._jobs):
            return
        points, indexed = self.index_status()
        if points - indexed >= max(self._index_min, REBUILD_SHARE * indexed):
            self.build_index()

    def build_index(self, wait: bool = False) -> None:
        """Rebuild the memories with an HNSW index in the background (now, whatever their number); ``wait``:
        return once it is in use (tests, benchmarks)."""
        self._rebuild("memories", hnsw=True, wait=wait)

    def compact(self, table: Table, wait: bool = False) -> None:
        """Rebuild ``table`` in the background with its live points only, giving back the disk its deleted ones
        hold; the memories keep an HNSW index once ``index_min`` of them are stored. ``wait``: return once the
        new generation is in use."""
        hnsw = table == "memories" and 0 < self._index_min <= self.index_status()[0]
        self._rebuild(table, hnsw, wait)

    def _rebuild(self, table: Table, hnsw: bool, wait: bool) -> None:
        """Queue a rebuild, unless the same one is queued already and not started: it will see every write."""
        with self._writing:
            if self._closing:
                return
            job = next((j for j in self._jobs[1:] if (j.table, j.hnsw) == (table, hnsw)), None)
            if job is None:
                job = Rebuild(table, hnsw)
                self._jobs.append(job)
            if self._builder is None:
                self._builder = threading.Thread(target=self._build, name="memrl-rebuild", daemon=True)
                self._builder.start()
        if wait:
            job.done.wait()

    def _build(self) -> None:
        """Run the rebuilds queued, one after another, until none is left or the store closes."""
        while True:
            with self._writing:
                if not self._jobs or self._closing:
                    self._builder = None
                    for job in self._jobs:
                        job.done.set()
                    self._jobs.clear()
                    return
                job = self._jobs[0]
                self._log = []
            target = self._path / f"{job.table}-{time.time_ns()}"
            times = BuildTimes()
            try:
                new = self._build_shard(job, target, times)
                if new is not None and self._swap(job.table, new, times):
                    self.last_build = times
                    log.info("%s rebuilt%s: %s", job.table, " with an HNSW index" if job.hnsw else "", times)
            except Exception:
                if not self._closing:  # else: the child was killed by close()
                    log.exception("rebuilding the %s table failed; it stays as it was", job.table)
                shutil.rmtree(target, ignore_errors=True)
                if job.hnsw:
                    self._index_min = 0  # no retry in this process: searches stay exact until the next open
            finally:
                with self._writing:
                    self._log = None
                    self._child = None
                    self._jobs.remove(job)
                job.done.set()

    def _build_shard(self, job: Rebuild, target: Path, times: BuildTimes) -> _Live | None:
        """Stream every point of the table to the child, wait for its shard; None if the store closed meanwhile."""
        start = time.perf_counter()
        params = self._params(job.table, job.hnsw).to_json()
        with tempfile.TemporaryFile() as errors:  # not a pipe: nobody reads it until the child is done
            child = subprocess.Popen(
                [sys.executable, "-m", "memrl_mcp.storage.edge_index", str(target), params],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )
            self._child = child
            assert child.stdin is not None
            with child.stdin, self._reading(job.table) as shard:
                offset = None
                while not self._closing:
                    request = self._edge.ScrollRequest(
                        offset=offset, limit=BUILD_PAGE, with_payload=True, with_vector=True
                    )
                    records, offset = shard.scroll(request)
                    # The page is made in one hold of the GIL and sent in one write, which releases it until
                    # the child has read the page (see BUILD_PAGE).
                    child.stdin.write(pickle.dumps(list(map(RECORD, records))))
                    times.points += len(records)
                    self._read_through(job.table, len(records))
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
                raise RuntimeError(f"the rebuild exited with status {child.returncode}: {detail}")
        start = time.perf_counter()
        self._room.check_open([target])
        new = _Live(self._edge.EdgeShard.load(str(target)), target.name)
        times.load_s = time.perf_counter() - start
        self._warm_up(new)
        return new

    def _swap(self, table: Table, new: _Live, times: BuildTimes) -> bool:
        """Replay the writes logged during the rebuild on ``new``, in rounds until one is short enough to finish
        with writers held back, then make ``new`` current (on disk first) and retire the old shard. False if the
        store closed meanwhile."""
        while True:
            # Flushed before each round, with writers let through: the held phase's flush of the new shard and the
            # old shard's close (each holds the GIL) then have only the last round's writes left to write.
            new.shard.flush()
            with self._reading(table) as current:
                current.flush()
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
                    pointer = self._path / f"{table}.current"
                    write_atomically(pointer, lambda stream: stream.write(new.name.encode()))
                    with self._generations:
                        old, self._live[table] = self._live[table], new
                    times.held_s = time.perf_counter() - held
                    break
            for operation in replay:
                new.shard.update(operation)
        with self._generations:
            self._generations.wait_for(lambda: old.readers == 0)
        start = time.perf_counter()
        old.shard.close()
        shutil.rmtree(self._path / old.name, ignore_errors=True)
        times.retire_s = time.perf_counter() - start
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

    def _fields(self, shard: Any, ids: Sequence[str], fields: Sequence[str]) -> dict[str, dict[str, Any]]:
        selector = self._edge.PayloadSelector.Include(list(fields))
        return {str(r.id): dict(r.payload or {}) for r in shard.retrieve(list(ids), selector, False)} if ids else {}

    def _write(
        self,
        table: Table,
        operation: Any,
        room: float | None,
        ids: Sequence[str] | None = None,
        new: Mapping[str, Mapping[str, Any]] | None = None,
        update: Mapping[str, Any] | None = None,
        where: Where | None = None,
    ) -> bool:
        """Apply one write under the lock that orders them: check the free space it needs (``room``: the share of
        the margin; None: a delete, always let through since it frees room); with ``where``, only if the point
        ``ids[0]`` meets it (else False, nothing written: this process is the store's only writer, so the point read
        under the lock is the one the write meets); count its effect on the memories' tally (on ``ids``, None: every
        point it may touch, read first; after: ``new``, their payloads, or ``update`` laid over the fields read, else
        read back); log it for a rebuild in flight, and start an index build of the memories when one is due."""
        memories = table == "memories"
        with self._writing, self._reading(table) as shard:
            if room is not None:
                self._room.check(room)
            if memories or where is not None:
                ids = [point_id for point_id, _ in self.scroll("memories", fields=())] if ids is None else ids
                fields = [*(TALLY_FIELDS if memories else ()), *fields_of(where or {})]
                old = self._fields(shard, ids, fields)
                # exactly once, checked here under the write lock: no read back (its cost: perf/write_costs.py)
                if where is not None and (ids[0] not in old or not matches(old[ids[0]], where)):
                    return False
            shard.update(operation)
            self._flush_when_due(table, shard)
            if memories:
                if new is not None:
                    after = new
                elif update is not None:
                    after = {point_id: as_set({**read, **update}) for point_id, read in old.items()}
                else:
                    assert ids is not None  # read above, for the tally
                    after = self._fields(shard, ids, TALLY_FIELDS)
                for point_id in set(old) | set(after):
                    self._tally.apply(old.get(point_id), after.get(point_id))
                self._writes_to_check -= 1
            if self._log is not None and self._jobs[0].table == table:
                self._log.append(operation)
        if memories and self._writes_to_check <= 0:
            self._writes_to_check = CHECK_EVERY
            self._maybe_build()
        return True

    # -- the Store primitives ------------------------------------------------------------------------

    def _flush_when_due(self, table: Table, shard: Any) -> None:
        """Flush a table at every :data:`FLUSH_EVERY`-th write to it in this process (its only writer)."""
        self._unflushed[table] += 1
        if self._unflushed[table] >= FLUSH_EVERY:
            self._unflushed[table] = 0
            shard.flush()

    def flush(self, table: Table) -> None:
        with self._writing, self._reading(table) as shard:
            self._unflushed[table] = 0
            shard.flush()

    def reclaim(self, namespace: str) -> int:
        return 0  # counted by the layer over it (memrl_mcp.storage.quota.MeteredStore)

    def upsert(self, table: Table, points: Sequence[Point]) -> None:
        batch = [self._edge.Point(p.id, p.vector.astype(np.float32).tolist(), p.payload) for p in points]
        operation = self._edge.UpdateOperation.upsert_points(batch)
        room = RECALL_SHARE if table == "recalls" else 1.0
        self._write(table, operation, room, [p.id for p in points], {p.id: p.payload for p in points})

    def insert(self, table: Table, point: Point) -> None:
        batch = [self._edge.Point(point.id, point.vector.astype(np.float32).tolist(), point.payload)]
        operation = self._edge.UpdateOperation.upsert_points(batch, update_mode=self._edge.UpdateMode.InsertOnly)
        self._write(table, operation, 1.0, [point.id])

    def get(self, table: Table, ids: Sequence[str], fields: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        payload = True if fields is None else self._edge.PayloadSelector.Include(list(fields))
        with self._reading(table) as shard:
            records = shard.retrieve(list(ids), payload, False)
        return {str(r.id): dict(r.payload or {}) for r in records}

    def get_vector(self, table: Table, point_id: str) -> np.ndarray | None:
        with self._reading(table) as shard:
            records = shard.retrieve([point_id], False, True)
        return np.asarray(records[0].vector, dtype=np.float32) if records else None

    def set_payload(self, table: Table, point_id: str, payload: dict[str, Any]) -> None:
        written = kept(payload)
        self._write(table, self._edge.UpdateOperation.set_payload([point_id], written), 1.0, [point_id], update=written)

    def set_payload_if(self, table: Table, point_id: str, payload: dict[str, Any], where: Where) -> bool:
        """Checked here (:meth:`_write`), written as a plain update: replayed on a rebuilt table, the writes that
        applied rebuild the same state in the same order."""
        written = kept(payload)
        operation = self._edge.UpdateOperation.set_payload([point_id], written)
        return self._write(table, operation, 1.0, [point_id], update=written, where=where)

    def delete(self, table: Table, ids: Sequence[str]) -> None:
        if ids:
            self._write(table, self._edge.UpdateOperation.delete_points(list(ids)), None, ids)

    def delete_namespace(self, table: Table, namespace: str) -> None:
        where = {"namespace": namespace}
        operation = self._edge.UpdateOperation.delete_points_by_filter(edge_filter(self._edge, where))
        ids = [point_id for point_id, _ in self.scroll(table, where, ())] if table == "memories" else None
        self._write(table, operation, None, ids)

    def purge_recalls(self, expired_before: float) -> None:
        edge = self._edge
        expired = edge.Filter(must=[edge.FieldCondition(EXPIRY, range=edge.RangeFloat(lt=expired_before))])
        self._write("recalls", edge.UpdateOperation.delete_points_by_filter(expired), None)

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
            filter=edge_filter(self._edge, where),
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
                    filter=edge_filter(self._edge, where),
                    with_payload=self._edge.PayloadSelector.Include(list(fields)),
                    with_vector=True,
                )
                records, offset = shard.scroll(request)
                yield from ((str(r.id), np.asarray(r.vector, dtype=np.float32), dict(r.payload or {})) for r in records)
                self._read_through(table, len(records))
                if offset is None:
                    return

    def scroll_from(
        self, table: Table, where: Where, offset: str | None, limit: int
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        request = self._edge.ScrollRequest(
            offset=offset,
            limit=limit,
            filter=edge_filter(self._edge, where),
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
            filter=edge_filter(self._edge, where),
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
                    offset=offset, limit=SCROLL_PAGE, filter=edge_filter(self._edge, where), with_payload=payload
                )
                records, offset = shard.scroll(request)
                yield from ((str(r.id), dict(r.payload or {})) for r in records)
                self._read_through(table, len(records))
                if offset is None:
                    return

    def _read_through(self, table: Table, records: int) -> None:
        """Count the records a long read returned; every :data:`RELEASE_EVERY`, give back the pages it mapped."""
        self._unreleased[table] += records
        if self._unreleased[table] >= RELEASE_EVERY:
            self._unreleased[table] = 0
            release(self._path / self._live[table].name)

    def count(self, table: Table, where: Where | None = None) -> int:
        request = self._edge.CountRequest(exact=True, filter=edge_filter(self._edge, where))
        with self._reading(table) as shard:
            return int(shard.count(request))

    def usage(self, namespace: str) -> int | None:
        return None  # measured by the layer over it (memrl_mcp.storage.quota.MeteredStore)

    def close(self) -> None:
        """Stop a build in flight (its child is killed, its folder removed), then flush, close and save the
        counts; what the engine made under an open umask is then made private (:func:`seal`)."""
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
        seal(self._path)


@dataclass
class _Live:
    """A table's open shard, its generation folder's name and the readers inside it."""

    shard: Any
    name: str = ""
    readers: int = 0
