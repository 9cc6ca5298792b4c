"""The controlled multi-step benchmark: an LLM-free experiment in which success hinges on one decision late in the
episode, the right decision is shared by tickets that look nothing alike, and only an observation inside the episode
tells which one it is. Built to show what a step memory (Rememberer) adds to an episode memory (MemRL), and where it
adds nothing (``one_step=true``).

The world
---------
Incident tickets: "Team Atlas reports that the billing API on host fra-07 has been failing since the deploy." The
benchmark ``seed`` draws ``tasks`` (40) tickets (team, service, host, time, template), and, for each of ``causes`` (4)
hidden causes, its *fix* and its *decoy* among ``fixes`` (8) remedies (no two causes share a fix). With
``cause=episode`` (default) every episode of a ticket draws its cause anew from the episode's seeded ``rng``: the same
complaint has another cause another day, and its wording says nothing of it. ``cause=task`` gives each ticket one
cause for good (ticket i has cause i mod ``causes``; its type in the report).

An episode is ``depth`` (4) decisions. The first ``depth - 1`` are diagnostics (read the log, check the dashboard,
ping the host, list the deploys, check the load balancer, restart the service): each gives a plausible reading of the
ticket's own host and service (some look like progress: "the service restarted and looks healthy for now") and leads
on; none changes the outcome. The last diagnostic shows the cause's evidence, worded the same on every ticket ("The
last check reads: the volume /var is 100% full and every write fails with 'No space left on device'."). The last
decision picks a remedy; the checker: the cause's fix succeeds (+1), its decoy succeeds by luck with probability
``decoy_luck`` (0.4; a misleading success), anything else fails (-1).

``one_step=true`` (the control): one decision, the remedy, taken on the ticket alone; no diagnostic shows the
evidence. The step memory's only observation is then the ticket, which does not tell the cause.

``close_step=true``: one more decision after the remedy, on its visible result ("The alert clears." or "The alert
stays.", the same words on every ticket): close the ticket, any way (``CLOSINGS``). The reward still hinges on the
remedy alone, but now comes one step after it: the decision that earns it is no longer the last. With ``depth=2``:
a diagnostic, the remedy that decides, the closing. This is where the step memory's credit order shows
(``step_order`` of memrl-mcp): credited backward, the first success encourages the remedy that earned it; forward
(Rememberer's code), the remedy's first target bootstraps from the result's record, which that episode has not made
yet, so the success marks the winning remedy with Q 0, discouraged.

The agent (scripted; deterministic given the episode's ``rng``), per decision, on the menu of that decision:

1. take the encouraged action of highest value that is not also discouraged (the step advice is about this very
   observation, so it outranks the episode memories, which are about a similar ticket);
2. else avoid the discouraged actions and the action each injected failure memory took at this decision
   ("mistakes to avoid"), and take the action the best-ranked injected success memory took here ("examples");
3. else explore: a uniform choice among the actions not avoided (not discouraged, if none is left; any, if none).

Its experience (``Episode.experience``): ``steps: "a1"; "a2"; ...`` on success, ``reflection: the steps "a1"; ...
failed on this task; avoid them.`` on failure.

What each memory can learn
--------------------------
- ``none`` explores: success (1 + decoy_luck) / fixes = 0.175.
- ``rag`` / ``memrl``: recall is keyed by the ticket, which says nothing of the cause; a remembered remedy is right
  when the cause happens to recur (1 in ``causes``), so the episode memory can learn the causes' fixes as a set
  (about 1 / causes) but not which one applies now.
- ``rememberer`` / ``both``: the evidence reads the same on every ticket of a cause, so a remedy tried on one ticket
  advises every ticket that shows the same evidence: the step memory learns cause -> fix, within the first epoch.
- ``one_step=true``: nothing observable tells the cause, so no memory can do better than a fix of some cause (its
  step Q is a running mean over the causes: 1 win in ``causes``, so below 0 and discouraged); step memory cannot
  help. With ``cause=task`` the ticket does decide, and both memories learn per ticket (the step memory faster: it
  keeps every remedy tried on a ticket with its value, the episode memory one success and the newest reflection).

Results: docs/harness.md, "Step memory in the harness".
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl_harness.benchmarks.base import Episode, Memory, StepAdvice, Steps, StepwiseBenchmark, Task
from memrl_harness.benchmarks.options import BenchmarkOptions
from memrl_harness.llm import LLM

# cause -> its evidence, as the last diagnostic reads it on the ticket's host and service
CAUSES: dict[str, str] = {
    "disk": "the volume /var is 100% full and every write fails with 'No space left on device'",
    "certificate": "TLS handshakes fail with 'certificate has expired' for the service's own certificate",
    "memory": "the process grows by 200 MB an hour until the kernel's OOM killer ends it",
    "dns": "lookups of the database host return an address that was retired last month",
    "config": "the service refuses to start: 'unknown key max_conns in /etc/service.yaml line 12'",
    "clock": "the host's clock is 9 minutes ahead and every signed token is rejected as not yet valid",
    "pool": "all 50 database connections are held by idle sessions and new requests queue until they time out",
    "quota": "the upstream provider answers HTTP 429: the account's monthly request quota is used up",
}
REMEDIES = (
    "rotate the logs and grow the volume",
    "renew the certificate",
    "roll back to the previous release",
    "flush the DNS cache and fix the resolver entry",
    "restore the last good configuration",
    "resync the clock with NTP",
    "recycle the connection pool",
    "raise the quota with the provider",
    "restart the service",
    "reboot the host",
    "scale out to another instance",
    "clear the application cache",
)
DIAGNOSTICS: dict[str, str] = {  # command -> its reading (harmless; the restart looks like progress)
    "read the service log": "the log shows a burst of errors in the last hour",
    "check the monitoring dashboard": "the error rate is at 12% and latency is up threefold",
    "ping the host": "the host answers in 0.4 ms; the network is fine",
    "list recent deploys": "the last deploy was four days ago and passed its checks",
    "restart the service": "the service restarted and looks healthy for now",
    "check the load balancer": "two of three backends are marked unhealthy",
}
CLOSINGS = ("close the ticket", "write a postmortem", "hand the ticket to the next shift")
TEAMS = ("Atlas", "Borealis", "Cobalt", "Dune", "Ember", "Fjord", "Granite", "Harbor")
SERVICES = ("billing API", "search service", "login portal", "report generator", "image resizer", "mail relay")
HOSTS = ("fra-07", "ams-12", "lon-03", "par-21", "ber-09", "mad-14", "vie-02", "osl-18")
TIMES = ("since the deploy", "since this morning", "every few minutes", "after the weekend", "since midnight")
TEMPLATES = (
    "Team {team} reports that the {service} on host {host} has been failing {when}.",
    "The {service} ({host}) is down for team {team} {when}.",
    "Please restore the {service} on {host}: team {team} sees errors {when}.",
    "{team} on-call: {service} at {host} keeps erroring {when}.",
)

_QUOTED = re.compile(r'"([^"]+)"')


def success_experience(actions: Sequence[str]) -> str:
    return "steps: " + "; ".join(f'"{a}"' for a in actions) + "."


def failure_experience(actions: Sequence[str]) -> str:
    return "reflection: the steps " + "; ".join(f'"{a}"' for a in actions) + " failed on this task; avoid them."


def memory_actions(experience: str) -> list[str]:
    """The actions an experience lists, one per decision in order."""
    return _QUOTED.findall(experience)


def choose(
    menu: Sequence[str], decision: int, advice: StepAdvice, memories: Sequence[Memory], rng: random.Random
) -> str:
    """The scripted agent's choice at one decision (see the module docstring): the step advice, which is about the
    current observation, outranks the episode memories, which are about a similar ticket."""

    def taken(memory: Memory) -> str | None:
        actions = memory_actions(memory.experience)
        return actions[decision] if decision < len(actions) and actions[decision] in menu else None

    discouraged = {a.action for a in advice.discouraged}
    for item in sorted(advice.encouraged, key=lambda a: -a.q):
        if item.action in menu and item.action not in discouraged:
            return item.action
    avoided = discouraged | {a for m in memories if m.outcome == "failure" and (a := taken(m))}
    for memory in memories:
        action = taken(memory) if memory.outcome == "success" else None
        if action is not None and action not in avoided:
            return action
    return rng.choice([a for a in menu if a not in avoided] or [a for a in menu if a not in discouraged] or list(menu))


@dataclass(frozen=True)
class Ticket:
    """Where a task's incident happens, and (``cause="task"``) its one cause."""

    service: str
    host: str
    cause: str | None


