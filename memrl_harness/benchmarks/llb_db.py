"""LifelongAgentBench DB (``llb-db``): answer a question or change a table with SQL on MariaDB.

Data: ``llb/db_train.json`` of the data folder (``memrl_harness.install.shared_data_root``),
or the ``data`` option: a JSON object of tasks by id, each with ``instruction``,
``answer_info{direct, md5, sql}``, ``table_info{name, column_info_list, row_list}`` and ``skill_list``.
``Task.intent`` is the instruction; ``Task.type`` is the gold SQL's kind (select / insert / update /
delete).

Server (``backend``): ``mariadb`` (default), a private MariaDB started by the first episode
(:class:`memrl_harness.backends.mariadb.LocalMariaDB`, ``make mariadb``); ``docker``, a MariaDB container of a locally
built image (``image``; :class:`memrl_harness.backends.docker.MariaDBContainer`). Either way the agent's SQL goes
through a database driver as an unprivileged user made for the episode, with rights on its own database only
and a time limit per action it cannot lift (see :mod:`memrl_harness.backends.mariadb` for what that guarantees and
what it does not). The server is stopped by :meth:`LLBDBBenchmark.close`, when collected, or at exit.

Episode (LifelongAgentBench's protocol): a fresh database holds the task's table, created as LLB does
(columns with their declared types, every value inserted as a quoted string). Up to ``max_rounds`` (15)
rounds: the LLM answers JSON ``{thought, action, content}`` with ``action`` ``sql`` (the SQL is run, one or
more statements stopping at the first error, its last result set or its error shown back, cut to
``max_output_chars``) or ``answer`` (the final answer; ends the episode). Recalled memories are in the first
prompt: successes to follow, failures to avoid. In the step-memory modes each round's request also carries the step
memory's advice on the current observation (the last result; the table's description before the first). The
database and its user are dropped afterwards.

Checker (LLB's): for INSERT / UPDATE / DELETE tasks (``answer_info.md5``) the table's hash after the
agent's SQL, computed as LLB computes it (:data:`MD5_QUERY`: the md5 of the sorted, comma-joined first
5 hex digits of each row's ``MD5(CONCAT_WS(',', columns...))``) as the server's administrator, must equal
``answer_info.md5``, whatever the agent answered. For SELECT tasks the final answer's rows (a Python-style
list of tuples, e.g. ``[(1, 'a'), (2, 'b')]``, or LLB's looser ``(1, a), (2, b)`` / a bare value for one cell)
must match ``answer_info.direct``: numbers within 1e-6, strings exactly (one pair of quotes forgiven), in
order where the gold SQL has ``ORDER BY``, as a multiset where it has none (LLB itself is strict about order
everywhere). Reward +1 on success, 0 on failure (MemRL's LLB setting).

How the check was validated against the gold SQL (and the few tasks MariaDB answers otherwise than MySQL):
docs/harness.md; ``tests/harness/test_llb_db.py`` and :meth:`LLBDBBenchmark.oracle` run it.

Options (``--option KEY=VALUE``): :class:`LLBDBOptions` (``memrl-harness options llb-db``).
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from memrl_harness.backends.docker import DB_IMAGE, MariaDBContainer
from memrl_harness.backends.mariadb import LocalMariaDB
from memrl_harness.backends.sql import EpisodeDatabase, ResultSet, Row, SQLResult, SQLServer
from memrl_harness.benchmarks.base import (
    Episode,
    Memory,
    Steps,
    StepwiseBenchmark,
    Task,
    memory_sections,
    with_advice,
)
from memrl_harness.benchmarks.options import LLBOptions
from memrl_harness.install import data_hint, shared_data_root
from memrl_harness.llm import LLM, LLMError, Usage

DATA_FILE = "llb/db_train.json"
MD5_QUERY = (
    "SELECT MD5(GROUP_CONCAT(rowhash ORDER BY rowhash)) AS hash FROM "
    "(SELECT SUBSTRING(MD5(CONCAT_WS(',', {columns})), 1, 5) AS rowhash FROM `{table}`) AS sub;"
)
ACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "thought": {"type": "string"},
        "action": {"type": "string", "enum": ["sql", "answer"]},
        "content": {"type": "string"},
    },
    "required": ["thought", "action", "content"],
    "additionalProperties": False,
}


# --- the task's table ------------------------------------------------------------------------


def quote(value: Any) -> str:
    """An SQL string literal, as LLB inserts every value (``'...'``, quotes and backslashes escaped)."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "''") + "'"


