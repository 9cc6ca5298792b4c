"""What the harness needs beyond its Python packages (memrl_harness/install.py): where it looks for the benchmark
data, ``$MEMRL_SHARED_DATA``, then ``../shared/data`` when a checkout has it beside it, then the user's data folder
(a wheel never looks beside itself); and what it says when an optional install is missing. The data cases load the
real ``install.py`` from a copy laid out as a checkout (or as an installed package) in a temporary folder."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

import memrl_harness.install
from memrl_harness.benchmarks.alfworld import Game

SOURCE = Path(memrl_harness.install.__file__)


def copy_of_install(root: Path, *, checkout: bool) -> ModuleType:
    """``install.py`` in ``root/memrl_harness``; with the checkout's Makefile and pyproject.toml, or without."""
    package = root / "memrl_harness"
    package.mkdir(parents=True)
    shutil.copy(SOURCE, package / "install.py")
    if checkout:
        for name in ("Makefile", "pyproject.toml"):
            (root / name).write_text("")
    spec = importlib.util.spec_from_file_location(f"install_copy_{root.name}", package / "install.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def user_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's data folder of the harness, moved under ``tmp_path`` (platformdirs follows XDG_DATA_HOME)."""
    monkeypatch.delenv("MEMRL_SHARED_DATA", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "memrl-harness" / "data"


def test_a_clone_with_nothing_beside_it_reads_the_user_data_folder(tmp_path: Path, user_data: Path) -> None:
    install = copy_of_install(tmp_path / "clone", checkout=True)
    assert install.in_checkout()
    assert install.shared_data_root() == user_data


def test_a_checkout_with_the_data_beside_it_reads_it_there(tmp_path: Path, user_data: Path) -> None:
    install = copy_of_install(tmp_path / "clone", checkout=True)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert install.shared_data_root() == tmp_path / "shared" / "data"


def test_an_installed_package_never_looks_beside_itself(tmp_path: Path, user_data: Path) -> None:
    install = copy_of_install(tmp_path / "site-packages", checkout=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert not install.in_checkout()
    assert install.shared_data_root() == user_data


def test_the_environment_wins(tmp_path: Path, user_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install = copy_of_install(tmp_path / "clone", checkout=True)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    monkeypatch.setenv("MEMRL_SHARED_DATA", str(tmp_path / "mine"))
    assert install.shared_data_root() == tmp_path / "mine"


def test_a_game_without_alfworld_installed_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textworld", None)  # what importing it does where it is not installed
    with pytest.raises(ValueError) as missing:
        Game("valid_seen/some-task/trial/game.tw-pddl")
    assert str(missing.value) == (
        "ALFWorld is not installed (no module textworld): run `make alfworld` (pip install 'memrl-mcp[alfworld]')"
    )
