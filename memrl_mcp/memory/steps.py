"""The step memory: Rememberer's experience memory (arXiv 2306.07929) beside MemRL's episode memory.

The episode memory learns one utility per remembered episode from one terminal reward; it cannot tell which decision
of a long episode went wrong. The step memory learns per decision. What a record holds, how a query matches it
(:func:`~memrl_mcp.memory.algorithm.step_similarity`), how a reported trajectory's n-step targets are made
(:func:`~memrl_mcp.memory.algorithm.episode_targets`: last step first by default, so the final reward reaches every
step) and what the capacities drop (:func:`~memrl_mcp.memory.algorithm.record_to_evict`, ``step_max_actions``):
docs/algorithm.md, "How the step memory learns". Here: a record's id derives from (namespace, task, observation),
whitespace folded and the task's trailing full stop dropped, so the same step always lands on the same record; its
vector is the task's and the observation's embeddings side by side (a long observation embedded as its head and
tail). The targets are computed once, against the memory as it stood when the report arrived, and written into the
claim, so a redo after a crash applies the same. Replicas writing at once may overshoot the record capacity by one
per writer.

**The closest pair without the matrix.** The paper's code keeps the similarity matrix of all stored records; a store
has no such matrix, and building it read every record of the namespace and took 500x500 products per new record at
the capacity, for every new step of a report (docs/performance.md). Instead each record stores its nearest other
record (``nearest``, an indexed number, and ``nearest_id``), looked up after its insert, and again when that
neighbour turns out to be gone. Every pair of stored records then has one record, the later one looked up, whose
``nearest`` is at least the pair's similarity, and each ``nearest`` is the similarity of a real pair unless its
neighbour was deleted since. So the record with the highest ``nearest`` whose neighbour still exists holds the
closest pair: an ordered look-up of one record, one read of its neighbour, and a re-look-up for each stale one met
on the way. A new record costs a few reads at any capacity (perf/step_capacity.py). A record never looked up
(imported, or stored before schema version 3) or looked up under another ``step_observation_weight`` is looked up
when its namespace next needs the pair: once, reading every record.

**Once per episode.** ``episode_id`` is the client's once-only key. The report inserts an episode record under an id
derived from (namespace, episode_id), insert-only, carrying a fresh claim id and every step with its target; the
record read back names the one report that proceeds (a duplicate, concurrent or later, changes nothing and is told
so). The record is the redo log, written whole once: each step is applied once to its record (operation
``step:<claim>:<t>`` of :meth:`~memrl_mcp.memory.ledger.Ledger.update_once`, or the operation id a new record is
inserted with), and the progress has a small point of its own (:class:`~memrl_mcp.memory.records.EpisodeProgress`),
written before each step's write with what that write does, so a redo counts the step it finds landed as its own run
would have. Then the episode is marked ``reported`` (its steps dropped, its result kept) and the progress point
deleted. Whoever runs the redo (the reporter, or the next server to open the store after a crash) gets the same
result, and redoes only the steps not yet checkpointed. With a ``recall_id``, the redo also applies the episode
memory's report of that recall with the last step's reward, under a claim id derived from the episode, so it too
happens once. A namespace remembers its newest ``max_reported_episodes`` reported episodes (memory module): a report
of an older episode id is a new episode, applied again. A namespace being forgotten deletes its episode records
first: a report whose record is gone stops (:class:`EpisodeGoneError`) and removes what it had just created.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memrl_mcp.embeddings import Embedder, embed_scoped, embed_tasks
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory import algorithm
from memrl_mcp.memory.ledger import Ledger
from memrl_mcp.memory.records import (
    ClaimedReport,
    EpisodeProgress,
    EpisodeRecord,
    ReportedStep,
    StepOutcome,
    StepPayload,
    applied_ids,
    canonical_text,
    episode_key,
    operation_token,
    progress_key,
    step_id,
    was_applied,
)
from memrl_mcp.models import (
    ActionView,
    MatchedStep,
    Provenance,
    ReportResult,
    StepAdvice,
    StepAdviceResult,
    StepChange,
    StepRecordView,
    TrajectoryResult,
)
from memrl_mcp.settings import StepSettings
from memrl_mcp.storage import PLACEHOLDER, Condition, Point, Range, Store
from memrl_mcp.storage.numbers import kept_float


class EpisodeGoneError(MemoryRequestError):
    """The episode being applied was deleted mid-report: its namespace was forgotten."""

    def __init__(self, episode_id: str) -> None:
        super().__init__(
            f"episode_id: episode {episode_id!r} is gone (its namespace was forgotten) while it was being applied; "
            "nothing more was written"
        )


@dataclass(frozen=True)
class Nearest:
    """A record's nearest other record in its namespace when looked up, and the observation weight of that
    similarity (the ``nearest*`` fields of :class:`~memrl_mcp.memory.records.StepPayload`; id and similarity None: the
    namespace had no other record)."""

    id: str | None
    similarity: float | None
    weight: float

    def fields(self) -> dict[str, Any]:
        return {"nearest": self.similarity, "nearest_id": self.id, "nearest_weight": self.weight}


@dataclass(frozen=True)
class Room:
    """The record capacity's decision for a new record: its nearest stored record, whether it is stored, and the
    record evicted first to make room for it (None: there was room)."""

    nearest: Nearest
    stored: bool
    evict: str | None = None


def embedded_text(observation: str, max_chars: int) -> str:
    """What of an observation is embedded: all of it when short, else its head and tail, half each (room
    descriptions say where the agent is at the head; shell output says what happened at the tail)."""
    text = canonical_text(observation)
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]} … {text[-half:]}"


class StepMemory:
    """Advice and trajectory reports over the ``steps`` and ``episodes`` tables. Callers are checked by the
    :class:`~memrl_mcp.memory.service.MemoryService` that owns it: namespaces here are already the caller's."""

    def __init__(self, store: Store, ledger: Ledger, rules: StepSettings, embedder: Embedder) -> None:
        self._store = store
        self._ledger = ledger
        self.rules = rules
        self._embedder = embedder
        self._nearest_weight = kept_float(rules.step_observation_weight)  # as stored, so that it compares equal
        self._rules = algorithm.StepRules(
            rules.step_n,
            rules.step_gamma,
            rules.step_update,
            rules.step_learning_rate,
            rules.step_max_actions,
            rules.step_order,
        )

    # -- vectors ------------------------------------------------------------------------------------

    def _tasks(self, tasks: Sequence[str], namespace: str) -> np.ndarray:
        return embed_tasks(self._embedder, tasks, namespace)

    def _observations(self, observations: Sequence[str], namespace: str) -> np.ndarray:
        texts = [embedded_text(o, self.rules.step_embed_chars) for o in observations]
        return embed_scoped(self._embedder, texts, namespace)

    def _query(self, task: np.ndarray, observation: np.ndarray) -> np.ndarray:
        """Dot product with a stored ``[g, o]`` = (1 - w) cos(task) + w cos(observation)."""
        w = self.rules.step_observation_weight
        return np.concatenate([(1.0 - w) * task, w * observation])

    # -- advice -------------------------------------------------------------------------------------

    def advise(self, task: str, observation: str, namespace: str, k: int, delta: float) -> StepAdviceResult:
        """The k records matching (task, observation) best (match >= delta), and the action advice they give."""
        task_vector = self._tasks([task], namespace)[0]
        observation_vector = self._observations([observation], namespace)[0]
        query = self._query(task_vector, observation_vector)
        hits = self._store.search(query, k, delta, {"namespace": namespace}, table="steps", with_vectors=True)
        records = []
        for hit in hits:
            assert hit.vector is not None
            dim = hit.vector.size // 2
            payload = StepPayload.model_validate(hit.payload)
            records.append(
                MatchedStep(
                    **payload.view(hit.id).model_dump(),
                    similarity=hit.similarity,
                    task_similarity=float(hit.vector[:dim] @ task_vector),
                    observation_similarity=float(hit.vector[dim:] @ observation_vector),
                )
            )
        values = [[_value(a) for a in record.actions] for record in records]
        encouraged, discouraged = algorithm.action_advice(values, self.rules.step_advice_threshold)
        return StepAdviceResult(
            namespace=namespace,
            encouraged=[StepAdvice(action=a.action, q=a.q, visits=a.visits) for a in encouraged],
            discouraged=[StepAdvice(action=a.action, q=a.q, visits=a.visits) for a in discouraged],
            advice_threshold=self.rules.step_advice_threshold,
            records=records,
        )

    # -- report -------------------------------------------------------------------------------------

    def applied(self, namespace: str, episode_id: str) -> TrajectoryResult | None:
        """The answer to a report of an episode already claimed (None: never reported in this namespace)."""
        key = episode_key(namespace, episode_id)
        payload = self._store.get("episodes", [key]).get(key)
        return None if payload is None else self._already(key, EpisodeRecord.model_validate(payload))

    def _already(self, key: str, record: EpisodeRecord) -> TrajectoryResult:
        """A report of an episode someone claimed before: nothing changes; say what was (or is being) applied."""
        if record.status == "reported" and record.result is not None:
            return TrajectoryResult(
                **record.result,
                already_applied=True,
                changes=[],
                message=f"episode_id {record.episode_id!r} was already reported and applied (its steps once: "
                f"{record.result['updated']} Q values); nothing was changed now",
            )
        progress = self._progress(key, record)
        return TrajectoryResult(
            episode_id=record.episode_id,
            namespace=record.namespace,
            already_applied=True,
            steps=len(record.steps),
            updated=progress.done - progress.dropped,
            created=progress.created,
            merged=progress.merged,
            dropped=progress.dropped,
            changes=[],
            message=f"episode_id {record.episode_id!r} is being applied by an earlier report ({progress.done} of "
            f"{len(record.steps)} steps so far; an interrupted one is finished by the server); nothing was changed "
            "now",
        )

    def report(
        self,
        task: str,
        steps: Sequence[tuple[str, str, float]],
        episode_id: str,
        namespace: str,
        recall_id: str | None,
        now: float,
        provenance: Provenance,
    ) -> TrajectoryResult:
        """Compute every step's target, claim the episode, then apply it (module docstring)."""
        taken = [
            algorithm.TakenStep(step_id(namespace, task, observation), canonical_text(action), reward)
            for observation, action, reward in steps
        ]
        stored, borrowed = self._known(task, [observation for observation, _, _ in steps], taken, namespace)
        targets = algorithm.episode_targets(taken, self._rules, stored, borrowed)
        key = episode_key(namespace, episode_id)
        record = EpisodeRecord(
            namespace=namespace,
            episode_id=episode_id,
            task=task,
            claim=str(uuid.uuid4()),
            status="applying",
            reported_at=now,
            recall_id=recall_id,
            reward_source=provenance.reward,
            note=provenance.note,
            steps=[
                ReportedStep(observation=o, action=canonical_text(a), reward=r, target=g)
                for (o, a, r), g in zip(steps, targets, strict=True)
            ],
        )
        self._store.insert("episodes", Point(key, PLACEHOLDER, record.model_dump()))
        written = self._store.get("episodes", [key]).get(key)
        if written is None:
            raise EpisodeGoneError(episode_id)
        claimed = EpisodeRecord.model_validate(written)
        if claimed.claim != record.claim:
            return self._already(key, claimed)
        fresh = EpisodeProgress(
            namespace=namespace, claim=record.claim, episode=key, reported_at=now, operations=f"step:{record.claim}"
        )
        return self.redo(key, claimed, fresh)

    def _known(
        self, task: str, observations: Sequence[str], taken: Sequence[algorithm.TakenStep], namespace: str
    ) -> tuple[dict[str, list[algorithm.ActionValue]], list[float | None]]:
        """What the memory knows before the episode: the actions of each step's record (one read of them all), and
        for each observation some step's tail reads (o_j, j >= n) that has no record, max_a Q of the nearest record
        matching at least ``step_match_threshold`` (None: none does)."""
        found = self._store.get("steps", sorted({step.record for step in taken}))
        stored = {
            key: [_value(ActionView.model_validate(a)) for a in payload["actions"]] for key, payload in found.items()
        }
        borrowed: list[float | None] = [None] * len(taken)
        missing = [j for j in range(self.rules.step_n, len(taken)) if taken[j].record not in found]
        if missing:
            task_vector = self._tasks([task], namespace)[0]
            vectors = self._observations([observations[j] for j in missing], namespace)
            for j, vector in zip(missing, vectors, strict=True):
                query = self._query(task_vector, vector)
                hits = self._store.search(query, 1, self.rules.step_match_threshold, {"namespace": namespace}, "steps")
                borrowed[j] = _state_value(hits[0].payload) if hits else None
        return stored, borrowed

    def _progress(self, key: str, record: EpisodeRecord) -> EpisodeProgress:
        """How far the redo of a claimed episode got. Without a progress point, no step of this claim was checkpointed:
        its report was killed before its first step, or claimed before schema version 3, which counted the steps
        done in the episode record and named their operations after the record's id."""
        payload = self._store.get("episodes", [progress_key(record.claim)]).get(progress_key(record.claim))
        if payload is not None:
            return EpisodeProgress.model_validate(payload)
        return EpisodeProgress(
            namespace=record.namespace,
            claim=record.claim,
            episode=key,
            reported_at=record.reported_at,
            operations=f"step:{key}",
            done=record.done,
        )

    def _checkpoint(self, progress: EpisodeProgress, pending: StepOutcome) -> None:
        """Write the progress, and what step ``progress.done`` does if the write about to be attempted lands."""
        point = Point(
            progress_key(progress.claim), PLACEHOLDER, progress.model_copy(update={"pending": pending}).model_dump()
        )
        self._store.upsert("episodes", [point])

    def redo(self, key: str, record: EpisodeRecord, progress: EpisodeProgress) -> TrajectoryResult:
        """Apply a claimed episode from ``progress`` on: each step once, then the recall, then ``reported``."""
        changes: list[StepChange] = []
        for t in range(progress.done, len(record.steps)):
            did, change = self._apply_step(key, record, t, progress)
            progress = progress.after(did)
            if change is not None:
                changes.append(change)
        outcome: ReportResult | None = None
        outcome_error: str | None = None
        if record.recall_id is not None:
            report = ClaimedReport(
                claim=str(uuid.uuid5(uuid.NAMESPACE_URL, f"memrl-episode-outcome:{key}")),
                reward=record.steps[-1].reward,
                reported_at=record.reported_at,
                experience=None,
                outcome=None,
                metadata={},
                reward_source=record.reward_source,
                note=record.note,
            )
            try:
                outcome = self._ledger.report(record.recall_id, report)
            except MemoryRequestError as error:
                outcome_error = str(error)
        steps, created, merged, dropped = len(record.steps), progress.created, progress.merged, progress.dropped
        result = TrajectoryResult(
            episode_id=record.episode_id,
            namespace=record.namespace,
            already_applied=False,
            reward_source=record.reward_source,
            steps=steps,
            updated=steps - dropped,
            created=created,
            merged=merged,
            dropped=dropped,
            changes=changes,
            outcome=outcome,
            outcome_error=outcome_error,
            message=f"applied episode {record.episode_id!r}: {steps - dropped} of {steps} step Q values updated, "
            f"{created} new records, {merged} merged into actions tried before, {dropped} dropped (memory full)",
        )
        summary = result.model_dump(exclude={"changes", "outcome", "already_applied", "message"})
        self._store.set_payload_if(
            "episodes",
            key,
            {"status": "reported", "task": "", "steps": [], "done": steps, "result": summary},
            {"claim": record.claim, "status": "applying"},
        )
        self._store.delete("episodes", [progress_key(record.claim)])
        return result

    def _apply_step(
        self, key: str, record: EpisodeRecord, t: int, progress: EpisodeProgress
    ) -> tuple[StepOutcome, StepChange | None]:
        """Fold step t into its record, creating the record if needed. The change is None when the step was not
        stored, or when an earlier run of this redo had applied it already (what that run did is ``pending``)."""
        step = record.steps[t]
        record_id = step_id(record.namespace, record.task, step.observation)
        operation = f"{progress.operations}:{t}"
        folded: list[tuple[algorithm.ActionValue | None, algorithm.ActionValue]] = []  # the attempt that landed

        def fold(payload: Any) -> dict[str, Any]:
            actions = [_value(ActionView.model_validate(a)) for a in payload["actions"]]
            old = next((a for a in actions if a.action == step.action), None)
            new = algorithm.update_action_value(
                old, step.action, step.target, step.reward, self.rules.step_update, self.rules.step_learning_rate
            )
            folded.append((old, new))
            self._checkpoint(progress, "added" if old is None else "merged")
            actions = [new if a is old else a for a in actions] + ([] if old else [new])
            kept = algorithm.prune_actions(actions, self.rules.step_max_actions)
            return {"actions": [_view(a).model_dump() for a in kept], "updated_at": record.reported_at}

        written = self._ledger.update_once(record_id, operation, fold, table="steps")
        if written is None:
            created = self._create(key, record, t, progress, record_id, operation)
            if created is not None:
                return created
            written = self._ledger.update_once(record_id, operation, fold, table="steps")
            if written is None:  # made by a concurrent report, and evicted by another at once
                return "dropped", None
        if written.update is None:  # landed in a run killed before its checkpoint, which said what it does
            return progress.pending or "added", None  # (a report claimed before version 3 did not say)
        old, new = folded[-1]
        change = StepChange(
            step=t,
            record_id=record_id,
            action=step.action,
            target=step.target,
            q_before=None if old is None else old.q,
            q_after=new.q,
            visits=new.visits,
            kept=any(a["action"] == step.action for a in written.update["actions"]),
        )
        return "added" if old is None else "merged", change

    def _create(
        self, key: str, record: EpisodeRecord, t: int, progress: EpisodeProgress, record_id: str, operation: str
    ) -> tuple[StepOutcome, StepChange | None] | None:
        """Make step t's record with the step folded in (one write): "dropped" when the memory is full and the
        record is the one to drop; None when a concurrent report made the record first."""
        step = record.steps[t]
        task_vector = self._tasks([record.task], record.namespace)[0]
        observation_vector = self._observations([step.observation], record.namespace)[0]
        vector = np.concatenate([task_vector, observation_vector])
        nearest = self._make_room(record.namespace, vector)
        if nearest is None:
            return "dropped", None
        new = algorithm.update_action_value(
            None, step.action, step.target, step.reward, self.rules.step_update, self.rules.step_learning_rate
        )
        payload = StepPayload(
            namespace=record.namespace,
            task=record.task,
            observation=step.observation,
            actions=[_view(new)],
            created_at=record.reported_at,
            updated_at=record.reported_at,
            applied=[operation_token(operation)],
            **nearest.fields(),
        )
        self._checkpoint(progress, "created")
        self._store.insert("steps", Point(record_id, vector, payload.model_dump()))
        if self._store.get_vector("episodes", key) is None:  # forgotten between the claim and this insert
            self._store.delete("steps", [record_id])
            self._store.delete("episodes", [progress_key(record.claim)])
            raise EpisodeGoneError(record.episode_id)
        stored = self._store.get("steps", [record_id]).get(record_id)
        if stored is None or not was_applied(applied_ids(stored), operation):
            return None
        self._recheck_nearest(record.namespace, record_id, vector, nearest)
        change = StepChange(
            step=t,
            record_id=record_id,
            action=step.action,
            target=step.target,
            q_before=None,
            q_after=new.q,
            visits=new.visits,
            kept=True,
        )
        return "created", change

    # -- the record capacity ------------------------------------------------------------------------

    def _nearest(self, namespace: str, vector: np.ndarray, record_id: str | None = None) -> Nearest:
        """The nearest record of the namespace to a stored-form ``vector`` (other than ``record_id``)."""
        dim = vector.size // 2
        hits = self._store.search(self._query(vector[:dim], vector[dim:]), 2, -1.0, {"namespace": namespace}, "steps")
        other = next((hit for hit in hits if hit.id != record_id), None)
        weight = self._nearest_weight
        return Nearest(None, None, weight) if other is None else Nearest(other.id, other.similarity, weight)

    def _look_up(self, namespace: str, record_id: str, vector: np.ndarray | None = None) -> None:
        """Store a record's nearest neighbour as it is now."""
        vector = self._store.get_vector("steps", record_id) if vector is None else vector
        if vector is not None:
            nearest = self._nearest(namespace, vector, record_id)
            self._store.set_payload_if("steps", record_id, nearest.fields(), {"namespace": namespace})

    def _recheck_nearest(self, namespace: str, record_id: str, vector: np.ndarray, stored: Nearest) -> None:
        """After a record's insert: a record inserted meanwhile by a concurrent report may be nearer than the one
        looked up before (each of the two may have missed the other); the later of two inserts sees both."""
        nearest = self._nearest(namespace, vector, record_id)
        if nearest.id != stored.id:  # the same one: the same similarity, but for rounding
            self._store.set_payload_if("steps", record_id, nearest.fields(), {"namespace": namespace})

    def _make_room(self, namespace: str, vector: np.ndarray) -> Nearest | None:
        """Before a new record: its nearest stored record, after making room (:meth:`room`); None when the new
        record is the one to drop."""
        room = self.room(namespace, vector)
        if not room.stored:
            return None
        if room.evict is not None:
            self._store.delete("steps", [room.evict])
        return room.nearest  # if it names the evicted record, the check after the insert finds the new nearest

    def room(self, namespace: str, vector: np.ndarray) -> Room:
        """What the record capacity decides for a new record of ``vector`` (stored form): below the capacity it is
        stored; at it, :func:`~memrl_mcp.memory.algorithm.record_to_evict` decides, reading a few records (module
        docstring)."""
        nearest = self._nearest(namespace, vector)
        records = self._store.count("steps", {"namespace": namespace})
        if records < self.rules.step_max_records or nearest.similarity is None:
            return Room(nearest, stored=True)
        closest = self._closest_pair(namespace, records)
        if closest is None:
            return Room(nearest, stored=True)
        pair, similarity = closest
        victim = algorithm.record_to_evict(nearest.similarity, pair, similarity)
        return Room(nearest, stored=victim is not None, evict=victim)

    def _closest_pair(
        self, namespace: str, records: int
    ) -> tuple[tuple[algorithm.StoredRecord, algorithm.StoredRecord], float] | None:
        """The two records of the namespace most similar to each other: the one whose nearest neighbour is nearest
        (an ordered look-up of the indexed ``nearest``), and that neighbour (module docstring, "Capacities")."""
        where: dict[str, Condition] = {"namespace": namespace}
        weight = self._nearest_weight
        if self._store.count("steps", {**where, "nearest_weight": Range(gte=weight, lte=weight)}) < records:
            # Records never looked up (imported, stored before version 3) or with another observation weight: once.
            for record_id, vector, payload in list(self._store.vectors("steps", where, ("nearest_weight",))):
                if payload.get("nearest_weight") != weight:
                    self._look_up(namespace, record_id, vector)
        while True:
            top = self._store.ordered("steps", where, "nearest", descending=True, limit=1)
            if not top:
                return None
            first_id, first = top[0]
            second_id = first["nearest_id"]
            second = self._store.get("steps", [second_id]).get(second_id)
            if second is not None:
                pair = (
                    algorithm.StoredRecord(first_id, _samples(first)),
                    algorithm.StoredRecord(second_id, _samples(second)),
                )
                return pair, float(first["nearest"])
            self._look_up(namespace, first_id)  # its neighbour was evicted or deleted since

    # -- backups ------------------------------------------------------------------------------------

    def points(self, namespace: str, records: Sequence[StepRecordView]) -> list[Point]:
        """The step records of ``namespace`` as stored, exactly as given, their texts embedded (an import)."""
        tasks = self._tasks([r.task for r in records], namespace)
        observations = self._observations([r.observation for r in records], namespace)
        return [
            Point(r.id, np.concatenate([task, observation]), StepPayload(**r.model_dump(exclude={"id"})).model_dump())
            for r, task, observation in zip(records, tasks, observations, strict=True)
        ]

    # -- housekeeping -------------------------------------------------------------------------------

    def housekeeping(self, now: float, stale_after: float) -> None:
        """Finish the episodes whose report was interrupted (``applying`` for ``stale_after`` seconds or more), then
        drop the progress points such a report left behind (killed between ``reported`` and their delete, or
        written after their namespace was forgotten)."""
        for key, payload in list(self._store.scroll("episodes", {"status": "applying"})):
            record = EpisodeRecord.model_validate(payload)
            if now - record.reported_at >= stale_after:
                try:
                    self.redo(key, record, self._progress(key, record))
                except EpisodeGoneError:
                    continue
        for progress_id, payload in list(self._store.scroll("episodes", {"status": "progress"})):
            progress = EpisodeProgress.model_validate(payload)
            if now - progress.reported_at >= stale_after:
                episode = self._store.get("episodes", [progress.episode]).get(progress.episode)
                if episode is None or episode["claim"] != progress.claim or episode["status"] != "applying":
                    self._store.delete("episodes", [progress_id])


def _value(view: ActionView) -> algorithm.ActionValue:
    return algorithm.ActionValue(action=view.action, q=view.q, visits=view.visits, reward=view.reward)


def _view(value: algorithm.ActionValue) -> ActionView:
    return ActionView(action=value.action, q=value.q, visits=value.visits, reward=value.reward)


def _samples(payload: dict[str, Any]) -> int:
    """A record's samples: the visits of all its actions."""
    return sum(int(a["visits"]) for a in payload.get("actions", []))


def _state_value(payload: dict[str, Any]) -> float | None:
    return algorithm.state_value([_value(ActionView.model_validate(a)) for a in payload.get("actions", [])])
