"""Coding chores: an LLM-free benchmark whose memory starts wrong, for the rewards' sources (docs/evaluation.md,
"Rewards from what happened"). The controlled benchmark (:mod:`~memrl_harness.benchmarks.controlled`) is its model.

A chore is a small Python project with something to do: bump a dependency pin, rename a function, make a test pass.
Each kind of chore has four named procedures; on each chore's project as it is now, one of them works. And the
memory says otherwise: the run's memory is seeded, for every chore, with a "success" of the kind's **stale**
procedure, which worked on the project as it used to be (the pin lived in requirements.txt; nothing called the
function; the test compared naive datetimes) and no longer does. An agent that believes its memory follows it and
fails; only what the tests said can teach the memory that it is stale.

The check is the chore's own tests, really run: the procedure applied to the project's files in a temporary folder,
then ``python -m pytest -q`` there (plugins not autoloaded: the project's tests need none). Its output, with
pytest's summary line (``1 failed, 1 passed in 0.04s``), and its exit code are what the agent's shell shows, and
what the plugin's hooks read (``Episode.check``). A procedure's result depends on the files alone, so each (chore,
procedure) is run once per process and its output remembered: a pytest run takes about 0.4 s on the project's
2-core machine, and a run of 20 rounds of 12 chores needs at most 48 distinct runs, against 240 without.

The world (``seed`` draws it): three kinds of chore, ``subjects`` chores of each (4 by default: 12 chores). Each
kind's four procedures: the stale one, two that each work on one of the kind's two current layouts of a project
(the pin in pyproject.toml, or in pip-tools' requirements.in; the old name removed, or kept as a deprecated alias;
the timestamp's offset kept, or converted to UTC), and one that never works. Each chore's layout is drawn, so a
sibling chore's success, worded alike, may be the wrong procedure here, as the controlled benchmark's twins are.

The agent is the controlled benchmark's (:func:`~memrl_harness.benchmarks.controlled.choose`): it avoids what the
recalled failures name, follows the best-ranked recalled success not avoided, else tries one of the kind's
procedures not avoided. Without memory it tries one of four: success 0.25.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from memrl_harness.benchmarks.base import Episode, Memory, SeededMemory, ShellRun, Task
from memrl_harness.benchmarks.controlled import choose
from memrl_harness.benchmarks.options import BenchmarkOptions
from memrl_harness.llm import LLM

TEST_COMMAND = "python -m pytest -q -p no:cacheprovider"
TEST_SECONDS = 60.0
Files = dict[str, str]


@dataclass(frozen=True)
class Procedure:
    """A named way to do a chore: what a memory of it says, the file it edits, and the edit."""

    name: str
    steps: str
    edits: str
    apply: Callable[[Files, Mapping[str, str]], Files]


@dataclass(frozen=True)
class Kind:
    """A kind of chore: its request, its projects (``files(subject, layout)``, layout None: the project as it used to
    be), its procedures (the first is the stale one), and the one that works on each current layout."""

    name: str
    request: str
    subjects: tuple[Mapping[str, str], ...]
    files: Callable[[Mapping[str, str], str | None], Files]
    procedures: tuple[Procedure, ...]
    works_on: Mapping[str, str]

    @property
    def stale(self) -> Procedure:
        return self.procedures[0]


def _sub(path: str, old: str, new: str) -> Callable[[Files, Mapping[str, str]], Files]:
    """An edit that replaces ``old`` by ``new`` in ``path`` (both formatted with the subject); no-op without it."""

    def apply(files: Files, s: Mapping[str, str]) -> Files:
        text = files.get(path.format(**s), "")
        return files | {path.format(**s): text.replace(old.format(**s), new.format(**s))}

    return apply


def _write(path: str, text: str) -> Callable[[Files, Mapping[str, str]], Files]:
    def apply(files: Files, s: Mapping[str, str]) -> Files:
        return files | {path.format(**s): text.format(**s)}

    return apply


def _both(*edits: Callable[[Files, Mapping[str, str]], Files]) -> Callable[[Files, Mapping[str, str]], Files]:
    def apply(files: Files, s: Mapping[str, str]) -> Files:
        for edit in edits:
            files = edit(files, s)
        return files

    return apply


# -- bump a dependency pin -------------------------------------------------------------------------------------------

PIN_TEST = """import pathlib
import re


def test_the_pin_is_bumped():
    found = re.search(r"{package}[>=]=([\\d.]+)", pathlib.Path("{source}").read_text())
    assert found, "no {package} pin in {source}"
    assert tuple(map(int, found.group(1).split("."))) >= {minimum}, f"{package} is pinned at {{found.group(1)}}"
