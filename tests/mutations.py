"""Mutations of the real fixtures in tests/data, shared by tests/test_robustness_parsers.py
(hypothesis draws the parameters) and benches/mutation_campaign.py (a seeded RNG draws them).

A mutation is ``(op, seed)``: ``mutate(target, op, seed)`` writes the mutated file and returns its
path. Text and JSON fixtures are mutated on their gunzipped content (a mutated gzip stream only
tests zlib), plus ``gzip_*`` ops on the compressed bytes; the nsys export is mutated as bytes of
the database file and through SQL (tables/columns dropped, rows deleted/duplicated/nulled, values
replaced); records Parquet as bytes and through its schema (version, columns, dtypes, values).

Every parser may only raise the project's ``ParseError``/``SchemaError``; when it returns records,
they must pass ``schema.validate`` (``check``).
"""

from __future__ import annotations

import functools
import gzip
import json
import random
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kernelmap import adapters, schema
from kernelmap.adapters import (
    cublas_log,
    cublaslt_log,
    cudnn_log,
    kineto,
    mkl_verbose,
    mxnet_profiler,
    nsys,
    onednn,
)
from kernelmap.errors import ParseError, SchemaError

DATA = Path(__file__).resolve().parent / "data"
RECORDS = DATA / "report_cpu_run" / "records.parquet"

BYTE_OPS = ("truncate", "flip", "flip_many", "gzip_truncate", "gzip_flip")
LINE_OPS = ("drop_line", "drop_lines", "dup_line", "swap_lines", "shuffle_lines", "interleave_blocks", "empty")
JSON_OPS = ("shuffle_events", "drop_events", "dup_events", "event_field_drop", "event_field_junk")
SQL_OPS = ("drop_table", "drop_column", "delete_rows", "dup_rows", "null_values", "junk_values")
PARQUET_OPS = ("version", "drop_meta", "drop_column", "extra_column", "bad_enum", "negative_dur", "retype")


@dataclass(frozen=True)
class Target:
    name: str  # "<parser>:<fixture>"
    fixture: Path
    parse: Callable[[Path], pd.DataFrame]
    ops: tuple[str, ...]
    kind: str  # text | json | sqlite | parquet


def _read_parquet(p: Path) -> pd.DataFrame:
    return schema.read_parquet(p)


_TEXT = {"gpu_cudnn.log.gz": cudnn_log, "gpu_cublas.log.gz": cublas_log, "gpu_cublaslt.log.gz": cublaslt_log,
         "cpu_torch_onednn.log.gz": onednn, "cpu_mxnet_onednn.log.gz": onednn,
         "cpu_run_all/pytorch/bs64/blas.log.gz": mkl_verbose}
_JSON = {"cpu_torch_kineto.json.gz": kineto, "cpu_mxnet_profile.json.gz": mxnet_profiler}


def targets() -> list[Target]:
    """Every parser x fixture pair: each adapter directly on its fixtures, ``adapters.read`` (format
    sniffed) on every fixture, ``schema.read_parquet`` on the real run's records."""
    out = []
    text_ops = BYTE_OPS + LINE_OPS
    json_ops = BYTE_OPS + LINE_OPS + JSON_OPS
    for fx, mod in _TEXT.items():
        out.append(Target(f"{mod.__name__.rsplit('.', 1)[1]}:{fx}", DATA / fx, mod.read, text_ops, "text"))
    for fx, mod in _JSON.items():
        out.append(Target(f"{mod.__name__.rsplit('.', 1)[1]}:{fx}", DATA / fx, mod.read, json_ops, "json"))
    out.append(Target("nsys:gpu_nsys.sqlite.gz", DATA / "gpu_nsys.sqlite.gz", nsys.read,
                      ("truncate", "flip", "flip_many", "gzip_truncate", "gzip_flip", "empty") + SQL_OPS, "sqlite"))
    for t in list(out):
        out.append(Target(f"adapters.read:{t.fixture.name}", t.fixture, adapters.read, t.ops, t.kind))
    out.append(Target("schema.read_parquet:records.parquet", RECORDS, _read_parquet,
                      ("truncate", "flip", "flip_many", "empty") + PARQUET_OPS, "parquet"))
    return out


