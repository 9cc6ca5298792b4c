"""Which checks a shell command ran and how they went, read from the command, its output and its exit code: the
evidence every agent's hooks hand the memory (:class:`~memrl_mcp.validation.Check`,
:mod:`memrl_mcp.memory.evidence`). Pure and standard-library only: a hook is a fresh process per event.

:func:`recognise` finds the check runners of a command line (:data:`PROGRAMS`: pytest, jest, cargo test, tsc, ...;
:data:`TASKS`: the task runners whose task's name says the kind, ``npm run test``, ``make build``, ``gradle check``;
and a project's ``own`` commands) through what only launches them (``CI=1``, ``uv run``, ``npx``, ``python -m``,
``bash -c``). How the run went comes from two witnesses:

- **The runner's summary** in the output (:class:`Summary`: pytest's ``3 failed, 40 passed in 1.2s``, cargo's
  ``test result: FAILED. 3 passed; 1 failed``, mypy's ``Found 2 errors in 1 file``), with its counts. A summary
  that reports a failure wins over everything: a failure hidden by ``|| true``, ``; echo`` or a pipe still shows.
- **The exit code**, where the agent gives one (Codex's after-tool event does not: there the summary alone speaks),
  and only where it is the check's: nothing runs after the check but ``&&`` steps, it is not piped, not run only
  after ``||``; and for a failure, nothing else in the line can have failed it (the other steps are ``cd``,
  ``export``, ``echo``, ...). ``npm ci && npm test`` failing without a test summary says nothing: ``npm ci`` may
  have failed.

Nothing is recorded when the outcome cannot be known: no summary and no exit code of the check's; a runner that did
not start (exit 126, 127) or was killed (130, 137, 143); a test run that ran no test. Of the command, only its
check's head is kept, without anything that may be a secret (:func:`redacted`); never its output.

:func:`is_edit` tells the agents' file-editing tools and the shell commands that obviously change files (after an
edit, earlier runs tested other code); :func:`stated_exit` reads the exit code an agent writes into its shell tool's
result.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

Kind = Literal["tests", "build", "typecheck", "lint", "check"]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


COMMAND_CHARS = 200  # validation.MAX_CHECK_TEXT: a check's command as the memory keeps it
OUTPUT_TAIL = 200_000  # the characters of an output that are read: runners print their summary last
RANK: Mapping[Kind, int] = {"tests": 4, "check": 3, "build": 2, "typecheck": 1, "lint": 0}
"""Which of a command's checks speaks for it when all passed: the one whose pass says most
(:data:`memrl_mcp.memory.evidence.PROVES_SUCCESS`)."""
UNKNOWN_EXITS = frozenset({126, 127, 130, 137, 143})
"""Exit codes that say nothing of the code checked: the runner could not start (126, 127) or was killed (SIGINT,
SIGKILL, SIGTERM: by the user, the agent's time limit, the kernel's memory limit)."""


class CheckRun(TypedDict):
    """A recognised run of a check, with the fields of :class:`~memrl_mcp.validation.Check`."""

    kind: Kind
    command: str
    passed: bool
    passed_count: NotRequired[int]
    failed_count: NotRequired[int]


# ---------------------------------------------------------------------------------------------------------------------
# What a runner's output says


@functools.cache
def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.MULTILINE)


@dataclass(frozen=True)
class Summary:
    """How a runner's output tells its result: the ``lines`` that hold its counts, the count each holds (a pattern
    whose first group that matched is the number; without groups, each such line counts one), and the patterns that
    say outright it ``failed`` or ``succeeded``. The counts of all its lines add up (cargo prints one per test
    binary, Maven one per module)."""

    lines: str = ""
    passed: str = ""
    failed: str = ""
    errors: str = ""
    total: str = ""
    skipped: str = ""
    failure: str = ""
    success: str = ""


@dataclass(frozen=True)
class Reading:
    """What an output says of a run: passed or failed (None: it does not say), its counts where printed, and whether
    it says no test ran."""

    passed: bool | None = None
    passed_count: int | None = None
    failed_count: int | None = None
    ran_nothing: bool = False


NO_TESTS = re.compile(
    r"\bno tests ran\b|^No tests found|\[no test files\]|^No test files found|^NO TESTS RAN|^No tests were found"
    r"|^\s*0 passing\b|^Ran 0 tests\b",
    re.MULTILINE,
)
"""The runners' words for a run that ran no test: no evidence either way."""
COUNTS = ("passed", "failed", "errors", "total", "skipped")


def _count(pattern: str, line: str) -> int | None:
    found = _rx(pattern).search(line) if pattern else None
    if found is None:
        return None
    if not found.groups():
        return 1
    return next((int(group) for group in found.groups() if group is not None), None)


def read(output: str, summaries: Sequence[Summary]) -> Reading:
    """What ``output`` says through these runners' summaries (module docstring)."""
    totals: dict[str, int] = {}
    failed = succeeded = False
    for summary in summaries:
        for found in _rx(summary.lines).finditer(output) if summary.lines else ():
            end = output.find("\n", found.end())
            line = output[output.rfind("\n", 0, found.start()) + 1 : None if end < 0 else end]  # all of its line
            for name in COUNTS:
                value = _count(getattr(summary, name), line)
                if value is not None:
                    totals[name] = totals.get(name, 0) + value
        failed = failed or bool(summary.failure and _rx(summary.failure).search(output))
        succeeded = succeeded or bool(summary.success and _rx(summary.success).search(output))
    passed_count = totals.get("passed")
    if passed_count is None and "total" in totals:
        passed_count = max(0, totals["total"] - sum(totals.get(name, 0) for name in ("failed", "errors", "skipped")))
    failed_count = (
        None if totals.keys().isdisjoint({"failed", "errors"}) else totals.get("failed", 0) + totals.get("errors", 0)
    )
    if failed or (failed_count or 0) > 0:
        return Reading(False, passed_count, failed_count)
    if passed_count == 0:  # a test run that ran nothing, or skipped all
        return Reading(None, passed_count, failed_count, ran_nothing=True)
    if succeeded or passed_count is not None or failed_count is not None:
        return Reading(True, passed_count, failed_count)
    return Reading(ran_nothing=NO_TESTS.search(output) is not None)


