"""Bounded growth: at most so many points of one kind per namespace, the oldest going first.

Pending recalls are bounded (a report of one dropped is refused as expired), and so are reported episodes (a report
of an episode id dropped is applied as a new episode): a client that recalls without ever reporting, or reports
under ever new ids, cannot grow the store without limit.
"""

from __future__ import annotations

from memrl_mcp.storage import Store, Table, Where

EVICT_DOWN_TO = 0.9  # of a bound: what an eviction leaves, so the next count is a tenth of it away


class OldestBeyond:
    """At most ``bound`` points of one kind (those of ``table`` matching ``where``) per namespace: once a namespace has
    more, the oldest by ``age`` go, down to :data:`EVICT_DOWN_TO` of the bound.

    Counting is a scan in qdrant-client's local mode, slow against qdrant-edge's indexed count (docs/performance.md),
    so a process counts a namespace only once the points it added since the last count could have reached the bound
    (nothing else adds them). Replicas on one Qdrant server may each add that many between counts."""

    def __init__(self, store: Store, table: Table, where: Where, age: str, bound: int) -> None:
        self._store = store
        self._table = table
        self._where = where
        self._age = age
        self._bound = bound
        self._budget: dict[str, int] = {}  # per namespace, additions to go before counting it again

    def added(self, namespace: str) -> None:
        """After adding one point of the kind to ``namespace``."""
        budget = self._budget.get(namespace, 0)
        if budget > 0:
            self._budget[namespace] = budget - 1
            return
        where = {**self._where, "namespace": namespace}
        count = self._store.count(self._table, where)
        if count > self._bound:
            ages = sorted(
                (float(payload[self._age]), point_id)
                for point_id, payload in self._store.scroll(self._table, where, (self._age,))
            )
            keep = int(self._bound * EVICT_DOWN_TO)
            self._store.delete(self._table, [point_id for _, point_id in ages[: max(len(ages) - keep, 0)]])
            count = min(count, keep)
        self._budget[namespace] = self._bound - count
