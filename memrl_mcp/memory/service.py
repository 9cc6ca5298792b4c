"""The memory service: MemRL's loop (recall -> act -> report) over an embedder and a Qdrant store.

Safe for concurrent callers: threads of one server, and replicas of the server sharing one Qdrant server. The
learned state is written only through :mod:`memrl_mcp.memory.ledger` (conditional writes, claimed reports that are
their own redo log); every input passes the rules of :mod:`memrl_mcp.validation`, and every text it stores or recalls
by (tasks, experiences, observations, actions, evidence, notes, metadata) :func:`~memrl_mcp.redaction.redacted`
first: no secret and nothing ``<private>`` is stored; the tables' records are typed in
:mod:`memrl_mcp.memory.records`. Every method that serves a caller takes the caller's :class:`Access`, required.

Unreported recalls are bounded: one expires after ``recall_ttl_seconds``, and a namespace keeps at most
``max_pending_recalls`` pending (the oldest go first), so a client that never reports cannot grow the store
without limit. Reported episodes of the step memory likewise: a namespace keeps the newest
``max_reported_episodes`` (a report of an episode id dropped before is applied as a new episode)
(:mod:`~memrl_mcp.memory.bounds`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Self

import numpy as np
from pydantic import BaseModel

from memrl_mcp.embeddings import Embedder, cached, create_embedder, embed_tasks
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory.access import Access
from memrl_mcp.memory.admission import Quotas, edit_bytes, report_bytes, trajectory_bytes
from memrl_mcp.memory.bounds import OldestBeyond
from memrl_mcp.memory.episodes import EpisodeMemory, PendingRecall, Scale
from memrl_mcp.memory.evidence import Decision, decide, verdict
from memrl_mcp.memory.ledger import Ledger
from memrl_mcp.memory.listing import DEFAULT_PAGE, decode_cursor, encode_cursor, keyset_page
from memrl_mcp.memory.records import (
    ClaimedReport,
    RecallRecord,
    StepPayload,
    memory_detail,
    memory_view,
)
from memrl_mcp.memory.steps import StepMemory
from memrl_mcp.models import (
    AGENT,
    EffectiveSettings,
    EvidenceResult,
    ExperienceSource,
    ForgetResult,
    MemoryDetail,
    MemoryPage,
    MemoryView,
    Provenance,
    QEvent,
    QSummary,
    RecallPool,
    RecallResult,
    RecallState,
    ReportResult,
    RewardSource,
    SearchResult,
    Stats,
    StepAdviceResult,
    StepRecordView,
    StoreResult,
    TrajectoryResult,
)
from memrl_mcp.redaction import redacted, redacted_json
from memrl_mcp.requests import (
    EvidenceReport,
    ForgetRequest,
    ListQuery,
    MemoryEdit,
    NewExperience,
    OutcomeReport,
    RecallQuery,
    StatsQuery,
    StepQuery,
    TrajectoryReport,
)
from memrl_mcp.settings import GROUP_OF, Settings, TokenGrant, load_grants
from memrl_mcp.storage import DiskFullError, Range, Store, Words, new_id, open_store
from memrl_mcp.storage.migrations import migrate
from memrl_mcp.storage.quota import new_record_bytes
from memrl_mcp.validation import (
    CHECKS,
    DELTA,
    EPISODE_ID,
    FLAG,
    MAX_CHECK_TEXT,
    NAMESPACE,
    Q_WEIGHT,
    SORT,
    TEXT_QUERY,
    Check,
    K,
    SortKey,
    check_outcome,
    is_point_id,
    outcome_of,
    rewarded,
)

PURGE_INTERVAL_SECONDS = 3600.0  # how often a running server drops expired recalls and finishes stale reports
STALE_REPORT_SECONDS = 60.0  # a report still "applying" after this long was interrupted: finish it
log = logging.getLogger(__name__)


class MemoryService:
    """recall / report / store / forget / stats over one store, with MemRL's scoring and update.

    The constructor does no I/O; :meth:`open` builds the parts and finishes what a crash interrupted."""

    def __init__(
        self,
        settings: Settings,
        embedder: Embedder,
        store: Store,
        clock: Callable[[], float] = time.time,
        grants: Sequence[TokenGrant] | None = None,
    ) -> None:
        """``grants``: the tokens whose ``namespace_quota_mb`` set their namespaces' quotas (None: the settings'
        ``tokens``; :meth:`open` also reads ``tokens_file``)."""
        self.settings = settings
        self.embedder = embedder
        self.limits = settings.input_limits()
        self._store = store
        self.quotas = Quotas(
            store, settings.storage.namespace_quota_mb, settings.serving.tokens if grants is None else grants
        )
        self.scale = Scale.of(settings, embedder)
        self._ledger = Ledger(store, settings.learning, settings.limits.max_metadata_chars, self.scale.merge_threshold)
        self.clock = clock  # of every time the service keeps, and of the budgets of the server in front
        self._calls = threading.Condition()
        self._tally_lock = threading.Lock()
        self.rewards: Counter[RewardSource] = Counter()  # reports by what decided their reward (a metric)
        self.contradicted = 0  # reports whose agent claimed what the evidence or the user contradicted (a metric)
        self._active_calls = 0
        self._closed = False
        self._housekept_at = -float("inf")
        self.episodes = EpisodeMemory(store, self._ledger, embedder, settings, clock, self.quotas, self.scale)
        self.steps = StepMemory(store, self._ledger, settings.steps, embedder)
        self._reported = OldestBeyond(
            store, "episodes", {"status": "reported"}, "reported_at", settings.steps.max_reported_episodes
        )

    @classmethod
    def open(
        cls,
        settings: Settings,
        embedder: Embedder | None = None,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
        read_only: bool | None = None,
    ) -> Self:
        """Build the embedder and open the store the settings name (unless given), bring its schema up to date
        (:mod:`memrl_mcp.storage.migrations`), then recover: an embedded store is this process's alone, so whatever is
        still "applying" was interrupted and is finished now; on a Qdrant server another replica may be
        mid-report, so only reports left for a while are. A recovery refused for want of disk space is left for
        later (the next open, or the hourly housekeeping of recall): a full disk must not stop the reads.

        ``read_only`` (default: the settings' read-only profile) writes nothing: a store that needs a migration is
        refused, and what a crash interrupted is left for a writable server to finish (reads show it as it stands)."""
        read_only = settings.serving.read_only if read_only is None else read_only
        embedder = embedder or create_embedder(settings.embeddings, settings.similarity)
        grants = load_grants(settings.serving)
        store = store or open_store(settings.storage, embedder.dim, read_only)
        service = cls(settings, embedder, store, clock, grants)
        try:
            migrate(service._store, embedder.dim, read_only=read_only)
            if not read_only:
                try:
                    service.housekeeping(stale_after=STALE_REPORT_SECONDS if settings.storage.qdrant_url else 0.0)
                except DiskFullError as error:
                    log.warning("interrupted reports are left unfinished until there is room: %s", error)
        except BaseException:
            service.close()  # release the store (an embedded one is locked while open)
            raise
        return service

    @property
    def write_conflicts(self) -> int:
        """Optimistic writes that lost a race and were retried (a metric)."""
        return self._ledger.conflicts

    def close(self) -> None:
        """Refuse new calls, wait for the ones in flight, then close the store, which flushes what it holds; logged
        when it begins and when it has finished (what an operator stopping a server looks for)."""
        log.info("closing the memory store")
        with self._calls:
            self._closed = True
            self._calls.wait_for(lambda: self._active_calls == 0)
        self._store.close()
        log.info("memory store closed")

    @contextmanager
    def _call(self) -> Iterator[None]:
        with self._calls:
            if self._closed:
                raise MemoryRequestError("the memory is closed (the server is shutting down)")
            self._active_calls += 1
        try:
            yield
        finally:
            with self._calls:
                self._active_calls -= 1
                self._calls.notify_all()

    def housekeeping(self, stale_after: float) -> None:
        """Finish reports interrupted (``applying`` for ``stale_after`` seconds or more), drop expired recalls."""
        now = self.clock()
        for recall_id, payload in list(self._store.scroll("recalls", {"status": "applying"})):
            recall = RecallRecord.model_validate(payload)
            if recall.report is not None and now - recall.report.reported_at >= stale_after:
                self._ledger.redo(recall_id, recall)
        self.steps.housekeeping(now, stale_after)
        self._store.purge_recalls(expired_before=now)
        self._housekept_at = now

    def _embed_tasks(self, tasks: Sequence[str], namespace: str) -> np.ndarray:
        """Embed the tasks' canonical forms, in the namespace's partition of the cache (embeddings.embed_tasks)."""
        return embed_tasks(self.embedder, tasks, namespace)

    # -- recall ---------------------------------------------------------------------------------

    def search(self, query: RecallQuery, *, access: Access) -> SearchResult:
        """Phase A and B without a recall to report: read-only (a RAG baseline, a look-up)."""
        resolved = self._resolve(query, access)
        with self._call():
            return self.episodes.find(resolved, explore=True, also=_also(query, access)).result()

    def recall(self, query: RecallQuery, *, access: Access) -> RecallResult:
        """Phase A (similarity >= delta, top-k1), then Phase B (value-aware top-k2); logs the recall so that its
        report updates exactly these memories."""
        resolved = self._resolve(query, access)
        with self._call():
            if self.clock() - self._housekept_at > PURGE_INTERVAL_SECONDS:
                self.housekeeping(stale_after=STALE_REPORT_SECONDS)
            return self.episodes.recall(resolved, also=_also(query, access))

    def runs_model(self, query: RecallQuery, *, access: Access) -> bool:
        """Whether a recall of ``query`` by ``access`` would run the embedding model (its task's vector is not
        cached); a namespace refused runs nothing."""
        try:
            scope = self.namespace_of(query.namespace, access)
        except MemoryRequestError:
            return False
        return not cached(self.embedder, query.task, scope)

    def pool(self, query: RecallQuery, *, access: Access) -> RecallPool:
        """Phase A's whole pool with every number Phase B chose by, and the choice without exploration: what a
        recall of ``query`` would choose, shown and explained (read-only: no recall, no Q moves)."""
        resolved = self._resolve(query, access)
        with self._call():
            return self.episodes.find(resolved, explore=False, also=_also(query, access)).pool()

    def _resolve(self, query: RecallQuery, access: Access) -> RecallQuery:
        """The query checked, its namespace the caller's, every unset number the server's."""
        retrieval = self.settings.retrieval
        task = self._text("task", query.task)
        namespace = self.namespace_of(query.namespace, access)
        k1 = K.check("k1", retrieval.k1 if query.k1 is None else query.k1)
        k2 = K.check("k2", retrieval.k2 if query.k2 is None else query.k2)
        if k2 > k1:
            raise MemoryRequestError(f"k2: {k2} exceeds k1 ({k1}): Phase B picks among Phase A's candidates")
        q_weight = Q_WEIGHT.check("q_weight", retrieval.q_weight if query.q_weight is None else query.q_weight)
        delta = DELTA.check("delta", self.scale.delta if query.delta is None else query.delta)
        return RecallQuery(task, namespace, k1, k2, q_weight, delta)

    # -- report ---------------------------------------------------------------------------------

    def report(self, report: OutcomeReport, *, access: Access, provenance: Provenance = AGENT) -> ReportResult:
        """The recall's reward decided (:mod:`~memrl_mcp.memory.evidence`: the user's, else its evidence's, else the
        agent's own, which moves Q less), Q <- Q + rate (R - Q) on the memories the agent followed (default: all the
        recall returned), once; then the new experience stored, with the outcome decided. ``provenance``: who gave
        the reward (the user, when the tools asked) and wrote the experience, kept in the Q history and the memory.
        Asking the user or a model is the tools' part (:mod:`memrl_mcp.surface.feedback`)."""
        if report.trajectory is not None:
            raise MemoryRequestError("trajectory: only a model can write an experience from it: pass experience")
        recall_id = report.recall_id
        claim = None if report.reward is None else self.limits.reward.check("reward", report.reward)
        experience = None if report.experience is None else self._text("experience", report.experience)
        if report.outcome is not None:
            check_outcome(report.outcome)
        meta = self._metadata(report.metadata)
        provenance = _noted(provenance)
        with self._call():
            recall = self.episodes.reportable(recall_id, access)
            decision = self._decision(recall.evidence, claim, provenance)
            if decision is None:
                raise MemoryRequestError(
                    "reward: required: nothing recorded of this task decides it (record_evidence), so give it"
                )
            outcome = report.outcome if decision.source == "agent" else None
            outcome = outcome or outcome_of(decision.reward, self.settings.learning.reward_scale.neutral)
            kept = experience if outcome is not None else None  # no clear outcome: no procedure, no warning to keep
            claimed = ClaimedReport(
                claim=new_id(),
                reward=decision.reward,
                reported_at=self.clock(),
                experience=kept,
                outcome=outcome,
                metadata=meta,
                reward_source=decision.source,
                experience_source=provenance.experience,
                note=provenance.note,
                weight=decision.weight,
                claimed=decision.claimed,
                followed=self._followed(recall, report.followed),
                client=access.client_name,
            )
            with self.quotas.admit(recall.namespace, report_bytes(recall, kept, meta, self.embedder.dim)):
                result = self._ledger.report(recall_id, claimed, recall)
        self._counted(decision)
        if experience is not None and kept is None:
            result.message = "no clear outcome (a neutral reward): the experience was not stored"
        return result

    def _decision(self, evidence: Sequence[Check], claim: float | None, provenance: Provenance) -> Decision | None:
        """The reward of a recall whose evidence is ``evidence`` and whose report gave ``claim``: the user's when the
        tools asked them (``provenance``), else :func:`~memrl_mcp.memory.evidence.decide`."""
        if provenance.reward == "user" and claim is not None:
            return Decision(claim, "user")
        learning = self.settings.learning
        return decide(evidence, claim, learning.reward_scale, learning.model_reward_weight)

    def _followed(self, recall: RecallRecord, positions: Sequence[int] | None) -> list[str] | None:
        """The recalled memories the report says the agent followed (1 is the first recalled), by id."""
        if positions is None:
            return None
        count = len(recall.memory_ids)
        for position in positions:
            if not 1 <= position <= count:
                raise MemoryRequestError(
                    f"followed: {position} is not the number of a recalled memory (the recall returned {count})"
                )
        return [recall.memory_ids[position - 1] for position in dict.fromkeys(positions)]

    def _counted(self, decision: Decision) -> None:
        with self._tally_lock:
            self.rewards[decision.source] += 1
            self.contradicted += decision.contradicted

    def record_evidence(self, report: EvidenceReport, *, access: Access) -> EvidenceResult:
        """Add what happened in a recalled task to its recall (:mod:`~memrl_mcp.memory.evidence`). A pending recall
        gathers it for its report (``close``: reported now with the evidence's reward, when it says one); a reported
        one, within ``correction_window_seconds`` of its report, has its reward decided again, and corrected when
        the decision changed."""
        recall_id, learning = report.recall_id, self.settings.learning
        checks = [_redacted_check(check) for check in CHECKS.check("checks", report.checks)]
        with self._call():
            record = self.episodes.add_evidence(recall_id, access, checks, learning.correction_window_seconds)
            found = verdict(record.evidence)
            says = None if found is None else ("success" if found.succeeded else "failure")
            result = EvidenceResult(
                recall_id=recall_id,
                checks=len(record.evidence),
                evidence_says=says,
                evidence_source=None if found is None else found.source,
                message=f"{len(record.evidence)} checks held; the evidence says {says or 'nothing clear'}",
            )
            if record.status == "reported" and found is not None:
                result.report = self._corrected(recall_id, record)
            elif record.status == "pending" and report.close and found is not None:
                result.report = self._report_evidence(recall_id, record)
        if result.report is not None:
            result.message += f"; reported with reward {result.report.reward:g} ({result.report.reward_source})"
        return result

    def _report_evidence(self, recall_id: str, record: RecallRecord) -> ReportResult:
        """Report a pending recall with its evidence's reward (its task is over; nothing written of it)."""
        decision = self._decision(record.evidence, None, AGENT)
        assert decision is not None, "only a recall whose evidence says something is reported by it"
        claimed = ClaimedReport(
            claim=new_id(),
            reward=decision.reward,
            reported_at=self.clock(),
            experience=None,
            outcome=None,
            metadata={},
            reward_source=decision.source,
        )
        with self.quotas.admit(record.namespace, report_bytes(record, None, {}, self.embedder.dim)):
            result = self._ledger.report(recall_id, claimed, record)
        self._counted(decision)
        return result

    def _corrected(self, recall_id: str, record: RecallRecord) -> ReportResult | None:
        """A reported recall's reward decided again from all its evidence (the user the tools asked keeps the first
        word, later words of theirs win); the correction, or None when the decision is the one applied."""
        report = record.report
        assert report is not None
        asked = [Check(kind="user", passed=report.reward > self.settings.learning.reward_scale.neutral)]
        earlier = asked if report.reward_source == "user" else []
        claim = report.claimed if report.claimed is not None else report.reward
        decision = self._decision([*earlier, *record.evidence], claim, AGENT)
        if decision is None or (decision.reward, decision.source) == (report.reward, report.reward_source):
            return None
        corrected = report.model_copy(
            update={
                "reward": decision.reward,
                "reward_source": decision.source,
                "weight": decision.weight,
                "claimed": decision.claimed,
                "corrections": report.corrections + 1,
                "reported_at": self.clock(),
            }
        )
        with self.quotas.admit(record.namespace, report_bytes(record, None, {}, self.embedder.dim)):
            result = self._ledger.correct(recall_id, record, corrected)
        self._counted(decision)
        return result

    def reportable(self, recall_id: str, *, access: Access) -> PendingRecall:
        """The caller's recall if it can be reported now, and its memories: checked before anyone is asked."""
        with self._call():
            return self.episodes.pending(recall_id, access)

    def recall_state(self, recall_id: str, *, access: Access) -> RecallState:
        """Whether the caller's recall ``recall_id`` still waits for its report; another tenant's is unknown."""
        with self._call():
            record = self.episodes.record(recall_id, access)
        expired = record.status == "pending" and record.expires_at < self.clock()
        found = verdict(record.evidence)
        return RecallState(
            recall_id=recall_id,
            namespace=record.namespace,
            task=record.task,
            status="expired" if expired else record.status,
            memories=len(record.memory_ids),
            created_at=record.created_at,
            expires_at=record.expires_at,
            reward=record.report.reward if record.report else None,
            reward_source=record.report.reward_source if record.report else None,
            evidence=record.evidence,
            evidence_says=None if found is None else ("success" if found.succeeded else "failure"),
            evidence_source=None if found is None else found.source,
        )

    # -- the step memory (Rememberer) ----------------------------------------------------------

    def recall_step_advice(self, query: StepQuery, *, access: Access) -> StepAdviceResult:
        """Encouraged and discouraged actions for (task, observation), from the k best-matching step records.
        Read-only: nothing is logged (the trajectory report names its own steps)."""
        task = self._text("task", query.task)
        observation = self._text("observation", query.observation)
        k = K.check("k", self.settings.steps.step_k if query.k is None else query.k)
        namespace = self.namespace_of(query.namespace, access)
        with self._call():
            return self.steps.advise(task, observation, namespace, k, self.scale.step_delta)

    def report_trajectory(
        self, report: TrajectoryReport, *, access: Access, provenance: Provenance = AGENT
    ) -> TrajectoryResult:
        """Move every step's Q toward its n-step target, once per ``episode_id`` in the namespace; with
        ``recall_id``, also report that recall of the episode memory with the last step's reward, once.
        ``provenance``: who gave the last step's reward (the user's note goes with it)."""
        task = self._text("task", report.task)
        steps = report.steps
        plain = [_plain(step) for step in steps] if isinstance(steps, list | tuple) else steps
        checked = self.limits.steps.check("steps", plain)
        limits = self.settings.limits
        trajectory = [
            (redacted(o, limits.max_observation_chars), redacted(a, limits.max_action_chars), r)
            for o, a, r in rewarded(checked)
        ]
        provenance = _noted(provenance)
        episode_id = EPISODE_ID.check("episode_id", report.episode_id)
        recall_id = report.recall_id
        if recall_id is not None and not isinstance(recall_id, str):
            raise MemoryRequestError(f"recall_id: must be a string, got {type(recall_id).__name__}")
        namespace = self.namespace_of(report.namespace, access)
        with self._call():
            already = self.steps.applied(namespace, episode_id)
            if already is not None:
                return already
            added = trajectory_bytes(task, trajectory, self.embedder.dim)
            if recall_id is not None:
                added += report_bytes(self.episodes.reportable(recall_id, access), None, {}, self.embedder.dim)
            with self.quotas.admit(namespace, added):
                result = self.steps.report(task, trajectory, episode_id, namespace, recall_id, self.clock(), provenance)
            if not result.already_applied:
                self._reported.added(namespace)
            return result

    def applied_trajectory(self, report: TrajectoryReport, *, access: Access) -> TrajectoryResult | None:
        """What ``report`` answers if its episode was reported already (None: it was not): checked first."""
        episode_id = EPISODE_ID.check("episode_id", report.episode_id)
        namespace = self.namespace_of(report.namespace, access)
        with self._call():
            return self.steps.applied(namespace, episode_id)

    # -- store ----------------------------------------------------------------------------------

    def store_experience(
        self, new: NewExperience, *, access: Access, source: ExperienceSource = "agent"
    ) -> StoreResult:
        """Add a memory directly (seeding, imports), written by ``source``; a near twin of one outcome merges. The
        experience is the request's own: asking a model for one is the tools' part."""
        if new.experience is None:
            raise MemoryRequestError("experience: required (only a model can write one from a trajectory)")
        task = self._text("task", new.task)
        experience = self._text("experience", new.experience)
        namespace = self.namespace_of(new.namespace, access)
        outcome = check_outcome(new.outcome)
        q = None if new.q is None else self.limits.reward.check("q", new.q)
        meta = self._metadata(new.metadata)
        added = new_record_bytes(task, experience, meta, dims=self.embedder.dim)
        with self._call(), self.quotas.admit(namespace, added):
            return self.episodes.store(namespace, task, experience, outcome, q, meta, source, access.client_name)

    # -- forget, read, stats --------------------------------------------------------------------

    def forget(self, request: ForgetRequest, *, access: Access) -> ForgetResult:
        """Delete one memory by id, or every memory and recall of a namespace (exactly one of the two).

        A namespace's recalls go first, then its memories: a crash in between leaves memories (run forget
        again) but no recall whose report could bring the forgotten tasks back."""
        memory_id, namespace = request.memory_id, request.namespace
        if (memory_id is None) == (namespace is None):
            raise MemoryRequestError("give exactly one of memory_id (one memory) or namespace (all of it)")
        with self._call():
            if memory_id is not None:
                self._payload(memory_id, access)
                self._store.delete("memories", [memory_id])
                self._ledger.history.forget([memory_id])
                return ForgetResult(deleted=1)
            forgotten = self.namespace_of(namespace, access)
            where = {"namespace": forgotten}
            self._store.delete_namespace("recalls", forgotten)
            self._store.delete_namespace("episodes", forgotten)
            deleted = self._store.count("memories", where)
            self._store.delete_namespace("memories", forgotten)
            self._store.delete_namespace("history", forgotten)
            steps_deleted = self._store.count("steps", where)
            self._store.delete_namespace("steps", forgotten)
            return ForgetResult(deleted=deleted, steps_deleted=steps_deleted)

    def get(self, memory_id: str, *, access: Access) -> MemoryDetail:
        """One memory with the history of its Q."""
        payload = self._payload(memory_id, access)
        return memory_detail(memory_id, payload, self._ledger.history.events(memory_id, payload))

    def _payload(self, memory_id: str, access: Access) -> dict[str, Any]:
        """A memory as stored; another tenant's memory is as unknown as a missing one."""
        payload = self._store.get("memories", [memory_id]).get(memory_id) if is_point_id(memory_id) else None
        if payload is None or not access.allows(payload["namespace"]):
            raise MemoryRequestError(f"memory_id: no memory {memory_id!r}")
        return payload

    def stats(self, query: StatsQuery, *, access: Access) -> Stats:
        """Of one namespace, or of every namespace the caller may use: from the store's counts
        (:mod:`memrl_mcp.storage.tally`), not by reading every memory."""
        namespace = query.namespace
        where: dict[str, Any] = {}
        if namespace is not None:
            where["namespace"] = self.namespace_of(namespace, access)
        elif access.namespaces is not None:
            where["namespace"] = sorted(access.namespaces)
        chosen = where.get("namespace")
        counts = self._store.tally(None if chosen is None else [chosen] if isinstance(chosen, str) else chosen)
        return Stats(
            namespace=namespace,
            memories=counts.memories,
            successes=counts.successes,
            failures=counts.failures,
            q=QSummary.of(counts),
            visits=counts.visits,
            recalls_pending=self._store.count("recalls", {**where, "status": "pending"}),
            recalls_reported=self._store.count("recalls", {**where, "status": "reported"}),
            steps=self._store.count("steps", where),
            episodes_reported=self._store.count("episodes", {**where, "status": "reported"}),
        )

    def effective_settings(self) -> EffectiveSettings:
        """The constants recall and report use, the embedder's defaults applied (no secret, no tenant data)."""
        scale, z = self.scale, self.scale.z_similarity
        resolved = {"embedder": self.embedder.name, "delta": scale.delta, "merge_threshold": scale.merge_threshold}
        resolved |= {"sim_mean": z.mean, "sim_std": z.std, "step_delta": scale.step_delta}
        configured = {name: self.settings.value(name) for name in EffectiveSettings.model_fields if name in GROUP_OF}
        return EffectiveSettings.model_validate(configured | resolved)

    # -- list and correct -----------------------------------------------------------------------

    def list_memories(self, query: ListQuery, *, access: Access) -> MemoryPage:
        """One page of a namespace's memories (default: the caller's), filtered and sorted, keyset-paged
        (:mod:`memrl_mcp.memory.listing`). ``text``: full text, every word of it a word of the task or the
        experience (any order, any case)."""
        namespace = self.namespace_of(query.namespace, access)
        where: dict[str | tuple[str, ...], Any] = {"namespace": namespace}
        if query.outcome is not None:
            where["outcome"] = check_outcome(query.outcome)
        q_range = Range(
            gte=None if query.q_min is None else self.limits.reward.check("q_min", query.q_min),
            lte=None if query.q_max is None else self.limits.reward.check("q_max", query.q_max),
        )
        if q_range.gte is not None and q_range.lte is not None and q_range.gte > q_range.lte:
            raise MemoryRequestError(f"q_min: {q_range.gte:g} exceeds q_max ({q_range.lte:g})")
        if q_range != Range():
            where["q"] = q_range
        if query.text is not None:
            where[("task", "experience")] = Words(TEXT_QUERY.check("text", query.text))
        sort: SortKey = SORT.check("sort", query.sort)  # type: ignore[assignment]
        descending = FLAG.check("descending", query.descending)
        limit = self.limits.page.check(
            "limit", min(DEFAULT_PAGE, self.settings.limits.max_list_page) if query.limit is None else query.limit
        )
        after = None if query.cursor is None else decode_cursor(query.cursor, sort, descending)
        with self._call():
            rows = keyset_page(self._store, where, sort, descending, after, limit + 1)
            total = self._store.count("memories", where)
        page = [memory_view(memory_id, payload) for memory_id, payload in rows[:limit]]
        last_id, last = rows[limit - 1] if len(rows) > limit else (None, None)
        next_cursor = None if last is None else encode_cursor(sort, descending, float(last[sort]), str(last_id))
        return MemoryPage(namespace=namespace, total=total, memories=page, next_cursor=next_cursor)

    def update_memory(self, edit: MemoryEdit, *, access: Access, source: ExperienceSource = "agent") -> MemoryDetail:
        """Correct a memory: its experience (written by ``source``) and/or metadata, by store_experience's rules. Q
        and visits are learned, not edited: ``reset_q`` sets them back to Q_init and 0, recorded in the history.

        The edit is one conditional write (:meth:`Ledger.update_once`): a report folding a reward into the same
        memory at the same moment keeps its reward, and the edit keeps its text."""
        memory_id = edit.memory_id
        experience = None if edit.experience is None else self._text("experience", edit.experience)
        meta = None if edit.metadata is None else self._metadata(edit.metadata)
        reset = FLAG.check("reset_q", edit.reset_q)
        if experience is None and meta is None and not reset:
            raise MemoryRequestError("give at least one of experience, metadata or reset_q=true: nothing to change")
        learning = self.settings.learning
        with self._call():
            payload = self._payload(memory_id, access)
            namespace = payload["namespace"]
            now = self.clock()

            def corrected(m: Mapping[str, Any]) -> dict[str, Any]:
                update: dict[str, Any] = {"updated_at": now}
                if experience is not None:
                    update |= {"experience": experience, "experience_source": source, "client": access.client_name}
                if meta is not None:
                    update["metadata"] = meta
                if reset:
                    q_init = learning.q_init(m["outcome"])
                    event = QEvent(
                        at=now, event="reset", reward=None, q_before=float(m["q"]), q_after=q_init, recall_id=None
                    )
                    history = self._ledger.history.append(memory_id, m, event)
                    update |= {"q": q_init, "visits": 0, "last_reward": None, **history}
                return update

            with self.quotas.admit(namespace, edit_bytes(payload, experience, meta)):
                written = self._ledger.update_once(memory_id, f"edit:{new_id()}", corrected)
        if written is None:
            self._ledger.history.forget([memory_id])  # an attempt may have copied its tail before it was deleted
            raise MemoryRequestError(f"memory_id: no memory {memory_id!r} (it was forgotten meanwhile)")
        memory = {**written.before, **(written.update or {})}
        return memory_detail(memory_id, memory, self._ledger.history.events(memory_id, memory))

    # -- the operator's: metrics and backups (no caller, every namespace) -------------------------

    def count(self) -> int:
        """Memories stored, in every namespace (a metric)."""
        return self._store.count("memories")

    def memories(self) -> Iterator[MemoryView]:
        """Every memory, in storage order: what an export writes."""
        for memory_id, payload in self._store.scroll("memories"):
            yield memory_view(memory_id, payload)

    def step_records(self) -> Iterator[StepRecordView]:
        """Every step record, in storage order: what an export writes after the memories."""
        for record_id, payload in self._store.scroll("steps"):
            yield StepPayload.model_validate(payload).view(record_id)

    @contextmanager
    def backup(self) -> Iterator[Store]:
        """The store itself, for a backup that reads or writes records exactly as stored (an import,
        :mod:`memrl_mcp.memory.archive`): a call in flight, which :meth:`close` waits for. Nothing is checked or
        admitted here: that is the backup's part."""
        with self._call():
            yield self._store

    # -- validation -----------------------------------------------------------------------------

    def namespace_of(self, namespace: str | None, access: Access) -> str:
        """The namespace a call means (``None``: the caller's default, else the setting's), if the caller may use it."""
        if namespace is None:
            namespace = access.default or self.settings.namespaces.namespace
        namespace = NAMESPACE.check("namespace", namespace)
        if not access.allows(namespace):
            raise MemoryRequestError(f"namespace: {namespace!r} is not one of the namespaces {access.holder} may use")
        return namespace

    def _metadata(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        """The metadata checked, every string of it redacted (:func:`~memrl_mcp.redaction.redacted_json`)."""
        if metadata is None:
            return {}
        checked = self.limits.metadata.check("metadata", dict(metadata) if isinstance(metadata, Mapping) else metadata)
        shown: dict[str, Any] = redacted_json(checked)
        return shown

    def _text(self, field: str, text: str) -> str:
        """A task, an experience or an observation checked against its limit, then without its secrets and its
        ``<private>`` parts (:func:`~memrl_mcp.redaction.redacted`), within the same limit."""
        limits = self.settings.limits
        rule, chars = {
            "task": (self.limits.task, limits.max_task_chars),
            "experience": (self.limits.experience, limits.max_experience_chars),
            "observation": (self.limits.observation, limits.max_observation_chars),
        }[field]
        return redacted(rule.check(field, text), chars)


def _also(query: RecallQuery, access: Access) -> tuple[str, ...]:
    """The namespaces a recall of ``query`` searches besides its own: when it is its caller's default, those its
    caller's recalls search too (:attr:`Access.also_recalled`: a project's earlier namespace) that it may use."""
    if query.namespace is not None and query.namespace != access.default:
        return ()
    return tuple(namespace for namespace in access.also_recalled if access.allows(namespace))


def _noted(provenance: Provenance) -> Provenance:
    """``provenance`` with the user's note redacted (it is kept in the Q history)."""
    if provenance.note is None:
        return provenance
    return dataclasses.replace(provenance, note=redacted(provenance.note))


def _redacted_check(check: Check) -> Check:
    """A check with its command and the user's words redacted (a recall's evidence is stored with it)."""
    named = {"command": check.command, "said": check.said}
    texts = {name: redacted(value, MAX_CHECK_TEXT) for name, value in named.items() if value is not None}
    return check.model_copy(update=texts) if texts else check


def _plain(step: Any) -> Any:
    """A step as the rules check it: a dict (the tools hand over their parsed model, Python callers dicts)."""
    return step.model_dump() if isinstance(step, BaseModel) else step
