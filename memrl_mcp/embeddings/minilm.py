"""Embedders: task text -> unit vector, so that cosine similarity is a plain dot product.

The default, ``minilm``, is all-MiniLM-L6-v2 (Apache-2.0) as an int8 ONNX model shipped inside the
package (``memrl_mcp/embedding_models/all-MiniLM-L6-v2-int8``, 23 MB) and run by onnxruntime: offline, no PyTorch,
nothing downloaded at run time. Why this stack, as measured by ``benchmarks/embedders.py``:

- Provenance a user can check. The model file is not a third party's upload: ``memrl_mcp.minilm_build``
  writes the BERT graph from the model's published ``model.safetensors`` (its SHA-256 is pinned) and
  quantizes it with onnxruntime's ``quantize_dynamic``; the build is deterministic, so
  ``python -m memrl_mcp.minilm_build --check`` rebuilds it and compares hashes. The fp32 graph matches
  sentence-transformers to 2e-7 per coordinate. The tokenizer is the model's own ``tokenizer.json``,
  shipped beside it. The SHA-256 of both files is checked on every load, on the very bytes handed to
  onnxruntime and the tokenizer (a tampered or truncated file is refused, not half-loaded).
- Real int8: weights quantized per output channel, so onnxruntime runs integer matrix products
  (``MatMulInteger``), not fp32 on dequantized weights: 1.5-1.7x faster per query than FastEmbed on
  the fp32 graph, at cosine 0.99 to fp32 and the same nearest task for 84-92% of tasks (the rest:
  fp32's second to fifth); ``MINILM_PROFILE`` below has the figures. Measured on avx512_vnni CPUs;
  CPUs without VNNI gain less. Who wants fp32's exact neighbours sets ``embedder: fastembed`` (its
  default model is this one in fp32, 90 MB, downloaded once).
- Light: onnxruntime and tokenizers only (PyTorch and ``onnx`` are needed by nobody at run time).
  ``embedder: fastembed`` runs any model of FastEmbed (Qdrant's embedding library), downloaded by
  name, or a local model folder; ``embedder: openai`` any OpenAI-compatible API. FastEmbed is not the
  default runtime because it pulls in more (huggingface-hub, Pillow, ...) for the same vectors: run on
  the shipped file, it returns this embedder's vectors (texts under 256 tokens) at the same speed.

The similarity scale depends on the model (two tasks of one benchmark average 0.26 with MiniLM; the
official code uses 0.19 for text-embedding-3-large), so every embedder carries the constants that go
with it (:class:`SimilarityProfile`); settings override them, and ``memrl-mcp calibrate`` measures them
for any embedder on the user's own tasks.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from memrl_mcp.errors import MemrlError

if TYPE_CHECKING:
    from memrl_mcp.settings import Settings


class ModelIntegrityError(MemrlError):
    """A model file is missing or is not the file whose SHA-256 the package pins."""


class EmbedderUnavailableError(MemrlError):
    """The configured embedder cannot run here: an optional package is not installed."""


class UncalibratedModelError(MemrlError):
    """An embedder has no similarity constants: they must be measured (``memrl-mcp calibrate``) and set."""


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


# Measured by benchmarks/embedders.py (the shipped int8 model, re-measured when it replaced the
# former one; ALFWorld goals, LLB os/db instructions, BigCodeBench instruct prompts cut at 300
# chars, from ../shared/data; 2,122 distinct texts):
# - speed, one query on one thread, median of 5 rounds on a busy 2-core machine, CPU time: 3.9 ms
#   for an ALFWorld goal, 12.3 ms for an LLB instruction, 15.4 ms for 300 chars, i.e. 1.5-1.7x
#   faster than FastEmbed running the fp32 graph (6.2, 18.4, 22.3 ms) in the same run.
# - agreement with fp32 (whose graph matches sentence-transformers to 2.6e-7): cosine mean 0.9925,
#   min 0.980; the nearest other task is fp32's own for 84-92% of tasks per benchmark, within 0.01
#   of fp32's best for 92-98%, in fp32's top 5 for 99.6-100%; top-5 overlap 0.89-0.90.
# - mean/std: same-benchmark task pairs average mean 0.26, std 0.15 (per benchmark: means
#   0.19-0.36, stds 0.13-0.19). Only std changes a ranking: it is the price of Q in similarity.
# - delta 0.5: keeps the nearest same-benchmark task for 96-100% of tasks in each benchmark,
#   while 0-17% of tasks (LLB-os the most) see any other-benchmark text above it (0.6: keeps
#   only 64% of LLB-db; 0.4: 6-43% see other-benchmark text).
# - merge 0.99: different tasks reach 0.95-0.985 ("cool some tomato ..." vs "heat some tomato
#   ...": 0.951, "put a toiletpaper in ..." vs "put some toiletpaper on ...": 0.985), no two
#   distinct texts of these benchmarks reach 0.99; case and spacing edits give 1.0, a toggled
#   trailing full stop 0.88-1.0 (78% of trivial edits reach 0.99).
MINILM_PROFILE = SimilarityProfile(mean=0.26, std=0.15, delta=0.5, merge=0.99)

# Not measured here: the official MemRL code's constants for OpenAI text-embedding-3-large
# (sim_norm_mean/std in memp/service/memory_service.py, delta 0.5 from its configs,
# merge = its add_similarity_threshold 0.9). Another model has another scale: set
# MEMRL_SIM_MEAN, MEMRL_SIM_STD and MEMRL_DELTA (and MEMRL_MERGE_THRESHOLD) for it.
OPENAI_PROFILE = SimilarityProfile(mean=0.1857, std=0.0941, delta=0.5, merge=0.90)

MINILM_FOLDER = Path(__file__).parent / "embedding_models" / "all-MiniLM-L6-v2-int8"  # package data
# SHA-256 of the shipped files that are loaded, as ``python -m memrl_mcp.minilm_build`` writes them.
MINILM_FILES = {
    "model.onnx": "8b30541fc2b25374559dd5bd933f1d0a3830da9191b4e55875d2ad68a48b939d",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}


def read_verified(folder: Path, name: str) -> bytes:
    """The bytes of ``folder/name`` if their SHA-256 is the pinned one; the caller loads these very bytes."""
    path = folder / name
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ModelIntegrityError(f"MiniLM embedder: cannot read {path}: {error.strerror}") from None
    found = hashlib.sha256(data).hexdigest()
    if found != MINILM_FILES[name]:
        raise ModelIntegrityError(
            f"MiniLM embedder: {path} has SHA-256 {found}, expected {MINILM_FILES[name]}: the file was changed "
            "or damaged; reinstall memrl-mcp (pip install --force-reinstall memrl-mcp)"
        )
    return data


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8, ONNX) on onnxruntime, from the package's verified files: offline, 384-d.

    The sentence-transformers pipeline: WordPiece, truncation at 256 tokens, mean pooling, L2
    normalisation. One model run per text, never a padded batch: the int8 graph quantizes its
    activations with one scale per run, so in a batch a text's vector would depend on the other texts
    (cosine 0.96-0.998 to the text embedded alone); the memory compares vectors made at different times.
    Constructing it checks and loads the model (a few hundred ms); ``embed`` is thread-safe
    (onnxruntime's ``run`` and ``encode_batch`` are). ``folder`` exists for tests: whatever the folder,
    its files must have the pinned hashes.
    """

    name = "all-MiniLM-L6-v2-int8"
    dim = 384
    max_tokens = 256
    similarity = MINILM_PROFILE

    def __init__(self, *, threads: int = 1, folder: Path = MINILM_FOLDER) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        model, tokenizer_json = read_verified(folder, "model.onnx"), read_verified(folder, "tokenizer.json")
        tokenizer = Tokenizer.from_str(tokenizer_json.decode())
        # tokenizer.json ships with truncation at 128 and fixed padding to 128: replace both
        # (sentence-transformers truncates this model at 256; one text per run needs no padding).
        tokenizer.enable_truncation(max_length=self.max_tokens)
        tokenizer.no_padding()
        self._tokenizer = tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        self._session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """See :meth:`Embedder.embed`."""
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        for row, encoding in enumerate(self._tokenizer.encode_batch(list(texts))):
            ids = np.array([encoding.ids], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
            vectors[row] = self._session.run(None, feeds)[0][0].mean(axis=0)
        return _normalise(vectors)


# FastEmbed models whose constants were measured (benchmarks/embedders.py): the same model in fp32 (its
# graph from minilm_build; same texts: mean 0.263, std 0.152; calibrate's rules on all texts mixed: delta
# 0.5, closest different tasks 0.987 so merge 0.99), i.e. MINILM_PROFILE.
FASTEMBED_PROFILES = {"sentence-transformers/all-MiniLM-L6-v2": MINILM_PROFILE}
FASTEMBED_DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


class FastEmbedEmbedder:
    """Any text model of FastEmbed (``pip install 'memrl-mcp[fastembed]'``), by name.

    FastEmbed downloads the model on first use (its cache: ``FASTEMBED_CACHE_PATH``); with ``path`` it
    loads that local folder instead (an ONNX file and the tokenizer files), fully offline. FastEmbed
    does the tokenising and pooling its model description names. ``similarity`` is None for a model
    whose constants nobody measured: :func:`create_embedder` then wants them from the settings.
    """

    def __init__(
        self, *, model: str, path: Path | None = None, threads: int = 1, similarity: SimilarityProfile | None = None
    ) -> None:
        try:
            from fastembed import TextEmbedding
        except ImportError:
            raise EmbedderUnavailableError(
                "embedder fastembed: the fastembed package is not installed (pip install 'memrl-mcp[fastembed]')"
            ) from None
        extra = {"specific_model_path": str(path)} if path else {}
        self._model = TextEmbedding(model_name=model, threads=threads, **extra)
        self.name = f"fastembed:{model}"
        self.dim = int(self._model.embedding_size)
        self.profile = similarity

    @property
    def similarity(self) -> SimilarityProfile:
        if self.profile is None:
            raise UncalibratedModelError(
                f"{self.name}: no measured similarity constants for this model; run `memrl-mcp calibrate "
                "--tasks FILE` and set delta, sim_mean, sim_std and merge_threshold from its output"
            )
        return self.profile

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """See :meth:`Embedder.embed` (re-normalised: not every FastEmbed model pools to unit vectors).

        One text per run, as :class:`MiniLMEmbedder` and for its reason: FastEmbed offers quantized models too."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _normalise(np.stack(list(self._model.embed(list(texts), batch_size=1))).astype(np.float32))


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
        try:
            from openai import OpenAI
        except ImportError:
            raise EmbedderUnavailableError(
                "embedder openai: the openai package is not installed (pip install 'memrl-mcp[openai]')"
            ) from None

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


def load_model(settings: Settings) -> Embedder:
    """The model ``settings.embedder`` names, uncached (what ``memrl-mcp calibrate`` measures)."""
    if settings.embedder == "minilm":
        return MiniLMEmbedder()
    if settings.embedder == "fastembed":
        model = settings.embedding_model or FASTEMBED_DEFAULT_MODEL
        return FastEmbedEmbedder(
            model=model, path=settings.embedding_model_path, similarity=_fastembed_profile(model, settings)
        )
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return OpenAIEmbedder(
        model=settings.embedding_model or "text-embedding-3-small",
        base_url=settings.openai_base_url,
        api_key=key,
        dimensions=settings.embedding_dimensions,
    )


def _fastembed_profile(model: str, settings: Settings) -> SimilarityProfile | None:
    """The measured constants of ``model``, else the settings' own when all four are set."""
    if model in FASTEMBED_PROFILES:
        return FASTEMBED_PROFILES[model]
    values = (settings.sim_mean, settings.sim_std, settings.delta, settings.merge_threshold)
    if any(value is None for value in values):
        return None
    mean, std, delta, merge = values
    return SimilarityProfile(mean=mean, std=std, delta=delta, merge=merge)


def canonical_task(task: str) -> str:
    """One form per task: spacing and a trailing full stop make no twin (MiniLM puts "x." and "x" as far as 0.90
    apart, while distinct tasks reach 0.98)."""
    return " ".join(task.split()).rstrip(".!;, ") or task.strip()


def embed_scoped(embedder: Embedder, texts: Sequence[str], scope: str) -> np.ndarray:
    """Embed through the cache's partition ``scope`` (the namespace, the unit of tenancy: a caller can only hit
    vectors computed for a namespace its token may use, so the time of a call tells nothing about another
    tenant's recent texts)."""
    if isinstance(embedder, CachedEmbedder):
        return embedder.embed(texts, scope=scope)
    return embedder.embed(texts)


def embed_tasks(embedder: Embedder, tasks: Sequence[str], scope: str) -> np.ndarray:
    """Embed the tasks' canonical forms (:func:`canonical_task`), in ``scope``."""
    return embed_scoped(embedder, [canonical_task(task) for task in tasks], scope)


def create_embedder(settings: Settings) -> Embedder:
    """The embedder named by ``settings.embedder``, behind a cache of ``settings.embedding_cache`` texts.

    Raises :class:`UncalibratedModelError` for a model without similarity constants (measured or set)."""
    embedder = load_model(settings)
    embedder.similarity  # noqa: B018 -- refuse an uncalibrated model at start-up, not at the first recall
    return CachedEmbedder(embedder, settings.embedding_cache) if settings.embedding_cache else embedder
