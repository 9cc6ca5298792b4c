"""Where the harness finds what it needs beyond Python packages, and how to tell a user to install it.

A checkout has the Makefile (``make llm``, ``make sandbox``), and the project's own machines keep the benchmark data
beside it (``../shared/data``); an installed wheel has neither, and a fresh clone may have no data beside it: their
defaults live in the user's data folder, and the hints of a wheel say what to run by hand.
"""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_data_dir

CHECKOUT = Path(__file__).resolve().parents[1]
ENV_SHARED_DATA = "MEMRL_SHARED_DATA"
ENV_ROOTFS = "MEMRL_LLB_ROOTFS"
DATA_GUIDE = "`memrl-harness data` prints it (docs/benchmark-data.md)"
LLB_PACKAGES = "python3,git,vim,curl,wget,zip,unzip,tree,zsh,passwd,procps"


def in_checkout() -> bool:
    """Whether this package runs from a source checkout (with its Makefile) rather than an installed wheel."""
    return (CHECKOUT / "Makefile").is_file() and (CHECKOUT / "pyproject.toml").is_file()


def install_hint(make_target: str, by_hand: str) -> str:
    """``make <target>`` in a checkout (with what it does), else the commands themselves."""
    return f"run `make {make_target}` ({by_hand})" if in_checkout() else f"run: {by_hand}"


def shared_data_root() -> Path:
    """Benchmark data: ``$MEMRL_SHARED_DATA``, else ``../shared/data`` when a checkout has it beside it, else the
    user's data folder (where docs/benchmark-data.md tells a user to put it)."""
    if env := os.environ.get(ENV_SHARED_DATA):
        return Path(env)
    beside = CHECKOUT.parent / "shared" / "data"
    if in_checkout() and beside.is_dir():
        return beside
    return Path(user_data_dir("memrl-harness")) / "data"


def default_rootfs() -> Path:
    """LLB OS's root filesystem: ``$MEMRL_LLB_ROOTFS``, else where ``make sandbox`` builds it, else the data folder."""
    if env := os.environ.get(ENV_ROOTFS):
        return Path(env)
    if in_checkout():
        return CHECKOUT / ".venv" / "llb-rootfs"
    return Path(user_data_dir("memrl-harness")) / "llb-rootfs"


def rootfs_hint(rootfs: Path) -> str:
    """How to build the root filesystem at ``rootfs`` (as root, with Debian's bubblewrap and mmdebstrap)."""
    by_hand = (
        f"apt-get install bubblewrap mmdebstrap libseccomp2 && mmdebstrap --variant=minbase "
        f"--include={LLB_PACKAGES} bookworm {rootfs} && python -m memrl_harness.backends.jail {rootfs}"
    )
    return install_hint("sandbox", by_hand)


def data_hint(what: str, path: Path) -> str:
    """A missing benchmark file: where it was looked for, how to point elsewhere, what to download."""
    return (
        f"{what} not found at {path} (set {ENV_SHARED_DATA} to the data folder or pass --option data=PATH; "
        f"what to download and where to put it: {DATA_GUIDE})"
    )
