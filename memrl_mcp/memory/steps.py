"""The step memory: Rememberer's experience memory (arXiv 2306.07929) beside MemRL's episode memory.

The episode memory learns one utility per remembered episode from one terminal reward; it cannot tell which
decision of a long episode went wrong. The step memory learns per decision:

- **Records.** One per (namespace, task, observation), under an id derived from the three (whitespace folded,
  the task's trailing full stop dropped), so the same step always lands on the same record. A record holds the
  actions tried there, each with Q(task, observation, action), its visits and its mean immediate reward.
- **Matching.** A record's vector is the task's and the observation's embeddings side by side; a query scores
  ``(1 - w) sim(task) + w sim(observation)`` (:func:`~memrl_mcp.memory.algorithm.step_similarity`; w =
  ``step_observation_weight``). A long observation is embedded as its head and tail (the embedder reads about
  512 characters); the whole text still keys the record.
- **Learning.** A reported trajectory moves each step's Q toward its n-step bootstrapped target (algorithm
  module). The tail max_a Q(task, o_{t+n}, a) comes from the record of o_{t+n} itself, else from the nearest
  record matching at least ``step_match_threshold``, else it is zero; the targets are computed against the memory
  as it stood when the report arrived, and written into the claim, so a redo after a crash applies the same.
- **Capacities.** ``step_max_actions`` per record (the lowest mean reward goes) and ``step_max_records`` per
  namespace (:func:`~memrl_mcp.memory.algorithm.record_to_evict`: the most redundant of the new record and the two
  closest stored ones goes). Replicas writing at once may overshoot the record capacity by one per writer.

**Once per episode.** ``episode_id`` is the client's once-only key. The report inserts an episode record under an
id derived from (namespace, episode_id), insert-only, carrying a fresh claim id and every step with its target;
the record read back names the one report that proceeds (a duplicate, concurrent or later, changes nothing and
is told so). The record is the redo log: each step is applied once to its record (operation ``step:<episode>:<t>``
of :meth:`~memrl_mcp.memory.ledger.Ledger.update_once`), progress is checkpointed in ``done``, then the episode is
marked ``reported`` (its steps dropped, its result kept). Whoever runs the redo (the reporter, or the next server
to open the store after a crash) gets the same result. With a ``recall_id``, the redo also applies the episode
memory's report of that recall with the last step's reward, under a claim id derived from the episode, so it
too happens once. A namespace being forgotten deletes its episode records first: a report whose record is gone
stops (:class:`EpisodeGone`) and removes what it had just created.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from memrl_mcp.embeddings import Embedder, embed_scoped, embed_tasks
from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory import algorithm
from memrl_mcp.memory.ledger import Ledger
from memrl_mcp.memory.records import (
    ClaimedReport,
    EpisodeRecord,
    ReportedStep,
    StepPayload,
    canonical_text,
    episode_key,
    step_id,
)
from memrl_mcp.models import (
    ActionView,
    MatchedStep,
    StepAdvice,
    StepAdviceResult,
    StepChange,
    StepRecordView,
    TrajectoryResult,
)
from memrl_mcp.settings import StepSettings
from memrl_mcp.storage import PLACEHOLDER, Point, Store


class EpisodeGone(MemoryRequestError):
    """The episode being applied was deleted mid-report: its namespace was forgotten."""

    def __init__(self, episode_id: str) -> None:
        super().__init__(
            f"episode_id: episode {episode_id!r} is gone (its namespace was forgotten) while it was being applied; "
            "nothing more was written"
        )


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
        payload = self._store.get("episodes", [episode_key(namespace, episode_id)])
        record = next(iter(payload.values()), None)
        return None if record is None else _already(EpisodeRecord.model_validate(record))

    def report(
        self,
        task: str,
        steps: Sequence[tuple[str, str, float]],
        episode_id: str,
        namespace: str,
        recall_id: str | None,
        now: float,
    ) -> TrajectoryResult:
        """Compute every step's target, claim the episode, then apply it (module docstring)."""
        rewards = [reward for _, _, reward in steps]
        values = self._state_values(task, [observation for observation, _, _ in steps], namespace)
        targets = algorithm.n_step_targets(rewards, self.rules.step_n, self.rules.step_gamma, values)
        key = episode_key(namespace, episode_id)
        record = EpisodeRecord(
            namespace=namespace,
            episode_id=episode_id,
            task=task,
            claim=str(uuid.uuid4()),
            status="applying",
            reported_at=now,
            recall_id=recall_id,
            steps=[
                ReportedStep(observation=o, action=canonical_text(a), reward=r, target=g)
                for (o, a, r), g in zip(steps, targets, strict=True)
            ],
        )
        self._store.insert("episodes", Point(key, PLACEHOLDER, record.model_dump()))
        stored = self._store.get("episodes", [key]).get(key)
        if stored is None:
            raise EpisodeGone(episode_id)
        claimed = EpisodeRecord.model_validate(stored)
        if claimed.claim != record.claim:
            return _already(claimed)
        return self.redo(key, claimed)

    def _state_values(self, task: str, observations: Sequence[str], namespace: str) -> list[float | None]:
        """max_a Q(task, o_j, a) for every j that is some step's o_{t+n} (j >= n); None where nothing matches."""
        values: list[float | None] = [None] * len(observations)
        wanted = range(self.rules.step_n, len(observations))
        if not wanted:
            return values
        ids = {j: step_id(namespace, task, observations[j]) for j in wanted}
        found = self._store.get("steps", sorted(set(ids.values())))
        missing = [j for j in wanted if ids[j] not in found]
        for j in wanted:
            if ids[j] in found:
                values[j] = _state_value(found[ids[j]])
        if missing:
            task_vector = self._tasks([task], namespace)[0]
            vectors = self._observations([observations[j] for j in missing], namespace)
            for j, vector in zip(missing, vectors, strict=True):
                query = self._query(task_vector, vector)
                hits = self._store.search(query, 1, self.rules.step_match_threshold, {"namespace": namespace}, "steps")
                values[j] = _state_value(hits[0].payload) if hits else None
        return values

    def redo(self, key: str, record: EpisodeRecord) -> TrajectoryResult:
        """Apply a claimed episode from where it stopped: each step once, then the recall, then ``reported``."""
        changes: list[StepChange] = []
        created = merged = dropped = 0
        for t in range(record.done, len(record.steps)):
            applied = self._apply_step(key, record, t)
            if applied is None:
                dropped += 1
            else:
                change, new_record = applied
                created += new_record
                if change is not None:
                    changes.append(change)
                    merged += change.q_before is not None
            self._store.set_payload_if("episodes", key, {"done": t + 1}, {"claim": record.claim})
        outcome, outcome_error = None, None
        if record.recall_id is not None:
            report = ClaimedReport(
                claim=str(uuid.uuid5(uuid.NAMESPACE_URL, f"memrl-episode-outcome:{key}")),
                reward=record.steps[-1].reward,
                reported_at=record.reported_at,
                experience=None,
                outcome=None,
                metadata={},
            )
            try:
                outcome = self._ledger.report(record.recall_id, report)
            except MemoryRequestError as error:
                outcome_error = str(error)
        steps = len(record.steps)
        result = TrajectoryResult(
            episode_id=record.episode_id,
            namespace=record.namespace,
            already_applied=False,
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
            {"status": "reported", "steps": [], "result": summary},
            {"claim": record.claim, "status": "applying"},
        )
        return result

    def _apply_step(self, key: str, record: EpisodeRecord, t: int) -> tuple[StepChange | None, bool] | None:
        """Fold step t into its record, creating the record if needed; None when the memory dropped the step.
        The change is None when an earlier run of this redo had applied it already."""
        step = record.steps[t]
        record_id = step_id(record.namespace, record.task, step.observation)
        operation = f"step:{key}:{t}"
        folded: list[algorithm.ActionValue] = []  # the action as the write that landed left it

        def fold(payload: Any) -> dict[str, Any]:
            actions = [_value(ActionView.model_validate(a)) for a in payload["actions"]]
            old = next((a for a in actions if a.action == step.action), None)
            new = algorithm.update_action_value(
                old, step.action, step.target, step.reward, self.rules.step_update, self.rules.step_learning_rate
            )
            folded.append(new)
            actions = [new if a is old else a for a in actions] + ([] if old else [new])
            kept = algorithm.prune_actions(actions, self.rules.step_max_actions)
            return {"actions": [_view(a).model_dump() for a in kept], "updated_at": record.reported_at}

        written = self._ledger.update_once(record_id, operation, fold, table="steps")
        created = False
        if written is None:
            task_vector = self._tasks([record.task], record.namespace)[0]
            observation_vector = self._observations([step.observation], record.namespace)[0]
            if not self._make_room(record.namespace, task_vector, observation_vector):
                return None
            payload = StepPayload(
                namespace=record.namespace,
                task=record.task,
                observation=step.observation,
                actions=[],
                created_at=record.reported_at,
                updated_at=record.reported_at,
            )
            vector = np.concatenate([task_vector, observation_vector])
            self._store.insert("steps", Point(record_id, vector, payload.model_dump()))
            if key not in self._store.get("episodes", [key]):  # forgotten between the claim and this insert
                self._store.delete("steps", [record_id])
                raise EpisodeGone(record.episode_id)
            created = True
            written = self._ledger.update_once(record_id, operation, fold, table="steps")
            if written is None:  # evicted by a concurrent report at once
                return None
        if written.update is None:
            return None, created
        before = next((a for a in written.before["actions"] if a["action"] == step.action), None)
        after = folded[-1]
        change = StepChange(
            step=t,
            record_id=record_id,
            action=step.action,
            target=step.target,
            q_before=None if before is None else float(before["q"]),
            q_after=after.q,
            visits=after.visits,
            kept=any(a["action"] == step.action for a in written.update["actions"]),
        )
        return change, created

    def _make_room(self, namespace: str, task: np.ndarray, observation: np.ndarray) -> bool:
        """Before a new record: at the capacity, evict per :func:`~memrl_mcp.memory.algorithm.record_to_evict`; False
        when the new record itself is the one to drop."""
        where = {"namespace": namespace}
        if self._store.count("steps", where) < self.rules.step_max_records:
            return True
        rows = list(self._store.vectors("steps", where, ("actions",)))
        ids = [row[0] for row in rows]
        matrix = np.stack([row[1] for row in rows]).astype(np.float64)
        dim = matrix.shape[1] // 2
        w = self.rules.step_observation_weight
        tasks, observations = matrix[:, :dim], matrix[:, dim:]
        old = (1.0 - w) * tasks @ tasks.T + w * observations @ observations.T
        new = (1.0 - w) * tasks @ task + w * observations @ observation
        samples = [sum(int(a["visits"]) for a in row[2].get("actions", [])) for row in rows]
        victim = algorithm.record_to_evict(old, new, samples)
        if victim is None:
            return False
        self._store.delete("steps", [ids[victim]])
        return True

    # -- backups ------------------------------------------------------------------------------------

    def restore(self, records: Sequence[StepRecordView], batch: int = 64) -> None:
        """Write checked records under their own ids, re-embedded (an import; a record with the id is replaced)."""
        for start in range(0, len(records), batch):
            chunk = sorted(records[start : start + batch], key=lambda r: r.namespace)
            points = []
            for namespace, group in itertools.groupby(chunk, key=lambda r: r.namespace):
                same = list(group)
                tasks = self._tasks([r.task for r in same], namespace)
                observations = self._observations([r.observation for r in same], namespace)
                for record, task, observation in zip(same, tasks, observations, strict=True):
                    payload = StepPayload(**record.model_dump(exclude={"id"}))
                    points.append(Point(record.id, np.concatenate([task, observation]), payload.model_dump()))
            self._store.upsert("steps", points)

    # -- housekeeping -------------------------------------------------------------------------------

    def housekeeping(self, now: float, stale_after: float) -> None:
        """Finish the episodes whose report was interrupted (``applying`` for ``stale_after`` seconds or more)."""
        for key, payload in list(self._store.scroll("episodes", {"status": "applying"})):
            record = EpisodeRecord.model_validate(payload)
            if now - record.reported_at >= stale_after:
                try:
                    self.redo(key, record)
                except EpisodeGone:
                    continue