class ControlledStepsOptions(BenchmarkOptions):
    """The controlled multi-step benchmark's options; the module docstring says what each does to the experiment."""

    causes: int = Field(4, ge=1, le=len(CAUSES), description="hidden causes, each with its evidence, fix and decoy")
    tasks: int = Field(40, ge=1, le=1000, description="tickets")
    fixes: int = Field(8, ge=2, le=len(REMEDIES), description="remedies to choose among (at least causes + 1)")
    depth: int = Field(4, ge=2, le=1 + len(DIAGNOSTICS), description="decisions per episode: diagnostics, a remedy")
    decoy_luck: float = Field(0.4, ge=0, le=1, description="probability that a cause's decoy succeeds")
    cause: Literal["episode", "task"] = Field(
        "episode", description="drawn anew every episode, or one for good per ticket (its type in the report)"
    )
    one_step: bool = Field(False, description="the control: the remedy chosen at once, on the ticket alone")
    close_step: bool = Field(False, description="one more decision after the remedy, on its result: close the ticket")
    seed: int = Field(0, description="draws the tickets and the causes' fixes and decoys")

    @model_validator(mode="after")
    def _a_decoy_besides_each_fix(self) -> ControlledStepsOptions:
        if self.fixes < self.causes + 1:
            raise ValueError(f"fixes: must be at least causes + 1 = {self.causes + 1}, got {self.fixes}")
        return self


