"""Load: N concurrent HTTP clients doing recall_experience -> report_outcome cycles (a benchmark, not a test).

By default the script starts its own ``memrl-mcp --transport streamable-http`` server on 127.0.0.1 (fresh
data dir, MEMRL_* cleared), seeds it over the tools with memories of real benchmark tasks, runs the load,
checks that no update was lost, and stops the server with SIGTERM. ``--url`` (and ``--token``, sent as
``Authorization: Bearer TOKEN``) targets a running server instead.

Tasks are the distinct task texts of the shared benchmark data (ALFWorld goals and their human
annotations, LifelongAgentBench OS/DB instructions, BigCodeBench prompts), sent in a shuffled order; once
the pool is used up, each later pass gets an " (attempt k)" suffix, so no two cycles send the same text.
``--task-set N`` instead cycles over N tasks again and again, as a benchmark's epochs do (the server's
embedding cache then spares the model run of a task seen before).
``--seed-memories`` (2000) of them are stored first (store_experience, 8 clients); the cycles start halfway
into the seeded texts, so some tasks have a stored twin and others only neighbours. Rewards: half from
{-1, 1}, half uniform in [-1, 1]; one report in four carries an experience (a new or merged memory).

Lost updates: every acknowledged report returns ``updated: [{id, q_before, q_after, visits}]``. Per memory,
the acknowledged visits must be consecutive from the memory's start (no gap, no repeat) and each q_before
must equal the previous q_after; after each run the server's own memory (``memrl://memories/{id}``) must
hold the last visits and q_after. Memories that a refused or failed report had recalled are left out. Qs are
compared to 1e-12: qdrant-edge may read a stored float back one ulp off. The exit status is 1 on any error
or lost update.

Clients: ``--client lean`` (default) speaks MCP streamable HTTP (JSON-RPC over POST, JSON or SSE answers,
Mcp-Session-Id) with httpx, so that the clients' own CPU stays small on a shared machine; ``--client sdk``
uses the MCP SDK's ``mcp.Client``. ``--py-spy FILE`` (``pip install py-spy``) samples the own server during
the timed runs and prints where its CPU goes, layer by layer; ``--server-env KEY=VALUE`` configures the own server.
``--against KEY=VALUE`` starts a second own server, the same with that setting added; the two take turns run by run
(each with its own clients and memories), and the ratios per pair of runs are printed, so that the comparison
survives a machine whose load changes (e.g. ``--against MEMRL_EMBEDDING_CACHE=0``).

    .venv/bin/python perf/load.py                       # 8 clients, 30 s, own server
    .venv/bin/python perf/load.py --clients 8 --seconds 30 --runs 3 --py-spy /tmp/server.txt
    .venv/bin/python perf/load.py --task-set 500 --runs 5 --against MEMRL_EMBEDDING_CACHE=0
    .venv/bin/python perf/load.py --url http://127.0.0.1:8765/mcp --token SECRET
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench as B

PROTOCOL_VERSION = "2025-06-18"
START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 60.0
EXPERIENCE_EVERY = 4  # one report in four stores an experience


class CallError(RuntimeError):
    """A tool call that was refused (tool error, JSON-RPC error) or failed (HTTP, timeout)."""


# ---------------------------------------------------------------- clients


class McpClient(Protocol):
    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]: ...

    async def read_resource(self, uri: str) -> str: ...


class LeanClient:
    """MCP streamable HTTP with httpx: initialize, notifications/initialized, then POSTed JSON-RPC requests."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self._http, self._url = http, url
        self._headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        self._next_id = 0

    async def open(self) -> None:
        info = {"name": "memrl-load", "version": "1"}
        params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": info}
        response = await self._post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
        if session_id := response.headers.get("mcp-session-id"):
            self._headers["Mcp-Session-Id"] = session_id
        self._answer(response, 0)
        self._headers["MCP-Protocol-Version"] = PROTOCOL_VERSION
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def close(self) -> None:
        if "Mcp-Session-Id" in self._headers:
            await self._http.delete(self._url, headers=self._headers)

    async def _post(self, message: dict[str, Any]) -> httpx.Response:
        try:
            response = await self._http.post(self._url, content=json.dumps(message), headers=self._headers)
        except httpx.HTTPError as error:
            raise CallError(f"{message.get('method')}: {type(error).__name__}: {error}") from None
        if response.status_code >= 400:
            raise CallError(f"{message.get('method')}: HTTP {response.status_code}: {response.text[:200]}")
        return response

    @staticmethod
    def _answer(response: httpx.Response, request_id: int) -> dict[str, Any]:
        """The JSON-RPC result for ``request_id``, from a JSON body or an SSE stream of messages."""
        if response.headers.get("content-type", "").startswith("application/json"):
            messages = [response.json()]
        else:
            messages = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
        for message in messages:
            if message.get("id") == request_id:
                if "error" in message:
                    raise CallError(f"JSON-RPC error {message['error']}")
                return message["result"]
        raise CallError(f"no answer to request {request_id} in {response.text[:200]!r}")

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        message = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        return self._answer(await self._post(message), self._next_id)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.request("tools/call", {"name": name, "arguments": arguments})
        if result.get("isError"):
            raise CallError(f"{name}: " + " ".join(block.get("text", "") for block in result.get("content", [])))
        return result["structuredContent"]

    async def read_resource(self, uri: str) -> str:
        return (await self.request("resources/read", {"uri": uri}))["contents"][0]["text"]


