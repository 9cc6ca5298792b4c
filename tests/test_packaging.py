"""One version, written once; what an installation needs ships as package data."""

import subprocess
import sys
from importlib import metadata, resources

import pytest
from mcp import Client

import memrl_mcp
from memrl_mcp.embeddings import Embedder
from memrl_mcp.surface.server import create_server
from tests.support.mcp import make_service


@pytest.mark.slow  # a child process
def test_the_version_is_written_once(embedder: Embedder) -> None:
    assert metadata.version("memrl-mcp") == memrl_mcp.__version__
    shown = subprocess.run(
        [sys.executable, "-m", "memrl_mcp.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == f"memrl-mcp {memrl_mcp.__version__}"


@pytest.mark.anyio
async def test_the_server_tells_its_version(embedder: Embedder, tmp_path) -> None:
    service = make_service(embedder, tmp_path / "data")
    try:
        async with Client(create_server(service)) as client:
            assert client.server_info is not None and client.server_info.version == memrl_mcp.__version__
    finally:
        service.close()


def test_package_data_is_found_through_the_package() -> None:
    configs = resources.files("memrl_harness") / "configs"
    assert {p.name for p in configs.iterdir() if p.name.endswith(".yaml")} >= {"alfworld.yaml", "llb.yaml"}
    models = resources.files("memrl_mcp") / "embeddings" / "models"
    assert any((folder / "model.onnx").is_file() for folder in models.iterdir())