class ControlledStepsBenchmark(StepwiseBenchmark):
    """Incident tickets whose fix hinges on a late observation; see the module docstring for the experiment."""

    name = "controlled-steps"
    needs_llm = False
    Options = ControlledStepsOptions

    def __init__(self, **values: Any) -> None:
        """``values``: the :class:`ControlledStepsOptions`, as text (``--option causes=3``) or typed."""
        options = self.options = ControlledStepsOptions.parse(self.name, values)
        draw = random.Random(f"controlled-steps:{options.seed}")
        self.remedies = tuple(draw.sample(REMEDIES, options.fixes))
        self.diagnostics = tuple(DIAGNOSTICS)
        self.causes = tuple(CAUSES)[: options.causes]
        fixes = draw.sample(self.remedies, options.causes)  # no two causes share one
        self.fix = dict(zip(self.causes, fixes, strict=True))
        self.decoy = {c: draw.choice([r for r in self.remedies if r != self.fix[c]]) for c in self.causes}
        self._tasks: list[Task] = []
        for i in range(options.tasks):
            team, service, host = draw.choice(TEAMS), draw.choice(SERVICES), draw.choice(HOSTS)
            text = draw.choice(TEMPLATES).format(team=team, service=service, host=host, when=draw.choice(TIMES))
            fixed = self.causes[i % options.causes] if options.cause == "task" else None
            self._tasks.append(
                Task(id=f"ticket-{i}", intent=text, data={"ticket": Ticket(service, host, fixed)}, type=fixed)
            )

    def tasks(self) -> Sequence[Task]:
        return list(self._tasks)

    def check(self, cause: str, remedy: str, rng: random.Random) -> bool:
        """The checker: the cause's fix succeeds, its decoy by luck, anything else fails."""
        roll = rng.random()
        return remedy == self.fix[cause] or (remedy == self.decoy[cause] and roll < self.options.decoy_luck)

    def run_steps(
        self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random, steps: Steps
    ) -> Episode:
        ticket: Ticket = task.data["ticket"]
        cause = ticket.cause or rng.choice(self.causes)
        observation = f"Ticket: {task.intent}"
        lines = [observation]
        actions: list[str] = []
        depth = self.options.depth
        for decision in range(0 if self.options.one_step else depth - 1):
            command = choose(self.diagnostics, decision, steps.advise(observation), memories, rng)
            steps.took(observation, command)
            actions.append(command)
            if decision == depth - 2:  # the evidence: the same words on every ticket of the cause
                observation = f"The last check reads: {CAUSES[cause]}."
            else:
                observation = f"{ticket.service} on {ticket.host}: {DIAGNOSTICS[command]}."
            lines.append(f"> {command}\n{observation}")
        remedy = choose(self.remedies, len(actions), steps.advise(observation), memories, rng)
        steps.took(observation, remedy)
        actions.append(remedy)
        success = self.check(cause, remedy, rng)
        result = "The alert clears." if success else "The alert stays."
        lines.append(f"> {remedy}\n{result} (cause: {cause})")
        if self.options.close_step:  # the reward comes after one more decision, which changes nothing
            closing = choose(CLOSINGS, len(actions), steps.advise(result), memories, rng)
            steps.took(result, closing)
            actions.append(closing)
            lines.append(f"> {closing}")
        return Episode(
            success=success,
            reward=1.0 if success else -1.0,
            steps=len(actions),
            trajectory="\n".join(lines),
            experience=success_experience(actions) if success else failure_experience(actions),
            mistaken_experience=failure_experience(actions) if success else success_experience(actions),
        )