def _value(view: ActionView) -> algorithm.ActionValue:
    return algorithm.ActionValue(action=view.action, q=view.q, visits=view.visits, reward=view.reward)


def _view(value: algorithm.ActionValue) -> ActionView:
    return ActionView(action=value.action, q=value.q, visits=value.visits, reward=value.reward)


def _state_value(payload: dict[str, Any]) -> float | None:
    return algorithm.state_value([_value(ActionView.model_validate(a)) for a in payload.get("actions", [])])


def _already(record: EpisodeRecord) -> TrajectoryResult:
    """A report of an episode someone claimed before: nothing changes; say what was (or is being) applied."""
    if record.status == "reported" and record.result is not None:
        return TrajectoryResult(
            **record.result,
            already_applied=True,
            changes=[],
            message=f"episode_id {record.episode_id!r} was already reported and applied (its steps once: "
            f"{record.result['updated']} Q values); nothing was changed now",
        )
    return TrajectoryResult(
        episode_id=record.episode_id,
        namespace=record.namespace,
        already_applied=True,
        steps=len(record.steps),
        updated=record.done,
        created=0,
        merged=0,
        dropped=0,
        changes=[],
        message=f"episode_id {record.episode_id!r} is being applied by an earlier report ({record.done} of "
        f"{len(record.steps)} steps so far; an interrupted one is finished by the server); nothing was changed now",
    )
