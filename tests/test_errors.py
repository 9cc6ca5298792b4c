"""The exception tree that memrl_mcp/errors.py draws is the code's: every exception class of the package, where it
is defined, under its base; each named ...Error."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys

import memrl_mcp
import memrl_mcp.errors
from memrl_mcp.errors import MemrlError


def drawn() -> dict[str, tuple[str, str | None]]:
    """The tree of the docstring: each class's defining module and its parent (None for the root)."""
    doc = memrl_mcp.errors.__doc__ or ""
    block = doc.split("::", 1)[1].split("Outside the tree", 1)[0]
    tree: dict[str, tuple[str, str | None]] = {}
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        found = re.match(r"^( +)([A-Za-z]+) +([a-z_.]+)", line)
        if found is None:
            continue
        indent, name, module = len(found.group(1)), found.group(2), found.group(3).rstrip(":")
        while parents and parents[-1][0] >= indent:
            parents.pop()
        tree[name] = (f"memrl_mcp.{module}", parents[-1][1] if parents else None)
        parents.append((indent, name))
    return tree


def test_the_drawn_tree_is_every_exception_of_the_package() -> None:
    for module in pkgutil.walk_packages(memrl_mcp.__path__, "memrl_mcp."):
        importlib.import_module(module.name)
    classes = {
        obj
        for name, loaded in list(sys.modules.items())
        if name.startswith("memrl_mcp")
        for obj in vars(loaded).values()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name
    }
    in_tree = {cls for cls in classes if issubclass(cls, MemrlError)}
    code = {
        cls.__name__: (cls.__module__, next((b.__name__ for b in cls.__bases__ if issubclass(b, MemrlError)), None))
        for cls in in_tree
    }
    assert drawn() == code
    assert all(cls.__name__.endswith("Error") for cls in classes), sorted(cls.__name__ for cls in classes)
    outside = sorted(cls.__name__ for cls in classes - in_tree)
    assert outside == ["InputRequiredError"]  # the one the docstring names, and why
