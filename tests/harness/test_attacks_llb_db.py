"""Issue 12's attacks on llb-db, made by a hostile model through the harness's public path.

Each test runs llb-db episodes (``Runner``, or the ``memrl-harness`` command, mode ``none``) whose scripted
OpenAI-compatible endpoint answers the hostile SQL, then checks that the attack's effect did not happen: no file
on the host, the server alive and unchanged, the other episode's database intact. They need MariaDB
(``make mariadb``) and fail without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pymysql
import pytest

from memrl_harness.backends.mariadb import LocalMariaDB
from memrl_harness.benchmarks.llb_db import LLBDBBenchmark
from memrl_harness.results import RunDir
from tests.harness.fake_llm import FakeLLMServer, RecordedRequest
from tests.harness.sql_attacks import OTHER, TASK, Action, play, refused

pytestmark = pytest.mark.slow  # needs MariaDB: `make test` runs it, `make test-fast` does not

UNLIMITED = "SET SESSION max_statement_time = 0"  # lifts MariaDB's own per-user limit for the session


@pytest.fixture(scope="module")
def bench() -> Iterator[LLBDBBenchmark]:
    with LLBDBBenchmark(ids=f"{TASK},{OTHER}", statement_timeout=3) as benchmark:  # fails without MariaDB
        yield benchmark


def server(bench: LLBDBBenchmark) -> LocalMariaDB:
    assert isinstance(bench.server, LocalMariaDB)
    return bench.server


def admin_rows(bench: LLBDBBenchmark, sql: str) -> list[tuple]:
    result = server(bench).admin.admin(sql)
    assert result.error is None, result.error
    return result.rows


def alive_episode_sessions(bench: LLBDBBenchmark) -> list[tuple]:
    return admin_rows(
        bench, "SELECT id, user, command, info FROM information_schema.processlist WHERE user LIKE 'llb%'"
    )


def test_client_commands_do_not_exist_through_the_cli(tmp_path: Path) -> None:
    """``\\! cmd`` and ``system cmd`` ran a host root shell through the ``mariadb`` client; a driver has no such
    commands: they are SQL syntax errors, and nothing runs on the host."""
    markers = [tmp_path / f"shell-{i}" for i in range(3)]
    actions = [f"\\! touch {markers[0]}", f"system touch {markers[1]}", f"SELECT 1;\n\\! touch {markers[2]}"]
    actions.append("source /etc/passwd")
    with FakeLLMServer() as fake:

        def answer(request: RecordedRequest) -> str:
            played = sum(m["role"] == "assistant" for m in request.messages)
            if played < len(actions):
                return json.dumps({"thought": "attack", "action": "sql", "content": actions[played]})
            return json.dumps({"thought": "done", "action": "answer", "content": "done"})

        fake.responder = answer
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")}
        env |= {"MEMRL_LLM_BASE_URL": fake.base_url, "MEMRL_LLM_MODEL": fake.model}
        done = subprocess.run(
            [sys.executable, "-m", "memrl_harness.cli", "run", "llb-db", "--mode", "none", "--epochs", "1",
             "--tasks", "1", "--runs", str(tmp_path / "runs"), "--option", f"ids={TASK}"],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        shown = [m["content"] for m in fake.chat_requests[-1].messages[2:] if m["role"] == "user"]
    assert done.returncode == 0, done.stderr
    assert not any(marker.exists() for marker in markers)
    assert len(shown) == len(actions) and all(o.startswith("Error: ERROR 1064") for o in shown), shown  # syntax
    record = RunDir(tmp_path / json.loads(done.stdout)["run_dir"]).episodes()[0]
    assert record.task_id == TASK and not record.success


@pytest.mark.anyio
async def test_host_files_can_be_neither_read_nor_written(
    fake_llm: FakeLLMServer, bench: LLBDBBenchmark, tmp_path: Path
) -> None:
    """No FILE privilege and ``secure_file_priv`` on an empty folder: LOAD_FILE gives NULL, INTO OUTFILE /
    DUMPFILE and LOAD DATA [LOCAL] are refused, DATA DIRECTORY is ignored (``--symbolic-links=0``)."""
    secret = Path(f"/tmp/llbdb-secret-{uuid.uuid4().hex}")
    secret.write_text("the-host-secret-42\n")
    secret.chmod(0o644)  # readable by the server's user: only the privileges stand in the way
    outside = Path(f"/tmp/llbdb-out-{uuid.uuid4().hex}")
    outside.mkdir(mode=0o777)
    outside.chmod(0o777)
    files = Path(server(bench).socket).parent / "files"
    try:
        played = await play(
            fake_llm,
            bench,
            tmp_path,
            {
                TASK: [
                    f"SELECT LOAD_FILE('{secret}') AS f",
                    "SELECT LOAD_FILE('/etc/shadow') AS f",
                    f"SELECT 'pwned' INTO OUTFILE '{outside}/outfile'",
                    f"SELECT 'pwned' INTO DUMPFILE '{outside}/dumpfile'",
                    f"SELECT 'pwned' INTO OUTFILE '{files}/outfile'",
                    "CREATE TABLE loaded (line TEXT)",
                    f"LOAD DATA INFILE '{secret}' INTO TABLE loaded",
                    f"LOAD DATA LOCAL INFILE '{secret}' INTO TABLE loaded",
                    f"CREATE TABLE placed (a INT) DATA DIRECTORY = '{outside}'",
                    "INSERT INTO placed VALUES (1)",
                    "SELECT * FROM loaded",
                ]
            },
        )
    finally:
        secret.unlink()
        leftovers = sorted(p.name for p in outside.iterdir())
        outside.rmdir() if not leftovers else None
    out = played.outputs[TASK]
    assert all("the-host-secret" not in o for o in out)
    assert out[0].endswith("rows: [(None,)]") and out[1].endswith("rows: [(None,)]")  # NULL: no FILE privilege
    assert all(refused(o) and "FILE privilege" in o for o in out[2:5]), out[2:5]
    assert refused(out[6]) and "Access denied" in out[6], out[6]  # LOAD DATA without FILE: error 1045
    assert refused(out[7]), out[7]  # the server refuses LOCAL (--local-infile=0), the driver would too
    assert not refused(out[8]) and not refused(out[9])  # accepted, but the table stays in the datadir
    assert out[10].endswith("rows: []")
    assert leftovers == [] and list(files.iterdir()) == []


@pytest.mark.anyio
async def test_another_live_episode_is_out_of_reach(
    fake_llm: FakeLLMServer, bench: LLBDBBenchmark, tmp_path: Path
) -> None:
    """Two episodes at once: the attacker does not see the victim's database in SHOW DATABASES nor
    information_schema, and can neither read, change nor drop it; the victim then passes its task."""
    victim_done_marking, attacker_done = threading.Event(), threading.Event()
    victim: dict[str, str] = {}

    def find_victim() -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = admin_rows(bench, "SELECT table_schema FROM information_schema.tables WHERE table_name = 'mark'")
            if rows:
                victim["db"] = rows[0][0]
                return rows[0][0]
            time.sleep(0.1)
        raise AssertionError("the victim's episode never made its table")

    def attack(template: str) -> Callable[[], str]:
        return lambda: template.format(db=victim.get("db") or find_victim())

    def finish_attack() -> str:
        attacker_done.set()
        return "SELECT 1"

    def victim_waits() -> str:
        victim_done_marking.set()
        assert attacker_done.wait(120), "the attacker never finished"
        return "SELECT COUNT(*) FROM mark"

    table = next(t for t in bench.tasks() if t.id == OTHER).data["table_info"]["name"]
    gold = next(t for t in bench.tasks() if t.id == TASK).data["answer_info"]["sql"]
    attacks = [
        attack("SELECT * FROM `{db}`.mark"),
        attack("SHOW DATABASES"),
        attack("SELECT schema_name FROM information_schema.schemata"),
        attack("SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema LIKE 'llb%'"),
        attack("USE `{db}`"),
        attack("INSERT INTO `{db}`.mark VALUES (666)"),
        attack(f"DELETE FROM `{{db}}`.`{table}`"),
        attack("DROP TABLE `{db}`.mark"),
        attack("DROP DATABASE `{db}`"),
        attack("CREATE DATABASE `llb_squat`"),
        attack("RENAME TABLE `{db}`.mark TO stolen"),
        finish_attack,
    ]
    played = await play(
        fake_llm,
        bench,
        tmp_path,
        {
            TASK: ["CREATE TABLE mark (x INT); INSERT INTO mark VALUES (1)", victim_waits, gold],
            OTHER: attacks,
        },
    )
    out = played.outputs[OTHER]
    name = victim["db"]
    assert victim_done_marking.is_set() and all(name not in o for o in out[1:4]), out[1:4]
    assert refused(out[0]) and all(refused(o) for o in out[4:11]), out
    records = {r.task_id: r for r in played.records}
    assert played.outputs[TASK][1].endswith("rows: [(1,)]")  # the mark row alone: nothing inserted or deleted
    assert records[TASK].success  # its table untouched: the gold SQL then gives the expected md5
    assert admin_rows(bench, "SHOW DATABASES LIKE 'llb%'") == []


@pytest.mark.anyio
async def test_the_server_and_its_accounts_cannot_be_changed(
    fake_llm: FakeLLMServer, bench: LLBDBBenchmark, tmp_path: Path
) -> None:
    """No CREATE USER, GRANT, SUPER, SHUTDOWN, plugin or mysql.* right: each statement is refused, and the
    server's settings, accounts, plugins and administrator are as they were, the server alive."""
    variables = "SELECT @@global.max_connections, @@global.event_scheduler, @@global.local_infile, @@global.read_only"
    before = (
        admin_rows(bench, variables),
        admin_rows(bench, "SELECT user, host FROM mysql.user ORDER BY 1, 2"),
        admin_rows(bench, "SELECT plugin_name, plugin_status FROM information_schema.plugins ORDER BY 1"),
    )
    bystander = server(bench).admin.connect()  # another session: the attacker may not kill it
    bystander_id = bystander.thread_id()
    attacks = [
        "CREATE USER 'evil'@'localhost' IDENTIFIED BY 'x'",
        "GRANT ALL PRIVILEGES ON *.* TO CURRENT_USER() WITH GRANT OPTION",
        "GRANT SELECT ON mysql.* TO CURRENT_USER()",
        "SET GLOBAL max_connections = 1",
        "SET GLOBAL event_scheduler = ON",
        "SET GLOBAL local_infile = 1",
        "SET GLOBAL read_only = 1",
        "SET PASSWORD FOR 'root'@'localhost' = PASSWORD('owned')",
        "ALTER USER 'root'@'localhost' IDENTIFIED BY 'owned'",
        "UPDATE mysql.global_priv SET priv = '{}' WHERE user = 'root'",
        "SELECT * FROM mysql.user",
        "INSTALL SONAME 'ha_connect'",
        "INSTALL PLUGIN federated SONAME 'ha_federatedx.so'",
        "CREATE FUNCTION sys_exec RETURNS INTEGER SONAME 'lib_mysqludf_sys.so'",
        "CREATE PROCEDURE p() SELECT 1",
        "CREATE EVENT e ON SCHEDULE EVERY 1 SECOND DO SELECT 1",
        "CREATE TEMPORARY TABLE t (a INT)",
        "CREATE TABLE m (a INT) ENGINE = MEMORY",
        "FLUSH PRIVILEGES",
        "LOCK TABLES mysql.user READ",
        f"KILL {bystander_id}",
        f"KILL QUERY {bystander_id}",
        "SHUTDOWN",
    ]
    try:
        played = await play(fake_llm, bench, tmp_path, {TASK: attacks})
        with bystander.cursor() as cursor:  # still connected: the KILLs did not reach it
            cursor.execute("SELECT 1")
            assert cursor.fetchall() == (("1",),)
    finally:
        bystander.close()
    out = played.outputs[TASK]
    assert all(refused(o) for o in out), [(a, o) for a, o in zip(attacks, out, strict=True) if not refused(o)]
    assert server(bench).running
    after = (
        admin_rows(bench, variables),
        admin_rows(bench, "SELECT user, host FROM mysql.user ORDER BY 1, 2"),
        admin_rows(bench, "SELECT plugin_name, plugin_status FROM information_schema.plugins ORDER BY 1"),
    )
    assert after == before  # the administrator's password still works: these queries ran with it
    with pytest.raises(pymysql.err.OperationalError):  # and root has no 'owned' password
        pymysql.connect(unix_socket=server(bench).socket, user="root", password="owned").close()


