"""Who can reach the local memory server, performed: another OS user (created for the test), a process that guesses
the inspector's port or talks nonsense to the socket, a page that rebinds its name or posts across sites, a runtime
folder that another user made or left open, another user swapping folders under a runtime folder it can rename, and
a socket another user listens on (tests/support/rendezvous.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from memrl_mcp.local.attach import attach
from memrl_mcp.local.greeting import Hello, decode
from memrl_mcp.local.place import AttachError, Place, build_identity, place_of
from memrl_mcp.settings import OTHER_VARIABLES
from tests.support.local import LocalStore, RawSession, local_store, python_with, stop_all
from tests.support.mcp import call
from tests.support.rendezvous import NOBODY, Listener, racing, shared_folder
from tests.support.servers import CLI, INITIALIZE, MCP_HEADERS

pytestmark = pytest.mark.anyio
START_S = 240

ATTEMPT = """
import json, os, socket, sys
path, build = sys.argv[1], sys.argv[2]
result = {}
try:
    os.listdir(os.path.dirname(path))
    result["list"] = "listed"
except PermissionError:
    result["list"] = "denied"
connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
connection.settimeout(20)
try:
    connection.connect(path)
except PermissionError:
    result["connect"] = "denied"
else:
    result["connect"] = "connected"
    hello = {"kind": "session", "version": "0.1.0", "build": build, "pid": os.getpid(), "data_dir": sys.argv[3],
             "config": None, "cwd": "/", "environ": {}, "protocol": 1}
    try:
        connection.sendall(json.dumps(hello).encode() + b"\\n")
        result["answer"] = connection.recv(65536).decode() or "closed unanswered"
    except (BrokenPipeError, ConnectionResetError):
        result["answer"] = "closed unanswered"
print(json.dumps(result))
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalStore]:
    with local_store(tmp_path) as found:
        yield found


@pytest.fixture
def other_user() -> Iterator[str]:
    """A local user made for this test (the suite runs as root), removed at the end."""
    name = f"memrl{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def attempt_as(user: str, place: Place, store: LocalStore) -> dict[str, str]:
    """What ``user`` gets when it tries the store's local server: its folder listed, its socket connected, and a
    well-formed greeting answered. Run by the system's Python (the attempt needs its standard library only; this
    suite's may live where another user cannot enter)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python is not None, "the system's python3 is missing (apt-get install -y python3)"
    done = subprocess.run(
        [python, "-I", "-c", ATTEMPT, str(place.socket), build_identity(), str(store.data_dir)],
        user=user,
        group=user,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


@pytest.mark.slow
async def test_another_user_cannot_reach_the_local_server(store: LocalStore, other_user: str) -> None:
    """As deployed, another user can neither enter the folder nor connect to the socket. With both opened to
    everyone (a mistaken chmod, a hostile ACL), the server still refuses: the kernel names the connecting user,
    who is not the server's, and the connection is closed unanswered; the owner's own sessions go on."""
    async with Client(store.session()) as client, anyio.create_task_group():
        with anyio.fail_after(START_S):
            await call(client, "store_experience", task="file the taxes", experience="before April")
        place = store.place
        assert attempt_as(other_user, place, store) == {"list": "denied", "connect": "denied"}
        opened = [(place.folder.parent, 0o711), (place.folder, 0o711), (place.socket, 0o666)]
        try:
            for path, mode in opened:
                os.chmod(path, mode)
            assert attempt_as(other_user, place, store) == {
                "list": "denied",
                "connect": "connected",
                "answer": "closed unanswered",
            }
        finally:
            for path, mode in [(place.folder.parent, 0o700), (place.folder, 0o700), (place.socket, 0o600)]:
                os.chmod(path, mode)
        assert (await call(client, "memory_stats"))["memories"] == 1


@pytest.mark.slow
async def test_a_guesser_or_a_page_gets_nothing_from_the_inspector_port(store: LocalStore) -> None:
    """The inspector's port is on loopback, where any local process or a page in a browser can reach it: without
    the token made at start, nothing but the page's empty shell and /health answers; a rebound host name and a
    request of another site are refused even by the MCP endpoint."""
    async with Client(store.session()) as client:
        with anyio.fail_after(START_S):
            await call(client, "store_experience", task="secret project plan", experience="launch on Monday")
        answer = store.status()
        assert answer is not None
        base, token = answer.ui.split("/ui#token=")
        bearer = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=base) as http:
            for path in ("/ui/api/session", "/ui/api/memories", "/stats", "/metrics"):
                assert (await http.get(path)).status_code == 401, path
                assert (await http.get(path, headers={"Authorization": "Bearer " + "x" * 43})).status_code == 401
            assert (await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)).status_code == 401
            page = await http.get("/ui")
            assert page.status_code == 200 and "secret project plan" not in page.text
            assert (await http.get("/health")).json() == {"status": "ok"}
            # DNS rebinding: the browser sends the attacker's host name (and, from a page, no token).
            rebound = {"Host": "attacker.example"}
            assert (await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS | rebound)).status_code == 401
            assert (await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS | rebound | bearer)).status_code == 421
            # Another site's page: a form cannot carry the header; a script with it is an Origin the server refuses.
            posted = await http.post("/ui/api/preview", data={"task": "x"}, headers={"Origin": "https://evil.example"})
            assert posted.status_code == 401
            evil = {"Origin": "https://evil.example"}
            assert (await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS | evil | bearer)).status_code == 403
            listed = await http.get("/ui/api/memories", headers=bearer)
            assert [m["task"] for m in listed.json()["memories"]] == ["secret project plan"]  # the token works


@pytest.mark.slow
async def test_a_stranger_on_the_socket_is_dropped_and_the_server_goes_on(store: LocalStore) -> None:
    async with Client(store.session()) as client:
        with anyio.fail_after(START_S):
            await call(client, "memory_stats")
        for nonsense in (b"GET / HTTP/1.1\r\n\r\n", b'{"jsonrpc": "2.0", "id": 1, "method": "initialize"}\n', b"\n"):
            assert answer_to(nonsense, store) == b""  # closed unanswered
        assert (await call(client, "memory_stats"))["memories"] == 0


def answer_to(nonsense: bytes, store: LocalStore) -> bytes:
    """What the server answers a connection that says ``nonsense`` first (a reset: nothing)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
        stranger.settimeout(20)
        stranger.connect(os.fspath(store.place.socket))
        stranger.sendall(nonsense)
        try:
            return stranger.recv(65536)
        except ConnectionResetError:
            return b""