# The runners' summaries, from their documented output formats and from real runs (tests/data/checks/).
PYTEST = Summary(
    lines=r"^=+ (?:\d+ \w+|no tests ran).* in [\d.]+s\b.*=+$|^(?:\d+ \w+(?:, \d+ \w+)*|no tests ran) in [\d.]+s\b.*$",
    passed=r"\b(\d+) passed",
    failed=r"\b(\d+) failed",
    errors=r"\b(\d+) errors?\b",
)
UNITTEST = Summary(  # also Django's `manage.py test`
    lines=r"^Ran \d+ tests? in |^FAILED \(.*\)$|^OK \(.*\)$",
    total=r"^Ran (\d+) test",
    failed=r"(?<!expected )failures=(\d+)",
    errors=r"errors=(\d+)",
    skipped=r"skipped=(\d+)",
    failure=r"^FAILED \(",
    success=r"^OK(?: \(.*\))?$",
)
JEST = Summary(lines=r"^Tests:\s+.*\btotal$", passed=r"(\d+) passed", failed=r"(\d+) failed")
VITEST = Summary(lines=r"^\s*Tests\s+\d+ .*\(\d+\)$", passed=r"(\d+) passed", failed=r"(\d+) failed")
MOCHA = Summary(lines=r"^\s*\d+ (?:passing|failing)\b", passed=r"(\d+) passing", failed=r"(\d+) failing")
NODE_TEST = Summary(lines=r"^(?:#|\u2139) (?:pass|fail) \d+$", passed=r"pass (\d+)", failed=r"fail (\d+)")
BUN_TEST = Summary(lines=r"^\s*\d+ (?:pass|fail)$", passed=r"(\d+) pass", failed=r"(\d+) fail")
DENO_TEST = Summary(lines=r"^(?:ok|FAILED) \| \d+ passed", passed=r"(\d+) passed", failed=r"(\d+) failed")
GO_TEST = Summary(  # counts: the tests `go test` names (every failure; passes only with -v)
    lines=r"^--- (?:PASS|FAIL): ",
    passed=r"^--- PASS",
    failed=r"^--- FAIL",
    failure=r"^FAIL\s+\S+\s+(?:[\d.]+s|\[build failed\]|\[setup failed\])$|^FAIL$|^panic: ",
    success=r"^ok\s+\S+\s+(?:[\d.]+s|\(cached\))",
)
CARGO_TEST = Summary(
    lines=r"^test result: (?:ok|FAILED)\. \d+ passed; \d+ failed",
    passed=r"(\d+) passed",
    failed=r"(\d+) failed",
    failure=r"^error(?:\[E\d+\])?: |^error: could not compile",
)
NEXTEST = Summary(lines=r"^\s*Summary \[.*\] \d+ tests? run: ", passed=r"(\d+) passed", failed=r"(\d+) failed")
CARGO_BUILD = Summary(
    lines=r"^error: could not compile .* due to \d+ previous errors?",
    failed=r"due to (\d+) previous",
    failure=r"^error(?:\[E\d+\])?: ",
    success=r"^\s*Finished\b",
)
MAVEN = Summary(
    lines=r"^(?:\[\w+\]\s+)?Tests run: \d+, Failures: \d+, Errors: \d+, Skipped: \d+\s*$",
    total=r"Tests run: (\d+)",
    failed=r"Failures: (\d+)",
    errors=r"Errors: (\d+)",
    skipped=r"Skipped: (\d+)",
    failure=r"^(?:\[\w+\]\s+)?BUILD FAILURE",
    success=r"^(?:\[\w+\]\s+)?BUILD SUCCESS",
)
GRADLE = Summary(
    lines=r"^\d+ tests? completed, \d+ failed",
    total=r"^(\d+) tests? completed",
    failed=r"(\d+) failed",
    skipped=r"(\d+) skipped",
    failure=r"^BUILD FAILED\b|^FAILURE: ",
    success=r"^BUILD SUCCESSFUL\b",
)
CTEST = Summary(
    lines=r"^\d+% tests passed, \d+ tests? failed out of \d+",
    total=r"out of (\d+)",
    failed=r"(\d+) tests? failed",
)
DOTNET_TEST = Summary(
    lines=r"^\s*(?:Passed!|Failed!)\s+-\s+Failed:\s+\d+|^Test summary: total: \d+",
    passed=r"(?:Passed|succeeded):\s+(\d+)",
    failed=r"(?:Failed|failed):\s+(\d+)",
)
DOTNET_BUILD = Summary(
    lines=r"^\s*\d+ Error\(s\)$", failed=r"(\d+) Error", failure=r"^Build FAILED\.", success=r"^Build succeeded\."
)
BAZEL = Summary(
    lines=r"^Executed \d+ out of \d+ tests?: ",
    passed=r"(\d+) tests? pass",
    failed=r"(\d+) (?:tests? )?fails?\b",
    failure=r"^FAILED: Build did NOT complete successfully|^ERROR: ",
    success=r"^INFO: Build completed successfully",
)
RSPEC = Summary(
    lines=r"^\d+ examples?, \d+ failures?",
    total=r"(\d+) examples?",
    failed=r"(\d+) failures?",
    skipped=r"(\d+) pending",
)
MINITEST = Summary(  # rake test, rails test
    lines=r"^\d+ (?:runs|tests), \d+ assertions, \d+ failures, \d+ errors, \d+ skips",
    total=r"(\d+) (?:runs|tests)",
    failed=r"(\d+) failures",
    errors=r"(\d+) errors",
    skipped=r"(\d+) skips",
)
PHPUNIT = Summary(
    lines=r"^OK \(\d+ tests?, \d+ assertions?\)|^Tests: \d+, Assertions: \d+",
    total=r"(?:OK \(|Tests: )(\d+)",
    failed=r"Failures: (\d+)",
    errors=r"Errors: (\d+)",
    skipped=r"Skipped: (\d+)",
    failure=r"^FAILURES!$|^ERRORS!$",
)
TOX = Summary(
    failure=r"evaluation failed :\(|^\s*\S+: FAIL code \d+|^ERROR:\s+\S+: commands failed",
    success=r"congratulations :\)",
)
NOX = Summary(failure=r"^nox > Session \S+ failed", success=r"^nox > Session \S+ was successful")
TSC = Summary(lines=r"^\S.*?(?:\(\d+,\d+\):|:\d+:\d+ -) error TS\d+: ", failed=r"^")  # one line per error
MYPY = Summary(
    lines=r"^Found \d+ errors? in \d+ files?",
    failed=r"^Found (\d+) error",
    failure=r"^\S+:\d+(?::\d+)?: error: ",
    success=r"^Success: no issues found",
)
PYRIGHT = Summary(lines=r"^\d+ errors?, \d+ warnings?, \d+ (?:informations?|notes?)", failed=r"^(\d+) error")
RUFF = Summary(
    lines=r"^Found \d+ errors?(?: \(\d+ fixed, \d+ remaining\))?\.$",
    failed=r"(\d+) remaining\)|^Found (\d+) errors?\.$",
    success=r"^All checks passed!$",
)
ESLINT = Summary(lines=r"^✖ \d+ problems? \(\d+ errors?, \d+ warnings?\)", failed=r"\((\d+) errors?")
FLAKE8 = Summary(lines=r"^[^:\s]+:\d+:\d+: [A-Z]+\d+ ", failed=r"^")
PYLINT = Summary(lines=r"^[^:\s]+:\d+:\d+: [CRWEFI]\d{4}: ", failed=r"^", success=r"rated at 10\.00/10")
RUBOCOP = Summary(lines=r"^\d+ files? inspected, (?:\d+|no) offenses? detected", failed=r"(\d+) offenses?")
GO_BUILD = Summary(failure=r"^# \S+$|^\S+\.go:\d+:\d+: ")
CMAKE_BUILD = Summary(success=r"^\[100%\] Built target ")