class SdkClient:
    """The MCP SDK's own client over streamable HTTP (with the bearer token on its httpx client)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await self._client.call_tool(name, arguments)
        except Exception as error:  # transport failures and JSON-RPC errors alike count as errors
            raise CallError(f"{name}: {type(error).__name__}: {error}") from None
        if result.is_error:
            raise CallError(f"{name}: " + " ".join(getattr(block, "text", "") for block in result.content))
        return result.structured_content

    async def read_resource(self, uri: str) -> str:
        try:
            return (await self._client.read_resource(uri)).contents[0].text
        except Exception as error:
            raise CallError(f"read {uri}: {type(error).__name__}: {error}") from None


async def open_clients(stack: AsyncExitStack, kind: str, n: int, url: str, token: str | None) -> list[McpClient]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx.Timeout(CALL_TIMEOUT_S)
    clients: list[McpClient] = []
    for _ in range(n):
        if kind == "lean":
            http = await stack.enter_async_context(httpx.AsyncClient(headers=headers, timeout=timeout))
            lean = LeanClient(http, url)
            await lean.open()
            stack.push_async_callback(lean.close)
            clients.append(lean)
        else:
            from mcp import Client
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            http2 = await stack.enter_async_context(create_mcp_http_client(headers=headers))
            transport = streamable_http_client(url, http_client=http2)
            clients.append(SdkClient(await stack.enter_async_context(Client(transport, cache=None))))
    return clients


# ---------------------------------------------------------------- tasks


def alfworld_annotations(root: Path) -> list[str]:
    """The human task descriptions of the ALFWorld games (several per game, worded freely)."""
    texts = []
    for path in sorted(root.glob("alfworld/valid_*/*/*/traj_data.json")):
        for ann in json.loads(path.read_text()).get("turk_annotations", {}).get("anns", []):
            texts.append(ann.get("task_desc", "").strip())
    return texts


def task_pool(seed: int) -> tuple[list[tuple[str, str]], str]:
    """(namespace, text) pairs: the distinct task texts of the shared data, shuffled."""
    root = B.shared_data_dir()
    groups = B.real_task_texts(root)
    if groups:
        groups["alfworld"] = list(dict.fromkeys([*groups["alfworld"], *alfworld_annotations(root)]))
        source = "real task texts (" + ", ".join(f"{ns} {len(g)}" for ns, g in groups.items()) + ")"
    else:
        rng = random.Random(seed)
        groups = {ns: [B.synthetic_text(rng, rng.randint(40, 300)) for _ in range(800)] for ns in B.NAMESPACES}
        source = f"synthetic texts (shared data not found under {root})"
    seen: set[str] = set()
    pairs = []
    for ns, texts in groups.items():
        for text in texts:
            key = " ".join(text.split()).rstrip(".!;, ").lower()
            if text and key not in seen:
                seen.add(key)
                pairs.append((ns, text))
    random.Random(seed).shuffle(pairs)
    return pairs, source


class TaskSource:
    """Hands out the pool's texts in order. Cold (default): each later pass over the pool adds
    " (attempt k)", so no text repeats and every recall embeds. Epochs: the same texts again and again,
    as the benchmark protocol runs a fixed task set for several epochs."""

    def __init__(self, pool: list[tuple[str, str]], epochs: bool) -> None:
        self._pool, self._i, self._epochs = pool, 0, epochs

    def next(self) -> tuple[str, str]:
        passes, index = divmod(self._i, len(self._pool))
        self._i += 1
        ns, text = self._pool[index]
        return ns, text if passes == 0 or self._epochs else f"{text.rstrip()} (attempt {passes + 1})"


def experience_text(rng: random.Random) -> str:
    return "Steps that worked: " + B.synthetic_text(rng, rng.randint(150, 300))


# ---------------------------------------------------------------- the lost-update ledger


def same_q(a: float, b: float) -> bool:
    """Equal up to float round-off: qdrant-edge reads a stored float back up to 1 ulp off (a lost update is
    a whole alpha * (R - Q) step, >= 1e-4 here)."""
    return abs(a - b) <= 1e-12


@dataclass
class Ledger:
    """What the server acknowledged: each memory's start (visits, q) and every Q update reported on it."""

    start: dict[str, tuple[int, float]] = field(default_factory=dict)
    updates: dict[str, list[tuple[int, float, float]]] = field(default_factory=lambda: defaultdict(list))
    tainted: set[str] = field(default_factory=set)  # recalled by a report that was not acknowledged

    def stored(self, result: dict[str, Any]) -> None:
        if not result["merged"]:  # a merge keeps the memory's q and visits, hence its chain
            self.start[result["id"]] = (result["memory"]["visits"], result["memory"]["q"])

    def reported(self, result: dict[str, Any]) -> None:
        for change in result["updated"]:
            self.updates[change["id"]].append((change["visits"], change["q_before"], change["q_after"]))
        if result["stored"] is not None:
            self.stored(result["stored"])

    def chain_problems(self, ids: set[str]) -> list[str]:
        """Gaps, repeats or broken q chains among the acknowledged updates of these memories."""
        problems = []
        for memory_id in sorted(ids - self.tainted):
            chain = sorted(self.updates[memory_id])
            visits, q = self.start.get(memory_id, (chain[0][0] - 1, chain[0][1]))
            for v, q_before, q_after in chain:
                if v != visits + 1 or not same_q(q_before, q):
                    problems.append(f"{memory_id}: after visits={visits} q={q!r} came visits={v} q_before={q_before!r}")
                visits, q = v, q_after
        return problems

    def last(self, memory_id: str) -> tuple[int, float]:
        visits, _, q_after = max(self.updates[memory_id])
        return visits, q_after


