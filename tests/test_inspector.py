"""The inspector's JSON API (/ui/api) through the real server process: tenants, tokens, cross-site requests,
headers; and "why this memory?" against algorithm.py's own numbers.

The browser tests (tests/test_inspector_browser.py) reuse this module's seeded servers.
"""

from __future__ import annotations

import re
import select
import socket
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from memrl_mcp.errors import MemoryRequestError
from memrl_mcp.memory import algorithm
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience, RecallQuery, StatsQuery
from memrl_mcp.transports.inspector import CONTENT_SECURITY_POLICY, preview
from tests.support.inspector import (
    ALICE,
    BOB,
    CLOSEST,
    FARTHER,
    JSON_WRITE,
    OBJECTS,
    ROOT,
    SAMPLED,
    SAMPLED_EXPERIENCE,
    SECRET,
    UNRELATED,
    USER_NOTE,
    VERBS,
    Seeded,
    auth,
    seeded_server,
)
from tests.support.servers import HttpServer


def base_url(server: HttpServer) -> str:
    return server.url.rsplit("/", 1)[0]


@pytest.fixture(scope="module")
def with_tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    with seeded_server(tmp_path_factory.mktemp("tokens"), tokens=True) as seeded:
        yield seeded


@pytest.fixture(scope="module")
def without_tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    with seeded_server(tmp_path_factory.mktemp("open"), tokens=False) as seeded:
        yield seeded


@pytest.mark.slow  # the module's server processes
def test_every_api_route_needs_a_valid_token(with_tokens: Seeded) -> None:
    memory = with_tokens.ids["Sort the CSV export"]
    routes = [
        ("GET", "/ui/api/session", None),
        ("GET", "/ui/api/stats", None),
        ("GET", "/ui/api/memories?namespace=alice", None),
        ("GET", f"/ui/api/memories/{memory}", None),
        ("PATCH", f"/ui/api/memories/{memory}", {"experience": "overwritten"}),
        ("DELETE", f"/ui/api/memories/{memory}", {}),
        ("POST", "/ui/api/preview", {"task": "Sort the CSV export"}),
        ("GET", "/ui/api/curves", None),
    ]
    with httpx.Client(base_url=with_tokens.base, timeout=10) as http:
        for headers in ({}, auth("not-a-token-at-all-123"), {"Authorization": f"Basic {ALICE}"}):
            for method, path, body in routes:
                response = http.request(method, path, json=body, headers={**JSON_WRITE, **headers})
                assert response.status_code == 401, (method, path, headers)
                assert response.headers["www-authenticate"].startswith("Bearer")
                assert "bearer token is required" in response.json()["error_description"]
        # Nothing changed: the memory is there, with its experience.
        kept = http.get(f"/ui/api/memories/{memory}", headers=auth(ALICE)).json()
        assert kept["experience"] == "Steps for sort the CSV export."
        # The page itself holds no data: it loads without a token, and asks for one.
        page = http.get("/ui")
        assert page.status_code == 200 and '<form id="login"' in page.text


@pytest.mark.slow  # the module's server processes
def test_a_token_sees_and_changes_only_its_own_namespaces(with_tokens: Seeded) -> None:
    alice_memory, secret = with_tokens.ids["Sort the CSV export"], with_tokens.ids[SECRET]
    with httpx.Client(base_url=with_tokens.base, timeout=10) as http:
        session = http.get("/ui/api/session", headers=auth(BOB)).json()
        assert (session["namespaces"], session["every_namespace"], session["tokens"]) == (["bob"], False, True)
        page = http.get("/ui/api/memories", headers=auth(BOB)).json()
        assert [m["task"] for m in page["memories"]] == [SECRET]
        denied = http.get("/ui/api/memories?namespace=alice", headers=auth(BOB))
        assert denied.status_code == 400
        assert "not one of the namespaces this token may use" in denied.json()["error_description"]
        assert http.get("/ui/api/stats?namespace=alice", headers=auth(BOB)).status_code == 400
        preview_alice = http.post("/ui/api/preview", json={"task": "Sort", "namespace": "alice"}, headers=auth(BOB))
        assert preview_alice.status_code == 400
        # Another tenant's memory is exactly as unknown as one that does not exist, for reading and changing.
        for method, body in (("GET", None), ("PATCH", {"experience": "bob was here"}), ("DELETE", {})):
            response = http.request(
                method, f"/ui/api/memories/{alice_memory}", json=body, headers={**JSON_WRITE, **auth(BOB)}
            )
            assert response.status_code == 400
            assert response.json()["error_description"] == f"memory_id: no memory {alice_memory!r}"
        assert http.get(f"/ui/api/memories/{alice_memory}", headers=auth(ALICE)).json()["experience"] == (
            "Steps for sort the CSV export."
        )
        alice_sees = http.get("/ui/api/memories?namespace=alice&limit=100", headers=auth(ALICE)).json()
        assert secret not in {m["id"] for m in alice_sees["memories"]}
        assert alice_sees["total"] == len(VERBS) * len(OBJECTS)


