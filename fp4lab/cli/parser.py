"""The parser of the `fp4lab` command: every subcommand and option with its help."""

from __future__ import annotations

import argparse
import math

import fp4lab
from fp4lab.cli import replicate, results, run
from fp4lab.cli.run import compile_cache_folder


def formats(_args) -> int:
    from fp4lab.core import formats

    print(f"fp4lab {fp4lab.__version__}")
    print("element formats:", ", ".join(formats.format_names()))
    return 0


def demo(_args) -> int:
    from fp4lab import demo

    return demo.main()


EXAMPLES = """examples:
  fp4lab run experiments/quickstart.py --workers 2       run a sweep (resumes where it stopped)
  fp4lab run experiments/quickstart.py --dry-run         its cells and seeds, what is finished
  fp4lab run experiments/own_model.py --design streams   quant seeds crossed with init=data
  fp4lab run experiments/quickstart.py --set lr=1e-3 --set d_model=128
                                                         the same sweep with other config values
  fp4lab run experiments/quickstart.py --telemetry 25    with per-layer error and drift telemetry
  fp4lab plot results/quickstart                         its figures, drift heatmaps included
  fp4lab ls results                                      runs per cell of every results folder
  fp4lab show results/quickstart                         the summary table
  fp4lab report results/quickstart                       one HTML page with tables and figures
  fp4lab export --tensorboard results/quickstart         every run's metrics for TensorBoard
  fp4lab replicate results/quickstart --seeds-from 8     the study on fresh seeds: its words
  fp4lab formats                                         the element formats
  fp4lab run -h                                          the options of one command
"""


