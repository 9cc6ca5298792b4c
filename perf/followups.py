"""How often the reading of the user's next prompt is right (memrl_mcp/clients/followups.py), on the labelled set of
follow-ups in tests/data/followups.jsonl: per verdict (worked, did not), the precision (of the prompts read so, how
many say so) and the recall (of the prompts that say so, how many are read so), the worst mistakes (a failure read
as a success and the reverse: each teaches the memory the opposite), and how often ``continues`` is right. The set's
``dev`` part is the one the rules were written against; ``held-out`` was written before them and never tuned on.

    .venv/bin/python perf/followups.py            # both parts, then each
    .venv/bin/python perf/followups.py --limit 20 # the first 20 of each part (the tests' tiny run)
    .venv/bin/python perf/followups.py --wrong    # and list every mistake
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from memrl_mcp.clients.followups import read_followup  # noqa: E402

SET = REPO / "tests" / "data" / "followups.jsonl"


def load(limit: int | None = None) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in SET.read_text().splitlines() if line.strip()]
    if limit is None:
        return rows
    return [row for split in ("dev", "held-out", "fresh") for row in [r for r in rows if r["split"] == split][:limit]]


def figures(rows: list[dict[str, object]]) -> dict[str, float | int]:
    """Precision and recall of each verdict, the opposite readings, and the accuracy of ``continues``."""
    read = [(row, read_followup(str(row["prompt"]))) for row in rows]
    out: dict[str, float | int] = {"prompts": len(rows)}
    for verdict, name in ((True, "worked"), (False, "failed")):
        said = [row for row, found in read if found.verdict is verdict]
        right = [row for row in said if row["verdict"] is verdict]
        truly = [row for row, _ in read if row["verdict"] is verdict]
        out[f"{name}: labelled"] = len(truly)
        out[f"{name}: precision"] = len(right) / len(said) if said else 1.0
        out[f"{name}: recall"] = sum(
            1 for row, found in read if row["verdict"] is verdict and found.verdict is verdict
        ) / max(1, len(truly))
        out[f"{name}: read as the opposite"] = sum(
            1 for row, found in read if found.verdict is (not verdict) and row["verdict"] is verdict
        )
    out["neither: read as a verdict"] = sum(
        1 for row, found in read if row["verdict"] is None and found.verdict is not None
    )
    out["continues: accuracy"] = sum(1 for row, found in read if found.continues is row["continues"]) / max(
        1, len(rows)
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, help="the first N prompts of each part")
    parser.add_argument("--wrong", action="store_true", help="list the prompts read wrong")
    args = parser.parse_args()
    rows = load(args.limit)
    for part in ("all", "dev", "held-out", "fresh"):
        chosen = [row for row in rows if part == "all" or row["split"] == part]
        print(f"\n{part}:")
        for name, value in figures(chosen).items():
            print(f"  {name:32} {value:.3f}" if isinstance(value, float) else f"  {name:32} {value}")
    if args.wrong:
        print("\nread wrong (labelled -> read):")
        for row in rows:
            found = read_followup(str(row["prompt"]))
            if (found.verdict, found.continues) != (row["verdict"], row["continues"]):
                said = f"{row['verdict']!s:5} {row['continues']!s:5} -> {found.verdict!s:5} {found.continues!s:5}"
                print(f"  [{row['split']}] {said}  {row['prompt']}")


if __name__ == "__main__":
    main()