@functools.cache
def _raw(fixture: Path) -> bytes:
    data = fixture.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def mutate(t: Target, op: str, seed: int, out_dir: Path) -> Path:
    """Write ``t.fixture`` mutated by ``op`` (parameters from ``seed``) under ``out_dir``; its path."""
    rng = random.Random(seed)
    stem = t.fixture.name.removesuffix(".gz")
    out = out_dir / f"mut_{stem}"
    if t.kind == "sqlite" and op in SQL_OPS:
        out.write_bytes(_raw(t.fixture))
        _mutate_sql(out, op, rng)
        return out
    if t.kind == "parquet" and op in PARQUET_OPS:
        _mutate_parquet(t.fixture, out, op, rng)
        return out
    if op.startswith("gzip_"):
        data = gzip.compress(_raw(t.fixture), mtime=0)
        out = out.with_name(out.name + ".gz")
        out.write_bytes(_bytes_op(data, op.removeprefix("gzip_"), rng, skip=10))
        return out
    data = _raw(t.fixture)
    if op in BYTE_OPS or op == "empty":
        data = b"" if op == "empty" else _bytes_op(data, op, rng)
    elif op in LINE_OPS:
        data = _lines_op(data, op, rng)
    elif op in JSON_OPS:
        data = _json_op(data, op, rng)
    else:
        raise ValueError(f"unknown op {op!r}")
    out.write_bytes(data)
    return out


def _bytes_op(data: bytes, op: str, rng: random.Random, skip: int = 0) -> bytes:
    if op == "truncate":
        return data[:rng.randrange(0, len(data) + 1)]
    b = bytearray(data)
    for _ in range(1 if op == "flip" else rng.randint(2, 64)):
        i = rng.randrange(skip, len(b))
        b[i] = rng.choice((b[i] ^ (1 << rng.randrange(8)), rng.randrange(256), 0, ord(rng.choice('{}[],:"\n'))))
    return bytes(b)