"""


def _pin_files(s: Mapping[str, str], layout: str | None) -> Files:
    source = {"pyproject": "pyproject.toml", "pip-tools": "requirements.in", None: "requirements.txt"}[layout]
    minimum = tuple(int(part) for part in s["new"].split("."))
    listed = f'dependencies = ["{s["package"]}>={s["old"]}"]' if layout == "pyproject" else 'dynamic = ["dependencies"]'
    files = {
        "pyproject.toml": f'[project]\nname = "{s["service"]}"\nversion = "1.0"\n{listed}\n',
        "requirements.txt": f"{s['package']}=={s['old']}\n",
        "test_pin.py": PIN_TEST.format(package=s["package"], source=source, minimum=minimum),
    }
    if layout == "pip-tools":
        files["requirements.in"] = f"{s['package']}>={s['old']}\n"
        compiled = "# compiled by pip-compile from requirements.in: do not edit\n"
        files["requirements.txt"] = f"{compiled}{s['package']}=={s['old']}\n"
    return files


PIN = Kind(
    name="pin",
    request="Bump {package} to {new} in the {service} service.",
    subjects=(
        {"package": "requests", "old": "2.31", "new": "2.32", "service": "billing"},
        {"package": "django", "old": "5.0", "new": "5.1", "service": "accounts"},
        {"package": "numpy", "old": "2.0", "new": "2.1", "service": "forecasts"},
        {"package": "flask", "old": "2.3", "new": "3.0", "service": "webhooks"},
    ),
    files=_pin_files,
    procedures=(
        Procedure(
            "edit requirements.txt",
            "open requirements.txt; set the package's version to the new one; save",
            "requirements.txt",
            _sub("requirements.txt", "{package}=={old}", "{package}=={new}"),
        ),
        Procedure(
            "edit the pyproject dependencies",
            "open pyproject.toml; raise the package's lower bound in [project] dependencies; save",
            "pyproject.toml",
            _sub("pyproject.toml", "{package}>={old}", "{package}>={new}"),
        ),
        Procedure(
            "edit requirements.in",
            "open requirements.in; raise the package's lower bound; save (pip-compile writes requirements.txt)",
            "requirements.in",
            _sub("requirements.in", "{package}>={old}", "{package}>={new}"),
        ),
        Procedure(
            "pin it in constraints.txt",
            "create constraints.txt; add the package at the new version; save",
            "constraints.txt",
            _write("constraints.txt", "{package}>={new}\n"),
        ),
    ),
    works_on={"pyproject": "edit the pyproject dependencies", "pip-tools": "edit requirements.in"},
)

# -- rename an API ---------------------------------------------------------------------------------------------------

RENAME_TESTS = {
    None: "import {module}\n\n\ndef test_the_new_name():\n    assert {module}.{new}(2) == 4\n",
    "clean": """import {module}
import views


def test_the_new_name():
    assert {module}.{new}(2) == 4


def test_the_callers_use_it():
    assert views.show(2) == 5


def test_the_old_name_is_gone():
    assert not hasattr({module}, "{old}")
""",
    "deprecated": """import pytest

import {module}
import views


def test_the_new_name():
    assert {module}.{new}(2) == 4


def test_the_callers_use_it():
    assert views.show(2) == 5


def test_the_old_name_still_works_and_warns():
    with pytest.deprecated_call():
        assert {module}.{old}(2) == 4
""",
}
ALIAS = """

def {old}(x):
    import warnings

    warnings.warn("{old} is deprecated: use {new}", DeprecationWarning, stacklevel=2)
    return {new}(x)