@pytest.mark.anyio
async def test_the_time_limit_cannot_be_lifted(fake_llm: FakeLLMServer, bench: LLBDBBenchmark, tmp_path: Path) -> None:
    """``SET SESSION max_statement_time=0`` lifts MariaDB's own per-user limit (measured), so the harness's
    watchdog kills the action at the limit (3 s here): long sleeps, CPU burners and a flood of short sleeps, each
    on a session that lifted MariaDB's limit first (a killed session is replaced by a fresh one)."""
    running: list[list[tuple]] = []

    def check_then(sql: str) -> Callable[[], str]:
        def action() -> str:  # between two actions: nothing of the previous one still runs
            running.append([r for r in alive_episode_sessions(bench) if r[2] != "Sleep"])
            return sql

        return action

    attacks: list[Action] = [
        UNLIMITED,
        "SELECT @@max_statement_time AS t",
        "SELECT SLEEP(60)",
        check_then("SET STATEMENT max_statement_time = 0 FOR SELECT SLEEP(60)"),
        check_then(f"{UNLIMITED}; SELECT BENCHMARK(100000000000, MD5('x'))"),
        check_then(f"{UNLIMITED}; " + "; ".join(["SELECT SLEEP(2)"] * 5)),
        check_then(f"{UNLIMITED}; SELECT COUNT(*) FROM seq_1_to_100000 a, seq_1_to_100000 b WHERE a.seq + b.seq = 7"),
        check_then("SELECT 1 AS alive"),
    ]
    started = time.monotonic()
    played = await play(fake_llm, bench, tmp_path, {TASK: attacks})
    elapsed = time.monotonic() - started
    out = played.outputs[TASK]
    stopped = "Error: the SQL was stopped: the action ran longer than 3 s"
    assert out[1].endswith("rows: [(0.0,)]")  # the session did lift MariaDB's own limit...
    assert [out[i] for i in (2, 3, 4, 5, 6)] == [stopped] * 5  # ...the watchdog did not
    assert out[7].endswith("rows: [(1,)]")  # the next action runs on a fresh session
    assert running == [[]] * 5  # the watchdog's kills took effect before the next action
    assert elapsed < 100  # 120 s of SLEEP and a 10^11-round BENCHMARK did not run
    assert alive_episode_sessions(bench) == []