@pytest.mark.slow  # the module's server processes
def test_every_answer_carries_the_security_headers(with_tokens: Seeded) -> None:
    with httpx.Client(base_url=with_tokens.base, timeout=10) as http:
        for path in ("/ui", "/ui/", "/ui/app.js", "/ui/charts.js", "/ui/app.css", "/ui/api/session", "/ui/api/stats"):
            response = http.get(path, headers=auth(ALICE))
            assert response.status_code == 200, path
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY
            assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["x-frame-options"] == "DENY"
            assert "set-cookie" not in response.headers
        for script_name in ("app.js", "charts.js"):
            assert http.get(f"/ui/{script_name}").headers["content-type"].startswith("text/javascript")
        assert http.get("/ui/../ui/secrets.txt").status_code == 404
        assert http.get("/ui/index.htm").status_code == 404
    scripts = sorted((ROOT / "memrl_mcp" / "transports" / "ui").glob("*.js"))
    assert [script.name for script in scripts] == ["app.js", "charts.js"]
    for script in scripts:
        assert not re.search(r"\.(inner|outer)HTML\b|insertAdjacentHTML|document\.write|\beval\(", script.read_text())
    assert "<script>" not in (ROOT / "memrl_mcp" / "transports" / "ui" / "index.html").read_text()  # no inline script


@pytest.mark.slow  # the module's server processes
def test_a_server_without_tokens_answers_loopback_names_only(without_tokens: Seeded) -> None:
    memory = without_tokens.ids["Sort the CSV export"]
    with httpx.Client(base_url=without_tokens.base, timeout=10) as http:
        session = http.get("/ui/api/session").json()  # no token needed on a loopback-only server
        assert session["tokens"] is False and session["every_namespace"] is True
        assert {"alice", "preview", "hostile"} <= set(session["namespaces"])
        for host in ("localhost:1", "[::1]:1"):
            assert http.get("/ui/api/session", headers={"Host": host}).status_code == 200
        # DNS rebinding: a page whose name now resolves to 127.0.0.1 still sends its own name.
        for path in ("/ui", "/ui/api/session", f"/ui/api/memories/{memory}"):
            assert http.get(path, headers={"Host": "evil.example.com"}).status_code == 421


@pytest.mark.slow  # the module's server processes
def test_a_memory_says_who_wrote_its_experience_and_who_gave_each_reward(with_tokens: Seeded) -> None:
    """Issue 26: the experience the client's model wrote, the reward the user gave (with the note), a reward the
    tests decided against the agent's claim (issue 39), and an operator's correction, as the inspector's API shows
    them (the page draws them: tests/test_inspector_browser.py)."""
    memory_id = with_tokens.ids[SAMPLED]
    with httpx.Client(base_url=with_tokens.base, timeout=10) as http:
        memory = http.get(f"/ui/api/memories/{memory_id}", headers=auth(ALICE)).json()
        assert (memory["experience"], memory["experience_source"]) == (SAMPLED_EXPERIENCE, "client_model")
        asked, contradicted = memory["history"]
        assert (asked["source"], asked["note"], asked["reward"]) == ("user", USER_NOTE, 1.0)
        assert (contradicted["source"], contradicted["reward"], contradicted["claimed"]) == ("tests", -1.0, 1.0)
        agent = http.get(f"/ui/api/memories/{with_tokens.ids['Sort the CSV export']}", headers=auth(ALICE)).json()
        assert agent["experience_source"] == "agent" and {e["source"] for e in agent["history"]} == {"agent"}
        edited = http.patch(
            f"/ui/api/memories/{memory_id}", json={"experience": "corrected"}, headers={**JSON_WRITE, **auth(ALICE)}
        ).json()
        assert (edited["experience_source"], edited["history"]) == ("operator", memory["history"])