def test_a_runtime_folder_another_user_made_or_left_open_is_refused(tmp_path: Path) -> None:
    """Someone else's folder where the sockets would go could catch every session: refused, never repaired."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(AttachError, match="belongs to another user"):
        place_of(tmp_path / "data", theirs)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o755)
    with pytest.raises(AttachError, match="lets other users in"):
        place_of(tmp_path / "data", open_to_all)
    mine = tmp_path / "mine"
    place = place_of(tmp_path / "data", mine)
    assert (mine.stat().st_mode & 0o777, place.folder.stat().st_mode & 0o777) == (0o700, 0o700)
    place.folder.rmdir()
    place.folder.symlink_to(theirs)  # a link to a folder another user controls, put in place of the store's
    with pytest.raises(AttachError, match="not a folder"):
        place_of(tmp_path / "data", mine)


# -- The rendezvous raced: another user who can write the runtime folder's parent --------------------------------

SERVED = "ATTACKER SERVED THIS"


@dataclass(frozen=True)
class Victims:
    """What the sessions that attached during an attack got, each one: their own server, a refusal, or the
    attacker."""

    own: int
    refused: list[str]
    attacker: list[str]


def victim_env(store: LocalStore, shared: Path, variable: str, **more: str) -> dict[str, str]:
    """The sessions' environment with the runtime root under ``shared``: named by ``MEMRL_RUNTIME_DIR``
    (``shared/run``) or the default under ``XDG_RUNTIME_DIR`` (``shared/memrl-mcp``)."""
    env = store.env(**more)
    if variable == "XDG_RUNTIME_DIR":
        del env["MEMRL_RUNTIME_DIR"]
        env["XDG_RUNTIME_DIR"] = str(shared)
    else:
        env["MEMRL_RUNTIME_DIR"] = str(shared / "run")
    return env


def hook_victim(env: dict[str, str], project: Path, prompt: str) -> tuple[str, str]:
    """The prompt hook as Claude Code runs it: how it ended (own / refused / attacker) and what it said."""
    event = {"session_id": uuid.uuid4().hex, "cwd": str(project), "prompt": prompt}
    done = subprocess.run(
        [*CLI, "hook", "user-prompt-submit"], input=json.dumps(event), env=env | {"CLAUDE_PROJECT_DIR": str(project)},
        cwd=project, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    if SERVED in said:
        return "attacker", said
    return ("refused" if "memory is unavailable" in done.stderr else "own"), said


def session_victim(env: dict[str, str], cwd: Path, prompt: str) -> tuple[str, str]:
    """A stdio session (``memrl-mcp``, the relay) that recalls for ``prompt``: how it ended and what it said."""
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "victim", "version": "1"}}
    lines = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "recall_experience", "arguments": {"task": prompt}}},
    ]  # fmt: skip
    done = subprocess.run(
        CLI, input="".join(json.dumps(line) + "\n" for line in lines), env=env, cwd=cwd, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    said = done.stdout + done.stderr
    if SERVED in said:
        return "attacker", said
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    recalled = [answer for answer in answers if answer.get("id") == 1 and "result" in answer]
    served = recalled and not recalled[0]["result"].get("isError")  # a tool error: the memory was unavailable
    return ("own" if served else "refused"), said


def attack(runs: list[Callable[[], tuple[str, str]]], shared: Path) -> Victims:
    """Run the victims, four at a time; each refusal must name the folder it refused."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(lambda run: run(), runs))
    refused = [said for how, said in outcomes if how == "refused"]
    for said in refused:
        assert str(shared) in said, said
    return Victims(
        sum(1 for how, _ in outcomes if how == "own"), refused, [said for how, said in outcomes if how == "attacker"]
    )