@pytest.mark.anyio
async def test_huge_results_are_refused(fake_llm: FakeLLMServer, bench: LLBDBBenchmark, tmp_path: Path) -> None:
    """A result past 10,000 rows or 64 MB is an error (streamed, then the session killed), and a single value is
    NULL past the server's max_allowed_packet: none can fill the harness's memory."""
    played = await play(
        fake_llm,
        bench,
        tmp_path,
        {
            TASK: [
                "SELECT * FROM seq_1_to_1000000",
                "SELECT a.seq, b.seq FROM seq_1_to_1000 a, seq_1_to_1000 b",
                "SELECT REPEAT('x', 1000000) FROM seq_1_to_5000",  # 5 GB in 5,000 rows
                "SELECT LENGTH(REPEAT('x', 100000000)) AS n, REPEAT('x', 100000000) IS NULL AS cut",
                "SELECT COUNT(*) AS n FROM seq_1_to_10000",
            ]
        },
    )
    out = played.outputs[TASK]
    assert all(o.startswith("Error: the result is too large (more than 10000 rows or 64 MB)") for o in out[:3]), out
    assert out[3].endswith("rows: [(None, 1)]"), out[3]
    assert out[4].endswith("rows: [(10000,)]")
    assert alive_episode_sessions(bench) == []