def init_sql(table: Mapping[str, Any]) -> str:
    """LLB's table set-up: declared column types, all values inserted as quoted strings."""
    columns = ",".join(f"`{c['name']}` {c['type']}" for c in table["column_info_list"])
    names = ",".join(f"`{c['name']}`" for c in table["column_info_list"])
    sql = f"CREATE TABLE `{table['name']}` ({columns});\n"
    if table["row_list"]:
        values = ",".join("(" + ",".join(quote(v) for v in row) + ")" for row in table["row_list"])
        sql += f"INSERT INTO `{table['name']}` ({names}) VALUES {values};\n"
    return sql


def md5_query(table: Mapping[str, Any]) -> str:
    columns = ", ".join(f"`{c['name']}`" for c in table["column_info_list"])
    return MD5_QUERY.format(columns=columns, table=table["name"])


# --- the checker ----------------------------------------------------------------------------


def _number_equal(agent: Any, gold: float) -> bool:
    if isinstance(agent, bool):
        return False
    if isinstance(agent, (int, float)):
        value = float(agent)
    else:
        text = re.sub(r"^Decimal\(([\"']?)(.*?)([\"']?)\)$", r"\2", str(agent).strip())
        text = re.sub(r"^[^0-9.\-]+|[^0-9.\-]+$", "", text)  # '-55' -> -55, as LLB does
        try:
            value = float(text)
        except ValueError:
            return False
    return math.isclose(value, float(gold), rel_tol=1e-6, abs_tol=1e-6)


def _string_equal(agent: Any, gold: str) -> bool:
    text = agent if isinstance(agent, str) else str(agent)
    if text == gold:
        return True
    if 0 < len(text) - len(gold) <= 2:  # one pair of quotes the agent kept
        for char in ("'", '"'):
            if text.startswith(char) and not gold.startswith(char):
                text = text[1:]
                break
        for char in ("'", '"'):
            if text.endswith(char) and not gold.endswith(char):
                text = text[:-1]
                break
    return text == gold


def row_matches(agent: Sequence[Any], gold: Sequence[Any]) -> bool:
    if len(agent) != len(gold):
        return False
    for a, g in zip(agent, gold, strict=True):
        if isinstance(g, (int, float)) and not isinstance(g, bool):
            if not _number_equal(a, g):
                return False
        elif isinstance(g, str):
            if not _string_equal(a, g):
                return False
        elif a != g:
            return False
    return True


def parse_answer(answer: str) -> list[Row] | None:
    """The rows in a final answer: a Python literal first, else LLB's loose ``(a, b), (c, d)`` text."""
    text = answer.strip()
    with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = ast.literal_eval(text.replace("Decimal(", "(")) if text else None
        if isinstance(value, (list, tuple)) and value and all(isinstance(r, (list, tuple)) for r in value):
            return [tuple(r) for r in value]
        if isinstance(value, (list, tuple)) and not value:
            return []
        if isinstance(value, tuple):
            return [value]
        if isinstance(value, (int, float, str)):
            return [(value,)]
    spans = []
    start = None
    depth_decimal = False
    for index, char in enumerate(text):
        if char == "(":
            if text[max(0, index - 7) : index] == "Decimal":
                if depth_decimal:
                    return None
                depth_decimal = True
            else:
                start = index
        elif char == ")":
            if depth_decimal:
                depth_decimal = False
                continue
            if start is None:
                return None
            spans.append(text[start + 1 : index])
            start = None
    if start is not None:
        return None
    pieces = spans or ([text] if text else [])
    return [tuple(e.strip() for e in re.split(r"\s*,\s*", piece) if e.strip()) for piece in pieces]


