"""The default embedder, ``minilm``: all-MiniLM-L6-v2 (Apache-2.0) as an int8 ONNX model shipped inside the
package (``memrl_mcp/embeddings/models/all-MiniLM-L6-v2-int8``) and run by onnxruntime: offline, no PyTorch,
nothing downloaded at run time. Why this stack (``perf/embedders.py`` compares it; the figures: docs/embeddings.md):

- Provenance a user can check. The model file is not a third party's upload: ``memrl_mcp.embeddings.minilm_build``
  writes the BERT graph from the model's published ``model.safetensors`` (its SHA-256 is pinned) and
  quantizes it with onnxruntime's ``quantize_dynamic``; the build is deterministic, so
  ``python -m memrl_mcp.embeddings.minilm_build --check`` rebuilds it and compares hashes. The fp32 graph gives
  sentence-transformers' vectors to float rounding. The tokenizer is the model's own ``tokenizer.json``,
  shipped beside it. The SHA-256 of both files is checked on every load, on the very bytes handed to
  onnxruntime and the tokenizer (a tampered or truncated file is refused, not half-loaded).
- Real int8: weights quantized per output channel, so onnxruntime runs integer matrix products
  (``MatMulInteger``), not fp32 on dequantized weights: faster per query than FastEmbed on the fp32
  graph, with vectors close to fp32's and mostly the same nearest task (where not, one of fp32's top
  five). CPUs without VNNI gain less. Who wants fp32's exact neighbours sets ``embedder: fastembed``
  (its default model is this one in fp32, downloaded once).
- Light: onnxruntime and tokenizers only (PyTorch and ``onnx`` are needed by nobody at run time).
  ``embedder: fastembed`` runs any model of FastEmbed (Qdrant's embedding library), downloaded by
  name, or a local model folder; ``embedder: openai`` any OpenAI-compatible API. FastEmbed is not the
  default runtime because it pulls in more (huggingface-hub, Pillow, ...) for the same vectors: run on
  the shipped file, it returns this embedder's vectors (texts under 256 tokens) at the same speed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from memrl_mcp.embeddings.base import ModelIntegrityError, SimilarityProfile, normalise

# The shipped model's similarity constants, measured by perf/embedders.py on the task texts of the four benchmarks
# (the figures and their date: docs/embeddings.md, "The similarity constants of the shipped model"):
# - mean/std: of same-benchmark task pairs. Only std changes a ranking: it is the price of Q in similarity.
# - delta: keeps each task's nearest same-benchmark task in each benchmark while few tasks see another benchmark's
#   text above it (a higher delta loses LLB-db's neighbours, a lower one lets other benchmarks in).
# - merge: above the closest two different tasks of these benchmarks, so only a restated task merges (case and
#   spacing edits; a trailing full stop not always: tasks are embedded in a canonical form for that).
MINILM_PROFILE = SimilarityProfile(mean=0.26, std=0.15, delta=0.5, merge=0.99)

MINILM_FOLDER = Path(__file__).parent / "models" / "all-MiniLM-L6-v2-int8"  # package data
# SHA-256 of the shipped files that are loaded, as ``python -m memrl_mcp.embeddings.minilm_build`` writes them.
MINILM_FILES = {
    "model.onnx": "8b30541fc2b25374559dd5bd933f1d0a3830da9191b4e55875d2ad68a48b939d",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}


def model_threads() -> int:
    """Threads per model run: two if this process may use two CPUs, else one. The second thread shortens a recall
    when other jobs contend for the CPUs and costs nothing on an idle machine; more were not measured
    (docs/performance.md)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(2, usable)


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
    (docs/embeddings.md); the memory compares vectors made at different times.
    Constructing it checks and loads the model; ``embed`` is thread-safe
    (onnxruntime's ``run`` and ``encode_batch`` are). ``threads``: onnxruntime's threads per model run, by default
    two where two CPUs are usable (:func:`model_threads`); they give the vectors of one thread. ``folder`` exists
    for tests: whatever the folder, its files must have the pinned hashes.
    """

    name = "all-MiniLM-L6-v2-int8"
    dim = 384
    max_tokens = 256
    similarity = MINILM_PROFILE

    def __init__(self, *, threads: int | None = None, folder: Path = MINILM_FOLDER) -> None:
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
        options.intra_op_num_threads = model_threads() if threads is None else threads
        options.inter_op_num_threads = 1
        # A pool thread that spins after its share of a run (onnxruntime's default) takes a core from the event
        # loop and the client while they answer: with spinning, two threads made a recall slower than one under
        # load; without, faster (docs/performance.md, "The embedder").
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
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
        return normalise(vectors)
