"""Embeddings: the embedder port and its similarity constants (:mod:`~memrl_mcp.embeddings.base`), the shipped
MiniLM model and the builder that makes it, FastEmbed and OpenAI-compatible providers, the namespace-partitioned
cache, and ``memrl-mcp calibrate``, which measures a model's constants."""

from __future__ import annotations

from memrl_mcp.embeddings.base import (
    Embedder,
    EmbedderUnavailableError,
    ModelIntegrityError,
    SimilarityProfile,
    UncalibratedModelError,
)
from memrl_mcp.embeddings.cache import CachedEmbedder, cached, canonical_task, embed_scoped, embed_tasks
from memrl_mcp.embeddings.minilm import MiniLMEmbedder
from memrl_mcp.embeddings.providers import (
    FASTEMBED_DEFAULT_MODEL,
    FASTEMBED_PROFILES,
    FastEmbedEmbedder,
    OpenAIEmbedder,
)
from memrl_mcp.settings import EmbeddingSettings, SimilaritySettings

__all__ = [
    "CachedEmbedder",
    "Embedder",
    "EmbedderUnavailableError",
    "FastEmbedEmbedder",
    "MiniLMEmbedder",
    "ModelIntegrityError",
    "OpenAIEmbedder",
    "SimilarityProfile",
    "UncalibratedModelError",
    "cached",
    "canonical_task",
    "create_embedder",
    "embed_scoped",
    "embed_tasks",
    "load_model",
]


def load_model(settings: EmbeddingSettings, similarity: SimilaritySettings) -> Embedder:
    """The model ``settings.embedder`` names, uncached (what ``memrl-mcp calibrate`` measures). ``similarity``: the
    constants a FastEmbed model nobody measured takes from the settings."""
    if settings.embedder == "minilm":
        return MiniLMEmbedder(threads=settings.embedding_threads)
    if settings.embedder == "fastembed":
        model = settings.embedding_model or FASTEMBED_DEFAULT_MODEL
        return FastEmbedEmbedder(
            model=model, path=settings.embedding_model_path, similarity=_fastembed_profile(model, similarity)
        )
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return OpenAIEmbedder(
        model=settings.embedding_model or "text-embedding-3-small",
        base_url=settings.openai_base_url,
        api_key=key,
        dimensions=settings.embedding_dimensions,
    )


def _fastembed_profile(model: str, similarity: SimilaritySettings) -> SimilarityProfile | None:
    """The measured constants of ``model``, else the settings' own when all four are set."""
    if model in FASTEMBED_PROFILES:
        return FASTEMBED_PROFILES[model]
    mean, std, delta, merge = similarity.sim_mean, similarity.sim_std, similarity.delta, similarity.merge_threshold
    if mean is None or std is None or delta is None or merge is None:
        return None
    return SimilarityProfile(mean=mean, std=std, delta=delta, merge=merge)


def create_embedder(settings: EmbeddingSettings, similarity: SimilaritySettings) -> Embedder:
    """The embedder named by ``settings.embedder``, behind a cache of ``settings.embedding_cache`` texts.

    Raises :class:`UncalibratedModelError` for a model without similarity constants (measured or set)."""
    embedder = load_model(settings, similarity)
    embedder.similarity  # noqa: B018 -- refuse an uncalibrated model at start-up, not at the first recall
    return CachedEmbedder(embedder, settings.embedding_cache) if settings.embedding_cache else embedder