@pytest.mark.slow  # the module's server processes
def test_the_page_opens_on_a_namespace_that_holds_memories(without_tokens: Seeded, with_tokens: Seeded) -> None:
    """The default namespace (``default``) holds nothing here: the page opens on the fullest namespace instead, not
    on an empty table; a caller whose default namespace holds memories opens on it."""
    with httpx.Client(timeout=10) as http:
        session = http.get(f"{without_tokens.base}/ui/api/session").json()
        assert (session["default_namespace"], session["open_namespace"]) == ("default", "alice")
        assert http.get(f"{without_tokens.base}/ui/api/stats?namespace=default").json()["memories"] == 0
        for token, namespace in ((ALICE, "alice"), (BOB, "bob")):
            session = http.get(f"{with_tokens.base}/ui/api/session", headers=auth(token)).json()
            assert (session["default_namespace"], session["open_namespace"]) == (namespace, namespace)


@pytest.mark.slow  # the module's server processes
def test_no_cross_site_request_changes_anything(without_tokens: Seeded) -> None:
    """What another site's page could send to a loopback server without tokens: forms (POST, urlencoded or
    multipart or text/plain), and writes that say they come from elsewhere. None changes the memory."""
    memory = without_tokens.ids["Compress the CSV export"]
    path = f"/ui/api/memories/{memory}"
    evil = {"Origin": "http://evil.example.com"}
    with httpx.Client(base_url=without_tokens.base, timeout=10) as http:
        before = http.get(path).json()
        assert http.post(path, data={"experience": "pwned"}).status_code == 405  # a form can only GET or POST
        text_form = http.post(path, content=b'{"experience": "pwned"}', headers={"Content-Type": "text/plain"})
        assert text_form.status_code == 405
        for content_type in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"):
            for method in ("PATCH", "DELETE"):
                response = http.request(
                    method, path, content=b'{"experience": "pwned"}', headers={"Content-Type": content_type}
                )
                assert response.status_code == 415, (method, content_type)
        for method, body in (("PATCH", {"experience": "pwned"}), ("DELETE", {})):
            assert http.request(method, path, json=body, headers=evil).status_code == 403
            cross = {"Sec-Fetch-Site": "cross-site"}
            assert http.request(method, path, json=body, headers=cross).status_code == 403
            assert http.request(method, path, json=body, headers={"Sec-Fetch-Site": "same-site"}).status_code == 403
        assert http.get(path).json() == before
        # The same request from the page itself (its own origin) is accepted.
        mine = {"Origin": without_tokens.base, "Sec-Fetch-Site": "same-origin"}
        edited = http.patch(path, json={"metadata": {"checked": True}}, headers=mine)
        assert edited.status_code == 200 and edited.json()["metadata"] == {"checked": True}


@pytest.mark.slow  # the module's server processes
def test_bad_requests_are_named(with_tokens: Seeded) -> None:
    memory = with_tokens.ids["Back up the CSV export"]
    with httpx.Client(base_url=with_tokens.base, timeout=10, headers=auth(ALICE)) as http:
        for query, named in (
            ("limit=ten", "limit"),
            ("sort=task", "sort"),
            ("outcome=maybe", "outcome"),
            ("q_min=2", "q_min"),
            ("unknown=1", "unknown"),
        ):
            response = http.get(f"/ui/api/memories?namespace=alice&{query}")
            assert response.status_code == 400, query
            assert response.json()["error_description"].startswith(named), response.json()
        for body, named in (
            ({"experience": 5}, "experience"),
            ({"metadata": []}, "metadata"),
            ({"experience": "x" * 20001}, "experience"),
            ({"q": 1.0}, "q"),
            ({}, "give at least one"),
        ):
            response = http.patch(f"/ui/api/memories/{memory}", json=body)
            assert response.status_code == 400, body
            assert response.json()["error_description"].startswith(named), response.json()
        for preview, named in (({"task": "x", "k1": 2, "k2": 3}, "k2"), ({"task": "x", "q_weight": 2.0}, "q_weight")):
            response = http.post("/ui/api/preview", json=preview)
            assert response.status_code == 400 and response.json()["error_description"].startswith(named)
        big = http.patch(f"/ui/api/memories/{memory}", content=b" " * (2 << 20), headers=JSON_WRITE)
        assert big.status_code == 413
        assert http.get(f"/ui/api/memories/{memory}").json()["experience"] == "Steps for back up the CSV export."


