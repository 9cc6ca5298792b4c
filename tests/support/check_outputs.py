"""Real outputs of real check runners, the fixtures of tests/test_checks.py: each a command run in a tiny project,
its exit code and its output as an agent's shell tool sees it (stdout and stderr merged), with the runner's version.

They are recorded in ``tests/data/check_outputs.json`` by this module run as a script, with the runners on PATH
(pytest, mypy, ruff, flake8, pylint, tox, nox from a virtualenv; tsc, jest, vitest, mocha, eslint from an npm
folder, ``--node-bin``; cargo with clippy, make, cmake, node):

    python -m tests.support.check_outputs --node-bin /path/to/node_modules/.bin

A runner that is not installed is left out: its rows in the tests use its documented output format instead (go,
Maven, Gradle, dotnet, ...: Maven is installed here, but its plugins cannot be fetched for an offline run)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "check_outputs.json"


@dataclass(frozen=True)
class Recorded:
    """One run of a check: what ran, where, how it ended, what it printed."""

    name: str
    runner: str  # the runner and its version
    command: str
    exit_code: int
    output: str


def recorded() -> dict[str, Recorded]:
    """The recorded runs, by name."""
    return {run["name"]: Recorded(**run) for run in json.loads(FIXTURES.read_text())}


PY = {
    "calc.py": "def add(a: int, b: int) -> int:\n    return a + b\n",
    "test_ok.py": "from calc import add\n"
    + "".join(f"\n\ndef test_{i}():\n    assert add({i}, 1) == {i + 1}\n" for i in range(3)),
    "test_bad.py": """import pytest
from calc import add


def test_good():
    assert add(1, 1) == 2


def test_wrong():
    assert add(2, 2) == 5


@pytest.fixture
def broken():
    raise RuntimeError("setup")


def test_uses_broken(broken):
    pass
""",
    "test_none.py": "VALUE = 1\n",
    "test_broken.py": "import missing_module\n\n\ndef test_x():\n    pass\n",
    "test_unit_ok.py": """import unittest


class T(unittest.TestCase):
    def test_a(self):
        self.assertTrue(True)

    @unittest.skip("later")
    def test_b(self):
        pass
""",
    "test_unit_bad.py": """import unittest


class T(unittest.TestCase):
    def test_a(self):
        self.assertEqual(1, 2)

    def test_b(self):
        raise KeyError("x")

    def test_c(self):
        pass
""",
    "typed_bad.py": "def f(x: int) -> str:\n    return x\n\n\ny: int = 'a'\n",
    "lint_bad.py": "import os\nimport sys\n\n\ndef f():\n    l = 1\n    return undefined_name\n",
    "tox.ini": "[tox]\nenv_list = py\nskipsdist = true\n\n[testenv]\ndeps = pytest\ncommands = pytest -q {posargs}\n",
    "noxfile.py": """import nox


@nox.session(venv_backend="none")
def tests(session):
    session.run("pytest", "-q", *session.posargs)
