"""Mutation campaign: N mutations of the real fixtures per parser (tests/mutations.py), and a table
of how each parser handled them.

    python benches/mutation_campaign.py [-n 1000] [--seed 0] [--only SUBSTRING]

"Handled cleanly" = the parser raised the project's ParseError/SchemaError, or returned records
that pass ``schema.validate``. Anything else is a failure; the first traceback of each parser is
printed (one per distinct exception type and place). Exit status 1 when any parser failed.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import mutations as M  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1000, help="mutations per parser x fixture (default 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="only targets whose name contains this")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    rows = []
    first_tb: dict[str, dict[str, str]] = {}  # target -> failure signature -> first traceback
    ops_failed: dict[str, collections.Counter] = {}
    with tempfile.TemporaryDirectory(prefix="kernelmap-mut-") as tmp:
        for t in M.targets():
            if args.only and args.only not in t.name:
                continue
            tried = errors = records = failed = 0
            t0 = time.perf_counter()
            for _ in range(args.n):
                op, seed = rng.choice(t.ops), rng.randrange(2**32)
                d = M.fresh_dir(Path(tmp) / "m")
                path = M.mutate(t, op, seed, d)
                tried += 1
                try:
                    outcome = M.check(t, path)
                except Exception:  # the campaign's job is to count these
                    failed += 1
                    ops_failed.setdefault(t.name, collections.Counter())[op] += 1
                    exc = sys.exc_info()[1]
                    frame = traceback.extract_tb(exc.__traceback__)[-1]
                    sig = f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}"
                    first_tb.setdefault(t.name, {}).setdefault(sig, f"op={op} seed={seed}\n{traceback.format_exc()}")
                    continue
                errors += outcome == "error"
                records += outcome == "records"
            rows.append((t.name, tried, errors + records, errors, records, failed, time.perf_counter() - t0))
            print(f"  {t.name}: {tried} tried, {failed} failed ({rows[-1][-1]:.1f} s)", file=sys.stderr, flush=True)
    w = max(len(r[0]) for r in rows)
    print(f"{'parser:fixture':<{w}}  {'tried':>6}  {'handled':>7}  {'(error':>7}  {'records)':>8}  {'failures':>8}  {'s':>6}")
    for name, tried, handled, err, rec, failed, secs in rows:
        print(f"{name:<{w}}  {tried:>6}  {handled:>7}  {err:>7}  {rec:>8}  {failed:>8}  {secs:>6.1f}")
    tot = [sum(r[i] for r in rows) for i in (1, 2, 5)]
    print(f"{'total':<{w}}  {tot[0]:>6}  {tot[1]:>7}  {'':>7}  {'':>8}  {tot[2]:>8}")
    for name, sigs in first_tb.items():
        for sig, tb in sigs.items():
            print(f"\n=== {name}: first {sig} (failing ops: {dict(ops_failed[name])})\n{tb}")
    return 1 if first_tb else 0


if __name__ == "__main__":
    sys.exit(main())