"""


def _rename_files(s: Mapping[str, str], layout: str | None) -> Files:
    files = {f"{s['module']}.py": f"def {s['old']}(x):\n    return 2 * x\n", "test_api.py": RENAME_TESTS[layout]}
    if layout is not None:  # since then, a caller
        files["views.py"] = f"import {s['module']}\n\n\ndef show(x):\n    return {s['module']}.{s['old']}(x) + 1\n"
    return {path: text.format(**s) if path == "test_api.py" else text for path, text in files.items()}


def _alias(files: Files, s: Mapping[str, str]) -> Files:
    path = f"{s['module']}.py"
    return files | {path: files[path] + ALIAS.format(**s)}


_DEFINITION = _sub("{module}.py", "def {old}(", "def {new}(")
_CALLERS = _sub("views.py", "{module}.{old}(", "{module}.{new}(")
RENAME = Kind(
    name="rename",
    request="Rename {old}() to {new}() in the {module} module.",
    subjects=(
        {"module": "users", "old": "fetch_user", "new": "get_user"},
        {"module": "settings_store", "old": "load_cfg", "new": "load_config"},
        {"module": "invoices", "old": "calc_tax", "new": "compute_tax"},
        {"module": "mailer", "old": "send_msg", "new": "send_message"},
    ),
    files=_rename_files,
    procedures=(
        Procedure("rename the definition", "open the module; rename the def; save", "{module}.py", _DEFINITION),
        Procedure(
            "rename it everywhere",
            "rename the def; rename every call of the old name (grep the project); save",
            "views.py",
            _both(_DEFINITION, _CALLERS),
        ),
        Procedure(
            "rename it and keep a deprecated alias",
            "rename the def and its calls; add the old name as a wrapper that warns DeprecationWarning; save",
            "{module}.py",
            _both(_DEFINITION, _CALLERS, _alias),
        ),
        Procedure("rename the callers only", "rename every call of the old name; save", "views.py", _CALLERS),
    ),
    works_on={"clean": "rename it everywhere", "deprecated": "rename it and keep a deprecated alias"},
)

# -- make a test pass ------------------------------------------------------------------------------------------------

FIX_TESTS = {
    None: """from datetime import datetime

from {module} import {function}


def test_{function}_reads_the_local_time():
    assert {function}("2026-12-01T10:00:00+02:00") == datetime(2026, 12, 1, 10, 0)
""",
    "offset": """from datetime import timedelta

from {module} import {function}


def test_{function}_reads_the_time():
    parsed = {function}("2026-12-01T10:00:00+02:00")
    assert (parsed.hour, parsed.minute) == (10, 0)


def test_{function}_keeps_the_offset():
    assert {function}("2026-12-01T10:00:00+02:00").utcoffset() == timedelta(hours=2)
""",
    "utc": """from datetime import datetime, timedelta, timezone

from {module} import {function}


def test_{function}_gives_the_instant():
    assert {function}("2026-12-01T10:00:00+02:00") == datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)


def test_{function}_is_in_utc():
    assert {function}("2026-12-01T10:00:00+02:00").utcoffset() == timedelta(0)
