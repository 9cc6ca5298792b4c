"""What the hooks read of a shell command as evidence (memrl_mcp/clients/checks.py): real outputs of real runners
recorded here (tests/data/check_outputs.json, tests/support/check_outputs.py), the runners' documented formats where
a runner is not installed, the command forms agents run, the tool events four agent CLIs sent their hooks
(tests/data/agent_tool_events.json), the edits, and the secrets a command may carry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memrl_mcp.clients.checks import (
    COMMAND_CHARS,
    PROGRAMS,
    TASKS,
    Agent,
    CheckRun,
    edits,
    is_edit,
    program,
    recognise,
    runner,
    shell_command,
    stated_exit,
)
from memrl_mcp.validation import MAX_CHECK_TEXT, Check
from tests.support.check_outputs import recorded

EVENTS = json.loads((Path(__file__).parent / "data" / "agent_tool_events.json").read_text())
RUNS = recorded()


def checked(found: CheckRun | None) -> CheckRun | None:
    """What recognise found, as the memory's Check takes it (a real Check is built: the fields are its fields)."""
    if found is not None:
        Check(**found)
    return found


# name: what the recorded run is, with its exit code (an agent that gives one) and without (Codex)
RECORDED = {
    "pytest-pass": ({"kind": "tests", "passed": True, "passed_count": 3}, "same"),
    "pytest-fail": ({"kind": "tests", "passed": False, "passed_count": 4, "failed_count": 2}, "same"),
    "pytest-quiet-fail": ({"kind": "tests", "passed": False, "passed_count": 4, "failed_count": 2}, "same"),
    "pytest-no-tests": (None, None),  # exit 5: no evidence either way
    "pytest-collect-error": ({"kind": "tests", "passed": False, "failed_count": 1}, "same"),
    "unittest-pass": ({"kind": "tests", "passed": True, "passed_count": 1}, "same"),  # 2 ran, 1 skipped
    "unittest-fail": ({"kind": "tests", "passed": False, "passed_count": 1, "failed_count": 2}, "same"),
    "mypy-pass": ({"kind": "typecheck", "passed": True}, "same"),
    "mypy-fail": ({"kind": "typecheck", "passed": False, "failed_count": 2}, "same"),
    "ruff-pass": ({"kind": "lint", "passed": True}, "same"),
    "ruff-fail": ({"kind": "lint", "passed": False, "failed_count": 4}, "same"),
    "ruff-fix": ({"kind": "lint", "passed": False, "failed_count": 2}, "same"),  # 4 found, 2 fixed, 2 remaining
    "flake8-fail": ({"kind": "lint", "passed": False, "failed_count": 5}, "same"),
    "pylint-fail": ({"kind": "lint", "passed": False, "failed_count": 6}, "same"),
    "tox-fail": ({"kind": "tests", "passed": False, "passed_count": 4, "failed_count": 2}, "same"),
    "tox-pass": ({"kind": "tests", "passed": True, "passed_count": 3}, "same"),
    "nox-fail": ({"kind": "tests", "passed": False, "passed_count": 4, "failed_count": 2}, "same"),
    "make-test-fail": ({"kind": "tests", "passed": False, "passed_count": 4, "failed_count": 2}, "same"),
    "make-build-fail": ({"kind": "build", "passed": False}, "same"),  # gcc's `file:1:25: error:` line
    "tsc-pass": ({"kind": "typecheck", "passed": True}, None),  # silent on success: only its exit code speaks
    "tsc-fail": ({"kind": "typecheck", "passed": False, "failed_count": 2}, "same"),
    "jest-pass": ({"kind": "tests", "passed": True, "passed_count": 1}, "same"),
    "jest-fail": ({"kind": "tests", "passed": False, "passed_count": 1, "failed_count": 1}, "same"),
    "npm-test-fail": ({"kind": "tests", "passed": False, "passed_count": 1, "failed_count": 1}, "same"),  # jest's
    "vitest-pass": ({"kind": "tests", "passed": True, "passed_count": 1}, "same"),
    "vitest-fail": ({"kind": "tests", "passed": False, "passed_count": 1, "failed_count": 1}, "same"),
    "mocha-pass": ({"kind": "tests", "passed": True, "passed_count": 1}, "same"),
    "mocha-fail": ({"kind": "tests", "passed": False, "passed_count": 1, "failed_count": 1}, "same"),
    "node-test-pass": ({"kind": "tests", "passed": True, "passed_count": 1, "failed_count": 0}, "same"),
    "node-test-fail": ({"kind": "tests", "passed": False, "passed_count": 1, "failed_count": 1}, "same"),
    "eslint-pass": ({"kind": "lint", "passed": True}, None),  # silent on success
    "eslint-fail": ({"kind": "lint", "passed": False, "failed_count": 3}, "same"),  # 2 errors... and a warning's rule
    "cargo-test-fail": ({"kind": "tests", "passed": False, "passed_count": 1, "failed_count": 1}, "same"),
    "cargo-test-pass": ({"kind": "tests", "passed": True, "passed_count": 2, "failed_count": 0}, "same"),
    "cargo-build-fail": ({"kind": "build", "passed": False, "failed_count": 2}, "same"),
    "cargo-build-pass": ({"kind": "build", "passed": True}, "same"),
    "cargo-check-fail": ({"kind": "typecheck", "passed": False, "failed_count": 2}, "same"),
    "cargo-clippy-warn": ({"kind": "lint", "passed": True}, "same"),  # warnings only: exit 0
    "cargo-clippy-deny": ({"kind": "lint", "passed": False, "failed_count": 1}, "same"),
    "ctest-fail": ({"kind": "tests", "passed": False, "passed_count": 1, "failed_count": 1}, "same"),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_recorded_run_of_a_real_runner_is_read_with_and_without_its_exit_code(name: str) -> None:
    """Each recorded run (command, exit code, output of the real runner): with its exit code (Claude Code, Gemini
    CLI, Copilot CLI) and without (Codex: the runner's summary alone)."""
    run = RUNS[name]
    expected, without = RECORDED[name]
    found = checked(recognise(run.command, run.output, run.exit_code))
    assert found == (None if expected is None else {**expected, "command": run.command}), run.output[-600:]
    blind = checked(recognise(run.command, run.output, None))
    assert blind == (found if without == "same" else without), run.output[-600:]


def test_every_recorded_run_is_tested() -> None:
    assert sorted(RUNS) == sorted(RECORDED)


# Documented output formats of runners not installed here (go, Maven, Gradle, dotnet, Ruby, PHP, Deno, Bun, Bazel,
# nextest, pyright) and of older versions (tsc 5's pretty lines): each from the runner's documentation and typical
# output, not from a run on this machine.
def row(command: str, output: str, exit_code: int | None, kind: str | None = None, passed: bool = True, **counts: int):
    """A case: the command, its output and exit code, and the check expected (kind None: none)."""
    return command, output, exit_code, None if kind is None else {"kind": kind, "passed": passed, **counts}


GO_FAIL = "--- FAIL: TestAdd (0.00s)\n    calc_test.go:9: got 4, want 5\nFAIL\nFAIL\texample.com/calc\t0.002s\nFAIL\n"
GO_VERBOSE = (
    "=== RUN   TestAdd\n--- PASS: TestAdd (0.00s)\n--- PASS: TestSub (0.00s)\nPASS\nok  \texample.com/calc\t0.002s\n"
)
SUREFIRE_FAIL = (
    "[ERROR] Tests run: 2, Failures: 1, Errors: 0, Skipped: 0, Time elapsed: 0.05 s <<< FAILURE! -- in p.CalcTest\n"
    "[ERROR] p.CalcTest.wrong -- Time elapsed: 0.01 s <<< FAILURE!\n[ERROR] Failures: \n"
    "[ERROR]   CalcTest.wrong:7 expected:<5> but was:<4>\n[ERROR] Tests run: 2, Failures: 1, Errors: 0, Skipped: 0\n"
)
SUREFIRE_PASS = (
    "[INFO] Tests run: 5, Failures: 0, Errors: 0, Skipped: 1, Time elapsed: 0.1 s -- in p.A\n[INFO] Results:\n"
    "[INFO] \n[INFO] Tests run: 5, Failures: 0, Errors: 0, Skipped: 1\n[INFO] \n[INFO] BUILD SUCCESS\n"
)
GRADLE_FAIL = (
    "CalcTest > wrong() FAILED\n\n5 tests completed, 2 failed\n\nFAILURE: Build failed.\n\nBUILD FAILED in 3s\n"
)
DOTNET_FAIL = (
    "Failed!  - Failed:     1, Passed:    11, Skipped:     0, Total:    12, Duration: 1 s - Calc.dll (net8.0)\n"
)
CARGO_TWO = "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n" * 2
DOCUMENTED = [
    row("go test ./...", "ok  \texample.com/calc\t0.003s\nok  \texample.com/calc/util\t(cached)\n", 0, "tests"),
    row("go test ./...", GO_FAIL, None, "tests", False, failed_count=1),
    row("go test -v ./...", GO_VERBOSE, None, "tests", passed_count=2),
    row("go test ./...", "?   \texample.com/calc\t[no test files]\n", 0),
    row("go build ./...", "# example.com/calc\n./calc.go:4:9: cannot use s as int value\n", 1, "build", False),
    row("go vet ./...", "# example.com/calc\n./calc.go:7:2: fmt.Printf format %d has arg s\n", None, "lint", False),
    row("mvn -q test", SUREFIRE_FAIL, 1, "tests", False, passed_count=1, failed_count=1),
    row("./mvnw verify", SUREFIRE_PASS, None, "tests", passed_count=4, failed_count=0),
    row("mvn clean package -DskipTests", "[INFO] BUILD SUCCESS\n", None, "build"),
    row("./gradlew test", GRADLE_FAIL, 1, "tests", False, passed_count=3, failed_count=2),
    row("gradle build", "BUILD SUCCESSFUL in 7s\n5 actionable tasks: 5 executed\n", None, "build"),
    row("dotnet test", DOTNET_FAIL, 1, "tests", False, passed_count=11, failed_count=1),
    row(
        "dotnet test",
        "Test summary: total: 13, failed: 0, succeeded: 13, skipped: 0, duration: 1.2s\n",
        None,
        "tests",
        passed_count=13,
        failed_count=0,
    ),
    row("dotnet build", "Build FAILED.\n\n    0 Warning(s)\n    2 Error(s)\n", 1, "build", False, failed_count=2),
    row(
        "bundle exec rspec",
        "...F\n\n4 examples, 1 failure, 1 pending\n",
        1,
        "tests",
        False,
        passed_count=2,
        failed_count=1,
    ),
    row(
        "bundle exec rake test",
        "13 runs, 20 assertions, 1 failures, 0 errors, 2 skips\n",
        1,
        "tests",
        False,
        passed_count=10,
        failed_count=1,
    ),
    row(
        "bin/rails test",
        "4 runs, 6 assertions, 0 failures, 0 errors, 0 skips\n",
        None,
        "tests",
        passed_count=4,
        failed_count=0,
    ),
    row(
        "vendor/bin/phpunit",
        "FAILURES!\nTests: 13, Assertions: 20, Failures: 1, Errors: 1.\n",
        1,
        "tests",
        False,
        passed_count=11,
        failed_count=2,
    ),
    row("composer test", "OK (5 tests, 9 assertions)\n", None, "tests", passed_count=5),
    row("deno test", "ok | 12 passed | 0 failed (30ms)\n", None, "tests", passed_count=12, failed_count=0),
    row("deno test", "FAILED | 1 passed | 1 failed (20ms)\n", 1, "tests", False, passed_count=1, failed_count=1),
    row(
        "bun test",
        " 12 pass\n 1 fail\nRan 13 tests across 2 files. [20.00ms]\n",
        None,
        "tests",
        False,
        passed_count=12,
        failed_count=1,
    ),
    row(
        "bazel test //...",
        "Executed 3 out of 3 tests: 2 tests pass and 1 fails locally.\n",
        3,
        "tests",
        False,
        passed_count=2,
        failed_count=1,
    ),
    row("bazel build //app", "INFO: Build completed successfully, 4 total actions\n", None, "build"),
    row("bazelisk test //...", "Executed 1 out of 1 test: 1 test passes.\n", None, "tests", passed_count=1),
    row("bazelisk build //...", "FAILED: Build did NOT complete successfully\n", None, "build", False),
    row(
        "cargo nextest run",
        "     Summary [   0.011s] 12 tests run: 11 passed, 1 failed, 0 skipped\n",
        100,
        "tests",
        False,
        passed_count=11,
        failed_count=1,
    ),
    row("cargo t", CARGO_TWO, None, "tests", passed_count=6, failed_count=0),  # the unit tests' and the doc tests'
    row("cargo b", "    Finished `dev` profile [unoptimized + debuginfo] target(s) in 0.31s\n", None, "build"),
    row("cargo c", "error[E0308]: mismatched types\n", None, "typecheck", False),
    row("cargo test", "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured\n", 0),
    row(
        "pyright",
        "/p/a.py:1:5 - error: Type is not assignable\n1 error, 0 warnings, 0 informations \n",
        1,
        "typecheck",
        False,
        failed_count=1,
    ),
    row("npx pyright", "0 errors, 0 warnings, 0 informations \n", None, "typecheck", failed_count=0),
    row("basedpyright", "2 errors, 0 warnings, 0 notes\n", None, "typecheck", False, failed_count=2),
    row(
        "npx tsc -p .",
        "src/a.ts:1:7 - error TS2322: Type 'string' is not assignable to type 'number'.\n\n"
        "Found 1 error in src/a.ts:1\n",
        None,
        "typecheck",
        False,
        failed_count=1,
    ),
    row("vue-tsc --noEmit", "", 0, "typecheck"),
    row("deno check main.ts", "", 0, "typecheck"),
    row("deno lint", "", 1, "lint", False),
    row("dmypy run -- src", "Success: no issues found in 3 source files\n", None, "typecheck"),
    row("rubocop", "3 files inspected, 2 offenses detected\n", 1, "lint", False, failed_count=2),
    row(
        "npx eslint .",
        "/p/a.js\n  1:7  warning  'x' is never used  no-unused-vars\n\n✖ 1 problem (0 errors, 1 warning)\n",
        0,
        "lint",
        failed_count=0,
    ),
    row("python manage.py test", "Ran 4 tests in 0.020s\n\nOK\n", 0, "tests", passed_count=4),
    row(
        "python -m django test",
        "Ran 4 tests in 0.020s\n\nFAILED (failures=1)\n",
        None,
        "tests",
        False,
        passed_count=3,
        failed_count=1,
    ),
    row("python setup.py test", "Ran 2 tests in 0.001s\n\nOK\n", None, "tests", passed_count=2),
    row("hatch test", "3 passed in 0.05s\n", None, "tests", passed_count=3),
    row("py.test", "1 failed in 0.05s\n", None, "tests", False, failed_count=1),
    row("cmake --build build", "[100%] Built target calc\n", None, "build"),
    row("npx jest", "No tests found, exiting with code 1\n", 1),
]


@pytest.mark.parametrize(("command", "output", "exit_code", "expected"), DOCUMENTED)
def test_a_runner_not_installed_is_read_from_its_documented_format(
    command: str, output: str, exit_code: int | None, expected: dict[str, Any] | None
) -> None:
    """These runners are not installed here (Maven is, but its plugins cannot be fetched offline): each output is
    the runner's documented format (its docs' examples and its source's summary lines), not a run of it."""
    found = checked(recognise(command, output, exit_code))
    assert found == (None if expected is None else {**expected, "command": command})


# How agents run checks: chains, env prefixes, launchers, wrappers, shells; and what is no check.
PASS = "3 passed in 0.10s\n"
FAIL = "1 failed, 2 passed in 0.10s\n"
FORMS = [
    # the command, its output, its exit code, the command kept (None: no check recognised), whether it passed
    ("pytest", PASS, 0, "pytest", True),
    ("CI=1 pytest -q", PASS, 0, "pytest -q", True),  # an env assignment is no part of what identifies it
    ("env -u DISPLAY PYTHONPATH=src time timeout 600 pytest -x", FAIL, 1, "pytest -x", False),
    ("uv run pytest tests/", PASS, 0, "uv run pytest tests/", True),
    ("uv run --with pytest-xdist pytest -n 2", PASS, 0, "uv run --with pytest-xdist pytest -n 2", True),
    ("poetry run pytest", FAIL, 1, "poetry run pytest", False),
    ("pipenv run python -m pytest", PASS, 0, "pipenv run python -m pytest", True),
    ("hatch run pytest", PASS, None, "hatch run pytest", True),
    ("hatch run test:unit", "", 0, "hatch run test:unit", True),  # a hatch script, by its name
    ("pdm run lint", "", 1, "pdm run lint", False),
    (".venv/bin/python -W error -m pytest", PASS, 0, ".venv/bin/python -W error -m pytest", True),
    (
        "python3 -m unittest discover -s tests",
        "Ran 3 tests in 0.001s\n\nOK\n",
        None,
        "python3 -m unittest discover -s tests",
        True,
    ),
    ("cd app && npm ci && npm test", "", 0, "cd app && npm test", True),
    ("cd app && npm ci && npm test", "npm error code 1\n", 1, None, None),  # npm ci may be what failed
    ("cd app && npm test", "", 1, "cd app && npm test", False),  # nothing else can have failed it
    (
        "npm run test:unit -- --watch=false",
        "Tests:       2 passed, 2 total\n",
        None,
        "npm run test:unit -- --watch=false",
        True,
    ),
    ("npm run build", "", 0, "npm run build", True),
    ("npm run lint", "", 2, "npm run lint", False),
    ("npm run typecheck", "", 0, "npm run typecheck", True),
    ("npm --prefix web test", "", 1, "npm --prefix web test", False),
    ("npm install", "", 0, None, None),
    ("npm start", "", 0, None, None),
    ("yarn test --coverage", "", 0, "yarn test --coverage", True),
    ("yarn jest src", "Tests:       1 failed, 1 total\n", 1, "yarn jest src", False),
    ("pnpm build", "", 0, "pnpm build", True),
    ("pnpm vitest run", "      Tests  4 passed (4)\n", None, "pnpm vitest run", True),
    ("bun run test", "", 0, "bun run test", True),
    ("bunx vitest run", "      Tests  1 failed | 3 passed (4)\n", 1, "bunx vitest run", False),
    ("npx --yes jest", "Tests:       5 passed, 5 total\n", None, "npx --yes jest", True),
    ("make", "", 0, "make", True),
    ("make -j4 all", "", 2, "make -j4 all", False),
    ("make -C backend test", "", 0, "make -C backend test", True),
    ("make lint test", "", 0, "make lint test", True),  # the strongest target speaks: tests
    ("make install", "", 0, None, None),
    ("make check", "", 0, "make check", True),
    ("gmake build", "", 1, "gmake build", False),
    ("just test", "", 0, "just test", True),
    ("rake spec", "4 examples, 0 failures\n", None, "rake spec", True),
    ("mvn dependency:tree", "", 0, None, None),
    ("gradle :app:test", "", 0, "gradle :app:test", True),
    ("tox -e py311,lint", "", 0, "tox -e py311,lint", True),
    ("nox -s lint", "", 1, "nox -s lint", False),
    ("bash -lc 'cd web && npx vitest run'", "      Tests  2 passed (2)\n", None, "cd web && npx vitest run", True),
    ("sh -c 'pytest -q'", FAIL, 1, "pytest -q", False),
    ("(cd api && go test ./...)", "ok  \texample.com/api\t0.01s\n", None, "cd api && go test ./...", True),
    ("pytest -q || true", FAIL, 0, "pytest -q", False),  # a failure hidden by || true still shows in the summary
    ("pytest -q || true", "", 0, None, None),  # ... and without a summary nothing is known
    ("pytest -q; echo done", PASS, 0, "pytest -q", True),
    ("pytest -q; echo done", "", 0, None, None),  # the exit code is echo's
    ("pytest -q 2>&1 | tail -5", FAIL, 0, "pytest -q", False),
    ("pytest -q 2>&1 | tail -5", "", 0, None, None),  # the exit code is tail's
    ("pytest -q > out.log 2>&1", "", 1, "pytest -q", False),
    ("false || pytest", PASS, 0, "pytest", True),  # said by its summary
    ("false || pytest", "", 0, None, None),  # a || pytest: exit 0 may be a's own, with pytest never run
    ("pytest &", "", 0, None, None),  # in the background: its exit code is not this one
    ("pytest\necho finished", PASS, 0, "pytest", True),  # one command a line
    ("pytest # the unit tests\n", FAIL, 1, "pytest", False),
    ("source .venv/bin/activate && pytest", "", 1, "pytest", False),  # activating a virtualenv cannot fail it
    ("cargo build && ./target/debug/app", "", 1, None, None),  # the app may be what failed
    ("cargo build && ./target/debug/app", "", 0, "cargo build", True),
    (
        "ruff check . && mypy src && pytest",
        f"All checks passed!\nSuccess: no issues found in 3 source files\n{PASS}",
        0,
        "pytest",
        True,
    ),  # the check whose pass says most
    (
        "ruff check . && mypy src && pytest",
        "All checks passed!\nsrc/a.py:1: error: bad\nFound 1 error in 1 file\n",
        1,
        "mypy src",
        False,
    ),  # the first that failed
    ("tsc --noEmit && jest", "", 1, None, None),  # either may have failed: neither said
    ("pytest -q", PASS, 127, "pytest -q", True),  # said by its summary
    ("pytest -q", "bash: pytest: command not found\n", 127, None, None),  # it did not run
    ("pytest -q", "", 137, None, None),  # killed: the agent's time limit, the memory
    ("pytest -q", "", 130, None, None),  # interrupted
    ("timeout 60 pytest -q", "", 124, "pytest -q", False),  # it ran past its time: a hanging test fails
    ("pytest tests/test_none.py", "no tests ran in 0.01s\n", 5, None, None),
    ("pytest --version", "pytest 9.2.0\n", 0, None, None),
    ("pytest --collect-only -q", "tests/test_a.py::test_x\n", 0, None, None),
    ("cargo --version", "cargo 1.95.0\n", 0, None, None),
    ("command -v pytest", "/usr/bin/pytest\n", 0, None, None),
    ("ls", "", 0, None, None),
    ("git status", "On branch main\n", 0, None, None),
    ("cat tests/test_a.py", "def test_a(): pass\n3 passed in 0.1s\n", 0, None, None),
    ('echo "pytest"', "pytest\n", 0, None, None),
    ("pip install pytest", "Successfully installed pytest-9.2.0\n", 0, None, None),
    ("python app.py", "", 1, None, None),
    ("python -c 'import pytest'", "", 0, None, None),
    ("grep -r 'npm test' .", "", 0, None, None),
    ("sh -c 'echo boom; exit 3'", "boom\n", 3, None, None),
    ("pytest -k 'broken", "", 1, None, None),  # unbalanced quotes: the shell would refuse it too
]


@pytest.mark.parametrize(("command", "output", "exit_code", "kept", "passed"), FORMS)
def test_the_forms_agents_run_checks_in(
    command: str, output: str, exit_code: int | None, kept: str | None, passed: bool | None
) -> None:
    found = checked(recognise(command, output, exit_code))
    assert (None if found is None else (found["command"], found["passed"])) == (
        None if kept is None else (kept, passed)
    )


def test_a_projects_own_check_commands_are_checks() -> None:
    own = ["./scripts/check.sh", "make ci-fast"]
    assert recognise("./scripts/check.sh --quick", "", 1, own) == {
        "kind": "check",
        "command": "./scripts/check.sh --quick",
        "passed": False,
    }
    assert recognise("CI=1 make ci-fast", PASS, None, own) == {
        "kind": "check",
        "command": "make ci-fast",
        "passed": True,
        "passed_count": 3,
    }
    assert recognise("./scripts/check.sh", "", 0) is None  # not without the setting
    assert recognise("./scripts/checker.sh", "", 0, own) is None  # a prefix of words, not of characters
    assert recognise("make ci", "", 0, own)["kind"] == "check"  # type: ignore[index]  # ci: make's own word


def test_every_runner_and_task_runner_has_a_case() -> None:
    """Each row of PROGRAMS and each task runner of TASKS is met by a case of this module's tables."""
    commands = [case[0] for case in DOCUMENTED + FORMS] + [run.command for run in RUNS.values()]
    seen = {id(found) for command in commands for step in _steps(command) if (found := runner(step)) is not None}
    missing = [key for key, row in PROGRAMS.items() if id(row) not in seen]
    assert not missing, f"rows without a case: {missing}"
    names = {words[0] for command in commands for step in _steps(command) if (words := program(step))}
    assert set(TASKS) - names == {"mvnw", "gradlew"} - names  # every task runner but the wrappers' twins
    assert {"mvnw", "gradlew"} <= names


def _steps(command: str) -> list[tuple[str, ...]]:
    from memrl_mcp.clients.checks import steps

    return [step.words for step in steps(command)]


SECRETS = [
    "ghp_abcdefghijklmnopqrstuvwx123456",
    "hunter2",
    "s3cr3t-value",
    "xoxb-1234-5678-abcdefgh",
    "AKIAIOSFODNN7EXAMPLE",
    "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZg",
    "tok3n-in-url",
    "pa55word",
    "eyJhbGciOiJIUzI1NiJ9payload",
    "sk-proj-abcdef1234567890",
    "npm_abcdefghijklmnop1234",
]


@pytest.mark.parametrize(
    "command",
    [
        "GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwx123456 pytest -q",
        "env API_KEY=hunter2 npm test",
        "pytest --token=s3cr3t-value tests/",
        "pytest --api-key s3cr3t-value tests/",
        "SLACK=xoxb-1234-5678-abcdefgh make test",
        "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE pytest",
        "pytest --basetemp /tmp/x --auth-header 'Bearer eyJhbGciOiJIUzI1NiJ9payload'",
        "npm test -- --registry https://user:tok3n-in-url@registry.example.com/",
        "pytest 'https://api.example.com/v1?access_token=tok3n-in-url&x=1'",
        "mvn -Dsonar.login=pa55word -Ddb.password=hunter2 verify",
        "gradle test -Pkey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZg",
        "OPENAI_API_KEY=sk-proj-abcdef1234567890 uv run pytest",
        "pytest tests/ sk-proj-abcdef1234567890",
        "npm test --//registry.npmjs.org/:_authToken=npm_abcdefghijklmnop1234",
        "cd /srv/ghp_abcdefghijklmnopqrstuvwx123456 && pytest",
        "bash -c 'TOKEN=hunter2 pytest --password pa55word'",
    ],
)
def test_a_secret_in_a_check_command_is_never_kept(command: str) -> None:
    """The attack: a check run with a secret on its command line (an env value, a flag, a URL's user, a query
    parameter, a bearer token, a token's known shape). What the memory keeps of it holds none."""
    found = checked(recognise(command, PASS, 0))
    assert found is not None, command
    assert not [secret for secret in SECRETS if secret in found["command"]], found["command"]


def test_the_command_kept_is_bounded_as_the_memory_keeps_it() -> None:
    assert COMMAND_CHARS == MAX_CHECK_TEXT
    found = checked(recognise("pytest " + " ".join(f"tests/test_{i}.py" for i in range(100)), PASS, 0))
    assert found is not None and len(found["command"]) == COMMAND_CHARS


# The tool events the agent CLIs sent their hooks (captured from real runs of Claude Code 2.1.197, Codex 0.171.0,
# Gemini CLI 0.61.0 and Copilot CLI 1.0.102; /tmp/agents-research in the research of issue 39).
AGENT_SHELL: dict[str, tuple[Agent, str, str, int | None]] = {
    "claude-code PostToolUseFailure": ("claude-code", "error", "boom", 3),
    "codex PostToolUse": ("codex", "tool_response", "boom\n", None),
    "gemini AfterTool": ("gemini", "llmContent", "boom", 3),
    "copilot postToolUse": ("copilot", "textResultForLlm", "boom", 3),
    "copilot PostToolUse": ("copilot", "text_result_for_llm", "boom", 3),
}


def _text(event: dict[str, Any], field: str) -> str:
    """The field of a tool event that holds the shell's result text, wherever the agent puts it."""
    for holder in (event, event.get("tool_response"), event.get("toolResult"), event.get("tool_result")):
        if isinstance(holder, dict) and isinstance(holder.get(field), str):
            return str(holder[field])
    return str(event[field])


@pytest.mark.parametrize("name", sorted(AGENT_SHELL))
def test_the_captured_shell_events_of_each_agent(name: str) -> None:
    """Each agent's real after-tool event of a failing shell (`sh -c 'echo boom; exit 3'`): the command, the output
    and the exit code as the agent states them (Codex: none); no check; no edit."""
    event = EVENTS[name]
    agent, field, output, exit_code = AGENT_SHELL[name]
    command = shell_command(event.get("tool_name") or event["toolName"], event.get("tool_input") or event["toolArgs"])
    assert command == "sh -c 'echo boom; exit 3'"
    assert stated_exit(agent, _text(event, field)) == (output, exit_code)
    assert recognise(command, output, exit_code) is None
    assert not is_edit(event.get("tool_name") or event["toolName"], event.get("tool_input") or event["toolArgs"])


def test_the_captured_successful_shell_and_mcp_events_are_no_checks() -> None:
    success = EVENTS["claude-code PostToolUse"]
    command = shell_command(success["tool_name"], success["tool_input"])
    assert command == "echo hi; echo err >&2"
    assert recognise(command, success["tool_response"]["stdout"], 0) is None
    for name in (
        "claude-code PostToolUse mcp",
        "codex PostToolUse mcp",
        "gemini AfterTool mcp",
        "copilot PostToolUse mcp",
    ):
        event = EVENTS[name]
        assert shell_command(event["tool_name"], event["tool_input"]) is None
        assert not is_edit(event["tool_name"], event["tool_input"])


@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini", "copilot"])
def test_a_failing_test_run_reads_the_same_through_every_agent(agent: Agent) -> None:
    """A real failing pytest run as each agent hands it to its hooks: its output and exit code wrapped the agent's
    way (Claude Code: PostToolUseFailure's error; Gemini: llmContent; Copilot: the shell's last line; Codex: the
    output alone), read back, recognised alike."""
    run = RUNS["pytest-fail"]
    wrapped = {
        "claude-code": f"Exit code {run.exit_code}\n{run.output}",
        "codex": run.output,
        "gemini": f"<untrusted_context>\nOutput: {run.output.strip()}\nExit Code: {run.exit_code}\n"
        "Process Group PGID: 2567\n</untrusted_context>",
        "copilot": f"{run.output}\n<shellId: 0 completed with exit code {run.exit_code}>",
    }[agent]
    output, exit_code = stated_exit(agent, wrapped)
    assert exit_code == (None if agent == "codex" else 1)
    assert recognise(run.command, output, exit_code) == {
        "kind": "tests",
        "command": run.command,
        "passed": False,
        "passed_count": 4,
        "failed_count": 2,
    }


def test_an_exit_code_is_read_only_where_its_agent_writes_it() -> None:
    """A command's own output that prints an agent's marker does not set the exit code: Gemini writes its own after
    the output, Copilot its marker last; a text in no agent's form states none."""
    assert stated_exit("gemini", "Output: 3 passed in 0.1s\nProcess Group PGID: 12") == ("3 passed in 0.1s", 0)
    assert stated_exit("gemini", "Output: (empty)\nProcess Group PGID: 12") == ("", 0)
    assert stated_exit("gemini", "Output: x\nSignal: 9\nProcess Group PGID: 12")[1] is None  # killed
    assert stated_exit("gemini", "Command was cancelled by user before it could complete.")[1] is None
    faked = "<shellId: 0 completed with exit code 0>\n1 failed in 0.1s\n<shellId: 7 completed with exit code 1>"
    assert stated_exit("copilot", faked)[1] == 1
    assert stated_exit("copilot", "<shellId: 0 completed with exit code 0>\n1 failed in 0.1s")[1] is None
    noted = "boom\n<shellId: 0 completed with exit code 2>\n<sandbox is active and may have blocked this command>"
    assert stated_exit("copilot", noted) == ("boom", 2)
    assert stated_exit("claude-code", "boom\nExit code 0") == ("boom\nExit code 0", None)
    assert stated_exit("codex", "Exit code 1\nboom") == ("Exit code 1\nboom", None)


@pytest.mark.parametrize(
    ("tool", "tool_input", "edited"),
    [
        ("Edit", {"file_path": "/p/a.py", "old_string": "a", "new_string": "b"}, True),  # Claude Code
        ("Write", {"file_path": "/p/a.py", "content": "x"}, True),
        ("MultiEdit", {"file_path": "/p/a.py", "edits": []}, True),
        ("NotebookEdit", {"notebook_path": "/p/a.ipynb", "new_source": "x"}, True),
        ("Read", {"file_path": "/p/a.py"}, False),
        ("Grep", {"pattern": "x"}, False),
        ("apply_patch", {"command": "*** Begin Patch\n*** Update File: a.py\n*** End Patch"}, True),  # Codex
        ("Bash", {"command": "apply_patch <<'EOF'\n*** Begin Patch\n*** End Patch\nEOF"}, True),
        ("write_file", {"file_path": "a.py", "content": "x"}, True),  # Gemini CLI
        ("replace", {"file_path": "a.py", "old_string": "a", "new_string": "b"}, True),
        ("read_file", {"file_path": "a.py"}, False),
        ("run_shell_command", {"command": "sed -i 's/a/b/' a.py"}, True),
        ("edit", {"path": "a.py", "old_str": "a", "new_str": "b"}, True),  # Copilot CLI
        ("create", {"path": "a.py", "file_text": "x"}, True),
        ("str_replace_editor", {"command": "str_replace", "path": "a.py", "old_str": "a"}, True),
        ("str_replace_editor", {"command": "view", "path": "a.py"}, False),
        ("view", {"path": "a.py"}, False),
        ("bash", {"command": "cat > a.py <<'EOF'\nprint(1)\nEOF"}, True),
        ("mcp__memrl__report_outcome", {"outcome": "success"}, False),
    ],
)
def test_each_agents_editing_tools_are_edits(tool: str, tool_input: dict[str, Any], edited: bool) -> None:
    """The editing tools as each agent's hooks name them (Claude Code's SDK types; Codex's apply_patch hook name;
    Gemini CLI's tool names; Copilot CLI's tool kinds), and shell commands that edit."""
    assert is_edit(tool, tool_input) is edited


@pytest.mark.parametrize(
    ("command", "edited"),
    [
        ("sed -i 's/a/b/' src/a.py", True),
        ("sed -i.bak -e 's/a/b/' src/a.py", True),
        ("sed -n '1,20p' src/a.py", False),
        ("perl -pi -e 's/a/b/' a.py", True),
        ("echo 'x = 1' > src/config.py", True),
        ("printf 'x\\n' >> requirements.in", True),
        ("cat <<EOF > app.py\nprint('it works')\nEOF", True),
        ("echo x | tee src/a.py", True),
        ("pytest -q | tee test-output.txt", False),  # a log of the run
        ("pytest -q > /tmp/out 2>&1", False),
        ("make > build.log", False),
        ("echo x > /dev/null", False),
        ("cmd 2>&1", False),
        ("git checkout -- src/a.py", True),
        ("git stash", True),
        ("git -C repo apply fix.patch", True),
        ("git diff", False),
        ("git log --oneline", False),
        ("patch -p1 < fix.diff", True),
        ("mv a.py b.py", True),
        ("rm -rf build/", True),
        ("black .", True),
        ("black --check .", False),
        ("ruff format src", True),
        ("ruff format --check src", False),
        ("ruff check --fix .", True),
        ("ruff check .", False),
        ("npx prettier --write src", True),
        ("npx prettier --check src", False),
        ("npx eslint --fix .", True),
        ("gofmt -w .", True),
        ("go fmt ./...", True),
        ("cargo fmt", True),
        ("cargo fmt --check", False),
        ("npm run format", True),
        ("make fmt", True),
        ("pytest", False),
        ("cat a.py", False),
        ("grep -rn x src", False),
        ("python -c \"open('a.py', 'w').write('x')\"", False),  # not seen: an inline program that writes
    ],
)
def test_a_shell_command_that_obviously_edits(command: str, edited: bool) -> None:
    assert edits(command) is edited
