"""Backups: ``memrl-mcp export`` and ``memrl-mcp import``, as JSON Lines.

One record per line, with a ``kind``: ``"memory"`` (the episode memory: every field of :class:`MemoryView`: id,
namespace, task, experience, outcome, q, visits, last_reward, merges, created_at, updated_at, metadata) or
``"step"`` (the step memory: every field of :class:`StepRecordView`: id, namespace, task, observation, actions
with their q, visits and mean reward, created_at, updated_at). A line without ``kind`` is a memory (backups made
before the step memory). No vector: an import re-embeds the texts, so a backup also moves memories to another
embedder or engine. Floats are written in Python's shortest round-trip form, so Q and timestamps come back bit
for bit. Which episode ids and recalls were reported is not exported: a restored store would apply a repeated
report of an old episode again.

An export opens the store read-only (:class:`~memrl_mcp.storage.layers.ReadOnlyStore`: an embedded store is read from a
copy in TMPDIR), so it works on a full disk or a read-only volume and changes nothing. An export to a file writes
a temporary file in the same folder, syncs it and renames it over the target: a crashed export leaves a stray
``.<name>.*.tmp``, never a file that looks complete.

An import checks every line first (JSON, fields, types, limits, ids unique in the file, and that what it adds to
each namespace fits in the namespace's storage quota) and writes nothing unless all of them pass. Blank lines are
skipped. Every text is redacted as the tools' writes are (:func:`~memrl_mcp.redaction.redacted`: no secret, nothing
``<private>``), so an export of a store written before redaction existed and imported again comes back clean. Each
memory is then written under its own id, replacing a stored memory with that id (other memories are
kept; none is merged into a twin). So an import is resumable: if it dies mid-write, run it again.
"""

from __future__ import annotations

import itertools
import json
import reprlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError

from memrl_mcp.errors import MemoryRequestError, MemrlError
from memrl_mcp.memory.admission import RESTORE_BATCH, restore_bytes
from memrl_mcp.memory.records import check_memory, check_step, step_id
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import MemoryView, StepRecordView
from memrl_mcp.redaction import redacted, redacted_json
from memrl_mcp.settings import Settings
from memrl_mcp.storage import Table
from memrl_mcp.storage.files import write_atomically
from memrl_mcp.validation import plain_error

Record = MemoryView | StepRecordView
KINDS: dict[str, type[MemoryView] | type[StepRecordView]] = {"memory": MemoryView, "step": StepRecordView}
SHOWN_PROBLEMS = 20  # lines listed when an import is refused


class BackupError(MemrlError, ValueError):
    """A backup was refused; the message names the line and the field."""


# -- export -------------------------------------------------------------------------------------


def export_memories(settings: Settings, out: Path | None, namespaces: Sequence[str], stdout: BinaryIO) -> str:
    """Write the memories (of ``namespaces``, or all) to ``out`` or ``stdout``; returns a summary."""
    storage = settings.storage
    if not storage.qdrant_url and not storage.data_dir.is_dir():
        raise BackupError(f"no memory store in {storage.data_dir}")  # a typo must not create an empty store
    service = MemoryService.open(settings, read_only=True)  # changes no byte of the store
    try:
        # One scan, filtered here: a namespace without memories (a typo) is then reported, not refused mid-stream.
        wanted = set(namespaces)
        everything: Iterator[MemoryView | StepRecordView] = itertools.chain(service.memories(), service.step_records())
        records = (r for r in everything if not wanted or r.namespace in wanted)
        if out is None:
            counts = write_records(records, stdout)
            stdout.flush()
        else:
            counts = write_atomically(out, lambda stream: write_records(records, stream))
    finally:
        service.close()
    empty = "".join(
        f"; no memory in namespace {ns!r}" for ns in dict.fromkeys(namespaces) if not any(c[ns] for c in counts)
    )
    source = storage.qdrant_url or storage.data_dir
    return f"exported {_tally(*counts)} from {source} to {out or 'stdout'}{empty}"


