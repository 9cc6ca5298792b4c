"""Backups: ``memrl-mcp export`` and ``memrl-mcp import``, as JSON Lines.

One memory per line, every field of :class:`MemoryView` (id, namespace, task, experience, outcome, q,
visits, last_reward, merges, created_at, updated_at, metadata) and no vector: an import re-embeds the
tasks, so a backup also moves memories to another embedder or engine. Floats are written in Python's
shortest round-trip form, so Q and timestamps come back bit for bit.

An export to a file writes a temporary file in the same folder, syncs it and renames it over the
target: a crashed export leaves a stray ``.<name>.*.tmp``, never a file that looks complete.

An import checks every line first (JSON, fields, types, limits, ids unique in the file) and writes
nothing unless all of them pass. Blank lines are skipped. Each memory is then written under its own
id, replacing a stored memory with that id (other memories are kept; none is merged into a twin).
So an import is resumable: if it dies mid-write, run it again.
"""

from __future__ import annotations

import json
import reprlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, TypeVar

from pydantic import ValidationError

from memrl_mcp.errors import MemoryRequestError, MemrlError
from memrl_mcp.files import write_atomically
from memrl_mcp.memory import MemoryService
from memrl_mcp.models import MemoryView
from memrl_mcp.settings import Settings

FIELDS = tuple(MemoryView.model_fields)
SHOWN_PROBLEMS = 20  # lines listed when an import is refused
T = TypeVar("T")


class BackupError(MemrlError, ValueError):
    """A backup was refused; the message names the line and the field."""


# -- export -------------------------------------------------------------------------------------


def export_memories(settings: Settings, out: Path | None, namespaces: Sequence[str], stdout: BinaryIO) -> str:
    """Write the memories (of ``namespaces``, or all) to ``out`` or ``stdout``; returns a summary."""
    if not settings.qdrant_url and not settings.data_dir.is_dir():
        raise BackupError(f"no memory store in {settings.data_dir}")  # a typo must not create an empty store
    service = MemoryService.open(settings)
    try:
        # One scan, filtered here: a namespace without memories (a typo) is then reported, not refused mid-stream.
        wanted = set(namespaces)
        memories = (m for m in service.memories() if not wanted or m.namespace in wanted)
        if out is None:
            counts = write_memories(memories, stdout)
            stdout.flush()
        else:
            counts = write_atomically(out, lambda stream: write_memories(memories, stream))
    finally:
        service.close()
    empty = "".join(f"; no memory in namespace {ns!r}" for ns in dict.fromkeys(namespaces) if not counts[ns])
    source = settings.qdrant_url or settings.data_dir
    return f"exported {_tally(counts)} from {source} to {out or 'stdout'}{empty}"


def write_memories(memories: Iterable[MemoryView], stream: BinaryIO) -> Counter[str]:
    """One JSON object per line, in UTF-8; returns the count per namespace."""
    counts: Counter[str] = Counter()
    for memory in memories:
        line = json.dumps(memory.model_dump(), ensure_ascii=False, allow_nan=False)
        stream.write(line.encode() + b"\n")
        counts[memory.namespace] += 1
    return counts


# -- import -------------------------------------------------------------------------------------


def import_memories(settings: Settings, path: Path, progress: Callable[[int, int], None] | None = None) -> str:
    """Check every line of ``path``, then restore them all; returns a summary. Idempotent by id.

    The file is read three times instead of held in memory (a million memories would take gigabytes as objects):
    parsed before the store is opened (a malformed file creates nothing), checked against the limits, written in
    batches. ``progress(done, total)`` is called after each batch."""
    total = len(check_lines(path))  # before opening the store
    service = MemoryService.open(settings)
    try:
        problems = []
        for number, memory in memories_in(path):
            try:
                service.check_memory(memory)
            except MemoryRequestError as error:
                problems.append(f"line {number}: {error}")
        _refuse(path, problems)
        counts: Counter[str] = Counter()

        def restored(done: int) -> None:
            if progress is not None:
                progress(done, total)

        service.restore_stream((memory for _, memory in memories_in(path)), restored, counts)
    finally:
        service.close()
    return f"imported {_tally(counts)} into {settings.qdrant_url or settings.data_dir}"


def check_lines(path: Path) -> dict[str, int]:
    """Parse every line; refuse the file if any is malformed or repeats an id. Returns each id's line number."""
    problems: list[str] = []
    first_line: dict[str, int] = {}
    for number, memory in memories_in(path, problems):
        if memory.id in first_line:
            problems.append(f"line {number}: id: {memory.id} is already on line {first_line[memory.id]}")
            continue
        first_line[memory.id] = number
    _refuse(path, problems)
    return first_line


def memories_in(path: Path, problems: list[str] | None = None) -> Iterator[tuple[int, MemoryView]]:
    """Each memory of the file with its line number, blank lines skipped; a malformed line is added to
    ``problems`` (None: the file was checked already)."""
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
                memory = parse_memory(text)
            except BackupError as error:
                if problems is not None:
                    problems.append(f"line {number}: {error}")
                continue
            yield number, memory


def parse_memory(text: str) -> MemoryView:
    """One line: a JSON object with exactly the fields of a memory, each of its exact type (no coercion)."""
    try:
        record = json.loads(text.rstrip("\r\n"))  # so that the column is the line's own
    except json.JSONDecodeError as error:
        raise BackupError(f"not JSON ({error.msg} at column {error.colno})") from None
    except RecursionError:
        raise BackupError("JSON nested too deep to read") from None
    if not isinstance(record, dict):
        raise BackupError(f"not a JSON object but {type(record).__name__}")
    missing = [field for field in FIELDS if field not in record]
    if missing:
        raise BackupError(f"{', '.join(missing)}: missing")
    unknown = [field for field in record if field not in FIELDS]
    if unknown:
        raise BackupError(f"{', '.join(unknown)}: unknown field")
    try:
        return MemoryView.model_validate(record, strict=True)
    except ValidationError as error:
        by_field: dict[str, str] = {}
        for e in error.errors():
            by_field.setdefault(str(e["loc"][0]), f"{e['loc'][0]}: {e['msg']}, got {reprlib.repr(e['input'])}")
        raise BackupError("; ".join(by_field.values())) from None


def _refuse(path: Path, problems: list[str]) -> None:
    if problems:
        shown = problems[:SHOWN_PROBLEMS]
        if len(problems) > SHOWN_PROBLEMS:
            shown.append(f"... and {len(problems) - SHOWN_PROBLEMS} more")
        raise BackupError(f"{path}: {len(problems)} bad line(s), nothing imported:\n  " + "\n  ".join(shown))


def _tally(counts: Counter[str]) -> str:
    total = sum(counts.values())
    detail = ", ".join(f"{namespace} {n}" for namespace, n in sorted(counts.items()))
    return f"{total} memor{'y' if total == 1 else 'ies'}" + (f" ({detail})" if detail else "")
