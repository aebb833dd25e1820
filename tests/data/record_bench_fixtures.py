"""Record the step-benchmark fixtures: two bench jobs' per-framework ``--benchmark-json`` files.

    python tests/data/record_bench_fixtures.py [--jobs 2] [--out tests/data/bench_jobs]

Each job runs, per framework of the noxfile's list (``STEP_BENCH_FRAMEWORKS``), the pytest command
line ``nox -s bench`` runs (``noxfile.step_benchmark_argv``) in a process of its own, by that
framework's interpreter (``KERNELMAP_PYTHON_<NAME>``, else ``.nox/<name>-workers`` where it exists,
else ``.nox/frameworks``), on the CPU at batch size 64, synthetic data, 2 rounds of
``timing.BLOCK_STEPS`` steps (``--benchmark-max-time=0.01 --benchmark-min-rounds=2``). The files
are stored as OUT/job<N>/<framework>.json.gz (gzip level 9, mtime 0), their content as pytest wrote
it but for ``machine_info["node"]`` (the host name: ``fixture-host``). A framework that ran no
benchmark (not importable here) is left out and said so.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _noxfile():
    spec = importlib.util.spec_from_file_location("_kernelmap_noxfile", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _python(nf, framework: str) -> str:
    var = os.environ.get(f"KERNELMAP_PYTHON_{framework.upper()}")
    own = ROOT / nf.own_env(framework) / "bin" / "python"
    if var:
        return var
    return str(own if own.exists() else ROOT / nf.FRAMEWORKS_ENV / "bin" / "python")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, default=HERE / "bench_jobs")
    args = p.parse_args()
    nf = _noxfile()
    for n in range(1, args.jobs + 1):
        job_dir = args.out / f"job{n}"
        job_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as scratch:
            for fw in nf.STEP_BENCH_FRAMEWORKS:
                part = Path(scratch) / f"{fw}.json"
                argv = nf.step_benchmark_argv(fw, part, "--benchmark-max-time=0.01", "--benchmark-min-rounds=2",
                                              "--bench-data=synthetic", "-k", "cpu-64", "-q")
                proc = subprocess.run([_python(nf, fw), "-m", *argv], cwd=ROOT, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
                    return proc.returncode
                if not part.is_file() or part.stat().st_size == 0:
                    print(f"job{n}: {fw} ran no benchmark; left out")
                    continue
                data = json.loads(part.read_text())
                data["machine_info"]["node"] = "fixture-host"
                out = job_dir / f"{fw}.json.gz"
                with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz:
                    gz.write(json.dumps(data, indent=4, ensure_ascii=True).encode())
                print(f"job{n}: {fw}: {len(data['benchmarks'])} benchmark(s) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
