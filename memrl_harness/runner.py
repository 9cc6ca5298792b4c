"""The paper's protocol (docs/algorithm.md, "The benchmark protocol"), driven through an MCP client of memrl-mcp.

Runtime learning: an epoch replays the benchmark's tasks in a seeded order. Per task: recall (query =
the task's intent) -> the agent acts with the recalled memories -> the benchmark's checker gives the
reward -> the memory learns:

- ``none``: no memory at all;
- ``rag``: look up with lambda = 0 (similarity only; ``search_experience``, which logs no recall that would
  never be reported); the new experience is stored, no Q update;
- ``memp``: procedural memory (MemP): recall with lambda = 0; only successes are stored, no Q update;
- ``memrl``: recall with the server's lambda; ``report_outcome`` updates the Q of exactly the
  recalled memories and stores the new experience;
- ``rememberer`` (multi-step benchmarks only): step memory (Rememberer, arXiv 2306.07929) and no episode memory:
  before each decision ``recall_step_advice`` (task, current observation) puts encouraged and discouraged actions
  in the prompt; at the end ``report_trajectory`` hands over every (observation, action, reward) step (reward 0 but
  for the last, the episode's), once, under a fresh episode id, and the server updates each step's Q;
- ``both``: episode memory as ``memrl`` plus step memory as ``rememberer``; ``report_trajectory`` with the
  ``recall_id`` also reports the episode's outcome for the recall (Q of the recalled memories), and the new experience
  is stored with ``store_experience`` (``report_trajectory`` takes none);
- ``reflexion``: no memory across tasks; up to ``trials`` attempts at a task (3 by default, as the
  Reflexion paper's runs), each failed attempt's reflection (the benchmark's own experience text, or the
  LLM's reflection on the trajectory) put before the next attempt as a "mistake to avoid". Every epoch
  starts afresh, so its curve is flat by design.

The agent's discipline (``RunConfig.discipline``, mode ``memrl``; :mod:`memrl_harness.discipline`): disciplined, every
recall and report; forgetful, forgetting one of them in a seeded share of its tasks; hooked, the same forgetful agent
with the plugin's hooks, whose UserPromptSubmit recalls for it and whose Stop hook holds it to every report.

Transfer (``RunConfig.transfer``): the memory is built by the epochs above on the training tasks; then
the server closes and a second memrl-mcp opens the same store with ``MEMRL_TOOL_PROFILE=read_only``, offering
no tool that writes, and the held-out tasks run once with recall only (into the sub-folder ``transfer/``).

Tasks of one epoch run in parallel on bounded workers; epochs run one after another. Each finished
episode is appended to its folder's ``episodes.jsonl`` (and its trajectory, memories and stored
experience to ``trajectories.jsonl.gz``) after the memory has learned from it, so a killed run resumes
with the episodes it lacks (an episode killed between its report and its record runs again; the memory
keeps what the lost attempt taught it). A finished run exports its final memory to ``memory.jsonl`` (not a
shared ``--memory-url`` server's, which holds other runs' memories too) and writes the intra-dataset query
similarity of its training tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import ReadResourceResult, TextContent, TextResourceContents

from memrl_harness.benchmarks.base import (
    ActionAdvice,
    Benchmark,
    Episode,
    Memory,
    Seeded,
    StepAdvice,
    Steps,
    StepwiseBenchmark,
    Task,
)
from memrl_harness.client_help import ClientModel, SimulatedUser
from memrl_harness.discipline import Lapse, ReportBy, lapse
from memrl_harness.judgement import claims_success
from memrl_harness.llm import LLM, TRAJECTORY_CHARS, Usage, summarize_experience, truncate_middle
from memrl_harness.metrics import TaskSimilarity, mean_pairwise_similarity, write_curve
from memrl_harness.plugin import Plugin, Session, installed, memories_in, recall_id_in
from memrl_harness.results import (
    EPISODE_Q_MODES,
    MEMORY_MODES,
    Q_VALUES_FILE,
    STEP_MODES,
    Attempt,
    EpisodeRecord,
    GivenMemory,
    RunConfig,
    RunDir,
    TrajectoryRecord,
    bound,
)
from memrl_harness.run_settings import RunSettings

ENV_MEMORY_TOKEN = "MEMRL_MEMORY_TOKEN"  # bearer token for --memory-url
ENV_TOOL_PROFILE = "MEMRL_TOOL_PROFILE"  # the runner's own memrl-mcp offers every tool; a frozen one, look-ups only
ENV_SAMPLINGS = "MEMRL_MAX_SAMPLINGS_PER_MINUTE"
MAX_SAMPLINGS = 100_000  # the setting's highest: memrl-mcp's budget guards a shared server, not a run's own
# A step's texts as the step memory takes them (memrl-mcp's default max_observation_chars / max_action_chars): a
# longer shell output or script keeps its head and tail.
STEP_OBSERVATION_CHARS = 8000
STEP_ACTION_CHARS = 1000

Progress = Callable[[int, int], None]
"""Called with (episodes done, episodes in the run) after each episode."""


class RunError(RuntimeError):
    """The run cannot go on (a memory tool refused, a run folder holds another run)."""


@asynccontextmanager
async def _http_memory_client(url: str, token: str | None, **callbacks: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
        try:
            client = await stack.enter_async_context(Client(streamable_http_client(url, http_client=http), **callbacks))
        except Exception as error:  # the SDK reports a 401 as a bare "error response"
            hint = "" if token else f" (a server with tokens needs {ENV_MEMORY_TOKEN})"
            raise RunError(f"cannot open the memory at {url}: {error}{hint}") from None
        yield client


def _store_args(config: RunConfig, run_dir: RunDir) -> list[str]:
    args = ["--data-dir", str(run_dir.memory_dir)]
    return [*args, "--config", str(run_dir.memory_settings)] if config.memory_config else args


@asynccontextmanager
async def _stdio_memory_client(
    config: RunConfig, run_dir: RunDir, log_dir: RunDir, read_only: bool, **callbacks: Any
) -> AsyncIterator[Client]:
    args = ["-m", "memrl_mcp.cli", *_store_args(config, run_dir)]
    profile = "read_only" if read_only else "full"
    # The run's own server, in a process of its own (not the user's shared local server): its store is the run's,
    # and the export that ends the run opens it once the server has gone.
    env = get_default_environment() | {"MEMRL_LOG_CALLS": "true", ENV_TOOL_PROFILE: profile, "MEMRL_ATTACH": "false"}
    if config.client_model:  # the run's own server, with the harness as its only client: every episode samples
        env[ENV_SAMPLINGS] = str(MAX_SAMPLINGS)
    # The server's log lines (one per call) are for whoever debugs this run, not for the terminal: they go to the
    # run folder.
    log_dir.make()
    with log_dir.server_log.open("a") as log:
        server = StdioServerParameters(command=sys.executable, args=args, env=env)
        async with Client(stdio_client(server, errlog=log), **callbacks) as client:
            yield client


def memory_client(config: RunConfig, run_dir: RunDir, **callbacks: Any) -> AbstractAsyncContextManager[Client]:
    """An MCP client of memrl-mcp: the given HTTP server (with the bearer token of ``MEMRL_MEMORY_TOKEN``,
    kept out of the run's saved config), or a fresh stdio server on the run's store, logging into the run folder.
    ``callbacks``: how the client answers the server (:mod:`memrl_harness.client_help`)."""
    if config.memory_url:
        return _http_memory_client(config.memory_url, os.environ.get(ENV_MEMORY_TOKEN), **callbacks)
    return _stdio_memory_client(config, run_dir, run_dir, read_only=False, **callbacks)


def frozen_memory_client(config: RunConfig, run_dir: RunDir) -> AbstractAsyncContextManager[Client]:
    """A transfer's evaluation: a memrl-mcp on the run's store with ``MEMRL_TOOL_PROFILE=read_only``, so the server
    itself offers look-ups only (the runner only looks up, but that is not what keeps the memory frozen)."""
    return _stdio_memory_client(config, run_dir, run_dir.transfer, read_only=True)


def split_tasks(tasks: Sequence[Task], held_out: float) -> tuple[list[Task], list[Task]]:
    """(training, held-out): a task is held out when the first 8 bytes of sha256(its id), read as a fraction of
    2**64, fall below ``held_out``. Deterministic across machines and orders, and stable when tasks are added."""

    def draw(task: Task) -> float:
        return int.from_bytes(hashlib.sha256(task.id.encode()).digest()[:8], "big") / 2**64

    return [t for t in tasks if draw(t) >= held_out], [t for t in tasks if draw(t) < held_out]


def epoch_order(tasks: Sequence[Task], seed: int, epoch: int) -> list[Task]:
    """The epoch's fixed, seeded order of the same task list."""
    order = list(tasks)
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def _text(resource: ReadResourceResult) -> str:
    """A resource of memrl-mcp, all of which are JSON text."""
    contents = resource.contents[0]
    if not isinstance(contents, TextResourceContents):
        raise RunError(f"memrl-mcp sent {contents.uri} as binary, not as JSON text")
    return contents.text


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error or result.structured_content is None:
        first = result.content[0] if result.content else None
        text = first.text if isinstance(first, TextContent) else "no content"
        if text.startswith("Unknown tool"):  # a --memory-url server started with a smaller tool profile
            text += f" (this mode calls a tool the server does not offer: start memrl-mcp with {ENV_TOOL_PROFILE}=full)"
        raise RunError(f"memrl-mcp {tool} failed: {text}")
    return result.structured_content


@dataclass(frozen=True)
class Phase:
    """Training (the epochs; the memory learns) or a transfer's evaluation (one pass; recall only)."""

    benchmark: Benchmark
    tasks: list[Task]
    run_dir: RunDir
    epochs: int
    learn: bool


class Runner:
    """Runs one configured run of one benchmark into one run folder.

    ``eval_benchmark`` is the benchmark a transfer evaluates on when its ``eval_options`` change it (another
    split); without eval options the held-out tasks come from ``benchmark`` itself.
    """

    def __init__(
        self,
        config: RunConfig,
        benchmark: Benchmark,
        run_dir: RunDir,
        llm: LLM | None,
        eval_benchmark: Benchmark | None = None,
    ) -> None:
        for bench in (benchmark, eval_benchmark):
            if bench is not None and bench.needs_llm and llm is None:
                raise RunError(f"benchmark {bench.name} needs an LLM (MEMRL_LLM_BASE_URL / --llm-base-url)")
            if bench is not None and config.mode in STEP_MODES and not isinstance(bench, StepwiseBenchmark):
                raise RunError(
                    f"mode {config.mode}: benchmark {bench.name} takes one decision per task, so a step memory has "
                    "no later step to advise; the step-memory modes are for multi-step benchmarks "
                    "(alfworld, llb-os, llb-db, controlled-steps)"
                )
        if config.client_model and llm is None:
            raise RunError("--client-model: the client's model is the run's LLM (MEMRL_LLM_BASE_URL / --llm-base-url)")
        self.user = None if config.user_rewards is None else SimulatedUser(config.user_rewards)
        self.model = ClientModel(llm) if config.client_model and llm is not None else None
        transfer = config.transfer
        if transfer is not None and transfer.eval_options and eval_benchmark is None:
            raise RunError("a transfer with eval_options needs the benchmark built with them (eval_benchmark)")
        self.config = config
        self.benchmark = benchmark
        self.run_dir = run_dir
        self.llm = llm
        self.tasks = self._first(benchmark)
        self.evaluation: Phase | None = None
        if transfer is not None:
            evaluated = eval_benchmark or benchmark
            held = self._first(evaluated)
            if transfer.held_out is not None:
                self.tasks = split_tasks(self.tasks, transfer.held_out)[0]
                held = split_tasks(held, transfer.held_out)[1]
            if not self.tasks or not held:
                raise RunError(f"transfer: {len(self.tasks)} training and {len(held)} held-out tasks; both need some")
            self.evaluation = Phase(evaluated, held, run_dir.transfer, 1, learn=False)
        self.training = Phase(benchmark, self.tasks, run_dir, config.epochs, learn=True)
        self._record_lock = anyio.Lock()
        self.plugin: Plugin | None = None  # the Claude Code plugin, while a run with it trains
        self.scale = (-1.0, 1.0)  # the memory's reward_min and reward_max, read at the run's start

    def _first(self, benchmark: Benchmark) -> list[Task]:
        tasks = list(benchmark.tasks())
        return tasks[: self.config.tasks] if self.config.tasks else tasks

    def prepare(self) -> set[tuple[int, str]]:
        """Write or check the run's config, and the memory server's settings file; the (epoch, task id) pairs
        already done."""
        self.run_dir.make()
        if self.config.memory_config:
            self._write_memory_settings(Path(self.config.memory_config))
        if self.run_dir.config_file.exists():
            stored = self.run_dir.read_config()
            if stored.model_copy(update={"memory_settings": None}) != self.config:
                raise RunError(
                    f"{self.run_dir.path} holds another run ({stored.model_dump_json()}); "
                    "choose another --run-dir to start a new one"
                )
        else:
            self.run_dir.write_config(self.config)
        self.run_dir.drop_torn_tail()
        self.run_dir.transfer.drop_torn_tail()
        return {(r.epoch, r.task_id) for r in self.run_dir.episodes()}

    async def run(self, progress: Progress | None = None) -> list[EpisodeRecord]:
        """Run (or finish) the run; the first failure stops it with a RunError, and it can resume."""
        self.prepare()
        phases = [self.training, *([self.evaluation] if self.evaluation else [])]
        done = {id(p): {(r.epoch, r.task_id) for r in p.run_dir.episodes()} for p in phases}
        counter = _Counter(sum(len(d) for d in done.values()), sum(p.epochs * len(p.tasks) for p in phases), progress)
        memory = self.config.mode in MEMORY_MODES
        try:
            if not memory:
                await self._epochs(None, self.training, done[id(self.training)], counter)
            else:
                callbacks = {"elicitation_callback": self.user, "sampling_callback": self.model}
                async with self._memory(**callbacks) as client:
                    await self._record_memory_settings(client)
                    await self._seed(client)
                    await self._epochs(client, self.training, done[id(self.training)], counter)
                    if self.config.mode in EPISODE_Q_MODES:
                        await self._save_q_values(client)
                if not self.config.memory_url:
                    await self._export_memory()
            await anyio.to_thread.run_sync(self._write_similarity)
            if self.evaluation is not None:
                if not memory:
                    await self._epochs(None, self.evaluation, done[id(self.evaluation)], counter)
                else:
                    async with frozen_memory_client(self.config, self.run_dir) as client:
                        await self._epochs(client, self.evaluation, done[id(self.evaluation)], counter)
        except BaseExceptionGroup as group:  # task groups nest; report the failure itself
            first: BaseException = group
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
        return self.run_dir.episodes()

    @asynccontextmanager
    async def _memory(self, **callbacks: Any) -> AsyncIterator[Client]:
        """The run's MCP client of its memory: with the plugin, the agent's session of it (and the plugin's local
        server stopped when the block ends); else :func:`memory_client`."""
        if not self.config.uses_plugin:
            async with memory_client(self.config, self.run_dir, **callbacks) as client:
                yield client
            return
        settings = RunSettings.read(self.run_dir.memory_settings) if self.config.memory_config else None
        async with installed(self.run_dir, settings.environment() if settings else {}) as plugin:
            self.plugin = plugin
            try:
                async with plugin.client(**callbacks) as client:
                    yield client
            finally:
                self.plugin = None

    async def _seed(self, client: Client) -> None:
        """The memories the benchmark's world holds before the run (:class:`Seeded`), stored before its first
        episode in the modes with an episode memory."""
        if not isinstance(self.benchmark, Seeded) or self.config.mode == "rememberer" or self.run_dir.episodes():
            return
        for seeded in self.benchmark.seeded():
            arguments = {"task": seeded.task, "experience": seeded.experience, "outcome": seeded.outcome}
            await _call(client, "store_experience", arguments | {"metadata": {"seeded": True}})

    async def _epochs(self, client: Client | None, phase: Phase, done: set[tuple[int, str]], counter: _Counter):
        limiter = anyio.CapacityLimiter(self.config.workers)

        async def one(epoch: int, position: int, task: Task) -> None:
            async with limiter:
                try:
                    record, trajectory = await self._episode(client, phase, epoch, position, task)
                except RunError:
                    raise
                except Exception as error:
                    where = "transfer" if not phase.learn else f"epoch {epoch}"
                    raise RunError(f"{where}, task {task.id}: {error!r}") from error
            async with self._record_lock:
                phase.run_dir.append_trajectory(trajectory)  # first: a record always has its trajectory
                phase.run_dir.append(record)
                if phase.learn:  # the learning curve the /ui inspector draws, kept current episode by episode
                    write_curve(phase.run_dir, self.config)
                counter.step()

        phase.run_dir.make()
        for epoch in range(1, phase.epochs + 1):
            async with anyio.create_task_group() as group:
                for position, task in enumerate(epoch_order(phase.tasks, self.config.seed, epoch)):
                    if (epoch, task.id) not in done:
                        group.start_soon(one, epoch, position, task)

    async def _episode(
        self, client: Client | None, phase: Phase, epoch: int, position: int, task: Task
    ) -> tuple[EpisodeRecord, TrajectoryRecord]:
        mode = self.config.mode
        started = time.perf_counter()
        learn = phase.learn and client is not None
        forgets = lapse(self.config.discipline, self.config.lapse_rate or 0.0, self._rng(epoch, task, "lapse"))
        # With the plugin, the episode is a Claude Code session: its prompt hook recalls, whatever the agent forgets.
        session = self.plugin.session(self._session_id(epoch, task)) if self.plugin is not None and learn else None
        recall: dict[str, Any] | None = None
        memories: list[Memory] = []
        given: list[GivenMemory] = []
        if session is not None:
            context = await session.prompt(task.intent)
            memories = memories_in(context)  # what the agent reads of its memory: the hook's context
            given = [GivenMemory(id=m.id, outcome=m.outcome, q=m.q) for m in memories]
            recall = {"recall_id": recall_id_in(context)}
        elif client is not None and mode != "rememberer" and forgets != "recall":
            arguments: dict[str, Any] = {"task": task.intent}
            if mode in ("rag", "memp"):
                arguments["q_weight"] = 0.0
            # Only an episode that will report its outcome logs a recall; the others look up read-only.
            reports = mode in EPISODE_Q_MODES and phase.learn
            recall = await _call(client, "recall_experience" if reports else "search_experience", arguments)
            memories = [
                Memory(m["id"], m["task"], m["experience"], m["outcome"], m["q"], m["similarity"])
                for m in recall["memories"]
            ]
            given = [GivenMemory.model_validate(m) for m in recall["memories"]]
        rng = random.Random(f"{self.config.seed}:{epoch}:{task.id}")
        steps = _step_hook(client, task) if client is not None and mode in STEP_MODES else None
        attempts, episode, usage = await self._attempts(phase.benchmark, task, memories, given, rng, steps)
        # What the simulated user says of the episode: memrl-mcp asks it in the reports; the agent, in the chat.
        said = None
        if self.user is not None and learn:
            said = self.user.says(episode.success, self._rng(epoch, task, "user"))
        claimed = claims_success(self.config.judgement, episode.success, self._rng(epoch, task, "judgement"))
        learned = _Learned()
        if session is not None:
            assert client is not None and recall is not None
            learned = await self._in_session(client, session, task, episode, recall["recall_id"], forgets, claimed)
            recall["recall_id"] = learned.recall_id
        elif learn:
            assert client is not None
            learned = await self._learn(client, task, episode, recall, steps, said, forgets, claimed)
        usage = usage + learned.usage
        recall_id = recall.get("recall_id") if recall else None
        record = EpisodeRecord(
            epoch=epoch,
            position=position,
            task_id=task.id,
            task_type=task.type,
            success=episode.success,
            checker_reward=episode.reward,
            learned_reward=learned.reward,
            reward_source=learned.reward_source,
            claimed_reward=learned.claimed,
            steps=sum(a.steps for a in attempts),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            wall_s=time.perf_counter() - started,
            recall_id=recall_id,
            memory_ids=learned.memory_ids if session is not None else [m.id for m in memories],
            stored_id=learned.stored_id,
            trials=len(attempts),
            advised_steps=steps.advised if steps else 0,
            reported_steps=learned.reported_steps,
            user_said_success=said,
            recall_by=("hook" if session is not None else "agent") if recall_id else None,
            report_by=learned.report_by,
            q_updates=learned.q_updates,
        )
        trajectory = TrajectoryRecord(
            epoch=epoch,
            task_id=task.id,
            intent=task.intent,
            attempts=attempts,
            experience=learned.experience,
            stored_id=learned.stored_id,
            checker_reward=episode.reward,
            success=episode.success,
        )
        return record, trajectory

    async def _learn(
        self,
        client: Client,
        task: Task,
        episode: Episode,
        recall: dict[str, Any] | None,
        steps: Steps | None,
        said: bool | None,
        forgets: Lapse | None,
        claimed: bool,
    ) -> _Learned:
        """What the memory learns from an episode: its steps (step modes), its recall's report, or its experience
        stored (rag, memp). ``said``: the simulated user's answer, which memrl-mcp asks for in the reports;
        ``forgets``: the half of the loop the agent forgets; ``claimed``: whether the agent says it succeeded."""
        mode = self.config.mode
        learned = _Learned()
        succeeded = claimed if said is None else said
        recall_reported = False
        if steps is not None and steps.taken:
            arguments = _trajectory_report(task, steps, episode, recall, ask_user=said is not None)
            async with self._asking(said):
                report = await _call(client, "report_trajectory", arguments)
            if report.get("outcome_error"):
                raise RunError(f"memrl-mcp report_trajectory could not report the recall: {report['outcome_error']}")
            learned.reported_steps, recall_reported = report["updated"], recall is not None
            if recall_reported:
                learned.note_report("agent", report["outcome"], None)
        if recall is None or (mode == "memp" and not succeeded):
            return learned
        if mode in EPISODE_Q_MODES and not recall_reported:
            if forgets == "report":
                return learned
            await self._report(client, recall["recall_id"], "agent", task, episode, said, claimed, learned)
        else:  # rag, memp; both, whose report_trajectory reported the recall but takes no experience
            written, learned.usage = await self._written(task, episode, succeeded)
            outcome = "success" if succeeded else "failure"
            arguments = {"task": task.intent, **written, "outcome": outcome, "metadata": {"task_id": task.id}}
            stored = await _call(client, "store_experience", arguments)
            learned.stored_id, learned.experience = stored["id"], stored["memory"]["experience"]
        return learned

    async def _in_session(
        self,
        client: Client,
        session: Session,
        task: Task,
        episode: Episode,
        named: str | None,
        forgets: Lapse | None,
        claimed: bool,
    ) -> _Learned:
        """The rest of a Claude Code session with the plugin, after the agent's work: with ``evidence: hooks`` its
        edits and its check's run as tool events; then its report: on its own, of the recall its context ``named``,
        when it is a forgetful agent that did not forget; else when the Stop hook holds it, of the recall its reason
        names; then the end of the turn and of the session."""
        learned = _Learned()
        if self.config.evidence == "hooks":
            for path in episode.edited:
                await session.edited(path)
            if episode.check is not None:
                await session.ran(episode.check)
        if named is not None and self.config.discipline == "hooked" and forgets != "report":
            await self._report(client, named, "agent", task, episode, None, claimed, learned)
        held = await session.stop()
        if held is not None:
            await self._report(client, recall_id_in(held), "stop hook", task, episode, None, claimed, learned)
            await session.stop(active=True)
        await session.end()
        if learned.recall_id is None:
            where = session.plugin.log
            raise RunError(f"task {task.id}: the plugin's hooks neither recalled nor held the stop (see {where})")
        return learned

    async def _report(
        self,
        client: Client,
        recall_id: str | None,
        reporter: ReportBy,
        task: Task,
        episode: Episode,
        said: bool | None,
        claimed: bool,
        learned: _Learned,
    ) -> None:
        """Report the recall with the agent's claim (or, with a simulated user, no reward: memrl-mcp asks) and the
        experience it writes of the outcome it claims; into ``learned``, what memrl-mcp decided."""
        if recall_id is None:
            raise RunError(f"task {task.id}: the Stop hook's hold names no recall ({self.plugin and self.plugin.log})")
        succeeded = claimed if said is None else said
        written, learned.usage = await self._written(task, episode, succeeded)
        arguments: dict[str, Any] = {"recall_id": recall_id, **written, "metadata": {"task_id": task.id}}
        claim = None
        if said is None:  # else memrl-mcp asks the user, and takes the outcome from the answer
            low, high = self.scale
            claim = episode.reward if claimed == episode.success else high if claimed else low
            arguments |= {"reward": claim, "outcome": "success" if claimed else "failure"}
        async with self._asking(said):
            report = await _call(client, "report_outcome", arguments)
        learned.recall_id = recall_id
        learned.note_report(reporter, report, claim)
        stored = report["stored"]
        if stored is not None:
            learned.stored_id, learned.experience = stored["id"], stored["memory"]["experience"]

    async def _attempts(
        self,
        benchmark: Benchmark,
        task: Task,
        memories: list[Memory],
        given: list[GivenMemory],
        rng: random.Random,
        steps: Steps | None,
    ) -> tuple[list[Attempt], Episode, Usage]:
        """The attempts at one task: one, or (reflexion) until a success or ``trials``, each failed attempt's
        reflection shown to the next ones, newest first, as a mistake to avoid. ``steps``, the step memory's hook,
        goes to a multi-step benchmark's episode loop (the step-memory modes make one attempt)."""
        reflections: list[Memory] = []
        attempts: list[Attempt] = []
        usage = Usage()
        llm = self.llm if benchmark.needs_llm else None  # the run's LLM may be the client's model alone
        for trial in range(1, self.config.attempts + 1):
            shown = [*reversed(reflections), *memories]
            if steps is not None:
                assert isinstance(benchmark, StepwiseBenchmark)  # checked when the runner was made
                episode = await anyio.to_thread.run_sync(benchmark.run_steps, task, shown, llm, rng, steps)
            else:
                episode = await anyio.to_thread.run_sync(benchmark.run_episode, task, shown, llm, rng)
            usage = usage + episode.usage
            attempt = Attempt(
                memories=[*(GivenMemory(id=r.id, outcome=r.outcome) for r in reversed(reflections)), *given],
                trajectory=bound(episode.trajectory),
                success=episode.success,
                checker_reward=episode.reward,
                steps=episode.steps,
            )
            attempts.append(attempt)
            if episode.success or trial == self.config.attempts:
                break
            attempt.reflection, reflection_usage = await self._experience(task, episode)
            usage = usage + reflection_usage
            reflections.append(Memory(f"reflection-{trial}", task.intent, attempt.reflection, "failure", 0.0, 1.0))
        return attempts, episode, usage

    def _asking(self, said: bool | None) -> AbstractAsyncContextManager[None]:
        """Around a report that memrl-mcp asks the simulated user about (``said``: its answer; None: no user)."""
        return nullcontext() if self.user is None or said is None else self.user.reporting(said)

    def _rng(self, epoch: int, task: Task, purpose: str) -> random.Random:
        """A draw of its own per episode and purpose (the user's answer, the agent's lapse), apart from the
        episode's."""
        return random.Random(f"{self.config.seed}:{epoch}:{task.id}:{purpose}")

    def _session_id(self, epoch: int, task: Task) -> str:
        """The Claude Code session of an episode: an id of its own, drawn from the episode's seed."""
        return str(uuid.UUID(int=self._rng(epoch, task, "session").getrandbits(128), version=4))

    async def _written(self, task: Task, episode: Episode, succeeded: bool) -> tuple[dict[str, str], Usage]:
        """A report's or a store's experience argument: the experience of the outcome the agent believes
        (``succeeded``; :meth:`_experience`), or with ``client_model`` the trajectory (cut to what the harness's
        summaries give an LLM), for the client's model."""
        if self.model is not None:
            return {"trajectory": truncate_middle(episode.trajectory.strip(), TRAJECTORY_CHARS)}, Usage()
        text, usage = await self._experience(task, episode, succeeded)
        return {"experience": text}, usage

    async def _experience(self, task: Task, episode: Episode, succeeded: bool | None = None) -> tuple[str, Usage]:
        """What an episode teaches, as the agent believes it went (``succeeded``, default: as it went): the
        benchmark's own text (its ``mistaken_experience`` for the outcome it did not have), else the LLM's procedure
        (success) or reflection."""
        succeeded = episode.success if succeeded is None else succeeded
        own = episode.experience if succeeded == episode.success else episode.mistaken_experience
        if own is not None:
            return own, Usage()
        assert self.llm is not None, "a benchmark without its own experiences needs the LLM"
        return await anyio.to_thread.run_sync(
            summarize_experience, self.llm, task.intent, episode.trajectory, succeeded
        )

    async def _export_memory(self) -> None:
        """The final memory beside the results, as `memrl-mcp export` writes it (the server has closed)."""
        args = [sys.executable, "-m", "memrl_mcp.cli", *_store_args(self.config, self.run_dir)]
        args += ["export", "--out", str(self.run_dir.memory_export)]
        done = await anyio.run_process(args, check=False, env=get_default_environment())
        if done.returncode != 0:
            raise RunError(f"memrl-mcp export failed: {done.stderr.decode(errors='replace').strip()}")

    async def _record_memory_settings(self, client: Client) -> None:
        """Put the memory server's effective constants in run.json; a resumed run must find the same ones (a changed
        setting, e.g. a MEMRL_* variable set since, would make it another run)."""
        resource = await client.read_resource("memrl://settings")
        settings = json.loads(_text(resource))
        self.scale = (float(settings["reward_min"]), float(settings["reward_max"]))
        stored = self.run_dir.read_config()
        if stored.memory_settings is None:
            self.run_dir.write_config(stored.model_copy(update={"memory_settings": settings}))
        elif stored.memory_settings != settings:
            changed = sorted(
                k
                for k in settings.keys() | stored.memory_settings.keys()
                if settings.get(k) != stored.memory_settings.get(k)
            )
            raise RunError(
                f"{self.run_dir.path}: the memory server's settings changed since this run began "
                f"({', '.join(changed)}); choose another --run-dir to start a new run"
            )

    def _write_memory_settings(self, run_file: Path) -> None:
        """memrl-mcp's part of the run's settings file, for the run's own server: checked here, before any episode,
        as the server will read it."""
        from memrl_mcp.settings import load_settings

        try:
            load_settings(RunSettings.read(run_file).write_memory(self.run_dir.memory_settings), environ={})
        except ValueError as error:  # memrl-mcp's SettingsError is one; it names the copy, the user wrote the file
            raise RunError(str(error).replace(str(self.run_dir.memory_settings), str(run_file))) from None

    def _write_similarity(self) -> None:
        """The training tasks' mean pairwise query similarity with the run's embedder (once per run folder; with
        ``--memory-url``, whose settings the harness cannot see, the default settings' embedder)."""
        if self.run_dir.similarity_file.exists():
            return
        from memrl_mcp.embeddings import create_embedder  # the model is loaded only here, and only once
        from memrl_mcp.settings import load_settings

        settings = load_settings(self.run_dir.memory_settings if self.config.memory_config else None)
        embedder = create_embedder(settings.embeddings, settings.similarity)
        vectors = embedder.embed([t.intent for t in self.tasks])
        similarity = TaskSimilarity(
            embedder=embedder.name, tasks=len(self.tasks), mean_pairwise=mean_pairwise_similarity(vectors)
        )
        self.run_dir.similarity_file.write_text(similarity.model_dump_json(indent=2) + "\n")

    async def _save_q_values(self, client: Client) -> None:
        """Final Q of every memory that was ever injected, for the Q-critic metric."""
        used = sorted({memory_id for r in self.run_dir.episodes() for memory_id in r.memory_ids})
        q_values: dict[str, float] = {}
        for memory_id in used:
            try:
                result = await client.read_resource(f"memrl://memories/{memory_id}")
            except Exception:  # forgotten since (merges keep ids, so this is rare): no final Q
                continue
            q_values[memory_id] = json.loads(_text(result))["q"]
        (self.run_dir.path / Q_VALUES_FILE).write_text(json.dumps(q_values, indent=0) + "\n")


def _step_hook(client: Client, task: Task) -> Steps:
    """The step memory's hook for one episode: each observation's advice from ``recall_step_advice`` (read-only),
    called from the episode's worker thread through the run's event loop."""

    def recall(observation: str) -> StepAdvice:
        arguments = {"task": task.intent, "observation": bound(observation, STEP_OBSERVATION_CHARS)}
        found = anyio.from_thread.run(_call, client, "recall_step_advice", arguments)

        def actions(key: str) -> tuple[ActionAdvice, ...]:
            return tuple(ActionAdvice(a["action"], float(a["q"]), int(a["visits"])) for a in found[key])

        return StepAdvice(encouraged=actions("encouraged"), discouraged=actions("discouraged"))

    return Steps(recall)


def _trajectory_report(
    task: Task, steps: Steps, episode: Episode, recall: dict[str, Any] | None, ask_user: bool
) -> dict[str, Any]:
    """``report_trajectory``'s arguments: every step taken, reward 0 but the last (the episode's reward: the
    benchmarks reward the outcome only; left out with ``ask_user``, for memrl-mcp to ask the user), under a fresh
    episode id (the once-only key: an episode run again after a kill is another trajectory); with the episode
    memory's recall (mode both), whose outcome it reports too."""
    rewards = [0.0] * (len(steps.taken) - 1) + [None if ask_user else episode.reward]
    arguments: dict[str, Any] = {
        "task": task.intent,
        "steps": [
            {
                "observation": bound(s.observation, STEP_OBSERVATION_CHARS),
                "action": bound(s.action, STEP_ACTION_CHARS),
            }
            | ({} if r is None else {"reward": r})
            for s, r in zip(steps.taken, rewards, strict=True)
        ],
        "episode_id": str(uuid.uuid4()),
    }
    if recall is not None:
        arguments["recall_id"] = recall["recall_id"]
    return arguments


@dataclass
class _Learned:
    """What the memory learned from one episode, for its records."""

    stored_id: str | None = None
    experience: str | None = None
    reported_steps: int = 0
    report_by: ReportBy | None = None
    reward: float | None = None
    reward_source: str | None = None
    claimed: float | None = None
    q_updates: int = 0
    recall_id: str | None = None
    memory_ids: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)

    def note_report(self, reporter: ReportBy, report: dict[str, Any] | None, claim: float | None) -> None:
        """A report of the episode's recall (``report_outcome``'s result; None when none was applied) that claimed
        the reward ``claim``: the reward memrl-mcp decided, its source, and the memories it moved."""
        if report is not None and report.get("reported", True):
            self.report_by, self.reward, self.q_updates = reporter, report["reward"], len(report["updated"])
            self.reward_source, self.claimed = report.get("reward_source"), claim
            self.memory_ids = [change["id"] for change in report["updated"]] + list(report.get("missing", []))


class _Counter:
    """Episodes done over the run's total, for the progress callback."""

    def __init__(self, done: int, total: int, progress: Progress | None) -> None:
        self.done, self.total, self.progress = done, total, progress

    def step(self) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total)


def default_run_dir(root: Path, config: RunConfig) -> Path:
    transfer = "-transfer" if config.transfer else ""
    discipline = (
        "" if config.discipline == "disciplined" else f"-{config.discipline}{round(100 * (config.lapse_rate or 0))}"
    )
    judgement = "" if config.judgement == "honest" else f"-{config.judgement}"
    evidence = "" if config.evidence == "none" else f"-evidence-{config.evidence}"
    return root / f"{config.benchmark}-{config.mode}{discipline}{judgement}{evidence}{transfer}-seed{config.seed}"
