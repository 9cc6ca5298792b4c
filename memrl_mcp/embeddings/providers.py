"""Embedders beyond the shipped default: any FastEmbed model (Qdrant's embedding library), and any
OpenAI-compatible embeddings API."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memrl_mcp.embeddings.base import EmbedderUnavailableError, SimilarityProfile, UncalibratedModelError, normalise
from memrl_mcp.embeddings.minilm import MINILM_PROFILE

# Not measured here: the official MemRL code's constants for OpenAI text-embedding-3-large
# (sim_norm_mean/std in memp/service/memory_service.py, delta 0.5 from its configs,
# merge = its add_similarity_threshold 0.9). Another model has another scale: set
# MEMRL_SIM_MEAN, MEMRL_SIM_STD and MEMRL_DELTA (and MEMRL_MERGE_THRESHOLD) for it.
OPENAI_PROFILE = SimilarityProfile(mean=0.1857, std=0.0941, delta=0.5, merge=0.90)

# FastEmbed models whose constants were measured (perf/embedders.py): the same model in fp32 (its graph from
# minilm_build), whose constants on the same texts round to the int8 model's (docs/embeddings.md): MINILM_PROFILE.
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
        extra: dict[str, Any] = {"specific_model_path": str(path)} if path else {}
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
        return normalise(np.stack(list(self._model.embed(list(texts), batch_size=1))).astype(np.float32))


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
        extra: dict[str, Any] = {"dimensions": self._dimensions} if self._dimensions else {}
        response = self._client.embeddings.create(
            model=self._model, input=list(texts), encoding_format="float", **extra
        )
        rows = sorted(response.data, key=lambda item: item.index)
        if [row.index for row in rows] != list(range(len(texts))):
            raise RuntimeError(f"embedder {self.name}: got {len(rows)} embeddings for {len(texts)} inputs")
        return normalise(np.array([row.embedding for row in rows], dtype=np.float32))
