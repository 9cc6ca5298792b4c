"""``memrl-harness``: run a benchmark through memrl-mcp (``run``), turn runs into a report (``report``), list a
benchmark's options (``options``), say where the benchmarks' data goes (``data``).

One ``run`` command may run several modes and seeds (``--mode none rag memrl --seed 0 1 2``), one run folder each,
one after another; ``report`` takes them all and aggregates the seeds of each setting.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

import anyio
from tqdm import tqdm

from memrl_harness.backends.sandbox import SandboxError
from memrl_harness.backends.sql import SQLServerError
from memrl_harness.benchmarks import REGISTRY, load_benchmark, memory_config, options_model
from memrl_harness.benchmarks.base import Benchmark
from memrl_harness.benchmarks.options import OptionError
from memrl_harness.discipline import DEFAULT_LAPSE_RATE, DISCIPLINES
from memrl_harness.install import shared_data_root
from memrl_harness.judgement import EVIDENCE, JUDGEMENTS, NOISE, SYCOPHANCY
from memrl_harness.llm import LLM, LLMError
from memrl_harness.metrics import write_summary
from memrl_harness.report import build_report, load_run
from memrl_harness.results import DEFAULT_TRIALS, MODES, RunConfig, RunDir, TransferConfig
from memrl_harness.run_settings import RunSettings
from memrl_harness.runner import RunError, Runner, default_run_dir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="memrl-harness", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="run a benchmark in one memory mode",
        description="Run a benchmark through memrl-mcp, in each --mode and --seed (one run folder each).",
        epilog=RUN_EPILOG.format(data=shared_data_root()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("benchmark", choices=sorted(REGISTRY))
    run.add_argument("--mode", nargs="+", choices=MODES, default=["memrl"], help="one run per mode (default: memrl)")
    run.add_argument("--epochs", type=int, default=3)
    run.add_argument("--tasks", type=int, help="run the first K tasks only")
    run.add_argument("--seed", nargs="+", type=int, default=[0], help="one run per seed (default: 0)")
    run.add_argument(
        "--trials", type=int, help=f"reflexion: attempts per task, reflections in between (default {DEFAULT_TRIALS})"
    )
    transfer = run.add_argument_group(
        "transfer", "build the memory on one split, then evaluate on another with the memory frozen (read-only)"
    )
    transfer.add_argument(
        "--eval-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="benchmark option of the evaluation, over the training's (e.g. split=valid_seen)",
    )
    transfer.add_argument(
        "--held-out",
        type=float,
        metavar="FRACTION",
        help="hold out this share of the tasks by a hash of their id; train on the rest",
    )
    client = run.add_argument_group(
        "the client's help", "memrl-mcp asks its MCP client (the harness) for what the reports leave out"
    )
    client.add_argument(
        "--user-rewards",
        type=float,
        metavar="ERROR",
        help="leave the rewards out: a simulated user answers memrl-mcp's question (elicitation), wrong with "
        "probability ERROR (e.g. 0.1)",
    )
    client.add_argument(
        "--client-model",
        action="store_true",
        help="hand over trajectories: the run's LLM writes the experiences memrl-mcp asks for (sampling)",
    )
    agent = run.add_argument_group(
        "the agent's discipline",
        "how faithfully the agent recalls and reports (mode memrl; memrl_harness/discipline.py)",
    )
    agent.add_argument(
        "--discipline",
        nargs="+",
        choices=DISCIPLINES,
        default=["disciplined"],
        help="one run per discipline: disciplined (every recall and report, the default), forgetful (forgets the "
        "recall or the report in a share of its tasks), hooked (the same forgetful agent, with the Claude Code "
        "plugin's hooks recalling before every task and holding it to every report)",
    )
    agent.add_argument(
        "--lapse-rate",
        type=float,
        metavar="SHARE",
        help=f"forgetful, hooked: the share of tasks in which the agent forgets one of the two (default "
        f"{DEFAULT_LAPSE_RATE})",
    )
    judged = run.add_argument_group(
        "the agent's judgement",
        "what the agent claims of its own work, and whether what happened reaches the memory beside it (mode memrl; "
        "memrl_harness/judgement.py)",
    )
    judged.add_argument(
        "--judgement",
        nargs="+",
        choices=JUDGEMENTS,
        default=["honest"],
        help=f"one run per judgement: honest (says what the checker said, the default), noisy (wrong in "
        f"{NOISE:.0%}% of its tasks), sycophantic (says success in {SYCOPHANCY:.0%}% of them, whatever happened)",
    )
    judged.add_argument(
        "--evidence",
        nargs="+",
        choices=EVIDENCE,
        default=["none"],
        help="one run per kind: none (the memory has the claim alone, the default), hooks (the agent works in "
        "Claude Code sessions with the plugin's real hooks, which see its check run as a test run and hand it to "
        "the memory)",
    )
    run.add_argument("--workers", type=int, default=1, help="episodes in parallel within an epoch")
    run.add_argument(
        "--config",
        help="the run's settings file: memrl-mcp's settings by group, and an llm: group (base_url, model) "
        "(default: the paper's constants for the benchmark, packaged)",
    )
    run.add_argument(
        "--memory-url",
        help="use a running memrl-mcp over HTTP instead of a fresh stdio one (token: MEMRL_MEMORY_TOKEN)",
    )
    run.add_argument("--runs", default="runs", help="folder of run folders (default: runs)")
    run.add_argument("--run-dir", help="this run's folder (default: RUNS/BENCHMARK-MODE-seedS); resumes if present")
    run.add_argument("--data", help="the benchmark's data file or folder (same as --option data=PATH)")
    run.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="benchmark option (memrl-harness options BENCHMARK lists them)",
    )

    options = commands.add_parser("options", help="the options of a benchmark, with their defaults and limits")
    options.add_argument("benchmark", choices=sorted(REGISTRY))

    commands.add_parser(
        "data",
        help="what data each benchmark reads, where to download it and where to put it",
        description="Print the benchmark data guide (docs/benchmark-data.md) and the data folder in use.",
    )

    report = commands.add_parser("report", help="markdown table and plots of one or several runs")
    report.add_argument("runs", nargs="+", type=Path)
    report.add_argument("--out", type=Path, default=Path("report"), help="output folder (default: report)")
    return parser.parse_args(argv)


RUN_EPILOG = """\
the LLM (alfworld, bigcodebench, hle, llb-db, llb-os, and controlled with --option agent=llm):
  MEMRL_LLM_BASE_URL   an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1
  MEMRL_LLM_MODEL      the model name
  MEMRL_LLM_API_KEY    its key (else OPENAI_API_KEY; a local server needs none)
  The endpoint and the model may instead sit in the --config file, beside the memory's settings:
    llm: {{base_url: http://127.0.0.1:8080/v1, model: smollm2-135m-instruct}}
  (the environment wins; the key stays in the environment). A local LLM: python -m memrl_harness.local_llm

the benchmarks' data:
  MEMRL_SHARED_DATA    the data folder; here: {data}
  --data PATH          one benchmark's file or folder instead
  memrl-harness data   prints what to download and where to put it
"""


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
    eval_options = _options(args.eval_option)
    modes, seeds = list(dict.fromkeys(args.mode)), list(dict.fromkeys(args.seed))
    disciplines = list(dict.fromkeys(args.discipline))
    judgements, evidence = list(dict.fromkeys(args.judgement)), list(dict.fromkeys(args.evidence))
    agents = [(d, j, e) for d in disciplines for j in judgements for e in evidence]
    try:
        if args.config and args.memory_url:
            raise ValueError("--config sets up the harness's own memory server; a --memory-url server has its own")
        if args.config and not Path(args.config).is_file():
            raise ValueError(f"--config: no settings file at {args.config}")
        if args.run_dir and len(modes) * len(seeds) * len(agents) > 1:
            raise ValueError(
                "--run-dir names one run's folder; several modes, seeds, disciplines, judgements or evidence go under "
                "--runs"
            )
        if disciplines != ["disciplined"] and modes != ["memrl"]:
            raise ValueError("--discipline: only --mode memrl recalls and reports, so only it can forget to")
        if (judgements != ["honest"] or evidence != ["none"]) and modes != ["memrl"]:
            raise ValueError("--judgement, --evidence: only --mode memrl reports a reward the agent claims")
        if args.lapse_rate is not None and disciplines == ["disciplined"]:
            raise ValueError("--lapse-rate: only a forgetful or hooked agent (--discipline) has lapses")
        if args.trials is not None and modes != ["reflexion"]:
            raise ValueError("--trials: only --mode reflexion retries")
        transfer = (
            TransferConfig(eval_options=eval_options, held_out=args.held_out) if eval_options or args.held_out else None
        )
        settings_file = Path(args.config).resolve() if args.config else memory_config(args.benchmark)
        run_settings = RunSettings.read(settings_file)
        benchmark = load_benchmark(args.benchmark, **options)
        eval_benchmark = load_benchmark(args.benchmark, **(options | eval_options)) if eval_options else None
        needs_llm = benchmark.needs_llm or (eval_benchmark is not None and eval_benchmark.needs_llm)
        needs_llm = needs_llm or args.client_model  # the client's model is the run's LLM
        llm = LLM.from_env(settings=run_settings.llm) if needs_llm else None
        configs = [
            RunConfig(
                benchmark=args.benchmark,
                mode=mode,
                epochs=args.epochs,
                tasks=args.tasks,
                seed=seed,
                workers=args.workers,
                memory_config=None if args.memory_url else str(settings_file),
                memory_url=args.memory_url,
                model=llm.model if llm else None,
                benchmark_options=options,
                trials=args.trials,
                transfer=transfer,
                user_rewards=args.user_rewards,
                client_model=args.client_model,
                discipline=discipline,
                lapse_rate=None if discipline == "disciplined" else args.lapse_rate,
                judgement=judgement,
                evidence=kind,
            )
            for mode in modes
            for discipline, judgement, kind in agents
            for seed in seeds
        ]
    except OptionError as error:
        print(f"memrl-harness: {error}\n(memrl-harness options {args.benchmark} lists its options)", file=sys.stderr)
        return 2
    # Missing data, no LLM configured, inconsistent settings, a sandbox or database server that cannot run here.
    except (ValueError, LLMError, SandboxError, SQLServerError) as error:
        print(f"memrl-harness: {error}", file=sys.stderr)
        return 2
    headlines = []
    for config in configs:
        run_dir = RunDir(Path(args.run_dir) if args.run_dir else default_run_dir(Path(args.runs), config))
        code = _run_one(config, benchmark, eval_benchmark, run_dir, llm)
        if code:
            return code
        headlines.append(_headline(run_dir))
    print(json.dumps(headlines[0] if len(headlines) == 1 else headlines, indent=2))
    return 0


def _headline(run_dir: RunDir) -> dict[str, object]:
    """The run's summary files written, and its headline figures."""
    loaded = load_run(run_dir.path)
    write_summary(run_dir, loaded.summary)
    headline = loaded.summary.model_dump(
        include={"last_success", "best_success", "final_csr", "forgetting_rate", "q_critic"}
    )
    if loaded.transfer is not None:
        write_summary(run_dir.transfer, loaded.transfer)
        headline["transfer_success"] = loaded.transfer.last_success
    return {"run_dir": str(run_dir.path), **headline}


def _run_one(
    config: RunConfig, benchmark: Benchmark, eval_benchmark: Benchmark | None, run_dir: RunDir, llm: LLM | None
) -> int:
    bar = tqdm(unit="episode", file=sys.stderr, disable=None)  # disabled when stderr is no terminal

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        anyio.run(Runner(config, benchmark, run_dir, llm, eval_benchmark).run, progress)
    except RunError as error:
        print(f"memrl-harness: {error}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    return 0


def report_command(args: argparse.Namespace) -> int:
    print(build_report(args.runs, args.out))
    return 0


def data_command(args: argparse.Namespace) -> int:
    guide = resources.files("memrl_harness").joinpath("benchmark-data.md").read_text()
    print(f"The data folder in use: {shared_data_root()} (MEMRL_SHARED_DATA to choose another)\n\n{guide}")
    return 0


def options_command(args: argparse.Namespace) -> int:
    print(f"{args.benchmark} --option KEY=VALUE (an empty VALUE is the default):")
    print(options_model(args.benchmark).describe())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    commands = {"run": run_command, "report": report_command, "options": options_command, "data": data_command}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