TEST_SUMMARIES: tuple[Summary, ...] = (PYTEST, UNITTEST, JEST, VITEST, MOCHA, NODE_TEST, BUN_TEST, DENO_TEST)
TEST_SUMMARIES += (GO_TEST, CARGO_TEST, NEXTEST, MAVEN, GRADLE, CTEST, DOTNET_TEST, BAZEL, RSPEC, MINITEST, PHPUNIT)
ANY = (*TEST_SUMMARIES, TOX, NOX, CARGO_BUILD, DOTNET_BUILD, TSC, MYPY, PYRIGHT, RUFF, ESLINT)
"""What a task runner's output may hold (``npm test`` runs jest or vitest, ``make check`` anything): every runner's
summary that cannot be mistaken for another's line."""


# ---------------------------------------------------------------------------------------------------------------------
# Which runner a command calls


@dataclass(frozen=True)
class Runner:
    """A check runner: the kind of check it runs and the summaries its output may hold."""

    kind: Kind
    summaries: tuple[Summary, ...]


def _r(kind: Kind, *summaries: Summary) -> Runner:
    return Runner(kind, summaries)


PROGRAMS: Mapping[tuple[str, ...], Runner] = {
    ("pytest",): _r("tests", PYTEST),
    ("py.test",): _r("tests", PYTEST),
    ("unittest",): _r("tests", UNITTEST),  # python -m unittest
    ("manage.py", "test"): _r("tests", UNITTEST),
    ("django", "test"): _r("tests", UNITTEST),  # python -m django test
    ("setup.py", "test"): _r("tests", PYTEST, UNITTEST),
    ("hatch", "test"): _r("tests", PYTEST),
    ("jest",): _r("tests", JEST),
    ("vitest",): _r("tests", VITEST),
    ("mocha",): _r("tests", MOCHA),
    ("node", "--test"): _r("tests", NODE_TEST),
    ("bun", "test"): _r("tests", BUN_TEST),
    ("deno", "test"): _r("tests", DENO_TEST),
    ("deno", "check"): _r("typecheck", TSC),
    ("deno", "lint"): _r("lint"),
    ("go", "test"): _r("tests", GO_TEST),
    ("go", "build"): _r("build", GO_BUILD),
    ("go", "vet"): _r("lint", GO_BUILD),
    ("cargo", "test"): _r("tests", CARGO_TEST),
    ("cargo", "t"): _r("tests", CARGO_TEST),
    ("cargo", "nextest"): _r("tests", NEXTEST),
    ("cargo", "build"): _r("build", CARGO_BUILD),
    ("cargo", "b"): _r("build", CARGO_BUILD),
    ("cargo", "check"): _r("typecheck", CARGO_BUILD),
    ("cargo", "c"): _r("typecheck", CARGO_BUILD),
    ("cargo", "clippy"): _r("lint", CARGO_BUILD),
    ("ctest",): _r("tests", CTEST),
    ("cmake", "--build"): _r("build", CMAKE_BUILD),
    ("dotnet", "test"): _r("tests", DOTNET_TEST, DOTNET_BUILD),
    ("dotnet", "build"): _r("build", DOTNET_BUILD),
    ("bazel", "test"): _r("tests", BAZEL),
    ("bazel", "build"): _r("build", BAZEL),
    ("bazelisk", "test"): _r("tests", BAZEL),
    ("bazelisk", "build"): _r("build", BAZEL),
    ("rspec",): _r("tests", RSPEC),
    ("rails", "test"): _r("tests", MINITEST),
    ("phpunit",): _r("tests", PHPUNIT),
    ("tsc",): _r("typecheck", TSC),
    ("vue-tsc",): _r("typecheck", TSC),
    ("mypy",): _r("typecheck", MYPY),
    ("dmypy", "run"): _r("typecheck", MYPY),
    ("pyright",): _r("typecheck", PYRIGHT),
    ("basedpyright",): _r("typecheck", PYRIGHT),
    ("ruff", "check"): _r("lint", RUFF),
    ("eslint",): _r("lint", ESLINT),
    ("flake8",): _r("lint", FLAKE8),
    ("pylint",): _r("lint", PYLINT),
    ("rubocop",): _r("lint", RUBOCOP),
}
"""The check runners called by name, with their subcommand where they have one (a flag: anywhere in the arguments)."""