def write_records(records: Iterable[Record], stream: BinaryIO) -> tuple[Counter[str], Counter[str]]:
    """One JSON object per line, in UTF-8, with its kind; returns the count per namespace of memories and of
    steps."""
    memories: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    for record in records:
        kind = "step" if isinstance(record, StepRecordView) else "memory"
        line = json.dumps({"kind": kind, **record.model_dump()}, ensure_ascii=False, allow_nan=False)
        stream.write(line.encode() + b"\n")
        (steps if kind == "step" else memories)[record.namespace] += 1
    return memories, steps


# -- import -------------------------------------------------------------------------------------


def import_memories(settings: Settings, path: Path, progress: Callable[[int, int], None] | None = None) -> str:
    """Check every line of ``path``, then restore them all; returns a summary. Idempotent by id.

    The file is read three times instead of held in memory (a million memories would take gigabytes as objects):
    parsed before the store is opened (a malformed file creates nothing), checked against the limits, written in
    batches. ``progress(done, total)`` is called after each batch."""
    total = check_lines(path)  # before opening the store
    service = MemoryService.open(settings)
    try:
        problems = []
        added: Counter[str] = Counter()  # per namespace, what the import adds: it must fit in the quota
        numbered = records_in(path)
        while batch := list(itertools.islice(numbered, RESTORE_BATCH)):
            valid = []
            for number, record in batch:
                try:
                    valid.append(cleaned(service, checked(service, record)))
                except MemoryRequestError as error:
                    problems.append(f"line {number}: {error}")
            with service.backup() as store:
                added += restore_bytes(store, valid, service.embedder.dim)
        for namespace, size in sorted(added.items()):
            try:
                service.quotas.check(namespace, size)
            except MemoryRequestError as error:
                problems.append(str(error))
        _refuse(path, problems)
        memories: Counter[str] = Counter()
        steps: Counter[str] = Counter()
        remaining = (record for _, record in records_in(path))
        done = 0
        while chunk := list(itertools.islice(remaining, RESTORE_BATCH)):
            restore(service, chunk)
            memories.update(r.namespace for r in chunk if isinstance(r, MemoryView))
            steps.update(r.namespace for r in chunk if isinstance(r, StepRecordView))
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    finally:
        service.close()
    return f"imported {_tally(memories, steps)} into {settings.storage.qdrant_url or settings.storage.data_dir}"


def restore(service: MemoryService, records: Sequence[Record]) -> int:
    """Write ``records`` exactly as given (same id, Q, visits, timestamps; a record whose id is stored is replaced),
    their texts redacted (:func:`cleaned`) and embedded anew; every one is checked, and what they add admitted under
    the namespaces' quotas, before any is written."""
    records = [cleaned(service, checked(service, record)) for record in records]
    with service.backup() as store, service.quotas.admit_all(restore_bytes(store, records, service.embedder.dim)):
        for start in range(0, len(records), RESTORE_BATCH):
            chunk = sorted(records[start : start + RESTORE_BATCH], key=lambda r: (_table(r), r.namespace))
            for (table, namespace), group in itertools.groupby(chunk, key=lambda r: (_table(r), r.namespace)):
                same = list(group)
                if table == "memories":
                    points = service.episodes.points(namespace, [r for r in same if isinstance(r, MemoryView)])
                else:
                    points = service.steps.points(namespace, [r for r in same if isinstance(r, StepRecordView)])
                store.upsert(table, points)
    return len(records)


def checked(service: MemoryService, record: Record) -> Record:
    """``record`` if it passes the rules of what the tools store (:mod:`memrl_mcp.memory.records`)."""
    if isinstance(record, StepRecordView):
        check_step(service.limits, service.settings.steps.step_max_actions, record)
    else:
        check_memory(service.limits, record)
    return record


def cleaned(service: MemoryService, record: Record) -> Record:
    """``record`` with its texts redacted as the tools' writes redact theirs, each within its limit; a step record
    under the id of its redacted (task, observation), where reports find it."""
    limits = service.settings.limits
    task = redacted(record.task, limits.max_task_chars)
    if isinstance(record, StepRecordView):
        observation = redacted(record.observation, limits.max_observation_chars)
        actions = [a.model_copy(update={"action": redacted(a.action, limits.max_action_chars)}) for a in record.actions]
        key = step_id(record.namespace, task, observation)
        return record.model_copy(update={"id": key, "task": task, "observation": observation, "actions": actions})
    experience = redacted(record.experience, limits.max_experience_chars)
    return record.model_copy(
        update={"task": task, "experience": experience, "metadata": redacted_json(record.metadata)}
    )


