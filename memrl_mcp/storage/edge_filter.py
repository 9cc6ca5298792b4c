"""The stores' conditions (:data:`~memrl_mcp.storage.store.Where`) as qdrant-edge filters."""

from __future__ import annotations

from typing import Any

from memrl_mcp.storage.store import Condition, Range, Where, Words


def edge_filter(edge: Any, where: Where | None) -> Any:
    """``where`` as a filter of the ``qdrant_edge`` module ``edge`` (imported by the store that opened it); None:
    every point. A tuple key matches when any of its fields does."""
    must: list[Any] = []
    for key, value in (where or {}).items():
        if isinstance(key, tuple):
            must.append(edge.Filter(should=[_condition(edge, field, value) for field in key]))
        else:
            must.append(_condition(edge, key, value))
    return edge.Filter(must=must) if must else None


def _condition(edge: Any, key: str, value: Condition) -> Any:
    if value is None:
        return edge.IsEmptyCondition(key)
    if isinstance(value, Range):
        return edge.FieldCondition(key, range=edge.RangeFloat(gte=value.gte, gt=value.gt, lte=value.lte, lt=value.lt))
    if isinstance(value, Words):
        return edge.FieldCondition(key, match=edge.MatchText(value.text))
    if isinstance(value, list | tuple | set | frozenset):
        return edge.FieldCondition(key, match=edge.MatchAny(list(value)))
    return edge.FieldCondition(key, match=edge.MatchValue(value))