@dataclass(frozen=True)
class Tasks:
    """A runner of a project's named tasks (npm's scripts, make's targets, Maven's goals), whose name says the kind
    (its own ``names``, else :func:`task_kind` where it may ``guess``, else ``unknown``). ``lead``: the words before
    a name (npm's ``run``; tox's ``-e``); ``direct``: the names that may follow the tool itself (npm's ``test``;
    None: any, ``make test``); ``bare``: the kind when no task is named (``make``)."""

    summaries: tuple[Summary, ...] = ANY
    lead: frozenset[str] = frozenset()
    direct: frozenset[str] | None = None
    bare: Kind | None = None
    unknown: Kind | None = None
    names: Mapping[str, Kind] = field(default_factory=dict)
    guess: bool = True


MAVEN_GOALS: Mapping[str, Kind] = {
    **dict.fromkeys(("test", "verify", "integration-test"), "tests"),
    **dict.fromkeys(("package", "install", "compile", "test-compile"), "build"),
}
SCRIPTS = frozenset({"run", "run-script"})
TASKS: Mapping[str, Tasks] = {
    "npm": Tasks(lead=SCRIPTS, direct=frozenset({"test", "t", "tst"})),
    "yarn": Tasks(lead=SCRIPTS),
    "pnpm": Tasks(lead=SCRIPTS),
    "bun": Tasks(lead=SCRIPTS, direct=frozenset()),
    "hatch": Tasks(lead=SCRIPTS, direct=frozenset()),
    "pdm": Tasks(lead=SCRIPTS, direct=frozenset()),
    "composer": Tasks(lead=SCRIPTS, direct=frozenset({"test"})),
    "make": Tasks(bare="build", names={"all": "build"}),
    "gmake": Tasks(bare="build", names={"all": "build"}),
    "just": Tasks(),
    "rake": Tasks(summaries=(MINITEST, RSPEC)),
    "gradle": Tasks(summaries=(GRADLE,), names={"assemble": "build"}),
    "gradlew": Tasks(summaries=(GRADLE,), names={"assemble": "build"}),
    "mvn": Tasks(summaries=(MAVEN,), names=MAVEN_GOALS, guess=False),  # checkstyle:check is no project check
    "mvnw": Tasks(summaries=(MAVEN,), names=MAVEN_GOALS, guess=False),
    "tox": Tasks(summaries=(TOX, *TEST_SUMMARIES), lead=frozenset({"-e"}), bare="tests", unknown="tests"),
    "nox": Tasks(summaries=(NOX, *TEST_SUMMARIES), lead=frozenset({"-s", "--session"}), bare="tests", unknown="tests"),
}
"""The task runners, by program."""
TASK_WORDS: Mapping[str, Kind] = {
    **dict.fromkeys(("test", "tests", "spec", "specs", "e2e", "unit", "integration", "pytest", "jest"), "tests"),
    **dict.fromkeys(("build", "compile", "dist"), "build"),
    **dict.fromkeys(("typecheck", "type", "types", "tsc", "mypy", "pyright"), "typecheck"),
    **dict.fromkeys(("lint", "eslint", "ruff", "flake8", "pylint", "stylelint"), "lint"),
    **dict.fromkeys(("check", "checks", "ci", "verify", "validate"), "check"),
}


def task_kind(name: str) -> Kind | None:
    """The kind of check a task named ``name`` is, by its first word (``test:unit``, ``test-fast``, ``type-check``,
    gradle's ``:app:test``); None for other tasks (``install``, ``start``, ``clean``)."""
    return TASK_WORDS.get(re.split(r"[:\-_./]", name.rsplit(":", 1)[-1], maxsplit=1)[0].lower())


def _task_names(tasks: Tasks, args: Sequence[str]) -> list[str]:
    """The tasks ``args`` name: the targets of ``make lint test``; the one script of ``npm run NAME`` or ``npm test``
    (none of ``npm ci``); the environments of ``tox -e a,b``."""
    if any(lead.startswith("-") for lead in tasks.lead):
        return [name for word, value in itertools.pairwise(args) if word in tasks.lead for name in value.split(",")]
    names: list[str] = []
    i = _skip_flags(args, 0)
    while i < len(args) and args[i] != "--":
        if args[i] in tasks.lead:
            return list(args[i + 1 : i + 2])
        if tasks.direct is not None and args[i] not in tasks.direct:
            break
        names.append(args[i])
        if tasks.lead:
            break  # a script runner runs one script; the words after it are the script's
        i = _skip_flags(args, i + 1)
    return names