@pytest.mark.anyio
async def test_server_memory_is_capped_per_session(
    fake_llm: FakeLLMServer, bench: LLBDBBenchmark, tmp_path: Path
) -> None:
    """A session may raise its in-memory temporary tables to 8 GB, not its memory ceiling (256 MB, which it
    cannot raise): the GROUP BY that took an uncapped server from 98 MB to 1.5 GB is refused, the server's
    resident memory stays put."""
    process = server(bench)._process
    assert process is not None
    status = Path(f"/proc/{process.pid}/status")
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], int(status.read_text().split("VmRSS:")[1].split()[0]) << 10)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(0.2)
    before = peak[0]
    try:
        played = await play(
            fake_llm,
            bench,
            tmp_path,
            {
                TASK: [
                    "SET SESSION max_session_mem_used = 100000000000",
                    "SET SESSION tmp_memory_table_size = 8000000000, max_heap_table_size = 8000000000",
                    "SELECT @@max_session_mem_used AS cap, @@tmp_memory_table_size AS tmp",
                    "SELECT COUNT(*) FROM (SELECT seq, REPEAT('x', 200) r FROM seq_1_to_20000000 GROUP BY seq, r) s",
                ]
            },
        )
    finally:
        done.set()
        sampler.join()
    out = played.outputs[TASK]
    assert out[2].endswith("rows: [(268435456, 7999995904)]"), out[2]  # the ceiling did not move
    assert refused(out[3]) and "max-session-mem-used" in out[3], out[3]
    assert peak[0] - before < 256 << 20, (before, peak[0])