""",
    "Makefile": "test:\n\tpytest -q test_ok.py test_bad.py\n\nbuild:\n\tgcc -c broken.c -o broken.o\n",
    "broken.c": "int main(void) { return undefined; }\n",
}
JEST_TESTS = "const sum = require('./sum');\ntest('adds', () => { expect(sum(1, 2)).toBe(3); });\n"
VITEST_TESTS = "import { test, expect } from 'vitest';\ntest('adds', () => { expect(1 + 2).toBe(3); });\n"
MOCHA_TESTS = "const assert = require('assert');\nit('adds', () => assert.equal(1 + 2, 3));\n"
NODE_TESTS = (
    "const test = require('node:test');\nconst assert = require('assert');\ntest('adds', () => assert.ok(1));\n"
)
ESLINT_RULES = "{ 'no-unused-vars': 'error', 'no-undef': 'error', 'no-console': 'warn' }"
JS = {
    "package.json": json.dumps({"name": "p", "version": "1.0.0", "scripts": {"test": "jest sum"}, "type": "commonjs"}),
    "sum.js": "function sum(a, b) { return a + b; }\nmodule.exports = sum;\n",
    "sum.test.js": JEST_TESTS + "test('wrong', () => { expect(sum(2, 2)).toBe(5); });\n",
    "ok.test.js": JEST_TESTS,
    "v_ok.test.mjs": VITEST_TESTS,
    "v_bad.test.mjs": VITEST_TESTS + "test('wrong', () => { expect(2 + 2).toBe(5); });\n",
    "m_ok.spec.js": MOCHA_TESTS,
    "m_bad.spec.js": MOCHA_TESTS + "it('wrong', () => assert.equal(2 + 2, 5));\n",
    "n_ok.node.js": NODE_TESTS,
    "n_bad.node.js": NODE_TESTS + "test('wrong', () => assert.equal(2 + 2, 5));\n",
    "ok.ts": "const n: number = 1;\nexport { n };\n",
    "bad.ts": "const n: number = 'one';\nconst s: string = 2;\nexport { n, s };\n",
    "eslint.config.js": f"module.exports = [{{ rules: {ESLINT_RULES} }}];\n",
    "lint_ok.js": "export const one = 1;\n",
    "lint_bad.js": "const unused = 1;\nconsole.log(x);\n",
}
RUST = {
    "Cargo.toml": '[package]\nname = "calc"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n',
    "src/lib.rs": (
        "pub fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n\n"
        "    #[test]\n    fn adds() {\n        assert_eq!(add(1, 2), 3);\n    }\n\n    #[test]\n    fn wrong() {\n"
        "        assert_eq!(add(2, 2), 5);\n    }\n}\n"
    ),
}
RUST_OK = {**RUST, "src/lib.rs": RUST["src/lib.rs"].replace("add(2, 2), 5", "add(2, 2), 4")}
RUST_BROKEN = {**RUST, "src/lib.rs": "pub fn add(a: i32, b: i32) -> i32 {\n    let s: String = a + b;\n    s\n}\n"}
RUST_LINT = {**RUST, "src/lib.rs": "pub fn add(a: i32, b: i32) -> i32 {\n    let x = a + b;\n    return x;\n}\n"}
CMAKE = {
    "CMakeLists.txt": (
        "cmake_minimum_required(VERSION 3.10)\nproject(calc C)\nenable_testing()\nadd_executable(ok ok.c)\n"
        "add_executable(bad bad.c)\nadd_test(NAME ok COMMAND ok)\nadd_test(NAME bad COMMAND bad)\n"
    ),
    "ok.c": "int main(void) { return 0; }\n",
    "bad.c": "int main(void) { return 1; }\n",
}

RUNS: list[tuple[str, str, dict[str, str], str, str]] = [
    # name, runner (version command), project, setup, command
    ("pytest-pass", "pytest --version", PY, "", "pytest -q test_ok.py"),
    ("pytest-fail", "pytest --version", PY, "", "pytest test_ok.py test_bad.py"),
    ("pytest-quiet-fail", "pytest --version", PY, "", "python -m pytest -q test_ok.py test_bad.py"),
    ("pytest-no-tests", "pytest --version", PY, "", "pytest -q test_none.py"),
    ("pytest-collect-error", "pytest --version", PY, "", "pytest -q test_broken.py"),
    ("unittest-pass", "python --version", PY, "", "python -m unittest test_unit_ok"),
    ("unittest-fail", "python --version", PY, "", "python -m unittest test_unit_bad"),
    ("mypy-pass", "mypy --version", PY, "", "mypy calc.py"),
    ("mypy-fail", "mypy --version", PY, "", "mypy typed_bad.py"),
    ("ruff-pass", "ruff --version", PY, "", "ruff check calc.py"),
    ("ruff-fail", "ruff --version", PY, "", "ruff check lint_bad.py"),
    ("ruff-fix", "ruff --version", PY, "", "ruff check --fix lint_bad.py"),
    ("flake8-fail", "flake8 --version", PY, "", "flake8 lint_bad.py"),
    ("pylint-fail", "pylint --version", PY, "", "pylint lint_bad.py"),
    ("tox-fail", "tox --version", PY, "", "tox -- test_ok.py test_bad.py"),
    ("tox-pass", "tox --version", PY, "", "tox -- test_ok.py"),
    ("nox-fail", "nox --version", PY, "", "nox -- test_ok.py test_bad.py"),
    ("make-test-fail", "make --version", PY, "", "make test"),
    ("make-build-fail", "make --version", PY, "", "make build"),
    ("tsc-pass", "tsc --version", JS, "", "npx tsc --noEmit ok.ts"),
    ("tsc-fail", "tsc --version", JS, "", "npx tsc --noEmit bad.ts"),
    ("jest-pass", "jest --version", JS, "", "npx jest ok.test.js"),
    ("jest-fail", "jest --version", JS, "", "npx jest sum.test.js"),
    ("npm-test-fail", "npm --version", JS, "", "npm test"),
    ("vitest-pass", "vitest --version", JS, "", "npx vitest run v_ok.test.mjs"),
    ("vitest-fail", "vitest --version", JS, "", "npx vitest run v_bad.test.mjs"),
    ("mocha-pass", "mocha --version", JS, "", "npx mocha m_ok.spec.js"),
    ("mocha-fail", "mocha --version", JS, "", "npx mocha m_bad.spec.js"),
    ("node-test-pass", "node --version", JS, "", "node --test n_ok.node.js"),
    ("node-test-fail", "node --version", JS, "", "node --test n_bad.node.js"),
    ("eslint-pass", "eslint --version", JS, "", "npx eslint lint_ok.js"),
    ("eslint-fail", "eslint --version", JS, "", "npx eslint lint_bad.js"),
    ("cargo-test-fail", "cargo --version", RUST, "", "cargo test"),
    ("cargo-test-pass", "cargo --version", RUST_OK, "", "cargo test"),
    ("cargo-build-fail", "cargo --version", RUST_BROKEN, "", "cargo build"),
    ("cargo-build-pass", "cargo --version", RUST_OK, "", "cargo build"),
    ("cargo-check-fail", "cargo --version", RUST_BROKEN, "", "cargo check"),
    ("cargo-clippy-warn", "cargo clippy --version", RUST_LINT, "", "cargo clippy"),
    ("cargo-clippy-deny", "cargo clippy --version", RUST_LINT, "", "cargo clippy -- -D warnings"),
    (
        "ctest-fail",
        "ctest --version",
        CMAKE,
        "cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build",
        "cd build && ctest",
    ),
]


def _version(command: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    said = (done.stdout or done.stderr).strip()
    first, name = said.splitlines()[0].split(" from ")[0] if said else "", command.split()[0]
    return first if first.lower().startswith(name) else f"{name} {first}".strip()


def capture(node_bin: str | None) -> list[Recorded]:
    env = {**os.environ, "CARGO_NET_OFFLINE": "true", "NO_COLOR": "1", "TERM": "dumb", "CI": "1"}
    if node_bin:
        env["PATH"] = f"{node_bin}:{env['PATH']}"
    runs = []
    for name, version, files, setup, command in RUNS:
        if shutil.which(version.split()[0], path=env["PATH"]) is None:
            print(f"{name}: not installed, left out", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory(prefix="check-") as folder:
            root = Path(folder)
            for path, text in files.items():
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_text(text)
            if files is JS and node_bin:
                (root / "node_modules").symlink_to(Path(node_bin).parent)
            if setup:
                subprocess.run(setup, shell=True, cwd=root, env=env, capture_output=True, check=True)
            done = subprocess.run(["bash", "-c", command], cwd=root, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=600, check=False)  # fmt: skip
            output = done.stdout.replace(folder, "/project")
            runs.append(Recorded(name, _version(version, env, root), command, done.returncode, output))
            print(f"{name}: exit {done.returncode}", file=sys.stderr)
    return runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node-bin", help="the node_modules/.bin of tsc, jest, vitest, mocha and eslint")
    found = capture(parser.parse_args().node_bin)
    FIXTURES.parent.mkdir(exist_ok=True)
    FIXTURES.write_text(json.dumps([asdict(run) for run in found], indent=1, ensure_ascii=False) + "\n")
