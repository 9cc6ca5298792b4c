"""The attach path's parts that need no process: which store a session means without loading its settings (and
that this agrees with the settings), the greeting on the wire, the code's identity, the relay's line splitting and
its reading of an answer's head, and the command line's help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memrl_mcp
from memrl_mcp.cli import parse_args
from memrl_mcp.folders import default_data_dir
from memrl_mcp.local.attach import target_of
from memrl_mcp.local.greeting import Answer, Hello, decode, encode
from memrl_mcp.local.place import build_identity
from memrl_mcp.local.relay import ANSWER, Lines
from memrl_mcp.settings import ECOSYSTEM_VARIABLES, GROUP_OF, SettingsError, load_settings
from memrl_mcp.variables import read_by_settings
from tests.support.servers import child_env


@pytest.mark.parametrize(
    ("data_dir", "environ"),
    [
        (None, {}),
        (None, {"MEMRL_DATA_DIR": "relative/store"}),
        (None, {"MEMRL_DATA_DIR": "/abs/store", "MEMRL_RUNTIME_DIR": "run"}),
        ("given", {"MEMRL_DATA_DIR": "/not/this"}),
        (None, {"MEMRL_DATA_DIR": "/abs/store", "MEMRL_NAMESPACE": "desktop", "MEMRL_TOOL_PROFILE": "full"}),
    ],
)
def test_the_store_read_without_the_settings_is_the_settings_store(
    tmp_path: Path, data_dir: str | None, environ: dict[str, str]
) -> None:
    target = target_of(data_dir, None, environ, tmp_path)
    assert target is not None and target.config is None
    given = {} if data_dir is None else {"data_dir": data_dir}
    settings = load_settings(None, environ, relative_to=tmp_path, **given)
    assert target.data_dir == settings.storage.data_dir
    assert target.runtime_dir == settings.serving.runtime_dir
    assert settings.storage.data_dir.is_absolute()
    if not environ and data_dir is None:
        assert target.data_dir == default_data_dir()


@pytest.mark.parametrize(
    "environ",
    [
        {"MEMRL_ATTACH": "false"},
        {"MEMRL_ATTACH": "0"},
        {"MEMRL_TOOL_PROFILE": "read_only"},
        {"QDRANT_URL": "http://127.0.0.1:6333"},
        {"MEMRL_QDRANT_URL": "http://127.0.0.1:6333"},
    ],
)
def test_sessions_that_run_in_their_own_process(tmp_path: Path, environ: dict[str, str]) -> None:
    assert target_of(None, None, environ, tmp_path) is None


def test_a_config_file_is_read_for_the_store_it_names(tmp_path: Path) -> None:
    (tmp_path / "memrl.yaml").write_text("storage:\n  data_dir: from-the-file\nserving:\n  runtime_dir: run\n")
    target = target_of(None, None, {"MEMRL_CONFIG": "memrl.yaml"}, tmp_path)
    assert target is not None
    assert (target.data_dir, target.runtime_dir, target.config) == (
        tmp_path / "from-the-file",
        tmp_path / "run",
        tmp_path / "memrl.yaml",
    )
    (tmp_path / "off.yaml").write_text("serving:\n  attach: false\n")
    assert target_of(None, "off.yaml", {}, tmp_path) is None


def test_the_greeting_round_trips_and_a_stranger_is_no_greeting() -> None:
    hello = Hello("session", "0.1.0", "abc", 42, "/data", None, "/home/ann", {"MEMRL_K1": "3"})
    assert decode(Hello, encode(hello)) == hello
    answer = Answer(True, "0.1.0", "abc", 7, sessions=2, ui="http://127.0.0.1:1/ui#token=t")
    assert decode(Answer, encode(answer)) == answer
    for stranger in (
        b"GET / HTTP/1.1\r\n",
        b'{"jsonrpc": "2.0", "id": 1, "method": "initialize"}\n',
        b"[]\n",
        b"\xff\n",
    ):
        with pytest.raises(ValueError):
            decode(Hello, stranger)
    newer = json.loads(encode(hello)) | {"protocol": 2}
    with pytest.raises(ValueError, match="protocol 1"):
        decode(Hello, json.dumps(newer).encode())


def test_the_codes_identity_changes_with_any_file_of_the_package_and_with_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "memrl_mcp"
    (package / "surface").mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.1.0"\n')
    (package / "surface" / "tools.py").write_text("TOOLS = 10\n")
    monkeypatch.setattr(memrl_mcp, "__file__", str(package / "__init__.py"))
    before = build_identity()
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.pyc").write_bytes(b"compiled")  # what running the code writes changes nothing
    assert build_identity() == before
    os.utime(package / "surface" / "tools.py", (1, 1))  # another install of the same code: other times only
    assert build_identity() == before
    (package / "surface" / "tools.py").write_text("TOOLS = 1000\n")  # under the same version number
    assert build_identity() != before


def test_lines_are_split_whole_across_chunks() -> None:
    lines = Lines()
    assert lines.feed(b'{"a": 1}\n{"b"') == [b'{"a": 1}\n']
    assert lines.feed(b": 2}") == []
    assert lines.feed(b"\n\n{") == [b'{"b": 2}\n', b"\n"]
    assert lines.rest() == b"{"


def test_an_answers_id_is_read_from_its_head() -> None:
    plain = ANSWER.match(b'{"jsonrpc":"2.0","id":12,"result":{"content":[]}}\n')
    assert plain is not None and plain[1] == b"12"
    quoted = ANSWER.match(b'{"jsonrpc":"2.0","id":"a\\"b","error":{"code":-1}}\n')
    assert quoted is not None and json.loads(quoted.group(1)) == 'a"b'
    assert ANSWER.match(b'{"jsonrpc":"2.0","id":3,"method":"roots/list"}\n') is None  # a question: parsed whole
    assert ANSWER.match(b'{"jsonrpc":"2.0","method":"notifications/message"}\n') is None


def test_the_help_names_the_transports_the_inspector_and_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "streamable-http: an HTTP server at http://HOST:PORT/mcp" in shown and "/ui" in shown
    assert "memrl-mcp local ui" in shown and "--no-attach" in shown
    assert "commands (instead of serving)" in shown and "backups" not in shown
    for command in ("export", "import", "calibrate", "config", "local"):
        assert f" {command} " in shown


@pytest.mark.slow  # the CLI in a shell pipeline
def test_a_reader_that_stops_early_gets_no_traceback_and_no_error(tmp_path: Path) -> None:
    """``memrl-mcp local status | head -1``, and any command's output cut short: no traceback, no error line."""
    for command in ("local status", "config --defaults", "config"):
        done = subprocess.run(
            f"memrl-mcp {command} | head -c 10",
            shell=True,
            env=child_env(
                tmp_path / "data",
                MEMRL_ATTACH="true",
                MEMRL_RUNTIME_DIR=str(tmp_path / "run"),
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.stderr == "", (command, done.stderr)


SECRET = "sk-live-0123456789abcdef"


def test_a_session_sends_the_variables_the_settings_read_and_they_load_the_same_settings(tmp_path: Path) -> None:
    """What a session's greeting carries of its environment (:func:`~memrl_mcp.variables.read_by_settings`): the
    server loads from it the settings the whole environment gives, each from the same source; every variable a
    setting is read from passes, and a misspelt ``MEMRL_*`` too (the server refuses it by name); nothing else, so
    no secret of the session's environment leaves it."""
    environ = dict(os.environ) | {
        "MEMRL_K1": "3",
        "MEMRL_NAMESPACE": "desktop",
        "MEMRL_TOOL_PROFILE": "full",
        "MEMRL_DATA_DIR": "store",
        "QDRANT_API_KEY": "qdrant-key",
        "COLLECTION_NAME": "team",
        "CLAUDE_PROJECT_DIR": "/home/ann/alpha",
        "MEMRL_LLM_API_KEY": SECRET,  # memrl-harness's, not a setting
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "GITHUB_TOKEN": SECRET,
    }
    sent = read_by_settings(environ)
    assert SECRET not in json.dumps(sent)
    whole, greeted = load_settings(None, environ, relative_to=tmp_path), load_settings(None, sent, relative_to=tmp_path)
    assert whole == greeted
    assert [whole.origin(name) for name in GROUP_OF] == [greeted.origin(name) for name in GROUP_OF]
    every = {f"MEMRL_{name.upper()}" for name in GROUP_OF} | set(ECOSYSTEM_VARIABLES.values()) | {"MEMRL_CONFIG"}
    assert set(read_by_settings(dict.fromkeys([*every, "MEMRL_K_1", "PATH", "HOME"], "x"))) == every | {"MEMRL_K_1"}
    with pytest.raises(SettingsError, match="MEMRL_K_1"):
        load_settings(None, read_by_settings({"MEMRL_K_1": "3"}))