TRANSPARENT = _words("env time nice nohup command exec builtin sudo timeout xvfb-run stdbuf unbuffer chronic")
"""Programs that only run the next one."""
LAUNCHERS: Mapping[str, frozenset[str]] = {
    **dict.fromkeys(("npx", "bunx", "pnpx", "uvx"), frozenset({""})),
    **dict.fromkeys(("uv", "poetry", "pipenv", "pdm", "rye", "hatch", "pixi", "conda", "mamba"), frozenset({"run"})),
    "bundle": frozenset({"exec"}),
    "npm": frozenset({"exec", "x"}),
    "pnpm": frozenset({"exec", "dlx", ""}),
    "yarn": frozenset({"exec", "dlx", ""}),
    "bun": frozenset({"x"}),
}
"""Programs that launch a runner named after one of these words (``""``: right after the launcher's options):
``uv run pytest``, ``npx jest``, ``yarn jest``. Followed by no runner, a launcher may run tasks (``hatch run test``)."""
VALUE_FLAGS = _words(
    "-C -f -j -p -n -u -w -x -l -o -W -X -e -s -P -T -pl -k --with --python --extra --package --group --directory"
    " --project --name --env --cwd --prefix --filter --workspace --manifest-path --file --signal --kill-after"
)
"""Flags whose value is the next word, among a launcher's or a runner's options before its runner or subcommand:
``npm --prefix web test``, ``timeout -s KILL 60 pytest``."""
NOT_RUNS = _words(
    "--version --help -h --collect-only --co --fixtures --markers --listTests --showConfig --print-config --dry-run"
    " --init"
)
"""Flags with which a runner checks nothing: it prints its version, its help, what it would run."""
PYTHONS = re.compile(r"^(?:python(?:\d+(?:\.\d+)?)?|pypy\d*|py)$")
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh"})
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
DURATION = re.compile(r"^\d+(?:\.\d+)?[smhd]?$")


def _name(word: str) -> str:
    return os.path.basename(word).removesuffix(".exe").removesuffix(".cmd")


def _skip_flags(words: Sequence[str], start: int) -> int:
    """The index of the first word from ``start`` that is no flag, flag's value, assignment, toolchain (cargo's
    ``+nightly``) or duration (``timeout 60``)."""
    i = start
    while i < len(words):
        word = words[i]
        if word == "--":
            return i + 1
        if word.startswith("-") and len(word) > 1:
            i += 2 if word in VALUE_FLAGS else 1
        elif ASSIGNMENT.match(word) or word.startswith("+") or (_name(words[0]) == "timeout" and DURATION.match(word)):
            i += 1
        else:
            return i
    return len(words)


def _known(word: str) -> bool:
    """Whether ``word`` names a program this module knows (a runner, a task runner, a shell, a python, a writer)."""
    name = _name(word)
    return any(name in known for known in (PROGRAM_NAMES, TASKS, SHELLS, WRITERS)) or PYTHONS.match(name) is not None


PROGRAM_NAMES = frozenset(key[0] for key in PROGRAMS)


def program(words: Sequence[str]) -> list[str]:
    """The words from the program that runs, past what only launches it (module docstring): ``CI=1 uv run python -m
    pytest -q`` is ``pytest -q``; ``python -c ...`` and ``command -v pytest`` run nothing: ``[]``."""
    words = list(words)
    while True:
        while words and ASSIGNMENT.match(words[0]):
            words = words[1:]
        if not words:
            return []
        name = _name(words[0])
        if name in TRANSPARENT:
            if name == "command" and words[1:2] in (["-v"], ["-V"]):
                return []
            words = words[_skip_flags(words, 1) :]
        elif PYTHONS.match(name):
            i = 1
            while i < len(words) and words[i].startswith("-") and words[i] not in ("-m", "-c"):
                i += 2 if words[i] in ("-W", "-X") else 1
            if i >= len(words) or words[i] == "-c":
                return []
            words = words[i + 1 :] if words[i] == "-m" else [_name(words[i]), *words[i + 1 :]]
        elif name in LAUNCHERS:
            i = _skip_flags(words, 1)
            after = _skip_flags(words, i + 1) if i < len(words) and words[i] in LAUNCHERS[name] else len(words)
            if "" in LAUNCHERS[name] and i < len(words) and (LAUNCHERS[name] == {""} or _known(words[i])):
                words = words[i:]  # npx anything; yarn jest (yarn test runs a script)
            elif after < len(words) and _known(words[after]):
                words = words[after:]
            else:
                return [name, *words[1:]]
        else:
            return [name, *words[1:]]


def runner(words: Sequence[str], own: Sequence[str] = ()) -> Runner | None:
    """The check runner a simple command calls; None: no check. ``own``: a project's own check commands."""
    words = program(words)
    if not words or not NOT_RUNS.isdisjoint(words[1 : words.index("--") if "--" in words else None]):
        return None
    if any(_starts(words, mine) for mine in own):
        return Runner("check", ANY)
    name, args = words[0], words[1:]
    first = _skip_flags(args, 0)
    keys = [(name, args[first])] if first < len(args) else []
    for key in (*keys, *((name, flag) for flag in args if flag.startswith("--")), (name,)):
        if key in PROGRAMS:
            return PROGRAMS[key]
    tasks = TASKS.get(name)
    if tasks is None:
        return None
    names = _task_names(tasks, args)
    bare = [] if names else [tasks.bare]
    named = (tasks.names.get(task.rsplit(":", 1)[-1]) or (task_kind(task) if tasks.guess else None) for task in names)
    kinds = [kind for kind in (*(kind or tasks.unknown for kind in named), *bare) if kind is not None]
    return Runner(max(kinds, key=RANK.__getitem__), tasks.summaries) if kinds else None


