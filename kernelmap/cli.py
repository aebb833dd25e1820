"""The ``kernelmap`` console script.

Each subcommand lives in its own module, which exposes ``add_arguments(parser)`` and
``main(args) -> int``. Modules are imported only when their subcommand runs, so no framework
is imported by ``kernelmap --help`` or by a subcommand that does not need it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys

from . import frameworks, heap, interrupt
from .errors import KernelmapError, ParseError

heap.arrow_uses_c_heap()  # before any subcommand imports pyarrow (Arrow reads it once)

LABELS = [d.label for d in frameworks.REGISTRY.values()]
FRAMEWORK_LIST = ", ".join(LABELS[:-1]) + f" and {LABELS[-1]}" if len(LABELS) > 1 else LABELS[0]

# name -> (module, one-line help); then the commands a framework brings (its descriptor's ``commands``)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("kernelmap.run.cli", "train and time one framework or all of them into a run directory"),
    "parity": ("kernelmap.parity", "check that two frameworks compute the same model (fp32, CPU or GPU)"),
    "doctor": ("kernelmap.doctor", "say what is installed and usable here"),
    "normalise": ("kernelmap.normalise", "turn traces and library logs into schema records (Parquet)"),
    "report": ("kernelmap.reports.cli", "write the side-by-side HTML/PNG report of run directories"),
    "diff": ("kernelmap.reports.diffcli", "two runs, cases or traces kernel by kernel, with a verdict against noise"),
    "findings": ("kernelmap.reports.findingscli", "a run's findings ranked by what they would save; "
                                                  "--check-remedies runs the remedies and checks the predictions"),
    "compare": ("kernelmap.history.compare", "compare saved pytest-benchmark runs like with like"),
    "save-job": ("kernelmap.savejob", "save one bench job's per-framework step benchmarks as one numbered run"),
    **{name: cmd for d in frameworks.REGISTRY.values() for name, cmd in d.commands.items()},
}


def _command_in(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is one), or None."""
    return next((a for a in argv if a in COMMANDS), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given ``argv``, only the subcommand it names imports its module (its
    options), so ``kernelmap --help`` imports none of them (pandas, matplotlib: seconds)."""
    wanted = _command_in(argv) if argv is not None else None
    parser = argparse.ArgumentParser(
        prog="kernelmap",
        description=f"{FRAMEWORK_LIST} side by side: framework op -> library call -> kernel, and what it costs.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"kernelmap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        if argv is None or name == wanted:
            importlib.import_module(module).add_arguments(p)
    return parser


def _error_payload(exc: BaseException) -> dict:
    payload: dict = {"error": str(exc), "type": type(exc).__name__}
    if isinstance(exc, ParseError):
        payload.update(file=exc.path, line=exc.line, record=exc.record, cause=exc.cause)
    return payload


def _interrupted(args: argparse.Namespace, want_json: bool, signals: interrupt.Interrupt) -> int:
    what = "terminated" if signals.signum == signal.SIGTERM else "interrupted"
    if want_json:
        print(json.dumps({"error": what, "type": "KeyboardInterrupt"}))
    print(f"kernelmap {args.command}: {what}; nothing partial was kept", file=sys.stderr)
    return signals.exit_code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    want_json = bool(getattr(args, "json", False))
    signals = interrupt.install()
    try:
        rc = int(importlib.import_module(args._module).main(args) or 0)
        sys.stdout.flush()  # a buffered stdout (a pipe) meets a reader that left here, not at exit
        return rc
    except KernelmapError as exc:
        if signals.seen:
            return _interrupted(args, want_json, signals)
        if want_json:
            print(json.dumps(_error_payload(exc)))
        print(f"kernelmap {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return _interrupted(args, want_json, signals)
    except BrokenPipeError:  # `kernelmap ... | head`: the reader left; say nothing more (Python docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception:
        if signals.seen:  # Ctrl-C that a C extension turned into another exception (see interrupt.py)
            return _interrupted(args, want_json, signals)
        raise
    finally:
        interrupt.uninstall(signals)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