def owned_by(uid: int, folder: Path) -> list[Path]:
    """What under ``folder`` belongs to ``uid`` (links not followed)."""
    return [path for path in folder.rglob("*") if path.lstat().st_uid == uid]


@pytest.mark.slow  # another user's process (setpriv), servers, hooks and stdio sessions
@pytest.mark.parametrize("variable", ["MEMRL_RUNTIME_DIR", "XDG_RUNTIME_DIR"])
def test_a_user_swapping_folders_under_the_runtime_root_never_gets_a_byte(
    store: LocalStore, tmp_path: Path, variable: str
) -> None:
    """The runtime root's parent is another user's to write (``MEMRL_RUNTIME_DIR`` under a folder open to all, or
    an ``XDG_RUNTIME_DIR`` of another user): ``nobody`` swaps the root with a folder of its own (renameat2
    RENAME_EXCHANGE, in a loop), where it listens in the server's place and links the folder's log and locks to a
    file of the victim. Hooks and stdio sessions attach meanwhile, to a running server and then with none running
    (they start one): the attacker accepts no connection and receives no byte, no secret of the victims'
    environment nor their prompts; each victim is served by its own server or refused with a message naming the
    folder; nothing of the victims lands in the attacker's folder and the linked file is untouched."""
    shared = shared_folder()
    runtime = "memrl-mcp" if variable == "XDG_RUNTIME_DIR" else "run"
    if variable == "XDG_RUNTIME_DIR":
        os.chown(shared, NOBODY, NOBODY)
        shared.chmod(0o700)
    secret, prompt = f"env-secret-{uuid.uuid4().hex}", f"deploy the payroll {uuid.uuid4().hex}"
    env = victim_env(store, shared, variable, VICTIM_API_KEY=secret)
    canary = tmp_path / "canary"
    canary.write_text("the victim's file\n")
    project = tmp_path / "project"
    project.mkdir()
    place = place_of(store.data_dir, shared / runtime)
    servers = f"XDG_RUNTIME_DIR={shared}" if variable == "XDG_RUNTIME_DIR" else f"MEMRL_RUNTIME_DIR={shared / runtime}"
    try:
        started = subprocess.run([*CLI, "local", "ui"], env=env, capture_output=True, text=True, timeout=300)
        assert started.returncode == 0, started.stderr
        hooks = [lambda: hook_victim(env, project, prompt) for _ in range(24)]
        sessions = [lambda: session_victim(env, project, prompt) for _ in range(8)]
        with racing(shared, runtime, place.folder.name, canary) as attacker:
            running = attack([*hooks, *sessions], shared)
            stop_all(shared, servers)  # no server any more: the next victims start one, during the race
            starting = attack([*hooks[:8], *sessions[:2]], shared)
            loot = attacker.loot()
        for wave, victims in (("running", running), ("starting", starting)):
            print(f"{variable}, a server {wave}: {victims.own} own, {len(victims.refused)} refused, "
                  f"{len(victims.attacker)} served by the attacker")  # fmt: skip
        print(f"the attacker accepted {loot.connections} connections and received {len(loot.received)} bytes "
              f"(the secret: {secret in loot.received}, the prompt: {prompt in loot.received}); the victims' files in "
              f"its folder: {[path.name for path in owned_by(0, shared / 'evil')]}; the linked file: "
              f"{canary.read_text()!r}")  # fmt: skip
        assert (running.attacker, starting.attacker) == ([], [])
        assert (loot.connections, loot.received) == (0, "")
        assert owned_by(0, shared / "evil") == []
        assert canary.read_text() == "the victim's file\n"
    finally:
        stop_all(shared, servers)
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.slow  # another user's listener (setpriv), hooks, stdio sessions, the CLI
def test_a_socket_another_user_serves_is_refused_before_anything_is_sent(store: LocalStore, tmp_path: Path) -> None:
    """A listening socket of ``nobody`` where the server's should be (moved there: however it got there, the
    folder is this user's): every way in (a hook, a stdio session, a stdio session whose server died and which
    attaches again, ``LocalClient``, ``memrl-mcp local status|stop|ui``) refuses it by the kernel's word on who
    listens, before sending anything, naming the socket and what to do. Then a listener of the victim's own: the
    greeting it takes carries only the variables the settings read, never the secret beside them."""
    shared = shared_folder()
    secret = f"env-secret-{uuid.uuid4().hex}"
    env = store.env(VICTIM_API_KEY=secret)
    project = tmp_path / "project"
    project.mkdir()
    place = store.place
    try:
        relay = RawSession(store, VICTIM_API_KEY=secret)
        relay.initialize()
        assert "result" in relay.call("memory_stats")
        os.kill(store.server_pid(), signal.SIGKILL)
        store.wait_gone()
        with racing(shared, "-", place.folder.name, tmp_path / "nothing") as attacker:
            os.replace(shared / "evil" / place.folder.name / "socket", place.socket)  # nobody's listener, in place
            again = relay.call("memory_stats")
            assert again["result"]["isError"], again  # a tool error: the session's handshake stands (issue 40.2)
            said = again["result"]["content"][0]["text"]
            assert "another user" in said and str(place.socket) in said, said
            relay.close()
            how, said = hook_victim(env, project, f"plan the offsite {secret}")
            assert how == "refused" and "another user (uid 65534)" in said, said
            how, said = session_victim(env, project, "plan the offsite")
            assert how == "refused" and "another user (uid 65534)" in said, said
            script = python_with(LOCAL_CLIENT, env)
            assert "another user (uid 65534)" in script.stdout + script.stderr, script.stdout + script.stderr
            for action in ("status", "stop", "ui"):
                done = store.local(action, VICTIM_API_KEY=secret)
                assert done.returncode == 2 and "another user (uid 65534)" in done.stderr, (action, done.stderr)
            with pytest.raises(AttachError, match="another user"):
                attach(store.target, start=False)
            loot = attacker.loot()
        assert loot.received == "" and loot.connections >= 6  # connected, and nothing sent
        place.socket.unlink()
        own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        own.bind(os.fspath(place.socket))
        own.listen(8)
        listener = Listener(own)
        try:
            how, said = hook_victim(env, project, "plan the offsite")
            assert how == "refused", said
        finally:
            listener.close()
        (greeting,) = listener.received
        hello = decode(Hello, greeting.splitlines()[0])
        assert secret not in greeting.decode()
        assert set(hello.environ) == {
            name for name in env if name.startswith("MEMRL_") and name not in OTHER_VARIABLES
        } | {"CLAUDE_PROJECT_DIR"}, sorted(hello.environ)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


LOCAL_CLIENT = """
from memrl_mcp.local.client import LocalClient
from memrl_mcp.local.place import AttachError
try:
    LocalClient.open(start=False)
except AttachError as error:
    print(error)
"""