def _starts(words: Sequence[str], prefix: str) -> bool:
    try:
        mine = program(shlex.split(prefix))
    except ValueError:
        return False
    return bool(mine) and list(words[: len(mine)]) == mine


# ---------------------------------------------------------------------------------------------------------------------
# A command line's simple commands


@dataclass(frozen=True)
class Step:
    """One simple command of a command line, the operators around it (``&&``, ``||``, ``;``, ``|``, ``&``; ``""``:
    the line's start or end) and its redirections (operator, target)."""

    words: tuple[str, ...]
    before: str = ""
    after: str = ""
    redirects: tuple[tuple[str, str], ...] = ()


PUNCTUATION = frozenset(";&|()<>\n")
OPERATORS = re.compile(r"&&|\|\||;;|\|&|&>>|&>|>>|>&|>\||<<<|<<-|<<|<&|<>|[;&|()<>\n]")
REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", ">&", "<", "<<", "<<-", "<<<", "<&", "<>"})
HEREDOC = re.compile(
    r"(?<!<)<<-?[ \t]*(['\"]?)([A-Za-z_][\w-]*)\1([^\n]*)\n(?:(?:.*?\n)?[ \t]*\2[ \t]*(?=\n|\Z)|.*\Z)", re.DOTALL
)


def steps(command: str, depth: int = 0) -> list[Step]:
    """The simple commands of ``command`` in order; ``sh -c '...'`` stands for the commands of its string, and a
    here-document's body for nothing. A line the shell's quoting cannot split runs nothing known: ``[]``."""
    text = HEREDOC.sub(lambda m: f"<< {m.group(2)}{m.group(3)}", command.replace("\\\n", " "))
    lexer = shlex.shlex(text, posix=True, punctuation_chars="".join(sorted(PUNCTUATION)))
    lexer.whitespace, lexer.whitespace_split, lexer.commenters = " \t\r", True, ""
    try:
        tokens = iter(list(lexer))
    except ValueError:
        return []
    line: list[Step] = []
    words: list[str] = []
    redirects: list[tuple[str, str]] = []
    before = ""
    for token in tokens:
        if not set(token) <= PUNCTUATION:
            if not token.startswith("#"):
                words.append(token)
                continue
            token = next((rest for rest in tokens if "\n" in rest and set(rest) <= PUNCTUATION), "\n")  # a comment
        for operator in OPERATORS.findall(token):
            if operator in REDIRECTS:
                if words and words[-1].isdigit():
                    words.pop()  # the 2 of 2>&1
                redirects.append((operator, next(tokens, "")))
            elif operator not in "()" and (words or redirects):
                joint = ";" if operator == "\n" else operator
                line.append(Step(tuple(words), before, joint, tuple(redirects)))
                words, redirects, before = [], [], joint
    if words or redirects:
        line.append(Step(tuple(words), before, "", tuple(redirects)))
    elif line and line[-1].after == ";":
        line[-1] = Step(line[-1].words, line[-1].before, "", line[-1].redirects)
    return _unwrap(line, depth)


def _unwrap(line: list[Step], depth: int) -> list[Step]:
    """``bash -lc 'cd app && npm test'`` as the commands of its string, between the outer line's operators."""
    if depth >= 3:
        return line
    spliced: list[Step] = []
    for step in line:
        words = program(step.words)
        flag = next((i for i, word in enumerate(words[1:], 1) if re.fullmatch(r"-[a-z]*c[a-z]*", word)), None)
        inner = (
            steps(words[flag + 1], depth + 1)
            if words[:1] and words[0] in SHELLS and flag and flag + 1 < len(words)
            else []
        )
        if inner:
            inner[0] = Step(inner[0].words, step.before, inner[0].after, inner[0].redirects)
            inner[-1] = Step(inner[-1].words, inner[-1].before, step.after, inner[-1].redirects + step.redirects)
        spliced.extend(inner or [step])
    return spliced


HARMLESS = _words(
    ". : cd pushd popd export source set unset echo printf true sleep clear ulimit umask alias shopt hash pwd date"
)
"""Steps that cannot be why a line failed: a failing line of these and one check is the check's failure."""


def _harmless(step: Step) -> bool:
    words = program(step.words)
    return not words or words[0] in HARMLESS


def _bound(line: Sequence[Step], index: int) -> bool:
    """Whether the status of step ``index`` is the line's exit code when it fails, and a success of the line its
    success: it is not run only after another failed (``||``), and after it come ``&&`` steps only (no pipe, no
    ``;``, no ``||``, no ``&``)."""
    return line[index].before != "||" and all(step.after in ("&&", "") for step in line[index:])


# ---------------------------------------------------------------------------------------------------------------------
# The verdict


ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def recognise(command: str, output: str, exit_code: int | None, own: Sequence[str] = ()) -> CheckRun | None:
    """The check ``command`` ran and how it went, from its ``output`` and ``exit_code`` (None: the agent gives none);
    ``own``: a project's own check commands (prefixes), of kind ``check``. None when it ran no check or its outcome
    cannot be known (module docstring). Of a line of several checks, the first that failed, else the one whose pass
    says most (:data:`RANK`)."""
    line = steps(command)
    checks = {i: found for i, step in enumerate(line) if (found := runner(step.words, own)) is not None}
    if not checks:
        return None
    text = ANSI.sub("", output[-OUTPUT_TAIL:])
    readings = {i: read(text, found.summaries) for i, found in checks.items()}

    def run(i: int, passed: bool) -> CheckRun:
        found: CheckRun = {"kind": checks[i].kind, "command": head(line, i), "passed": passed}
        if (passed_count := readings[i].passed_count) is not None:
            found["passed_count"] = passed_count
        if (failed_count := readings[i].failed_count) is not None:
            found["failed_count"] = failed_count
        return found

    failing = [i for i in checks if readings[i].passed is False]
    if failing:
        return run(failing[0], False)
    passing = [i for i in checks if readings[i].passed]
    if exit_code is not None and exit_code not in UNKNOWN_EXITS:
        bound = [i for i in checks if _bound(line, i) and not readings[i].ran_nothing]
        if exit_code == 0:
            passing = sorted({*passing, *bound})
        else:
            unsaid = [i for i in bound if not readings[i].passed]
            others = [step for i, step in enumerate(line) if i not in checks and not _harmless(step)]
            if len(unsaid) == 1 and not others:  # nothing else in the line can have failed it
                return run(unsaid[0], False)
    return run(max(passing, key=lambda i: (RANK[checks[i].kind], i)), True) if passing else None