""",
}
PARSE = "from datetime import datetime, timezone\n\n\ndef {function}(text):\n    return {body}\n"
AWARE = "datetime.fromisoformat(text)"


def _fix_files(s: Mapping[str, str], layout: str | None) -> Files:
    # As it used to be, the parser kept the offset and the test wanted the local time; then someone stripped it (the
    # stale procedure) and the tests changed.
    body = AWARE if layout is None else f"{AWARE}.replace(tzinfo=None)"
    return {f"{s['module']}.py": PARSE.format(body=body, **s), "test_parse.py": FIX_TESTS[layout].format(**s)}


def _body(body: str) -> Callable[[Files, Mapping[str, str]], Files]:
    return _write("{module}.py", PARSE.replace("{body}", body))


FIX = Kind(
    name="fix",
    request="Make the {function} tests of the {module} app pass.",
    subjects=(
        {"module": "bookings", "function": "parse_start"},
        {"module": "tickets", "function": "read_deadline"},
        {"module": "audit", "function": "event_time"},
        {"module": "agenda", "function": "parse_when"},
    ),
    files=_fix_files,
    procedures=(
        Procedure(
            "strip the timezone",
            "parse with datetime.fromisoformat; drop the tzinfo (replace(tzinfo=None)); save",
            "{module}.py",
            _body(f"{AWARE}.replace(tzinfo=None)"),
        ),
        Procedure(
            "keep the offset",
            "parse with datetime.fromisoformat; return it as it is; save",
            "{module}.py",
            _body(AWARE),
        ),
        Procedure(
            "convert to UTC",
            "parse with datetime.fromisoformat; convert it with astimezone(timezone.utc); save",
            "{module}.py",
            _body(f"{AWARE}.astimezone(timezone.utc)"),
        ),
        Procedure(
            "parse the date only",
            "parse the first ten characters as a date; save",
            "{module}.py",
            _body("datetime.fromisoformat(text[:10])"),
        ),
    ),
    works_on={"offset": "keep the offset", "utc": "convert to UTC"},
)

KINDS = (PIN, RENAME, FIX)
_NAMES = {procedure.name: procedure for kind in KINDS for procedure in kind.procedures}
_SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error).*) in [\d.]+s\s*=*$", re.MULTILINE)


def success_experience(procedure: str) -> str:
    """What a success teaches: the procedure, as a short script (the controlled benchmark's form)."""
    return f'procedure "{procedure}": {_NAMES[procedure].steps}.'


def failure_experience(procedure: str) -> str:
    """What a failure teaches: the procedure that failed here, to avoid."""
    return f'reflection: procedure "{procedure}" failed on this chore: the tests still fail; try another procedure.'


def run_tests(files: Files) -> ShellRun:
    """The project's tests, really run in a temporary folder (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="chore-") as folder:
        for path, text in files.items():
            (Path(folder) / path).write_text(text)
        environ = os.environ | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(
            [sys.executable, *TEST_COMMAND.split()[1:]],
            cwd=folder,
            env=environ,
            capture_output=True,
            text=True,
            timeout=TEST_SECONDS,
            check=False,
        )
    return ShellRun(TEST_COMMAND, done.returncode, done.stdout + done.stderr)


class ChoresOptions(BenchmarkOptions):
    """The chores' options; the module docstring says what each does."""

    subjects: int = Field(4, ge=1, le=4, description="chores of each kind (pin, rename, fix)")
    seed: int = Field(0, description="draws each chore's current layout; the runner's seed rolls the episodes")


class ChoresBenchmark:
    """Coding chores with a stale memory each; see the module docstring."""

    name = "chores"
    needs_llm = False
    Options = ChoresOptions

    def __init__(self, **values: Any) -> None:
        """``values``: the :class:`ChoresOptions`, as text (``--option subjects=2``) or typed."""
        options = self.options = ChoresOptions.parse(self.name, values)
        draw = random.Random(f"chores:{options.seed}")
        self._tasks: list[Task] = []
        for kind in KINDS:
            for number, subject in enumerate(kind.subjects[: options.subjects]):
                layout = draw.choice(sorted(kind.works_on))
                intent = kind.request.format(**subject)
                data = {"kind": kind.name, "subject": number, "layout": layout}
                self._tasks.append(Task(id=f"{kind.name}-{number}", intent=intent, data=data, type=kind.name))
        self._checked: dict[tuple[str, str | None], ShellRun] = {}
        self._lock = threading.Lock()

    def tasks(self) -> Sequence[Task]:
        return list(self._tasks)

    def seeded(self) -> list[SeededMemory]:
        """Each chore's stale memory: its kind's stale procedure, a success once."""
        return [SeededMemory(t.intent, success_experience(_kind(t).stale.name)) for t in self._tasks]

    def project(self, task: Task, procedure: str | None = None, now: bool = True) -> Files:
        """The chore's project files, now (or as they used to be), after ``procedure`` (None: as they are)."""
        kind, subject = _kind(task), _subject(task)
        files = kind.files(subject, task.data["layout"] if now else None)
        if procedure is None:
            return files
        return next(p for p in kind.procedures if p.name == procedure).apply(files, subject)

    def check(self, task: Task, procedure: str) -> ShellRun:
        """The chore's tests after ``procedure``, run once per (chore, procedure) (module docstring)."""
        key = (task.id, procedure)
        with self._lock:
            if key not in self._checked:
                self._checked[key] = run_tests(self.project(task, procedure))
            return self._checked[key]

    def run_episode(self, task: Task, memories: Sequence[Memory], llm: LLM | None, rng: random.Random) -> Episode:
        kind = _kind(task)
        choice = choose(memories, [p.name for p in kind.procedures], rng)
        procedure = next(p for p in kind.procedures if p.name == choice.procedure)
        run = self.check(task, choice.procedure)
        success = run.exit_code == 0
        how = f"followed memory {choice.followed}" if choice.followed else "tried"
        summary = _SUMMARY.findall(run.output)
        trajectory = (
            f"{len(memories)} memories; avoided: {', '.join(choice.avoided) or 'nothing'}; {how}: {procedure.name}; "
            f"edited {procedure.edits.format(**_subject(task))}; $ {run.command}: exit {run.exit_code}, "
            f"{summary[-1] if summary else 'no summary'}"
        )
        worked, failed = success_experience(procedure.name), failure_experience(procedure.name)
        return Episode(
            success=success,
            reward=1.0 if success else -1.0,
            steps=1,
            trajectory=trajectory,
            experience=worked if success else failed,
            mistaken_experience=failed if success else worked,
            check=run,
            edited=(procedure.edits.format(**_subject(task)),),
        )


def _kind(task: Task) -> Kind:
    return next(kind for kind in KINDS if kind.name == task.data["kind"])


def _subject(task: Task) -> Mapping[str, str]:
    return _kind(task).subjects[task.data["subject"]]