def test_preview_gives_algorithms_numbers_and_logs_no_recall(service: MemoryService) -> None:
    for task, q in ((CLOSEST, -0.8), (FARTHER, 0.9), (UNRELATED, 0.0)):
        service.store_experience(NewExperience(task, "steps", q=q), access=EVERYTHING)
    before = service.stats(StatsQuery(), access=EVERYTHING)
    for q_weight in (0.0, 0.5, 1.0):
        shown = preview(service, RecallQuery(task=CLOSEST, k1=5, k2=1, q_weight=q_weight), access=EVERYTHING)
        pool = [algorithm.Candidate(c.similarity, c.q) for c in shown.candidates]
        assert [c.similarity for c in shown.candidates] == sorted((c.similarity for c in pool), reverse=True)
        scores = algorithm.phase_b_scores(pool, q_weight, service.scale.z_similarity)
        assert [c.score for c in shown.candidates] == pytest.approx(list(scores.total))
        sims = np.array([c.similarity for c in pool])
        assert [c.z_similarity for c in shown.candidates] == pytest.approx(
            list(algorithm.z_similarity(sims, service.scale.z_similarity))
        )
        assert [c.z_q for c in shown.candidates] == pytest.approx(
            list(algorithm.z_scores(np.array([c.q for c in pool])))
        )
        # The chosen one is the one a real search (and so a recall) hands out with the same constants.
        searched = service.search(RecallQuery(CLOSEST, k1=5, k2=1, q_weight=q_weight), access=EVERYTHING)
        assert [c.id for c in shown.candidates if c.chosen] == [m.id for m in searched.memories]
    closest_wins = preview(service, RecallQuery(task=CLOSEST, k2=1, q_weight=0.0), access=EVERYTHING)
    utility_wins = preview(service, RecallQuery(task=CLOSEST, k2=1, q_weight=1.0), access=EVERYTHING)
    assert [c.task for c in closest_wins.candidates if c.chosen] == [CLOSEST]
    assert [c.task for c in utility_wins.candidates if c.chosen] == [FARTHER]
    farther = next(c for c in utility_wins.candidates if c.task == FARTHER)
    assert farther.reason.startswith("chosen for its utility")
    closest = next(c for c in utility_wins.candidates if c.task == CLOSEST)
    assert closest.reason.startswith("displaced by higher utility")
    assert service.stats(StatsQuery(), access=EVERYTHING) == before  # no recall logged, no Q moved
    with pytest.raises(MemoryRequestError, match=r"^k2: 3 exceeds k1"):
        preview(service, RecallQuery(task=CLOSEST, k1=2, k2=3), access=EVERYTHING)