def head(line: Sequence[Step], index: int) -> str:
    """What identifies the check of step ``index``: its words without env assignments and what only runs it
    (``time``, ``timeout 60``), after the folder a ``cd`` before it went to, without secrets (:func:`redacted`), at
    most :data:`COMMAND_CHARS` long."""
    words = list(line[index].words)
    while words and (ASSIGNMENT.match(words[0]) or _name(words[0]) in TRANSPARENT):
        words = words[1:] if ASSIGNMENT.match(words[0]) else words[_skip_flags(words, 1) :]
    text = shlex.join(redacted(words))
    folder = next((step.words[1] for step in reversed(line[:index]) if step.words[:1] == ("cd",)), None)
    return (text if folder is None else f"cd {shlex.quote(redacted([folder])[0])} && {text}")[:COMMAND_CHARS]


SECRET_NAME = (
    r"(?:token|secret|passw(?:or)?d|pwd|api[-_]?key|apikey|auth\w*|credential\w*|cookie|session"
    r"|private[-_]?key|login|key)"
)
SECRET_FLAG = re.compile(rf"(?i)^(--?[\w.-]*{SECRET_NAME}[\w.-]*|-D[\w.-]*{SECRET_NAME}[\w.-]*)(=.*)?$")
SECRET_SHAPES = (
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@"), r"\1REDACTED@"),  # https://user:token@host
    (re.compile(rf"(?i)([?&][\w.-]*{SECRET_NAME}[\w.-]*=)[^&#\s]+"), r"\1REDACTED"),  # ?access_token=...
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+|=|:\s*)\S+"), r"\1\2REDACTED"),
    (re.compile(r"\b(?:gh[pousr]_|github_pat_|glpat-|xox[abprs]-|sk-|AKIA|AIza|npm_)[A-Za-z0-9_\-]{8,}"), "REDACTED"),
    (re.compile(r"(?<![\w/.-])(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{32,}(?![\w/.-])"), "REDACTED"),
)
"""What a secret in a word looks like: a URL's user and password, a secret-named query parameter, a bearer token,
the prefixes of known tokens, a long random string (replacement of each)."""


def redacted(words: Sequence[str]) -> list[str]:
    """``words`` with every value that may be a secret replaced by ``REDACTED``: a secret-named flag's value (``--token
    X``, ``--api-key=X``, ``-Dsonar.login=X``) and :data:`SECRET_SHAPES`."""
    out: list[str] = []
    hide = False
    for word in words:
        flag = SECRET_FLAG.match(word)
        if hide:
            word = "REDACTED"
        elif flag and flag.group(2):
            word = f"{flag.group(1)}=REDACTED"
        for shape, replacement in SECRET_SHAPES:
            word = shape.sub(replacement, word)
        out.append(word)
        hide = bool(flag and not flag.group(2) and not hide and not word.startswith("-D"))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Edits


EDIT_TOOLS = (
    _words("Edit Write MultiEdit NotebookEdit")  # Claude Code, and Copilot CLI's Claude-format hooks
    | _words("apply_patch")  # Codex (its hooks name every patch so; Write and Edit alias it for matchers only), Copilot
    | _words("write_file replace")  # Gemini CLI
    | _words("edit create str_replace")  # Copilot CLI
)
"""The agents' file-editing tools, as their hooks name them."""
SHELL_TOOLS = frozenset({"Bash", "bash", "run_shell_command", "shell", "exec_command", "local_shell"})
"""The agents' shell tools, as their hooks name them (Codex's ``exec_command`` reaches its hooks as ``Bash``)."""


def shell_command(tool_name: str, tool_input: Mapping[str, Any]) -> str | None:
    """The command line of a shell tool's call (``command``, or Codex's ``cmd``); None for any other tool."""
    command = tool_input.get("command", tool_input.get("cmd")) if tool_name in SHELL_TOOLS else None
    if isinstance(command, list) and all(isinstance(word, str) for word in command):
        return shlex.join(command)
    return command if isinstance(command, str) else None


def is_edit(tool_name: str, tool_input: Mapping[str, Any]) -> bool:
    """Whether this tool call changed the project's files: an agent's editing tool (:data:`EDIT_TOOLS`; Copilot
    CLI's ``str_replace_editor`` but to view), or a shell command that obviously edits (:func:`edits`)."""
    if tool_name in EDIT_TOOLS:
        return True
    if tool_name == "str_replace_editor":
        return tool_input.get("command") != "view"
    command = shell_command(tool_name, tool_input)
    return command is not None and edits(command)


def _without(*flags: str) -> Callable[[Sequence[str]], bool]:
    return lambda args: set(flags).isdisjoint(args)


def _with(*flags: str) -> Callable[[Sequence[str]], bool]:
    return lambda args: not set(flags).isdisjoint(args)