# ---------------------------------------------------------------- the load


@dataclass
class RunRecord:
    recall_ms: list[float] = field(default_factory=list)
    report_ms: list[float] = field(default_factory=list)
    cycle_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)
    updates: int = 0


async def worker(
    client: McpClient, tasks: TaskSource, ledger: Ledger, record: RunRecord, rng: random.Random, until: float
) -> None:
    while time.perf_counter() < until:
        ns, task = tasks.next()
        start = time.perf_counter()
        try:
            recall = await client.call_tool("recall_experience", {"task": task, "namespace": ns})
        except CallError as error:
            record.errors.append(str(error))
            continue
        middle = time.perf_counter()
        reward = rng.choice((-1.0, 1.0)) if rng.random() < 0.5 else round(rng.uniform(-1.0, 1.0), 4)
        arguments: dict[str, Any] = {"recall_id": recall["recall_id"], "reward": reward}
        if rng.randrange(EXPERIENCE_EVERY) == 0:
            arguments["experience"] = experience_text(rng)
        try:
            report = await client.call_tool("report_outcome", arguments)
        except CallError as error:
            record.errors.append(str(error))
            ledger.tainted.update(m["id"] for m in recall["memories"])
            continue
        end = time.perf_counter()
        ledger.reported(report)
        record.touched.update(c["id"] for c in report["updated"])
        record.updates += len(report["updated"])
        record.recall_ms.append((middle - start) * 1000)
        record.report_ms.append((end - middle) * 1000)
        record.cycle_ms.append((end - start) * 1000)