class Parser(argparse.ArgumentParser):
    """An argument parser that never takes an abbreviation for an option (`--seed` is an
    error, not `--seeds`); the subcommands' parsers are made of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def number(kind: type, low: int, high: int | None = None):
    """An argparse type: a `kind` (int or float) >= `low` (and <= `high`), else a clear error."""
    what = f"{'an integer' if kind is int else 'a number'} >= {low}"
    what += f" and <= {high}" if high is not None else ""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= (math.inf if high is None else high):  # NaN too
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse measures the commands' names without their indent, so a name of 9 letters
    (`replicate`) would push its help to the next line: the indent is counted here."""

    def add_argument(self, action):
        super().add_argument(action)
        if action.help is not argparse.SUPPRESS and hasattr(action, "add_parser"):
            names = [len(name) for name in action.choices]
            indented = max(names, default=0) + self._current_indent + self._indent_increment
            self._action_max_length = max(self._action_max_length, indented)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the `fp4lab` command: every subcommand and option with its help."""
    parser = Parser(
        prog="fp4lab",
        description=fp4lab.__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"fp4lab {fp4lab.__version__}")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, fn, text in (
        ("formats", formats, "list the element formats"),
        ("demo", demo, "a tour: formats, a quantized model, telemetry"),
    ):
        sub.add_parser(name, help=text, description=text).set_defaults(func=fn)

    text = "run an experiment file (resumes where it stopped)"
    run_parser = sub.add_parser("run", help=text, description=text)
    run_parser.add_argument("experiment", help="a Python file with get_config() and sweep(add)")
    run_parser.add_argument(
        "--out", metavar="DIR", help="results folder (default: results/<experiment name>)"
    )
    run_parser.add_argument(
        "--seeds",
        type=number(int, 1),
        metavar="N",
        help="run seeds 0..N-1 in every cell (with --design: N levels a stream)",
    )
    run_parser.add_argument(
        "--design",
        choices=("streams",),
        help="the seeds of every cell by design: streams = the quant stream crossed with "
        "init=data, 3 levels each (9 runs a cell), so that the verdict judges the quant "
        "stream's own spread (fl.design.crossed())",
    )
    run_parser.add_argument(
        "--steps",
        type=number(int, 1),
        metavar="N",
        help="override the number of steps of every cell",
    )
    run_parser.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="set a config field in every cell, e.g. --set lr=1e-3 --set d_model=128 "
        "(repeatable; the value is parsed as the field's type; checked like the file)",
    )
    run_parser.add_argument(
        "--telemetry",
        type=number(int, 1),
        metavar="K",
        help="every K steps, record the telemetry of every quantized GEMM with the "
        "high-precision shadow: operand errors (quant/), gradients against the exact ones "
        "(grad/) and the drift of each layer's activations and gradients (acc/); the same as "
        "--set telemetry_every=K --set shadow=True",
    )
    run_parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list the cells, trace each, time one run of the first unfinished cell (the "
        "probe) and estimate the sweep's time, stop",
    )
    run_parser.add_argument(
        "--no-probe", action="store_true", help="with --dry-run: no probe run, no estimate"
    )
    run_parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where cells compute: local (this machine, --workers processes) or ray (one Ray "
        "task per cell; see --address) (default local)",
    )
    run_parser.add_argument(
        "--address",
        metavar="ADDR",
        help="ray: the cluster to join (default: RAY_ADDRESS, else start one here)",
    )
    run_parser.add_argument(
        "--ray-cpus",
        type=number(float, 0),
        default=1,
        metavar="N",
        help="ray: CPUs per cell (default 1)",
    )
    run_parser.add_argument(
        "--ray-gpus",
        type=number(float, 0),
        default=0,
        metavar="N",
        help="ray: GPUs per cell (default 0)",
    )
    run_parser.add_argument(
        "--max-retries",
        type=number(int, 0),
        default=3,
        metavar="N",
        help="ray: reruns of a cell whose worker died (default 3)",
    )
    run_parser.add_argument(
        "--workers",
        type=number(int, 1, replicate.MAX_WORKERS),
        default=1,
        metavar="N",
        help="local: processes computing cells (default 1)",
    )
    run_parser.add_argument(
        "--force", action="store_true", help="run into a folder holding another experiment"
    )
    run_parser.add_argument(
        "--rerun-stale",
        action="store_true",
        help="recompute finished runs that another code version (fp4lab, git, jax) made",
    )
    run_parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        help=f"jax's persistent compilation cache (default {compile_cache_folder()}), with "
        "each cell's traced program in its programs/ folder: reruns and added seeds skip "
        "tracing and compiling; results are bit-identical without it",
    )
    run_parser.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="trace and compile every cell afresh (also for code that patches fp4lab at run time)",
    )
    run_parser.add_argument("--quiet", action="store_true", help="no progress bar")
    run_parser.add_argument(
        "--verbose",
        action="store_true",
        help="say which quantizer runs here (the CPU kernel or the jnp path) and why",
    )
    run_parser.add_argument(
        "--progress-every",
        type=int,
        metavar="K",
        help="steps between progress reports from inside a cell (default: about 50 a run; "
        "with --quiet, none unless --stream; 0: only whole cells move the bar). Reports change "
        "no number; on the CPU they cost a run about nothing and the compile caches keep their "
        "programs (elsewhere, or without fp4lab's CPU kernels, they are a Python callback and "
        "a rerun with them compiles afresh)",
    )
    run_parser.add_argument(
        "--stream",
        action="store_true",
        help="append each reported step of each run to OUT/stream.jsonl while it runs",
    )
    run_parser.add_argument("--no-figures", action="store_true", help="do not write the figures")
    run_parser.add_argument(
        "--xla-log",
        action="store_true",
        help=argparse.SUPPRESS,  # deprecated no-op: XLA's lines are no longer filtered
    )
    run_parser.set_defaults(func=run.run)

    for name, fn, text in (
        ("ls", results.ls, "runs per cell of a results folder (or of every folder under it)"),
        ("show", results.show, "the summary table of a results folder"),
        ("plot", results.plot, "write the standard figures (PNG)"),
        ("report", results.report, "write one self-contained HTML page"),
        ("compact", results.compact, "move the per-run files into one Parquet dataset"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("results", help="a results folder")
        if name in ("plot", "report"):
            p.add_argument("--out", help="where to write (default: inside the results folder)")
        if name == "show":
            p.add_argument("--stale", action="store_true", help="the stale runs instead")
        if name == "compact":
            p.add_argument(
                "--check",
                action="store_true",
                help="compact nothing: read every part of the dataset and say which are damaged "
                "(exit 1 if any)",
            )
        p.set_defaults(func=fn)

    text = "write every run's metrics in another format (TensorBoard event files)"
    export_parser = sub.add_parser("export", help=text, description=text)
    export_parser.add_argument("results", help="a results folder")
    kinds = export_parser.add_mutually_exclusive_group(required=True)
    kinds.add_argument(
        "--tensorboard",
        action="store_true",
        help="TensorBoard event files: one folder per run, <cell>/init<i>_data<d>_quant<q>, every "
        'metric a scalar by step (needs tensorboardX: pip install "fp4lab[tensorboard]")',
    )
    export_parser.add_argument(
        "--out", metavar="LOGDIR", help="where to write (default: RESULTS/tensorboard)"
    )
    export_parser.set_defaults(func=results.export)

    replicate.add_parser(sub, number)

    from fp4lab.diagnosis import command as diagnose_command  # the standard library only

    diagnose_command.add_parser(sub)
    return parser
