"""``kernelmap save-job``: save one bench job's per-framework step benchmarks as ONE numbered run.

``nox -s bench`` and ``nox -s benchmarks`` run each framework's step benchmarks in a pytest process of
its own, each writing ``--benchmark-json`` to a scratch file; this merges those files into the
pytest-benchmark storage (``kernelmap.history.job.save_job``: the next ``NNNN_<commit>_<date>.json`` of this
machine, never overwriting, with the job id as ``"kernelmap_job"``) and prints the saved file's path.
A file that is missing, empty or broken is an error naming it, and nothing is written.
"""

from __future__ import annotations

import argparse
import os

from .history.job import save_job
from .history.keys import JOB_ENV
from .history.storage import default_storage


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("parts", nargs="+", metavar="FILE.json",
                        help="each framework's pytest --benchmark-json file of the job, in the order to save them")
    parser.add_argument("--job", default=os.environ.get(JOB_ENV),
                        help=f"the job id (default ${JOB_ENV}; `nox -s bench` sets it to the run directory's name)")
    parser.add_argument("--storage", default=str(default_storage()),
                        help="pytest-benchmark storage folder (default: .benchmarks)")
    parser.add_argument("--machine", default=None,
                        help="the storage's machine folder (default: pytest-benchmark's machine id of this Python)")


def main(args: argparse.Namespace) -> int:
    path = save_job(args.storage, args.parts, args.job, args.machine)
    print(f"saved job {args.job}: {path}")
    return 0