def _table(record: Record) -> Table:
    return "steps" if isinstance(record, StepRecordView) else "memories"


def check_lines(path: Path) -> int:
    """Parse every line; refuse the file if any is malformed or repeats an id. Returns the number of records."""
    problems: list[str] = []
    first_line: dict[str, int] = {}
    for number, record in records_in(path, problems):
        if record.id in first_line:
            problems.append(f"line {number}: id: {record.id} is already on line {first_line[record.id]}")
            continue
        first_line[record.id] = number
    _refuse(path, problems)
    return len(first_line)


def records_in(path: Path, problems: list[str] | None = None) -> Iterator[tuple[int, Record]]:
    """Each memory or step record of the file with its line number, blank lines skipped; a malformed line is
    added to ``problems`` (None: the file was checked already)."""
    with path.open("rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                text = raw.decode()
            except UnicodeDecodeError as error:
                if problems is not None:
                    problems.append(f"line {number}: not UTF-8 ({error.reason} at byte {error.start})")
                continue
            if not text.strip():
                continue
            try:
                record = parse_record(text)
            except BackupError as error:
                if problems is not None:
                    problems.append(f"line {number}: {error}")
                continue
            yield number, record


def parse_record(text: str) -> Record:
    """One line: a JSON object with exactly the fields of its kind, each of its exact type (no coercion); a field
    with a default (added since: ``experience_source``) may be absent, so an earlier version's export imports."""
    try:
        record = json.loads(text.rstrip("\r\n"))  # so that the column is the line's own
    except json.JSONDecodeError as error:
        raise BackupError(f"not JSON ({error.msg} at column {error.colno})") from None
    except RecursionError:
        raise BackupError("JSON nested too deep to read") from None
    if not isinstance(record, dict):
        raise BackupError(f"not a JSON object but {type(record).__name__}")
    kind = record.pop("kind", "memory")
    if not isinstance(kind, str) or kind not in KINDS:
        raise BackupError(f"kind: must be one of {', '.join(map(repr, KINDS))}, got {reprlib.repr(kind)}")
    model = KINDS[kind]
    fields = tuple(model.model_fields)
    missing = [field for field, info in model.model_fields.items() if info.is_required() and field not in record]
    if missing:
        raise BackupError(f"{', '.join(missing)}: missing")
    unknown = [field for field in record if field not in fields]
    if unknown:
        raise BackupError(f"{', '.join(unknown)}: unknown field")
    try:
        return model.model_validate(record, strict=True)
    except ValidationError as error:
        by_field: dict[str, str] = {}
        for e in error.errors():
            by_field.setdefault(str(e["loc"][0]), plain_error(e))
        raise BackupError("; ".join(by_field.values())) from None


def _refuse(path: Path, problems: list[str]) -> None:
    if problems:
        shown = problems[:SHOWN_PROBLEMS]
        if len(problems) > SHOWN_PROBLEMS:
            shown.append(f"... and {len(problems) - SHOWN_PROBLEMS} more")
        raise BackupError(f"{path}: {len(problems)} bad line(s), nothing imported:\n  " + "\n  ".join(shown))


def _tally(memories: Counter[str], steps: Counter[str]) -> str:
    """ "4 memories (default 2, team 2)", and "and 3 step records (...)" when there are any."""
    total = sum(memories.values())
    text = f"{total} memor{'y' if total == 1 else 'ies'}" + _detail(memories)
    if steps:
        count = sum(steps.values())
        text += f" and {count} step record{'' if count == 1 else 's'}" + _detail(steps)
    return text


def _detail(counts: Counter[str]) -> str:
    detail = ", ".join(f"{namespace} {n}" for namespace, n in sorted(counts.items()))
    return f" ({detail})" if detail else ""
