"""The inspector in a real browser: Debian's chromium driven by Playwright, against the real server process with
real memories. Each test clicks through the page as a person would and checks what the page shows.

Screenshots of each view are written to the test's tmp folder (``INSPECTOR_SCREENSHOTS=folder`` keeps them
elsewhere, to look at them).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, expect, sync_playwright

from tests.support.inspector import (
    AGENT,
    ALICE,
    CLOSEST,
    FARTHER,
    HOSTILE_EXPERIENCE,
    HOSTILE_METADATA,
    HOSTILE_TASKS,
    OBJECTS,
    SAMPLED,
    SECRET,
    USER_NOTE,
    VERBS,
    Seeded,
    auth,
    harness_runs,
    seeded_server,
)

pytestmark = pytest.mark.slow  # needs chromium: `make test` runs it, `make test-fast` does not

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 15_000
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM.is_file(), "Debian's chromium is missing: `make browser` (apt-get install -y chromium)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    tmp = tmp_path_factory.mktemp("browser")
    runs = harness_runs(tmp / "runs")
    with seeded_server(tmp, tokens=True, runs=runs) as seeded:
        yield seeded


class Watched:
    """A page with everything that must not happen recorded: dialogs, uncaught errors, CSP violations."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", self._console)

    def _console(self, message: ConsoleMessage) -> None:
        """Errors of the page's script and CSP refusals ("Refused to ..."); an answer the page expects (a 401
        before the token is given, a refused edit) is logged by Chromium too, and is not one."""
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.errors.append(message.text)

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def clean(self) -> None:
        assert self.dialogs == [] and self.errors == []
        assert self.page.evaluate("window.__pwned") is None


@pytest.fixture
def page(browser: Browser, tmp_path: Path) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    watched = Watched(context.new_page())
    yield watched
    context.close()