def answer_matches(answer: str, gold: Sequence[Sequence[Any]], ordered: bool) -> bool:
    """LLB's direct-answer check; rows as a multiset unless ``ordered``."""
    rows = parse_answer(answer)
    if rows is None or len(rows) != len(gold):
        return False
    if ordered:
        return all(row_matches(a, g) for a, g in zip(rows, gold, strict=True))
    left = list(rows)
    for g in gold:
        hit = next((i for i, a in enumerate(left) if row_matches(a, g)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def has_order_by(sql: str) -> bool:
    return re.search(r"\border\s+by\b", sql, re.I) is not None


def format_rows(result: ResultSet) -> str:
    return f"columns: {result.columns}\nrows: {result.rows!r}"


# --- the benchmark --------------------------------------------------------------------------


@dataclass
class Outcome:
    """A finished episode as the checker saw it."""

    success: bool
    detail: str


class LLBDBOptions(LLBOptions):
    """LLB DB's options; the module docstring says what the server backends are."""

    backend: Literal["mariadb", "docker"] = Field(
        "mariadb", description="the SQL server: a private local MariaDB, or a MariaDB container of image"
    )
    max_rounds: int = Field(15, ge=1, description="LLM turns per episode")
    statement_timeout: float = Field(10.0, gt=0, description="seconds one action's SQL may run")


def sql_server(options: LLBDBOptions) -> SQLServer:
    """The server of ``options.backend``: a private local server, or a container of ``options.image``."""
    return MariaDBContainer(image=options.image or DB_IMAGE) if options.backend == "docker" else LocalMariaDB()


class LLBDBBenchmark(StepwiseBenchmark):
    """LifelongAgentBench's DB tasks, one fresh database and user per episode on a shared SQL server."""

    name = "llb-db"
    needs_llm = True
    Options = LLBDBOptions

    def __init__(self, **values: Any) -> None:
        """``values``: the :class:`LLBDBOptions`, as text (``--option limit=20``) or typed."""
        options = self.options = LLBDBOptions.parse(self.name, values)
        path = options.data or shared_data_root() / DATA_FILE
        if not path.is_file():
            raise ValueError(data_hint("LLB DB data", path))
        rows: dict[str, Any] = json.loads(path.read_text())
        chosen = list(options.ids or rows)
        unknown = [i for i in chosen if i not in rows]
        if unknown:
            raise ValueError(f"ids: not in the data: {', '.join(unknown)}")
        self._tasks = [self._task(i, rows[i]) for i in chosen[: options.limit]]
        self.server = sql_server(options)  # started by the first episode, stopped by close() or at exit
        self.engine = self.server.engine

    @staticmethod
    def _task(task_id: str, row: Mapping[str, Any]) -> Task:
        kind = row["answer_info"]["sql"].split()[0].lower()
        return Task(id=task_id, intent=row["instruction"].strip(), data=dict(row), type=kind)

    def tasks(self) -> Sequence[Task]:
        return list(self._tasks)

    def start(self) -> LLBDBBenchmark:
        self.server.start()
        return self

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> LLBDBBenchmark:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one database per episode ---------------------------------------------------------

    @contextlib.contextmanager
    def database(self, task: Task) -> Iterator[EpisodeDatabase]:
        """A fresh database holding the task's table and its user, both dropped afterwards."""
        with self.server.episode(init_sql(task.data["table_info"]), self.options.statement_timeout) as database:
            yield database

    def table_md5(self, task: Task, database: EpisodeDatabase) -> str | None:
        result = database.inspect(md5_query(task.data["table_info"]))
        if result.error or not result.rows:
            return None
        value = result.rows[0][0]
        return None if value is None else str(value)

    def observation(self, result: SQLResult) -> str:
        if result.error:
            text = f"Error: {result.error}"
        elif result.last is None:
            text = "The SQL ran; it returned no rows (no result set)."
        else:
            text = format_rows(result.last)
        if len(text) > self.options.max_output_chars:
            text = text[: self.options.max_output_chars] + f" ... [cut: {len(text)} characters in all]"
        return text

    def judge(self, task: Task, database: EpisodeDatabase, answer: str | None) -> Outcome:
        info = task.data["answer_info"]
        if info.get("md5"):
            got = self.table_md5(task, database)
            ok = got == info["md5"]
            return Outcome(ok, f"table md5 {'matches' if ok else 'differs from'} the expected one")
        ordered = has_order_by(info["sql"])
        ok = answer is not None and answer_matches(answer, info["direct"] or [], ordered)
        if answer is None:
            return Outcome(False, "no final answer given")
        return Outcome(ok, f"final answer rows {'match' if ok else 'do not match'} the expected rows")

    def oracle(self, task: Task) -> Outcome:
        """Run the gold SQL as the agent would and answer with its rows (the checker's sanity check)."""
        with self.database(task) as database:
            result = database.execute(task.data["answer_info"]["sql"])
            answer = repr(result.last.rows) if result.last else (result.error or "")
            return self.judge(task, database, answer)

    def nothing(self, task: Task) -> Outcome:
        """Change nothing and answer nothing."""
        with self.database(task) as database:
            return self.judge(task, database, "")

    # --- the agent ------------------------------------------------------------------------

    def table_description(self, task: Task) -> str:
        """The task's table as the agent first sees it (also the step memory's first observation)."""
        table = task.data["table_info"]
        columns = ", ".join(f"{c['name']} {c['type']}" for c in table["column_info_list"])
        return f"The {self.engine} table `{table['name']}` has the columns: {columns} ({len(table['row_list'])} rows)."

    def prompt(self, task: Task, memories: Sequence[Memory]) -> str:
        parts = memory_sections(memories)
        parts.append(f"Task: {task.intent}")
        parts.append(self.table_description(task))
        parts.append(
            f"You have {self.options.max_rounds} rounds. "
            "Each round answer JSON with `thought`, `action` and `content`:\n"
            '- action "sql": content is SQL to run on the database; you will see its result or error.\n'
            '- action "answer": content is your final answer; this ends the task. For a question, give the '
            "result rows as a Python list of tuples, e.g. [(1, 'a'), (2, 'b')]. For a change to the table, "
            "run the SQL first, then answer with a short confirmation."
        )
        return "\n\n".join(parts)

    def run_steps(
        self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random, steps: Steps
    ) -> Episode:
        if llm is None:
            raise ValueError("llb-db needs an LLM")
        messages: list[dict[str, str]] = [
            {"role": "system", "content": f"You are an expert in SQL working on a {self.engine} database."},
            {"role": "user", "content": self.prompt(task, memories)},
        ]
        usage = Usage()
        log = [f"Task: {task.intent}"]
        answer: str | None = None
        rounds = 0
        observation = self.table_description(task)
        with self.database(task) as database:
            for _ in range(self.options.max_rounds):
                chat = with_advice(messages, steps.advise(observation))
                try:
                    reply = llm.chat(chat, json_schema=ACTION_SCHEMA, max_tokens=self.options.max_tokens)
                except LLMError as exc:  # an unparsable answer ends the episode, as an invalid action in LLB
                    log.append(f"Invalid reply: {str(exc)[:300]}")
                    break
                usage = usage + reply.usage
                rounds += 1
                action, content = reply.data["action"], reply.data["content"].strip()
                steps.took(observation, f"{action}: {content}")
                messages.append({"role": "assistant", "content": reply.text})
                if action == "answer":
                    answer = content
                    log.append(f"Final answer: {content[:1000]}")
                    break
                observation = self.observation(database.execute(content))
                log.append(f"SQL: {content[:1000]}\nResult: {observation}")
                messages.append({"role": "user", "content": observation})
            else:
                log.append(f"No final answer within {self.options.max_rounds} rounds.")
            outcome = self.judge(task, database, answer)
        log.append(f"Checker: {outcome.detail}")
        return Episode(
            success=outcome.success,
            reward=1.0 if outcome.success else 0.0,
            steps=rounds,
            trajectory="\n\n".join(log),
            usage=usage,
        )