async def gather_sharded(clients: list[McpClient], items: list[Any], fn: Any) -> list[Any]:
    """fn(client, item) for every item, the items shared out over the clients (each runs its share in order)."""
    results: list[Any] = [None] * len(items)

    async def share(i: int) -> None:
        for j in range(i, len(items), len(clients)):
            results[j] = await fn(clients[i], items[j])

    await asyncio.gather(*(share(i) for i in range(len(clients))))
    return results


async def seed(clients: list[McpClient], pool: list[tuple[str, str]], n: int, ledger: Ledger, seed_: int) -> float:
    rng = random.Random(seed_)
    items = [(ns, text, rng.random() < 0.7, experience_text(rng)) for ns, text in pool[:n]]

    async def store(client: McpClient, item: tuple[str, str, bool, str]) -> None:
        ns, text, success, experience = item
        arguments = {"task": text, "experience": experience, "namespace": ns}
        arguments["outcome"] = "success" if success else "failure"
        ledger.stored(await client.call_tool("store_experience", arguments))

    start = time.perf_counter()
    await gather_sharded(clients, items, store)
    return time.perf_counter() - start


async def verify(clients: list[McpClient], ledger: Ledger, ids: set[str]) -> tuple[list[str], int]:
    """Lost updates among ``ids``: chain problems, then server state that differs from the last acknowledged one."""
    problems = ledger.chain_problems(ids)
    checked = sorted(ids - ledger.tainted)

    async def read(client: McpClient, memory_id: str) -> str | None:
        memory = json.loads(await client.read_resource(f"memrl://memories/{memory_id}"))
        visits, q = ledger.last(memory_id)
        if memory["visits"] != visits or not same_q(memory["q"], q):
            return f"{memory_id}: server has visits={memory['visits']} q={memory['q']!r}, acknowledged {visits} {q!r}"
        return None

    problems += [p for p in await gather_sharded(clients, checked, read) if p]
    return problems, len(checked)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_once(
    clients: list[McpClient],
    tasks: TaskSource,
    ledger: Ledger,
    seconds: float,
    seed_: int,
    server_pid: int | None,
    profile: str | None,
) -> dict[str, Any]:
    """One timed run (sampled by py-spy into ``profile`` if given), then its lost-update check (not timed)."""
    record = RunRecord()
    with py_spy(server_pid, profile):
        client_cpu, server_cpu = time.process_time(), cpu_seconds(server_pid) if server_pid else 0.0
        start = time.perf_counter()
        until = start + seconds
        await asyncio.gather(
            *(worker(c, tasks, ledger, record, random.Random(seed_ * 1000 + i), until) for i, c in enumerate(clients))
        )
        wall = time.perf_counter() - start
        client_cpu = time.process_time() - client_cpu
        server_cpu = (cpu_seconds(server_pid) - server_cpu) if server_pid else float("nan")
    problems, checked = await verify(clients, ledger, record.touched)
    return {
        "cycles": len(record.cycle_ms),
        "cps": len(record.cycle_ms) / wall,
        "wall": wall,
        "recall": record.recall_ms,
        "report": record.report_ms,
        "cycle": record.cycle_ms,
        "errors": record.errors,
        "lost": problems,
        "checked": checked,
        "updates": record.updates,
        "client_cores": client_cpu / wall,
        "server_cores": server_cpu / wall,
        "server_ms": 1000 * server_cpu / max(len(record.cycle_ms), 1),
        "client_ms": 1000 * client_cpu / max(len(record.cycle_ms), 1),
    }