def _sub(*subcommands: str, unless: str = "") -> Callable[[Sequence[str]], bool]:
    return lambda args: args[_skip_flags(args, 0) :][:1] in [[sub] for sub in subcommands] and unless not in args


WRITERS: Mapping[str, Callable[[Sequence[str]], bool]] = {
    "sed": lambda args: any(re.fullmatch(r"-[a-zA-Z]*i.*|--in-place(?:=.*)?", word) for word in args),
    "perl": lambda args: any(re.fullmatch(r"-[a-zA-Z]*i.*", word) for word in args),
    "tee": lambda args: any(_into_project(word) for word in args if not word.startswith("-")),
    **dict.fromkeys(("apply_patch", "applypatch", "patch", "mv", "cp", "rm", "truncate"), lambda args: True),
    "git": _sub(*_words("apply am checkout restore reset stash revert cherry-pick merge rebase pull switch")),
    **dict.fromkeys(("black", "isort", "rustfmt"), _without("--check", "--diff", "--check-only")),
    "ruff": lambda args: "--fix" in args or (_sub("format")(args) and _without("--check", "--diff")(args)),
    "prettier": _with("--write", "-w"),
    "eslint": _with("--fix"),
    **dict.fromkeys(("gofmt", "goimports"), _with("-w")),
    "go": _sub("fmt", "generate", "get"),
    "cargo": _sub("fmt", "fix", "add", "remove", unless="--check"),
    "clang-format": _with("-i"),
    "autopep8": _with("-i", "--in-place"),
    "rubocop": _with("-a", "-A", "--autocorrect", "--autocorrect-all"),
    "dotnet": _sub("format", unless="--verify-no-changes"),
}
"""The programs that change files, and when (``sed -i``, ``black`` but ``--check``, ``git checkout``)."""
FORMAT_TASKS = re.compile(r"^(?:format|fmt|fix|autofix)(?:$|[:\-_])")


def edits(command: str) -> bool:
    """Whether a shell ``command`` obviously changes the project's files: a program of :data:`WRITERS` as it writes,
    a formatting task (``npm run format``, ``make fmt``), output redirected into a file of the project (a here
    document's ``cat > app.py``). Not seen: a script or an inline program that writes (``python -c``, ``node -e``), a
    build's generated files, an install."""
    for step in steps(command):
        if any(op in (">", ">>", ">|", "&>", "&>>") and _into_project(target) for op, target in step.redirects):
            return True
        words = program(step.words)
        writer = WRITERS.get(words[0]) if words else None
        if writer is not None and writer(words[1:]):
            return True
        tasks = TASKS.get(words[0]) if words else None
        if tasks is not None and any(FORMAT_TASKS.match(name) for name in _task_names(tasks, words[1:])):
            return True
    return False


def _into_project(target: str) -> bool:
    """Whether writing to ``target`` changes the project: not a device, a temporary file, a descriptor, a log
    (``.log``, ``.out``, ``.txt``: where a check's output is kept, ``pytest | tee out.txt``)."""
    return bool(target) and not (
        target.isdigit()
        or target == "-"
        or target.startswith(("/dev/", "/tmp/", "&", "$"))
        or target.endswith((".log", ".out", ".txt"))
    )


# ---------------------------------------------------------------------------------------------------------------------
# The exit code an agent writes into its shell tool's result


COPILOT_EXIT = re.compile(r"^<(?:detached command with )?shellId: [^\r\n]+ completed with exit code (-?\d+)>[ \t]*$")
COPILOT_NOTES = (
    "<sandbox is active ",
    "<this failure may be caused by the active sandbox policy.",
    "<This command was retried outside the Copilot sandbox",
)
GEMINI_RESULT = re.compile(
    r"\AOutput: (?P<output>.*?)(?:\nError: [^\n]*)?(?:\nExit Code: (?P<code>-?\d+))?(?:\nSignal: (?P<signal>[^\n]*))?"
    r"(?:\nBackground PIDs: [^\n]*)?(?:\nProcess Group PGID: \d+)?\s*\Z",
    re.DOTALL,
)
UNTRUSTED = re.compile(r"\A<untrusted_context>\n(.*)\n</untrusted_context>\Z", re.DOTALL)
Agent = Literal["claude-code", "codex", "gemini", "copilot"]


def stated_exit(agent: Agent, text: str) -> tuple[str, int | None]:
    """The output and exit code an agent's shell tool result states, as each writes it: Claude Code's failure
    (``PostToolUseFailure``'s ``error``: ``Exit code 3``, then the output; a success fires ``PostToolUse``: exit 0),
    Gemini CLI's ``llmContent`` (``Output: ...``, then ``Exit Code: 3`` only when not 0, ...), Copilot CLI's last
    line (``<shellId: 0 completed with exit code 3>``). Codex states none, and a text not in its agent's form says
    nothing: ``(text, None)``."""
    if agent == "claude-code":
        found = re.match(r"\AExit code (-?\d+)(?:\n|\Z)", text)
        return (text[found.end() :], int(found.group(1))) if found else (text, None)
    if agent == "gemini":
        inner = UNTRUSTED.match(text)
        result = GEMINI_RESULT.match(inner.group(1) if inner else text)
        if result is None or result.group("signal"):
            return text, None
        output = "" if result.group("output") == "(empty)" else result.group("output")
        return output, int(result.group("code") or 0)
    if agent == "copilot":
        lines = text.replace("\r\n", "\n").split("\n")
        last = max((i for i, line in enumerate(lines) if line and not line.startswith(COPILOT_NOTES)), default=None)
        found = COPILOT_EXIT.match(lines[last]) if last is not None else None
        return ("\n".join(lines[:last]), int(found.group(1))) if found and last is not None else (text, None)
    return text, None
