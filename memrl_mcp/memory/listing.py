"""Paging through a namespace's memories: keyset pages on (sort value, id), and the cursor that carries the place.

The engine orders by the indexed sort field (``order_by``); ties, which are common (every new memory has Q = Q_init
and 0 visits), are read in id order, so a page never repeats or skips a memory that did not change meanwhile; one
whose sort value changed between pages moves with it.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import uuid
from typing import Any

from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.storage import Range, Store, Where

DEFAULT_PAGE = 20  # memories a list_memories page returns when the caller names no limit (at most max_list_page)
Row = tuple[str, dict[str, Any]]


def keyset_page(
    store: Store, where: Where, sort: str, descending: bool, after: tuple[float, str] | None, want: int
) -> list[Row]:
    """Up to ``want`` memories after ``after`` in (sort value, id) order, the value descending or not, the id always
    ascending (the engines' scroll order)."""
    base: Range = where.get(sort, Range())  # type: ignore[assignment]

    def at(value: float) -> dict[str | tuple[str, ...], Any]:
        return {**where, sort: base & Range(gte=value - tie(value), lte=value + tie(value))}

    def beyond(value: float) -> dict[str | tuple[str, ...], Any]:
        edge = Range(lt=value - tie(value)) if descending else Range(gt=value + tie(value))
        return {**where, sort: base & edge}

    rows: list[Row] = []
    rest: Where = dict(where)
    if after is not None:  # the rest of the cursor's tie group, then what lies beyond it
        value, last_id = after
        group, _ = store.scroll_from("memories", at(value), last_id, want + 1)
        rows += [row for row in group if row[0] != last_id][:want]
        rest = beyond(value)
    while len(rows) < want:
        need = want - len(rows)
        batch = store.ordered("memories", rest, sort, descending, need)
        if not batch:
            break
        edge = float(batch[-1][1][sort])
        whole = [row for row in batch if abs(float(row[1][sort]) - edge) > tie(edge)]  # groups before the last
        sign = -1.0 if descending else 1.0
        rows += sorted(whole, key=lambda row: (sign * float(row[1][sort]), uuid.UUID(row[0]).int))
        group, _ = store.scroll_from("memories", at(edge), None, need - len(whole))
        rows += group
        if len(group) == need - len(whole) or len(batch) < need:
            break
        rest = beyond(edge)
    return rows[:want]


def tie(value: float) -> float:
    """How far apart two sort values may be and count as equal (a tie group). qdrant-edge reads some floats back
    one ulp off the value its index holds (docs/storage.md, "Numbers read back as written"), so an exact match on a
    value read back can miss its own point."""
    return 4 * math.ulp(value)


def encode_cursor(sort: str, descending: bool, value: float, memory_id: str) -> str:
    """An opaque cursor: where the page ended, in the order it was read (it grants nothing: every page is
    filtered by the caller's access again)."""
    raw = json.dumps([sort, descending, value, memory_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, sort: str, descending: bool) -> tuple[float, str]:
    """The (sort value, id) a cursor ends at; refused unless it continues a list of this very order."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        cursor_sort, cursor_descending, value, memory_id = json.loads(raw)
        value = float(value)
        uuid.UUID(memory_id)
    except (binascii.Error, ValueError, TypeError, AttributeError):
        raise MemoryRequestError("cursor: not a cursor list_memories returned") from None
    if (cursor_sort, cursor_descending) != (sort, descending):
        raise MemoryRequestError(
            f"cursor: it continues a list sorted by {cursor_sort} (descending={cursor_descending}), not this "
            "one: pass the same sort and descending as for the first page"
        )
    return value, memory_id
