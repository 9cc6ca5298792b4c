"""Who can reach the local memory server, performed: another OS user (created for the test), a process that guesses
the inspector's port or talks nonsense to the socket, a page that rebinds its name or posts across sites, and a
runtime folder that another user made or left open."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from memrl_mcp.local.place import AttachError, Place, build_identity, place_of
from tests.support.local import LocalStore, local_store
from tests.support.mcp import call
from tests.support.servers import INITIALIZE, MCP_HEADERS

pytestmark = pytest.mark.anyio
START_S = 240
NOBODY = 65534

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
