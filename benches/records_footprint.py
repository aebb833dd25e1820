"""What a records table costs in memory, column by column: in the schema's pandas dtypes (v2:
``Int64``, ``string``) and in the narrowest pandas dtype that holds the same values (``category``
for a string column; ``Int8``/``Int16``/``Int32``/``Int64`` by the column's range), each measured
by pandas' own ``memory_usage(deep=False)`` of the converted column (a ``string`` column: its
8-byte row pointers, the shared str objects not counted; a ``category`` column: its codes and its
categories' pointers; a nullable integer: values and a 1-byte mask). Every narrowed column is
converted back and compared with the original; a column that does not come back equal is an
error, not a figure.

    python benches/records_footprint.py RECORDS.parquet [--input TRACE] [--json OUT.json]

``--input``: the trace the records were normalised from, for the figures as multiples of its size
(issue 11's peak-RSS goal is ≤ 3x the file), beside the interpreter's own footprint with what
``kernelmap normalise`` imports (measured in a fresh process: VmRSS after the imports).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

_INTS = ("Int8", "Int16", "Int32", "Int64")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    bytes: int
    narrow_dtype: str
    narrow_bytes: int


def narrowest(col: pd.Series) -> pd.Series:
    """The column in the narrowest dtype that holds its values: strings as ``category``, nullable
    integers in the smallest ``Int<N>`` whose range holds the column's minimum and maximum (an
    all-NA column: ``Int8``); other dtypes as they are."""
    if isinstance(col.dtype, pd.StringDtype):
        return col.astype("category")
    if isinstance(col.dtype, pd.api.extensions.ExtensionDtype) and col.dtype.name in _INTS:
        values = col.dropna()
        lo, hi = (int(values.min()), int(values.max())) if len(values) else (0, 0)
        for name in _INTS:
            info = np.iinfo(name.lower())
            if info.min <= lo and hi <= info.max:
                return col.astype(name)
    return col


def footprint(df: pd.DataFrame) -> list[Column]:
    """Each column's bytes in its own dtype and in ``narrowest``'s; raises ValueError where a
    narrowed column does not convert back to the same values."""
    out = []
    for name in df.columns:
        col = df[name]
        narrow = narrowest(col)
        if not narrow.astype(col.dtype).equals(col):
            raise ValueError(f"column {name}: {narrow.dtype} does not hold its values")
        out.append(Column(name, str(col.dtype), int(col.memory_usage(index=False, deep=False)),
                          str(narrow.dtype), int(narrow.memory_usage(index=False, deep=False))))
    return out


_IMPORTS = """
import re
import kernelmap.normalise, kernelmap.cli, pyarrow.parquet
print(int(re.search(r"VmRSS:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024)
"""


def interpreter_bytes() -> int | None:
    """VmRSS of a fresh interpreter after ``kernelmap normalise``'s imports; None off Linux."""
    if not Path("/proc/self/status").exists():
        return None
    proc = subprocess.run([sys.executable, "-c", _IMPORTS], capture_output=True, text=True, check=True)
    return int(proc.stdout.strip())


def summary(cols: list[Column], rows: int, input_bytes: int | None, interpreter: int | None) -> dict:
    """Totals (bytes, bytes a row) and, where the input's size is known, the totals beside the
    interpreter as multiples of it."""
    v2, narrow = sum(c.bytes for c in cols), sum(c.narrow_bytes for c in cols)
    out = {"rows": rows, "bytes": v2, "narrow_bytes": narrow,
           "bytes_per_row": v2 / rows if rows else None, "narrow_bytes_per_row": narrow / rows if rows else None,
           "interpreter_bytes": interpreter, "input_bytes": input_bytes, "columns": [asdict(c) for c in cols]}
    if input_bytes:
        base = interpreter or 0
        out["floor_x_input"] = (base + v2) / input_bytes
        out["narrow_floor_x_input"] = (base + narrow) / input_bytes
    return out


def render(s: dict) -> str:
    lines = [f"{'column':16s} {'dtype':8s} {'MB':>8s}  {'narrowest':10s} {'MB':>8s}"]
    for c in s["columns"]:
        lines.append(f"{c['name']:16s} {c['dtype']:8s} {c['bytes'] / 1e6:8.2f}  {c['narrow_dtype']:10s} "
                     f"{c['narrow_bytes'] / 1e6:8.2f}")
    lines.append(f"{s['rows']:,} rows: {s['bytes'] / 1e6:.1f} MB in the schema's dtypes "
                 f"({s['bytes_per_row'] or 0:.0f} B a row), {s['narrow_bytes'] / 1e6:.1f} MB in the narrowest "
                 f"({s['narrow_bytes_per_row'] or 0:.0f} B a row)")
    if s.get("interpreter_bytes") is not None:
        lines.append(f"interpreter with normalise's imports: {s['interpreter_bytes'] / 1e6:.1f} MB")
    if s.get("floor_x_input") is not None:
        lines.append(f"the interpreter and one frame, before any work, against the {s['input_bytes'] / 1e6:.1f} MB "
                     f"input: {s['floor_x_input']:.2f}x in the schema's dtypes, {s['narrow_floor_x_input']:.2f}x "
                     "in the narrowest")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", help="a records Parquet file (kernelmap normalise -o)")
    p.add_argument("--input", help="the trace it was normalised from (figures as multiples of its size)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    from kernelmap import schema
    from kernelmap.errors import KernelmapError

    try:
        df = schema.read_parquet(args.records)
        input_bytes = os.path.getsize(args.input) if args.input else None
    except (KernelmapError, OSError) as exc:
        print(f"records_footprint: {exc}", file=sys.stderr)
        return 2
    s = summary(footprint(df), len(df), input_bytes, interpreter_bytes() if args.input else None)
    print(render(s))
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