def test_the_pages_files_ship_as_package_data() -> None:
    """pyproject's package-data globs pick up every file the page serves (a wheel without them serves a 500)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["memrl_mcp"]
    shipped = {path.relative_to(ROOT / "memrl_mcp") for pattern in globs for path in (ROOT / "memrl_mcp").glob(pattern)}
    assert {Path(f"transports/ui/{name}") for name in ("index.html", "app.js", "charts.js", "app.css")} <= shipped
    dev = config["project"]["optional-dependencies"]["dev"]
    assert any(requirement.startswith("playwright") for requirement in dev)


def nested(levels: int, inner: str = "1") -> str:
    return '{"a": ' * levels + inner + "}" * levels


HOSTILE_EDITS = [  # (body, status, the refusal starts with)
    ('{"metadata": ' + nested(100_000) + "}", 400, "metadata: JSON nested deeper than 8 levels"),
    ('{"metadata": ' + nested(5_000) + "}", 400, "metadata: JSON nested deeper than 8 levels"),
    ('{"metadata": ' + nested(9) + "}", 400, "metadata: JSON nested deeper than 8 levels"),
    ('{"experience": "x", "metadata": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}", 400, "metadata: JSON nested"),
    ("[" * 100_000 + "]" * 100_000, 400, "body: JSON nested deeper than 9 levels"),
    ('{"unknown": ' + nested(5_000) + "}", 400, "body: JSON nested deeper than 9 levels"),
    ('{"metadata": {"a": ' + "9" * 5_000 + "}}", 400, "body: not JSON (Exceeds the limit (4300 digits)"),
    ('{"metadata": {"a": ' + "9" * 300 + "}}", 400, "metadata: at .a: integer of 300 digits is outside +-2^53"),
    ('{"metadata": {"a": 1e400}}', 400, "metadata: at .a: inf is not a finite number"),
    ('{"metadata": {"a": NaN}}', 400, "metadata: at .a: nan is not a finite number"),
    ('{"reset_q": Infinity}', 400, "reset_q: Input should be a valid boolean"),
    ('{"experience": 5}', 400, "experience: Input should be a valid string"),
    ('{"experience": "\\ud800"}', 400, "experience: Input should be a valid string"),
    ('{"experience": "x"', 400, "body: not JSON (Expecting ',' delimiter at character 18)"),
    ("", 400, "body: not JSON (Expecting value at character 0)"),
    ("[1, 2]", 400, "body: Input should be a JSON object"),
    ('"text"', 400, "body: Input should be a JSON object"),
    ("null", 400, "body: Input should be a JSON object"),
    ("5", 400, "body: Input should be a JSON object"),
]
HOSTILE_PREVIEWS = [
    ('{"task": ' + "[" * 100_000 + "]" * 100_000 + "}", 400, "task: JSON nested deeper than 8 levels"),
    ('{"task": "x", "k1": ' + "9" * 4_000 + "}", 400, "k1: Input should be less than or equal to 100"),
    ('{"task": "x", "k1": 1e400}', 400, "k1: Input should be a valid integer"),
    ('{"task": "x", "k1": -5}', 400, "k1: Input should be greater than or equal to 1"),
    ('{"task": "x", "q_weight": NaN}', 400, "q_weight: Input should be a finite number"),
    ('{"task": "x", "delta": -Infinity}', 400, "delta: Input should be a finite number"),
    ('{"task": "\\udfff"}', 400, "task: Input should be a valid string"),
]


@pytest.mark.slow  # the module's server processes
def test_hostile_bodies_are_refused_by_name_and_never_crash_a_route(with_tokens: Seeded) -> None:
    """Issue 22, item 7: a deeply nested body was an HTTP 500 with a logged traceback (Python's JSON parser
    recursing past its limit). Every hostile body is now a 4xx naming the field, and changes nothing."""
    memory = with_tokens.ids["Rename the CSV export"]
    path = f"/ui/api/memories/{memory}"
    log_before = len(with_tokens.server.log_path.read_text())
    with httpx.Client(base_url=with_tokens.base, timeout=30, headers={**auth(ALICE), **JSON_WRITE}) as http:
        before = http.get(path).json()
        attempts: list[tuple[str, str, str | bytes, int, str]]  # (method, path, body, status, the refusal starts with)
        attempts = [("PATCH", path, body, status, named) for body, status, named in HOSTILE_EDITS]
        attempts += [("POST", "/ui/api/preview", body, status, named) for body, status, named in HOSTILE_PREVIEWS]
        attempts += [
            ("DELETE", path, "[" * 100_000 + "]" * 100_000, 400, "body: JSON nested deeper than 9 levels"),
            ("PATCH", path, b'{"experience": "\xff\xfe"}', 400, "body: not UTF-8 (invalid start byte at byte 16)"),
        ]
        for method, where, body, status, named in attempts:
            response = http.request(method, where, content=body)
            shown = (method, where, str(body)[:60])
            assert response.status_code == status, (*shown, response.text[:300])
            assert response.json()["error_description"].startswith(named), (*shown, response.json())
        # A body past the limit is refused whether it says its length or not (chunked).
        for too_big in (b" " * (2 << 20), iter([b" " * (1 << 20)] * 3)):
            assert http.patch(path, content=too_big).status_code == 413
        assert http.get(path).json() == before
    # ... and the server stops reading it there: it never holds more than the limit of one body in memory.
    assert endless_body_sent(with_tokens, path) < ENDLESS_BYTES
    log = with_tokens.server.log_path.read_text()[log_before:]
    assert "Traceback" not in log and '"level": "error"' not in log


ENDLESS_BYTES = 64 << 20


def endless_body_sent(seeded: Seeded, path: str) -> int:
    """Bytes of a 64 MB chunked PATCH body (64 KB chunks) a client could send before the server answered or
    closed the connection: the whole of it when the server reads every body to its end before refusing it."""
    port = int(seeded.base.rsplit(":", 1)[1])
    chunk = b" " * (64 << 10)
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    head = (
        f"PATCH {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {ALICE}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode())
        while sent < ENDLESS_BYTES and not select.select([sock], [], [], 0)[0]:
            try:
                sock.sendall(framed)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
    return sent
