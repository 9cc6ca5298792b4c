"""``memrl-harness``: run a benchmark through memrl-mcp (``run``) and turn runs into a report (``report``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import anyio
from tqdm import tqdm

from harness.benchmarks import REGISTRY, load_benchmark, memory_config
from harness.llm import LLM, LLMError
from harness.metrics import write_summary
from harness.report import build_report, load_run
from harness.results import RunConfig, RunDir
from harness.runner import RunError, Runner, default_run_dir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="memrl-harness", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a benchmark in one memory mode")
    run.add_argument("benchmark", choices=sorted(REGISTRY))
    run.add_argument("--mode", choices=("none", "rag", "memrl"), default="memrl")
    run.add_argument("--epochs", type=int, default=3)
    run.add_argument("--tasks", type=int, help="run the first K tasks only")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--workers", type=int, default=1, help="episodes in parallel within an epoch")
    run.add_argument(
        "--config", help="memrl-mcp settings file (default: the paper's constants for the benchmark, packaged)"
    )
    run.add_argument(
        "--memory-url",
        help="use a running memrl-mcp over HTTP instead of a fresh stdio one (token: MEMRL_MEMORY_TOKEN)",
    )
    run.add_argument("--runs", default="runs", help="folder of run folders (default: runs)")
    run.add_argument("--run-dir", help="this run's folder (default: RUNS/BENCHMARK-MODE-seedS); resumes if present")
    run.add_argument("--data", help="the benchmark's data file or folder (same as --option data=PATH)")
    run.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="benchmark option")

    report = commands.add_parser("report", help="markdown table and plots of one or several runs")
    report.add_argument("runs", nargs="+", type=Path)
    report.add_argument("--out", type=Path, default=Path("report"), help="output folder (default: report)")
    return parser.parse_args(argv)


def _options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"memrl-harness: --option needs KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


def run_command(args: argparse.Namespace) -> int:
    options = _options(args.option) | ({"data": args.data} if args.data else {})
    try:
        if args.config and args.memory_url:
            raise ValueError("--config sets up the harness's own memory server; a --memory-url server has its own")
        if args.config and not Path(args.config).is_file():
            raise ValueError(f"--config: no settings file at {args.config}")
        settings_file = Path(args.config).resolve() if args.config else memory_config(args.benchmark)
        benchmark = load_benchmark(args.benchmark, **options)
        llm = LLM.from_env() if benchmark.needs_llm else None
    except (ValueError, LLMError) as error:  # a bad --option, no LLM configured
        print(f"memrl-harness: {error}", file=sys.stderr)
        return 2
    config = RunConfig(
        benchmark=args.benchmark,
        mode=args.mode,
        epochs=args.epochs,
        tasks=args.tasks,
        seed=args.seed,
        workers=args.workers,
        memory_config=None if args.memory_url else str(settings_file),
        memory_url=args.memory_url,
        model=llm.model if llm else None,
        benchmark_options=options,
    )
    run_dir = RunDir(Path(args.run_dir) if args.run_dir else default_run_dir(Path(args.runs), config))
    bar = tqdm(unit="episode", file=sys.stderr, disable=None)  # disabled when stderr is no terminal

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        anyio.run(Runner(config, benchmark, run_dir, llm).run, progress)
    except RunError as error:
        print(f"memrl-harness: {error}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    summary = load_run(run_dir.path).summary
    write_summary(run_dir, summary)
    headline = summary.model_dump(include={"last_success", "best_success", "final_csr", "forgetting_rate", "q_critic"})
    print(json.dumps({"run_dir": str(run_dir.path), **headline}, indent=2))
    return 0


def report_command(args: argparse.Namespace) -> int:
    print(build_report(args.runs, args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command(args) if args.command == "run" else report_command(args)


if __name__ == "__main__":
    sys.exit(main())
