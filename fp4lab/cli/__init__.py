"""The `fp4lab` command (bare `fp4lab` prints the help with examples).

fp4lab run EXPERIMENT [--out DIR] [--seeds N] [--steps N] [--set FIELD=VALUE ...] [--dry-run]
                      [--workers N] [--force] [--rerun-stale]
                      [--executor local|ray] [--address ADDR] [--ray-cpus N] [--ray-gpus N]
                      [--max-retries N]
fp4lab ls RESULTS          runs per cell (done, failed, missing) and the stale runs
fp4lab show RESULTS        the summary table: loss gap with a seed interval, divergences,
                           tokens to target; a warning when the runs come from different code
fp4lab show RESULTS --stale    the same for the stale runs (the file no longer asks for them)
fp4lab plot RESULTS        the standard figures, as PNG files in RESULTS/figures
fp4lab report RESULTS      one self-contained HTML page: RESULTS/report.html
fp4lab compact RESULTS     a finished sweep's per-run files as one Parquet dataset
fp4lab export --tensorboard RESULTS [--out LOGDIR]
                           every run's metrics as TensorBoard scalars, one folder per run
                           (default LOGDIR: RESULTS/tensorboard)
fp4lab replicate RESULTS --seeds-from N [--out DIR] [--workers N] [--executor local|ray]
                           a finished study's cells on fresh seeds (every seed moved up by N,
                           refused where it meets a seed the study used); its words on the
                           fresh and the pooled seeds beside the committed ones (words.csv)
fp4lab diagnose EXPERIMENT [--verify] [--out DIR]
                           which layers and GEMMs to keep in high precision (docs/diagnose.md)
fp4lab formats | demo      the element formats; a tour of the toolkit

Options are never abbreviated (`--seed` is an error, not `--seeds`). A folder given to show,
plot, report or export that is not a results folder (no experiment.json, no runs/) is an error.

Each command imports what it runs inside its function, on purpose (the package's layers sit
below the CLI, so no cycle is dodged): `fp4lab --help`, a mistyped option, `ls` and `show`
answer without loading jax, flax or optax (tests/sweep/test_index.py checks `ls` and `show`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings

from fp4lab.cli.parser import build_parser
from fp4lab.cli.run import compile_cache_folder

__all__ = [
    "build_parser",
    "compile_cache_folder",
    "console",
    "main",
    "restore_termination",
    "terminate_as_interrupt",
]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:  # bare `fp4lab`: the help with examples
        parser.print_help()
        return 0
    previous = terminate_as_interrupt() if args.command in LONG else None
    formatwarning = warnings.formatwarning
    warnings.formatwarning = one_line_warning
    try:
        return args.func(args)
    except BrokenPipeError:  # `fp4lab ... | head`: the reader is gone, say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:
        if not isinstance(e, user_errors()):
            raise
        print(f"fp4lab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        resume = "; finished runs are stored, run again to resume"
        print(
            f"\nfp4lab {args.command}: interrupted{resume * (args.command != 'diagnose')}",
            file=sys.stderr,
        )
        return 130
    finally:
        warnings.formatwarning = formatwarning
        restore_termination(previous)


# The commands that run for long: SIGTERM stops them as Ctrl-C does (`terminate_as_interrupt`)
LONG = ("run", "replicate", "diagnose")


def console() -> None:
    """The `fp4lab` command: `main()`, then the process's exit with its code.

    An interrupted command (Ctrl-C, SIGTERM: exit code 130) ends at once (`os._exit`) once jax
    is loaded: XLA may still run native threads then (a compile, a program dispatched
    asynchronously), and the interpreter's finalization under them crashed (a segmentation
    fault instead of exit 130, on a SIGTERM during `fp4lab run`'s first compile). What a run
    stores is on disk before `main` returns: records are written atomically, the index commits
    per run, the workers are stopped and the folder's lock is released as `main` unwinds (and
    the reaper ends a Ray cluster the run started, as after a kill -9)."""
    code = main()
    if code == 130 and "jax" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


# The errors a command reports in one line (exit 2), by module: the module of an error raised is
# loaded, so those not loaded are not looked for, and `ls` or `show` never load the trainer or jax
# just to name the errors of `run`.
USER_ERRORS = {
    "fp4lab.sweep.experiment": "ExperimentError",
    "fp4lab.sweep.ray": "RayNotInstalled",
    "fp4lab.sweep.records": "StoreError",
    "fp4lab.train.config": "ConfigError",
}


def user_errors() -> tuple[type[BaseException], ...]:
    """OSError and the `USER_ERRORS` of the modules this process has loaded."""
    loaded = [getattr(sys.modules[m], name) for m, name in USER_ERRORS.items() if m in sys.modules]
    return (OSError, *loaded)


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def terminate_as_interrupt():
    """SIGTERM (a scheduler's timeout, `kill`) raises KeyboardInterrupt in the main thread, so
    `fp4lab run`, `replicate` and `diagnose` (`LONG`) stop their workers and exit as on Ctrl-C,
    with one line. Returns what to pass to
    `restore_termination` (None off the main thread, where nothing is installed).

    A KeyboardInterrupt raised where Python ignores exceptions (a garbage-collection callback,
    such as jax's, or a `__del__`) was lost, and the run went on to its end: such a lost one,
    of a SIGTERM or of a Ctrl-C, is delivered again (the signal is sent anew) instead of
    reported as ignored with a traceback."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous_hook = sys.unraisablehook

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    def hook(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, KeyboardInterrupt):  # SIGTERM's (handler) or Ctrl-C's (SIGINT)
            term = str(exc) == f"signal {int(signal.SIGTERM)}"
            again = signal.SIGTERM if term else signal.SIGINT
            resend = threading.Timer(0.05, os.kill, (os.getpid(), again))
            resend.daemon = True
            resend.start()
            return
        previous_hook(unraisable)

    sys.unraisablehook = hook
    return signal.signal(signal.SIGTERM, handler), previous_hook


def restore_termination(saved) -> None:
    """Undoes `terminate_as_interrupt` (its return value; None: nothing to undo)."""
    if saved is not None:
        signal.signal(signal.SIGTERM, saved[0])
        sys.unraisablehook = saved[1]