@contextmanager
def page_server(html: str) -> Iterator[str]:
    """Serve one page from another origin (a port of its own); yields its URL."""

    class OnePage(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), OnePage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def shot(page: Page, tmp_path: Path, name: str) -> None:
    folder = Path(os.environ.get("INSPECTOR_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def log_in(page: Page, server: Seeded, token: str = ALICE) -> None:
    page.goto(f"{server.base}/ui")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", token)
    page.click("#login button")
    expect(page.locator("#memories")).to_be_visible()


def rows(page: Page) -> list[str]:
    return page.locator("#memories tbody td.task").all_inner_texts()


def test_the_page_asks_for_a_token_and_shows_the_callers_memories_only(
    page: Watched, server: Seeded, tmp_path: Path
) -> None:
    p = page.page
    p.goto(f"{server.base}/ui")
    expect(p.locator("#login-message")).to_have_text("This server needs a bearer token.")
    p.fill("#token", "not-the-right-token-000")
    p.click("#login button")
    expect(p.locator("#login-message")).to_have_text("That token was refused.")
    p.fill("#token", ALICE)
    p.click("#login button")
    expect(p.locator("#who-namespaces")).to_have_text("namespaces: alice, hostile, preview, sources")
    expect(p.locator("#stat-memories b")).to_have_text(str(len(VERBS) * len(OBJECTS)))
    expect(p.locator("#page-range")).to_have_text(f"1-25 of {len(VERBS) * len(OBJECTS)}")
    assert p.locator("#q-distribution rect").count() == 1  # the box of the middle half of Q
    assert SECRET not in p.content()
    # The token lives in this tab's sessionStorage only: no cookie, nothing in localStorage.
    assert p.evaluate("sessionStorage.getItem('memrl-inspector-token')") == ALICE
    assert p.context.cookies() == [] and p.evaluate("localStorage.length") == 0
    shot(p, tmp_path, "memories")
    p.click("#who button")  # Forget token
    expect(p.locator("#login")).to_be_visible()
    assert p.evaluate("sessionStorage.getItem('memrl-inspector-token')") is None
    page.clean()


def test_sort_filter_and_page_through_memories(page: Watched, server: Seeded) -> None:
    p = page.page
    log_in(p, server)
    total = len(VERBS) * len(OBJECTS)
    assert len(rows(p)) == 25
    p.click("#next-page")
    expect(p.locator("#page-range")).to_have_text(f"26-{total} of {total}")
    second = rows(p)
    p.click("#previous-page")
    expect(p.locator("#page-range")).to_have_text(f"1-25 of {total}")
    assert set(rows(p)) | set(second) == {f"{v} {o}" for v in VERBS for o in OBJECTS}  # no memory lost or repeated
    assert len(second) == total - 25

    p.click("th[data-sort=q]")  # highest Q first
    expect(p.locator("th[data-sort=q]")).to_have_text("Q ▼")
    qs = [float(text) for text in p.locator("#memories tbody tr td:nth-child(3)").all_inner_texts()]
    assert qs == sorted(qs, reverse=True) and qs[0] > 0.0  # rewards moved some Q up
    p.click("th[data-sort=q]")
    expect(p.locator("th[data-sort=q]")).to_have_text("Q ▲")
    qs = [float(text) for text in p.locator("#memories tbody tr td:nth-child(3)").all_inner_texts()]
    assert qs == sorted(qs)

    p.select_option("#filters select[name=outcome]", "failure")
    p.click("#filters button")
    expect(p.locator("#page-range")).to_have_text("1-10 of 10")
    assert set(p.locator("#memories tbody .badge").all_inner_texts()) == {"failure"}

    p.select_option("#filters select[name=outcome]", "")
    p.fill("#filters input[name=text]", "photo album")
    p.click("#filters button")
    expect(p.locator("#page-range")).to_have_text(f"1-{len(VERBS)} of {len(VERBS)}")
    assert all("photo album" in task for task in rows(p))

    p.fill("#filters input[name=text]", "")
    p.fill("#filters input[name=q_min]", "0.1")
    p.click("#filters button")
    expect(p.locator("#page-range")).to_have_text("1-3 of 3")  # the three memories the four reports moved up
    assert p.locator("#memories tbody tr td:nth-child(3)").all_inner_texts() == ["0.340"] * 3  # 1, 1, -1, 1
    p.fill("#filters input[name=q_min]", "0.99")
    p.click("#filters button")
    expect(p.locator("main")).to_contain_text("No memory matches.")
    page.clean()


def test_a_memorys_page_shows_experience_metadata_and_q_history(page: Watched, server: Seeded, tmp_path: Path) -> None:
    p = page.page
    log_in(p, server)
    p.click("th[data-sort=visits]")  # most visited first: the ones the four reports rewarded
    p.locator("#memories tbody a.memory-link").first.click()
    expect(p.locator("#memory-task")).to_be_visible()
    task = p.locator("#memory-task").inner_text()
    memory = httpx.get(f"{server.base}/ui/api/memories/{server.ids[task]}", headers=auth(ALICE)).json()
    assert memory["visits"] == 4 and len(memory["history"]) == 4
    expect(p.locator("#memory-experience")).to_have_text(memory["experience"])
    expect(p.locator("#memory-metadata")).to_have_text("{}")
    changes = p.locator("#q-history tbody tr td:nth-child(3)").all_inner_texts()
    assert changes == ["reward 1.00", "reward -1.00", "reward 1.00", "reward 1.00"]  # newest first
    q_after = [float(x) for x in p.locator("#q-history tbody tr td:nth-child(5)").all_inner_texts()]
    assert q_after == pytest.approx([e["q_after"] for e in reversed(memory["history"])], abs=1e-3)
    assert p.locator("svg.chart circle.point").count() == 5  # Q before the first reward, then after each
    shot(p, tmp_path, "memory")
    page.clean()


def test_a_memorys_page_says_who_wrote_it_and_who_gave_each_reward(
    page: Watched, server: Seeded, tmp_path: Path
) -> None:
    p = page.page
    log_in(p, server)
    p.select_option("#namespace", "sources")
    p.click(f"text={SAMPLED}")
    expect(p.locator("#memory-source")).to_have_text("the client's model")
    expect(p.locator("#memory-client")).to_have_text(AGENT)  # which agent's session wrote it (issue 41.3)
    givers = ["the tests (the agent claimed 1.00)", f"the user: \u201c{USER_NOTE}\u201d"]  # newest first
    expect(p.locator("#q-history tbody tr td.giver")).to_have_text(givers)
    expect(p.locator("#q-history .contradicted")).to_have_text("(the agent claimed 1.00)")
    shot(p, tmp_path, "provenance-user-and-model")
    p.click("#tabs a[data-view=memories]")
    p.select_option("#namespace", "alice")
    p.click("th[data-sort=visits]")
    p.locator("#memories tbody a.memory-link").first.click()
    expect(p.locator("#memory-source")).to_have_text("the agent")
    expect(p.locator("#q-history tbody tr td.giver")).to_have_text(["the agent's word"] * 4)
    shot(p, tmp_path, "provenance-agent")
    page.clean()


def test_why_this_memory_for_any_lambda_logs_no_recall(page: Watched, server: Seeded, tmp_path: Path) -> None:
    p = page.page
    log_in(p, server)
    stats_before = httpx.get(f"{server.base}/ui/api/stats?namespace=preview", headers=auth(ALICE)).json()
    p.click("#tabs a[data-view=preview]")
    p.select_option("#namespace", "preview")
    p.fill("#preview-task", CLOSEST)
    p.fill("#preview-k2", "1")

    def chosen() -> list[str]:
        return p.locator("#preview-candidates tr.chosen td.task").all_inner_texts()

    p.locator("#preview-lambda").fill("0")  # similarity only: the closest task
    expect(p.locator("#preview-lambda-value")).to_have_text("0.00")
    expect(p.locator("#preview-candidates tr.chosen td.task")).to_have_text([CLOSEST])
    expect(p.locator("#preview-summary")).to_contain_text("λ = 0.00")
    p.locator("#preview-lambda").fill("1")  # utility only: the learned-good memory
    expect(p.locator("#preview-candidates tr.chosen td.task")).to_have_text([FARTHER])
    assert chosen() == [FARTHER]
    farther = p.locator("#preview-candidates tr", has_text=FARTHER)
    expect(farther.locator("td.why")).to_contain_text("chosen for its utility")
    closest = p.locator("#preview-candidates tr", has_text=CLOSEST)
    expect(closest.locator("td.why")).to_contain_text("displaced by higher utility")
    # The numbers shown are the API's, which are algorithm.py's (tests/test_inspector.py checks those).
    shown = httpx.post(
        f"{server.base}/ui/api/preview",
        json={"task": CLOSEST, "namespace": "preview", "k2": 1, "q_weight": 1.0},
        headers=auth(ALICE),
    ).json()
    for candidate in shown["candidates"]:
        row = p.locator(f"#preview-candidates tr[data-id='{candidate['id']}'] td")
        assert row.nth(4).inner_text() == f"{candidate['similarity']:.3f}"
        assert row.nth(7).inner_text() == f"{candidate['score']:.3f}"
    p.locator("#preview-lambda").fill("0.5")
    expect(p.locator("#preview-summary")).to_contain_text("λ = 0.50")
    shot(p, tmp_path, "preview")
    stats_after = httpx.get(f"{server.base}/ui/api/stats?namespace=preview", headers=auth(ALICE)).json()
    assert stats_after == stats_before  # no recall pending or reported, no Q moved
    page.clean()


def test_edit_and_forget_a_memory_from_the_page(page: Watched, server: Seeded) -> None:
    p = page.page
    log_in(p, server)
    target = "Encrypt the invoice PDFs"
    memory_id = server.ids[target]
    p.fill("#filters input[name=text]", "encrypt invoice")
    p.click("#filters button")
    expect(p.locator("#memories tbody td.task")).to_have_text([target])
    p.click(f"text={target}")
    p.fill("#edit-experience", "Use age, not gpg: age -r KEY file.pdf > file.pdf.age")
    p.fill("#edit-metadata", '{"reviewed_by": "alice"}')
    p.click("#save")
    expect(p.locator("#status")).to_have_text("Saved.")
    expect(p.locator("#memory-experience")).to_have_text("Use age, not gpg: age -r KEY file.pdf > file.pdf.age")
    expect(p.locator("#memory-metadata")).to_contain_text('"reviewed_by": "alice"')
    expect(p.locator("#memory-source")).to_have_text("an operator (this page)")
    stored = httpx.get(f"{server.base}/ui/api/memories/{memory_id}", headers=auth(ALICE)).json()
    assert stored["metadata"] == {"reviewed_by": "alice"}

    p.fill("#edit-metadata", "[not json")  # refused in the page, nothing sent
    p.click("#save")
    expect(p.locator("#edit-message")).to_contain_text("metadata: not JSON")
    p.fill("#edit-metadata", "{}")
    p.fill("#edit-experience", "x" * 20_001)  # refused by the server, its message shown
    p.click("#save")
    expect(p.locator("#edit-message")).to_contain_text("experience:")
    p.reload()  # the edits refused changed nothing
    expect(p.locator("#memory-experience")).to_have_text("Use age, not gpg: age -r KEY file.pdf > file.pdf.age")

    p.click("#forget")
    expect(p.locator("#forget")).to_have_text("Click again to forget it for good")
    p.click("#forget")
    expect(p.locator("#status")).to_have_text(f"Forgotten: {target}")
    expect(p.locator("#memories")).to_be_visible()
    gone = httpx.get(f"{server.base}/ui/api/memories/{memory_id}", headers=auth(ALICE))
    assert gone.status_code == 400 and "no memory" in gone.json()["error_description"]
    page.clean()


def test_hostile_texts_render_as_text_and_run_nothing(page: Watched, server: Seeded, tmp_path: Path) -> None:
    p = page.page
    log_in(p, server)
    p.select_option("#namespace", "hostile")
    expect(p.locator("#memories tbody td.task")).to_have_count(len(HOSTILE_TASKS))
    assert sorted(rows(p)) == sorted(HOSTILE_TASKS)  # the markup is shown, as text
    for task in HOSTILE_TASKS:
        p.click("#tabs a[data-view=memories]")
        p.select_option("#namespace", "hostile")
        p.locator("#memories a.memory-link", has_text=task).click()
        expect(p.locator("#memory-task")).to_have_text(task)
        expect(p.locator("#memory-experience")).to_have_text(HOSTILE_EXPERIENCE)
        assert json.loads(p.locator("#memory-metadata").inner_text()) == HOSTILE_METADATA
        shot(p, tmp_path, "hostile")
    p.click("#tabs a[data-view=preview]")
    p.select_option("#namespace", "hostile")
    p.fill("#preview-task", HOSTILE_TASKS[1])
    p.fill("#preview-delta", "-1")  # every memory of the namespace a candidate
    p.click("#preview-run")
    expect(p.locator("#preview-candidates tr.chosen td.task").first).to_be_visible()
    assert set(HOSTILE_TASKS) <= set(p.locator("#preview-candidates td.task").all_inner_texts())
    # Nothing of the texts became an element: no image, script, svg or link of theirs, nothing ran.
    main = p.locator("main")
    assert main.locator("img").count() == 0 and main.locator("script").count() == 0
    assert p.locator("main svg[onload], main [onerror]").count() == 0
    hrefs = main.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert hrefs and all(re.fullmatch(r"#/memory/[0-9a-f-]{36}", href) for href in hrefs)
    page.clean()


def test_learning_curves_of_harness_runs(page: Watched, server: Seeded, tmp_path: Path) -> None:
    p = page.page
    log_in(p, server)
    p.click("#tabs a[data-view=curves]")
    expect(p.locator("#runs input")).to_have_count(2)
    labels = sorted(text.strip() for text in p.locator("#runs label").all_inner_texts())
    assert labels == ["controlled-memrl-seed0", "controlled-none-seed0"]
    section = p.locator("section.benchmark[data-benchmark=controlled]")
    charts = section.locator("svg.chart")
    expect(charts).to_have_count(2)
    assert charts.nth(0).get_attribute("aria-label") == "controlled: success rate per epoch"
    assert charts.nth(1).get_attribute("aria-label") == "controlled: CSR per epoch"
    assert sorted(section.locator(".legend-item").first.locator("xpath=..").inner_text().split()) == ["memrl", "none"]
    assert charts.nth(0).locator("circle.point").count() == 2 * 3  # two modes, three epochs
    # The points are the report's numbers: the run's summary per epoch.
    from memrl_harness.report import load_run

    assert server.runs is not None  # the fixture's server shows harness runs
    memrl = load_run(server.runs / "controlled-memrl-seed0")
    titles = charts.nth(1).locator("circle.point title").all_text_contents()
    for epoch in memrl.summary.epochs:
        assert f"memrl: epoch {epoch.epoch}, {epoch.csr:.3f}" in titles
    shot(p, tmp_path, "curves")
    p.uncheck("#runs input[value=controlled-none-seed0]")  # one run folder only
    expect(section.locator("svg.chart").nth(0).locator("circle.point")).to_have_count(3)
    page.clean()


def test_the_page_opens_on_a_namespace_that_holds_memories(
    page: Watched, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A server without tokens whose default namespace is empty: the page opens on the namespace holding the most
    memories, and shows their times as dates (the API gives ISO 8601)."""
    with seeded_server(tmp_path_factory.mktemp("empty-default"), tokens=False) as server:
        p = page.page
        p.goto(f"{server.base}/ui")
        expect(p.locator("main h2")).to_have_text("Memories in alice")
        expect(p.locator("#namespace")).to_have_value("alice")
        expect(p.locator("#page-range")).to_have_text(f"1-25 of {len(VERBS) * len(OBJECTS)}")
        updated = p.locator("#memories tbody tr td:nth-child(7)").all_inner_texts()
        assert len(updated) == 25 and all(re.search(r"\d{4}", text) and "Invalid" not in text for text in updated)
        page.clean()


def test_another_sites_page_cannot_change_a_memory(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A loopback server without tokens, and a page of another site open in the same browser: its form posts
    and its scripts' requests reach the server at most, and change nothing."""
    with seeded_server(tmp_path_factory.mktemp("csrf"), tokens=False) as server:
        memory_id = server.ids["Rename the CSV export"]
        target = f"{server.base}/ui/api/memories/{memory_id}"
        before = httpx.get(target).json()
        evil_page = f"""<!doctype html><html><body>
<form id="f" method="POST" action="{target}" enctype="text/plain">
<input name='{{"experience": "pwned", "x": "' value='"}}'></form>
<script>
window.results = [];
const tries = [
  ["PATCH", {{"Content-Type": "application/json"}}, JSON.stringify({{experience: "pwned"}})],
  ["DELETE", {{"Content-Type": "application/json"}}, "{{}}"],
  ["POST", {{"Content-Type": "text/plain"}}, JSON.stringify({{experience: "pwned"}})],
];
Promise.all(tries.map(([method, headers, body]) =>
  fetch("{target}", {{method, headers, body, mode: "cors"}}).then(r => "answered " + r.status, e => "blocked")
    .then(outcome => window.results.push(method + ": " + outcome))
    .then(() => fetch("{target}", {{method, body, mode: "no-cors"}}).then(() => "sent", () => "blocked"))
    .then(outcome => window.results.push(method + " no-cors: " + outcome))
)).then(() => {{ window.done = true; }});
</script></body></html>"""
        context = browser.new_context()
        evil = context.new_page()
        # Another origin on loopback too (another port), so that Chromium's private-network rules, which stop a
        # public site's requests to 127.0.0.1 before they leave, do not hide what the server itself does.
        with page_server(evil_page) as evil_origin:
            evil.goto(evil_origin)
            evil.wait_for_function("window.done === true", timeout=TIMEOUT_MS)
            results = set(evil.evaluate("window.results"))
        # The JSON PATCH and DELETE need a preflight, which is never granted: not sent. The text/plain POST and the
        # opaque (no-cors) POST are sent: the server refuses them (405), and the page reads nothing.
        assert {"PATCH: blocked", "DELETE: blocked", "POST: blocked", "POST no-cors: sent"} <= results
        with evil.expect_navigation() as navigation:  # the form's post reaches the server, which refuses it
            evil.evaluate("document.getElementById('f').submit()")
        assert navigation.value is not None and navigation.value.status == 405
        context.close()
        after = httpx.get(target).json()
        assert after == before  # nothing changed: experience, metadata, Q, timestamps


def test_a_late_answer_does_not_replace_the_page_opened_meanwhile(page: Watched, server: Seeded) -> None:
    """A list reloading for a namespace just picked answers after the user opened a memory: the memory stays."""
    p = page.page
    log_in(p, server)
    link = p.locator("#memories a.memory-link").first
    href, task = link.get_attribute("href"), link.inner_text()
    held: list = []
    lists = re.compile(r"/ui/api/memories\?")
    p.route(lists, lambda route: held.append(route))  # the list's answer is held back
    p.select_option("#namespace", "hostile")
    while not held:
        p.wait_for_timeout(20)
    p.evaluate(f"location.hash = {json.dumps(href)}")
    expect(p.locator("#memory-task")).to_have_text(task)
    with p.expect_response(lists):
        held[0].continue_()
    p.wait_for_timeout(300)  # the late answer's script runs
    expect(p.locator("#memory-task")).to_have_text(task)
    expect(p.locator("#memories")).to_have_count(0)
    page.clean()