# ---------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def own_server(data_dir: Path, log_path: Path, extra_env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A ``memrl-mcp --transport streamable-http`` child on a free port; (url, pid); SIGTERM at the end."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_")} | {"MEMRL_TOOL_PROFILE": "full"}
    env |= extra_env
    cmd = [sys.executable, "-m", "memrl_mcp.cli", "--transport", "streamable-http", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--data-dir", str(data_dir)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=B.REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    log_text = log_path.read_text()
                    raise SystemExit(f"server not listening after {START_TIMEOUT_S} s:\n{log_text}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def py_spy(pid: int | None, out: str | None, rate: int = 100) -> Iterator[None]:
    """``py-spy record`` of the server while the block runs (raw collapsed stacks, for summarize_profile). Only the
    thread holding the GIL is sampled (``--gil``): where the server's CPU goes. Without it, a thread waiting for the
    GIL or a lock counts as busy, and the store's lock showed as 17% of the samples."""
    if not out or pid is None:
        yield
        return
    exe = Path(sys.executable).with_name("py-spy")
    exe = exe if exe.is_file() else Path(shutil.which("py-spy") or exe)  # beside this Python, else on the PATH
    cmd = [str(exe), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--output", out]
    spy = subprocess.Popen([*cmd, "--threads", "--gil"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attached before the load starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)


LAYERS = (  # a loop sample belongs to the innermost frame of one of these (stdlib, anyio, pydantic: their caller's)
    ("memrl: tool wrapper (calls.py: hand-off to a thread, metrics, log, result dump)", r"surface/calls\.py"),
    ("memrl: identify, reports (feedback.py: hand-off to a thread)", r"memrl_mcp/surface/(tools|feedback|roots)"),
    ("MCP SDK: tool layer (Tool.run, argument model)", r"mcp/server/mcpserver/"),
    (
        "MCP SDK: runner (request validation, OpenTelemetry span, serialization)",
        r"mcp/(server/runner|server/_otel|shared/_otel)",
    ),
    ("MCP SDK: JSON-RPC dispatcher (a task per request, streams)", r"mcp/shared/"),
    ("MCP SDK: streamable-HTTP transport, session manager, auth", r"mcp/server/"),
    ("starlette: routing, middleware, request and response", r"starlette/"),
    ("memrl: session quota (http.py)", r"memrl_mcp/transports/http\.py"),
    ("uvicorn + h11: HTTP parsing, socket writes", r"(uvicorn|h11)/"),
)


def summarize_profile(paths: list[str], top: int = 12) -> str:
    """Where the server's CPU goes, layer by layer (:data:`LAYERS`; the worker threads run the memory's own work),
    and the top self frames, from py-spy's raw samples of the thread holding the GIL."""
    layers: Counter[str] = Counter()
    selfs: Counter[str] = Counter()
    lines = [line for path in paths if Path(path).is_file() for line in Path(path).read_text().splitlines()]
    for line in lines:
        stack, _, text = line.rpartition(" ")
        frames, count = stack.split(";"), int(text)
        label = "worker threads: the memory (store, service)" if "MainThread" not in frames[0] else None
        for frame in reversed(frames):
            if label:
                break
            label = next((name for name, pattern in LAYERS if re.search(pattern, frame)), None)
        layers[label or "event loop, other"] += count
        selfs[frames[-1]] += count
    whole = sum(layers.values()) or 1
    out = [f"  {100 * n / whole:5.1f}%  {label}" for label, n in layers.most_common()]
    out.append(f"  top self-time frames ({whole} samples holding the GIL):")
    out += [f"  {100 * n / whole:5.1f}%  {frame}" for frame, n in selfs.most_common(top)]
    return "\n".join(out)


# ---------------------------------------------------------------- main


def percentiles(values: list[float]) -> str:
    return f"p50 {B.p50(values):.1f} ms, p99 {B.pct(values, 99):.1f} ms" if values else "-"


@dataclass
class Server:
    """A server under load: its clients, its ledger, and its runs' results."""

    label: str
    url: str
    pid: int | None
    clients: list[McpClient] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    tasks: TaskSource | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    stats_before: dict[str, Any] = field(default_factory=dict)


async def prepare(server: Server, stack: AsyncExitStack, args: argparse.Namespace, pool: list[tuple[str, str]]) -> None:
    """Clients opened, memories seeded, the cycles' tasks chosen."""
    server.clients = await open_clients(stack, args.client, args.clients, server.url, args.token)
    if args.seed_memories:
        took = await seed(server.clients, pool, min(args.seed_memories, len(pool)), server.ledger, args.seed)
        print(f"  {server.label}: seeded {min(args.seed_memories, len(pool))} memories in {took:.1f} s")
    order = pool[args.seed_memories // 2 :] + pool[: args.seed_memories // 2]
    server.tasks = TaskSource(order[: args.task_set] if args.task_set else order, epochs=bool(args.task_set))
    server.stats_before = await server.clients[0].call_tool("memory_stats", {})


async def finish(server: Server) -> bool:
    """The server's own count of Q updates against the acknowledged ones; True when they differ."""
    stats = await server.clients[0].call_tool("memory_stats", {})
    before = server.stats_before
    acked = sum(r["updates"] for r in server.results)
    visits_ok = stats["visits"] - before["visits"] == acked
    reported = stats["recalls_reported"] - before["recalls_reported"]
    print(
        f"  {server.label}: memory_stats: {stats['memories']} memories; visits +{stats['visits'] - before['visits']} "
        f"(acknowledged Q updates {acked}: {'equal' if visits_ok else 'DIFFERENT'}); recalls reported +{reported}, "
        f"pending {stats['recalls_pending']}"
    )
    return not visits_ok and not any(r["errors"] for r in server.results)


def summary(results: list[dict[str, Any]]) -> str:
    def med(key: str, pick: Any = None) -> float:
        return statistics.median(pick(r[key]) if pick else r[key] for r in results)

    errors = sum(len(r["errors"]) for r in results)
    lost = sum(len(r["lost"]) for r in results)
    return (
        f"median of {len(results)} run(s): {med('cps'):.0f} cycles/s; "
        f"recall p50 {med('recall', B.p50):.1f} / p99 {med('recall', lambda v: B.pct(v, 99)):.1f} ms; "
        f"report p50 {med('report', B.p50):.1f} / p99 {med('report', lambda v: B.pct(v, 99)):.1f} ms; "
        f"cycle p50 {med('cycle', B.p50):.1f} / p99 {med('cycle', lambda v: B.pct(v, 99)):.1f} ms; "
        f"errors {errors}; LOST UPDATES {lost}; CPU: server {med('server_cores'):.2f} cores = "
        f"{med('server_ms'):.1f} ms/cycle, clients {med('client_cores'):.2f} = {med('client_ms'):.1f} ms/cycle"
    )


def paired(first: Server, second: Server) -> str:
    """The second server against the first, run by run (they alternate): medians, min-max."""

    def ratios(key: str) -> str:
        values = [b[key] / a[key] for a, b in zip(first.results, second.results, strict=True) if a[key]]
        return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})" if values else "-"

    return (
        f"{second.label} / {first.label}, per pair of runs (median, min-max): cycles/s {ratios('cps')}; "
        f"server CPU per cycle {ratios('server_ms')}"
    )


async def main_async(args: argparse.Namespace, servers: list[Server]) -> int:
    pool, source = task_pool(args.seed)
    print(f"load: {B.machine()}; {args.clients} {args.client} clients x {args.seconds:g} s x {args.runs} run(s)")
    print(f"  tasks: {len(pool)} distinct {source}; " + "; ".join(f"{s.label} {s.url}" for s in servers))
    cycles = f"a fixed set of {args.task_set} tasks, repeated" if args.task_set else "distinct texts"
    failed = False
    async with AsyncExitStack() as stack:
        for server in servers:
            await prepare(server, stack, args, pool)
        print(f"  cycles: {cycles}" + (" (the servers take turns, run by run)" if len(servers) > 1 else ""))
        profiles: dict[str, list[str]] = defaultdict(list)
        for run in range(args.runs):
            for server in servers:
                profile = f"{args.py_spy}.{server.label}.{run + 1}" if args.py_spy else None
                assert server.tasks is not None
                r = await run_once(
                    server.clients, server.tasks, server.ledger, args.seconds, args.seed + run, server.pid, profile
                )
                server.results.append(r)
                profiles[server.label] += [profile] if profile else []
                print(
                    f"  {server.label} run {run + 1}: {r['cps']:.0f} cycles/s ({r['cycles']} in {r['wall']:.1f} s); "
                    f"recall {percentiles(r['recall'])}; report {percentiles(r['report'])}; "
                    f"cycle {percentiles(r['cycle'])}; errors {len(r['errors'])}; LOST UPDATES {len(r['lost'])} "
                    f"({r['checked']} memories, {r['updates']} Q updates checked); CPU: server "
                    f"{r['server_cores']:.2f} cores = {r['server_ms']:.1f} ms/cycle, clients {r['client_cores']:.2f} "
                    f"= {r['client_ms']:.1f} ms/cycle",
                    flush=True,
                )
                for message in r["errors"][:3] + r["lost"][:5]:
                    print(f"    {message[:300]}")
        for server in servers:
            failed |= await finish(server)
    for server in servers:
        print(f"{server.label}: {summary(server.results)}")
    if len(servers) == 2:
        print(paired(*servers))
    for server in servers:
        if profiles[server.label]:
            print(f"{server.label}: server profile (py-spy --gil {args.py_spy}.{server.label}.*, all runs):")
            print(summarize_profile(profiles[server.label]))
    errors = sum(len(r["errors"]) + len(r["lost"]) for server in servers for r in server.results)
    return 1 if errors or failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of one timed run (default 30)")
    parser.add_argument("--runs", type=int, default=1, help="timed runs; the medians are printed last")
    parser.add_argument("--client", choices=("lean", "sdk"), default="lean", help="httpx JSON-RPC or mcp.Client")
    parser.add_argument("--url", help="an existing server's MCP endpoint (default: start one)")
    parser.add_argument("--token", help="bearer token, sent as 'Authorization: Bearer TOKEN'")
    parser.add_argument("--seed-memories", type=int, default=2000, help="memories stored before the load")
    parser.add_argument("--server-env", action="append", default=[], help="KEY=VALUE for the own server")
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also start a second own server with these settings too; the two take turns, run by run",
    )
    parser.add_argument("--py-spy", metavar="FILE", help="sample the own server with py-spy into FILE")
    parser.add_argument(
        "--task-set",
        type=int,
        default=0,
        metavar="N",
        help="cycle over a fixed set of N tasks, as benchmark epochs do (default 0: every text distinct)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.url:
        return asyncio.run(main_async(args, [Server("server", args.url, None)]))
    base = dict(item.split("=", 1) for item in args.server_env)
    variants = (
        {"server": base} if not args.against else {"A": base, "B": base | dict(a.split("=", 1) for a in args.against)}
    )
    with tempfile.TemporaryDirectory(prefix="memrl-load-") as tmp, ExitStack() as stack:
        servers = []
        for label, env in variants.items():
            url, pid = stack.enter_context(own_server(Path(tmp) / label, Path(tmp) / f"{label}.log", env))
            servers.append(Server(label, url, pid))
        if args.against:
            print(f"A: {' '.join(args.server_env) or 'the settings as they are'}; B: A + {' '.join(args.against)}")
        return asyncio.run(main_async(args, servers))


if __name__ == "__main__":
    sys.exit(main())
