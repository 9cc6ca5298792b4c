"""The bundle's entry point: memrl-mcp over stdio, started by Claude Desktop through ``uv run`` (manifest.json).

Claude Desktop passes each user setting to the server as a ``MEMRL_*`` variable, an empty string when the user left
it empty. For the server an empty value is a value (an empty ``MEMRL_DATA_DIR`` would be the current folder, the
bundle's own, which an update replaces), so an empty setting is taken out here and the server's default applies.

The data folder is read as the user typed it, without a shell: ``~`` is made their home here, and a relative path,
which would be a folder inside the extension's own (Claude Desktop starts the server there), is refused with a
message Claude Desktop shows. Every other setting is checked by the server itself, by its own rules.
"""

import os
import sys


def data_folder_problem() -> str:
    """Put the data folder as the user means it into the environment; what is wrong with it, if anything."""
    given = os.environ.get("MEMRL_DATA_DIR")
    if given is None:
        return ""
    folder = os.path.expanduser(given.strip())
    if not os.path.isabs(folder):
        return (
            f"data folder (MEMRL_DATA_DIR): {given!r} is a relative path, which would be a folder inside the "
            "extension's own (replaced at each update): choose a full path such as ~/memrl-memories, or leave it "
            "empty for the platform's data folder"
        )
    os.environ["MEMRL_DATA_DIR"] = folder
    return ""


if __name__ == "__main__":
    for name in [name for name, value in os.environ.items() if name.startswith("MEMRL_") and not value.strip()]:
        del os.environ[name]
    problem = data_folder_problem()
    if problem:
        from memrl_mcp.local.relay import refuse  # every request answered with the problem, as Claude Desktop shows

        sys.exit(refuse(problem))
    from memrl_mcp.cli import main

    sys.exit(main([]))
