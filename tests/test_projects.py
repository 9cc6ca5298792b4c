"""The project is the git repository (memrl_mcp/projects.py), read from real repositories made by git: its top, its
subfolders and its worktrees are one project; a submodule and another repository are projects of their own; a
folder outside any repository is its own project, as before. And a ``.git`` file cannot claim another project's
memory. Sessions of the real local server and the Claude Code plugin's hooks: tests/test_claude_code.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, types

from memrl_mcp.embeddings import Embedder
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.projects import Project, folder_uri, project_namespace, project_of
from memrl_mcp.surface.server import create_server
from tests.support.git import git, new_repository, repository_with_worktree
from tests.support.mcp import call, make_service, refused

pytestmark = pytest.mark.slow  # git makes the repositories
TASK = "run the unit tests of this project"


def namespace_of(folder: Path) -> str:
    """The namespace a session opened in ``folder`` had before the project was its repository."""
    return project_namespace(folder_uri(folder))


def test_a_repositorys_top_subfolders_and_worktrees_are_one_project(tmp_path: Path) -> None:
    repo = repository_with_worktree(tmp_path / "code" / "proj")
    other = new_repository(tmp_path / "code" / "other")
    plain = tmp_path / "code" / "notes"
    plain.mkdir()
    shared = namespace_of(repo.top)
    assert project_of(folder_uri(repo.top)) == Project(shared)  # started at the top: today's namespace, unchanged
    for folder in (repo.subfolder, repo.worktree, repo.worktree / "src"):
        if not folder.exists():
            folder.mkdir()
        assert project_of(folder_uri(folder)) == Project(shared, earlier=namespace_of(folder)), folder
    # A submodule is a repository of its own, and so is another repository; a folder outside any is its own.
    assert project_of(folder_uri(repo.submodule)) == Project(namespace_of(repo.submodule))
    (repo.submodule / "docs").mkdir()
    assert project_of(folder_uri(repo.submodule / "docs")).namespace == namespace_of(repo.submodule)
    (other / "src").mkdir()
    assert project_of(folder_uri(other / "src")).namespace == namespace_of(other) != shared
    assert project_of(folder_uri(plain)) == Project(namespace_of(plain))
    # A root that names no folder of this machine: taken as it is, its folder never looked for.
    laptop = folder_uri(repo.subfolder).replace("file://", "file://laptop")
    assert project_of(laptop) == Project(project_namespace(laptop))
    assert project_of(folder_uri(repo.subfolder), on_this_machine=False) == Project(namespace_of(repo.subfolder))


def test_a_worktree_reached_through_a_symbolic_link_is_the_same_project(tmp_path: Path) -> None:
    """Git records a worktree by its real path: the top is named by its real path too, however it is reached."""
    repo = repository_with_worktree(tmp_path / "real" / "proj")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    assert project_of(folder_uri(link / "proj" / "src")).namespace == namespace_of(repo.top)
    assert project_of(folder_uri(repo.worktree)).namespace == namespace_of(repo.top)


@asynccontextmanager
async def session_in(service: MemoryService, folder: Path) -> AsyncIterator[Client]:
    """A session of a client of this machine (stdio, the local server's) opened in ``folder``."""

    async def list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=folder_uri(folder))])

    server = create_server(service, single_client=True)
    async with Client(server, list_roots_callback=list_roots, mode="legacy") as client:
        yield client


@pytest.mark.anyio
async def test_a_git_file_cannot_claim_another_repositorys_memory(embedder: Embedder, tmp_path: Path) -> None:
    """The attack: a folder the user unpacked (an archive, a download: git itself never checks a ``.git`` out) holds
    a ``.git`` file naming the victim's repository, as a linked worktree's does: its session would reach the victim's
    memory, and its recalls the victim's prompts. Both ways a worktree points at its repository are tried: a
    ``commondir`` of the attacker's own naming the victim's git folder, and the victim's real record of one of its
    worktrees. The victim's repository records neither folder as its worktree: each is a project of its own."""
    victim = repository_with_worktree(tmp_path / "code" / "victim")
    hostile = tmp_path / "Downloads" / "tool"
    own_record = hostile / "fake"
    own_record.mkdir(parents=True)
    (own_record / "commondir").write_text(f"{victim.top / '.git'}\n")
    (own_record / "gitdir").write_text(f"{hostile / '.git'}\n")
    (own_record / "HEAD").write_text("ref: refs/heads/main\n")
    stolen_record = tmp_path / "Downloads" / "other-tool"
    stolen_record.mkdir()
    (stolen_record / ".git").write_text(f"gitdir: {victim.top / '.git' / 'worktrees' / victim.worktree.name}\n")
    (hostile / ".git").write_text("gitdir: fake\n")
    assert git(victim.top, "worktree", "list").count("\n") == 2  # the victim's repository and its one worktree

    service = make_service(embedder, tmp_path / "data")
    try:
        async with session_in(service, victim.worktree) as owner:
            stored = await call(owner, "store_experience", task=TASK, experience="pytest -q tests/unit")
        assert stored["memory"]["namespace"] == namespace_of(victim.top)
        for folder in (hostile, stolen_record):
            assert project_of(folder_uri(folder)).namespace == namespace_of(folder)
            async with session_in(service, folder) as attacker:
                found = await call(attacker, "recall_experience", task=TASK)
                assert found["namespace"] == namespace_of(folder) and found["memories"] == [], found
                message = await refused(attacker, "list_memories", namespace=namespace_of(victim.top))
                assert "not one of the namespaces a session of this project" in message
    finally:
        service.close()