def _lines_op(data: bytes, op: str, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    n = len(lines)
    if op == "empty":
        return b""
    if op == "drop_line":
        del lines[rng.randrange(n)]
    elif op == "drop_lines":
        i = rng.randrange(n)
        del lines[i:i + rng.randint(2, 50)]
    elif op == "dup_line":
        i = rng.randrange(n)
        lines.insert(rng.randrange(n), lines[i])
    elif op == "swap_lines":
        i, j = rng.randrange(n), rng.randrange(n)
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "shuffle_lines":
        i = rng.randrange(n)
        seg = lines[i:i + rng.randint(2, 40)]
        rng.shuffle(seg)
        lines[i:i + len(seg)] = seg
    elif op == "interleave_blocks":
        # several threads writing one log: blocks (a header line and what follows it up to the next
        # header) of two regions mixed, as an interleaved multi-threaded log is
        heads = [k for k, ln in enumerate(lines) if ln[:2] in (b"I!", b"[2", b"on", b"dn", b"mk") or ln.startswith(b'{"')]
        heads = heads or list(range(n))
        blocks = [lines[a:b] for a, b in zip(heads, [*heads[1:], n], strict=True)]
        pre = lines[:heads[0]]
        if len(blocks) > 2:
            i = rng.randrange(len(blocks) - 1)
            j = min(len(blocks), i + rng.randint(2, 30))
            seg = blocks[i:j]
            rng.shuffle(seg)
            blocks[i:j] = seg
        lines = pre + [ln for blk in blocks for ln in blk]
    return b"\n".join(lines)


def _json_op(data: bytes, op: str, rng: random.Random) -> bytes:
    doc = json.loads(data)
    ev = doc["traceEvents"]
    n = len(ev)
    if op == "shuffle_events":
        if rng.random() < 0.3:
            rng.shuffle(ev)
        else:
            i = rng.randrange(n)
            seg = ev[i:i + rng.randint(2, 200)]
            rng.shuffle(seg)
            ev[i:i + len(seg)] = seg
    elif op == "drop_events":
        for _ in range(rng.randint(1, 20)):
            del ev[rng.randrange(len(ev))]
    elif op == "dup_events":
        for _ in range(rng.randint(1, 20)):
            ev.insert(rng.randrange(len(ev)), ev[rng.randrange(len(ev))])
    elif op in ("event_field_drop", "event_field_junk"):
        for _ in range(rng.randint(1, 5)):
            e = ev[rng.randrange(n)]
            if not isinstance(e, dict) or not e:
                continue
            key = rng.choice(sorted(e))
            if op == "event_field_drop":
                del e[key]
            else:
                e[key] = rng.choice((None, "x", -1, 1e300, -5.5, [], {}, [1, 2], True, "ProfilerStep#x", 2**70))
    return json.dumps(doc).encode()


def _mutate_sql(db: Path, op: str, rng: random.Random) -> None:
    con = sqlite3.connect(db)
    try:
        tables = sorted(r[0] for r in con.execute("select name from sqlite_master where type='table'"))
        t = rng.choice(tables)
        cols = [r[1] for r in con.execute(f'pragma table_info("{t}")')]
        if op == "drop_table":
            con.execute(f'DROP TABLE "{t}"')
        elif op == "drop_column":
            c = rng.choice(cols)
            # another nsys version: the table without that column (recreated, so indexes/keys go too)
            keep = ", ".join(f'"{x}"' for x in cols if x != c) or "1 AS dummy"
            con.execute(f'CREATE TABLE "_tmp" AS SELECT {keep} FROM "{t}"')
            con.execute(f'DROP TABLE "{t}"')
            con.execute(f'ALTER TABLE "_tmp" RENAME TO "{t}"')
        elif op == "delete_rows":
            con.execute(f'DELETE FROM "{t}" WHERE abs(random()) % {rng.randint(1, 4)} = 0')
        elif op == "dup_rows":
            try:
                con.execute(f'INSERT INTO "{t}" SELECT * FROM "{t}" WHERE abs(random()) % 5 = 0')
            except sqlite3.IntegrityError:
                con.execute(f'DELETE FROM "{t}" WHERE abs(random()) % 3 = 0')
        elif op in ("null_values", "junk_values"):
            c = rng.choice(cols)
            val = "NULL" if op == "null_values" else rng.choice(("'junk'", "-1", "9223372036854775807", "1.5", "X'00ff'"))
            try:
                con.execute(f'UPDATE "{t}" SET "{c}" = {val} WHERE abs(random()) % 3 = 0')
            except sqlite3.IntegrityError:
                pass  # NOT NULL / primary key constraint: this mutation is a no-op
        con.commit()
    finally:
        con.close()


def _mutate_parquet(src: Path, out: Path, op: str, rng: random.Random) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    meta = dict(table.schema.metadata or {})
    if op == "version":
        meta[b"kernelmap.schema_version"] = str(rng.choice((0, 1, 3, 99, -1, "2.0", "v2", ""))).encode()
    elif op == "drop_meta":
        meta.pop(b"kernelmap.schema_version", None)
    elif op == "drop_column":
        table = table.drop_columns([rng.choice(table.column_names)])
    elif op == "extra_column":
        table = table.append_column("extra", pa.array([1] * table.num_rows))
    elif op in ("bad_enum", "negative_dur", "retype"):
        df = table.to_pandas()
        rows = [rng.randrange(len(df)) for _ in range(rng.randint(1, 5))]
        if op == "bad_enum":
            col = rng.choice(("kind", "phase", "direction", "library", "canonical_op"))
            df[col] = df[col].astype(object)
            df.loc[rows, col] = rng.choice(("bogus", "", None))
        elif op == "negative_dur":
            df.loc[rows, "dur_ns"] = -rng.randint(1, 10**6)
        else:
            col = rng.choice(list(schema.COLUMNS))
            df[col] = df[col].astype(str) if rng.random() < 0.5 else 1.5
        table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata(meta)
    pq.write_table(table, out)


ALLOWED = (ParseError, SchemaError)


def check(t: Target, path: Path) -> str:
    """Parse ``path`` with ``t``: "error" (the project's error) or "records" (valid records);
    anything else (another exception, records that fail validation) propagates."""
    try:
        df = t.parse(path)
    except ALLOWED:
        return "error"
    schema.validate(df, f"{t.name} on {path.name}")
    return "records"


def fresh_dir(base: Path) -> Path:
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    return base
