"""The runtime-learning protocol (MEMRL.md), driven through an MCP client of memrl-mcp.

An epoch replays the benchmark's tasks in a seeded order. Per task: recall (query = the task's
intent) -> the agent acts with the recalled memories -> the benchmark's checker gives the reward
-> the memory learns:

- ``none``: no memory at all;
- ``rag``: recall with lambda = 0 (similarity only); the new experience is stored, no Q update;
- ``memrl``: recall with the server's lambda; ``report_outcome`` updates the Q of exactly the
  recalled memories and stores the new experience.

Tasks of one epoch run in parallel on bounded workers; epochs run one after another. Each finished
episode is appended to the run's ``episodes.jsonl`` after the memory has learned from it, so a
killed run resumes with the episodes it lacks (an episode killed between its report and its record
runs again; the memory keeps what the lost attempt taught it).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from harness.benchmarks.base import Benchmark, Episode, Memory, Task
from harness.llm import LLM, summarize_experience
from harness.results import Q_VALUES_FILE, EpisodeRecord, RunConfig, RunDir

ENV_MEMORY_TOKEN = "MEMRL_MEMORY_TOKEN"  # bearer token for --memory-url

Progress = Callable[[int, int], None]
"""Called with (episodes done, episodes in the run) after each episode."""


class RunError(RuntimeError):
    """The run cannot go on (a memory tool refused, a run folder holds another run)."""


@asynccontextmanager
async def _http_memory_client(url: str, token: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
        try:
            client = await stack.enter_async_context(Client(streamable_http_client(url, http_client=http)))
        except Exception as error:  # the SDK reports a 401 as a bare "error response"
            hint = "" if token else f" (a server with tokens needs {ENV_MEMORY_TOKEN})"
            raise RunError(f"cannot open the memory at {url}: {error}{hint}") from None
        yield client


@asynccontextmanager
async def _stdio_memory_client(config: RunConfig, run_dir: RunDir) -> AsyncIterator[Client]:
    args = ["-m", "memrl_mcp.cli", "--data-dir", str(run_dir.memory_dir)]
    if config.memory_config:
        args += ["--config", config.memory_config]
    # The server's log lines are for whoever debugs this run, not for the terminal: they go to the run folder.
    with run_dir.server_log.open("a") as log:
        async with Client(stdio_client(StdioServerParameters(command=sys.executable, args=args), errlog=log)) as client:
            yield client


def memory_client(config: RunConfig, run_dir: RunDir) -> AbstractAsyncContextManager[Client]:
    """An MCP client of memrl-mcp: the given HTTP server (with the bearer token of ``MEMRL_MEMORY_TOKEN``,
    kept out of the run's saved config), or a fresh stdio server on the run's store, logging into the run folder."""
    if config.memory_url:
        return _http_memory_client(config.memory_url, os.environ.get(ENV_MEMORY_TOKEN))
    return _stdio_memory_client(config, run_dir)


def epoch_order(tasks: Sequence[Task], seed: int, epoch: int) -> list[Task]:
    """The epoch's fixed, seeded order of the same task list."""
    order = list(tasks)
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error or result.structured_content is None:
        text = result.content[0].text if result.content else "no content"
        raise RunError(f"memrl-mcp {tool} failed: {text}")
    return result.structured_content


class Runner:
    """Runs one configured run of one benchmark into one run folder."""

    def __init__(self, config: RunConfig, benchmark: Benchmark, run_dir: RunDir, llm: LLM | None) -> None:
        if benchmark.needs_llm and llm is None:
            raise RunError(f"benchmark {benchmark.name} needs an LLM (MEMRL_LLM_BASE_URL / --llm-base-url)")
        self.config = config
        self.benchmark = benchmark
        self.run_dir = run_dir
        self.llm = llm
        all_tasks = list(benchmark.tasks())
        self.tasks = all_tasks[: config.tasks] if config.tasks else all_tasks
        self._record_lock = anyio.Lock()

    def prepare(self) -> set[tuple[int, str]]:
        """Write or check the run's config; the (epoch, task id) pairs already done."""
        if self.run_dir.config_file.exists():
            stored = self.run_dir.read_config()
            if stored != self.config:
                raise RunError(
                    f"{self.run_dir.path} holds another run ({stored.model_dump_json()}); "
                    "choose another --run-dir to start a new one"
                )
        else:
            self.run_dir.write_config(self.config)
        self.run_dir.drop_torn_tail()
        return {(r.epoch, r.task_id) for r in self.run_dir.episodes()}

    async def run(self, progress: Progress | None = None) -> list[EpisodeRecord]:
        """Run (or finish) the run; the first failure stops it with a RunError, and it can resume."""
        done = self.prepare()
        total = self.config.epochs * len(self.tasks)
        try:
            if self.config.mode == "none":
                await self._epochs(None, done, total, progress)
            else:
                async with memory_client(self.config, self.run_dir) as client:
                    await self._epochs(client, done, total, progress)
                    if self.config.mode == "memrl":
                        await self._save_q_values(client)
        except BaseExceptionGroup as group:  # task groups nest; report the failure itself
            first: BaseException = group
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
        return self.run_dir.episodes()

    async def _epochs(self, client: Client | None, done: set[tuple[int, str]], total: int, progress: Progress | None):
        finished = len(done)
        limiter = anyio.CapacityLimiter(self.config.workers)

        async def one(epoch: int, position: int, task: Task) -> None:
            nonlocal finished
            async with limiter:
                try:
                    record = await self._episode(client, epoch, position, task)
                except RunError:
                    raise
                except Exception as error:
                    raise RunError(f"epoch {epoch}, task {task.id}: {error!r}") from error
            async with self._record_lock:
                self.run_dir.append(record)
                finished += 1
                if progress:
                    progress(finished, total)

        for epoch in range(1, self.config.epochs + 1):
            async with anyio.create_task_group() as group:
                for position, task in enumerate(epoch_order(self.tasks, self.config.seed, epoch)):
                    if (epoch, task.id) not in done:
                        group.start_soon(one, epoch, position, task)

    async def _episode(self, client: Client | None, epoch: int, position: int, task: Task) -> EpisodeRecord:
        mode = self.config.mode
        started = time.perf_counter()
        recall: dict[str, Any] | None = None
        memories: list[Memory] = []
        if client is not None:
            arguments: dict[str, Any] = {"task": task.intent}
            if mode == "rag":
                arguments["q_weight"] = 0.0
            recall = await _call(client, "recall_experience", arguments)
            memories = [
                Memory(m["id"], m["task"], m["experience"], m["outcome"], m["q"], m["similarity"])
                for m in recall["memories"]
            ]
        rng = random.Random(f"{self.config.seed}:{epoch}:{task.id}")
        episode: Episode = await anyio.to_thread.run_sync(self.benchmark.run_episode, task, memories, self.llm, rng)
        usage = episode.usage
        stored_id = None
        if client is not None and recall is not None:
            experience = episode.experience
            if experience is None:
                assert self.llm is not None, "a benchmark without its own experiences needs the LLM"
                experience, summary_usage = await anyio.to_thread.run_sync(
                    summarize_experience, self.llm, task.intent, episode.trajectory, episode.success
                )
                usage = usage + summary_usage
            outcome = "success" if episode.success else "failure"
            if mode == "memrl":
                report = await _call(
                    client,
                    "report_outcome",
                    {
                        "recall_id": recall["recall_id"],
                        "reward": episode.reward,
                        "experience": experience,
                        "outcome": outcome,
                        "metadata": {"task_id": task.id},
                    },
                )
                stored_id = report["stored"]["id"]
            else:
                stored = await _call(
                    client,
                    "store_experience",
                    {
                        "task": task.intent,
                        "experience": experience,
                        "outcome": outcome,
                        "metadata": {"task_id": task.id},
                    },
                )
                stored_id = stored["id"]
        return EpisodeRecord(
            epoch=epoch,
            position=position,
            task_id=task.id,
            task_type=task.type,
            success=episode.success,
            reward=episode.reward,
            steps=episode.steps,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            wall_s=time.perf_counter() - started,
            recall_id=recall["recall_id"] if recall else None,
            memory_ids=[m.id for m in memories],
            stored_id=stored_id,
        )

    async def _save_q_values(self, client: Client) -> None:
        """Final Q of every memory that was ever injected, for the Q-critic metric."""
        used = sorted({memory_id for r in self.run_dir.episodes() for memory_id in r.memory_ids})
        q_values: dict[str, float] = {}
        for memory_id in used:
            try:
                result = await client.read_resource(f"memrl://memories/{memory_id}")
            except Exception:  # forgotten since (merges keep ids, so this is rare): no final Q
                continue
            q_values[memory_id] = json.loads(result.contents[0].text)["q"]
        (self.run_dir.path / Q_VALUES_FILE).write_text(json.dumps(q_values, indent=0) + "\n")


def default_run_dir(root: Path, config: RunConfig) -> Path:
    return root / f"{config.benchmark}-{config.mode}-seed{config.seed}"
