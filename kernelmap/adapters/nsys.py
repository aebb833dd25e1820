"""Nsight Systems SQLite export (``nsys export --type sqlite``), or a ``.nsys-rep`` converted with
``nsys export`` when nsys is on PATH.

Tables exist only when they have rows and their columns change between nsys versions, so the
adapter reads ``sqlite_master`` and each table's ``pragma table_info`` and asks only for what it
needs; a missing required table/column raises ParseError naming it. Everything is SQL + pandas:

* ``CUPTI_ACTIVITY_KIND_KERNEL`` -> kernel rows (name: ``demangledName`` through ``StringIds``)
* ``CUPTI_ACTIVITY_KIND_RUNTIME`` -> runtime rows (kernel <-> launch by ``correlationId``)
* ``CUPTI_ACTIVITY_KIND_MEMCPY`` / ``_MEMSET`` -> memcpy / memset rows
* ``NVTX_EVENTS`` ranges (push/pop 59, start/end 60) -> ``op`` rows for ``emit_nvtx`` ranges
  (``aten::conv2d, seq = 12, op_id = 34, sizes = [[...]], ...``: name, seq and sizes parsed from
  the fields) and for MXNet's operator ranges (the framework told from the texts, ``nvtx_framework``;
  its C API ranges ``MX*`` are not ops), ``step``/``annotation`` rows for other ranges (``kernelmap:*``,
  user ranges). Where the capture holds a ``kernelmap:capture`` range (a worker whose nsys records the
  whole process: ``registry.NsysWindow.NVTX_RANGE``), only rows that start inside it are kept, and the
  range itself is dropped: warm-up, autotuning and set-up never enter the records.
* ``CUDNN_EVENTS`` / ``CUBLAS_EVENTS`` (nsys ``--trace=cudnn,cublas``) -> library_call rows

``tid``/``pid`` are decoded from nsys' ``globalTid`` (pid = bits 24..47, tid = low 24 bits); the device rows'
pid from their ``globalPid``. A capture of several processes (a multi-process case's every rank) is labelled per
process (``launch_processes``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from .. import schema, strings
from ..errors import ParseError
from ..native import sqlite as _native  # optional C helpers: SQLite columns read natively
from ..strings import STRING
from . import _trace
from ._common import GZIP_MAGIC, XZ_MAGIC, decompressed_copy, finish, frame, int64_array
from .canonical import CAPTURE_RANGE, FALLBACK_FRAMEWORK, VOCABULARIES, framework_of_names

SOURCE = "nsys"
UNKNOWN = "unknown"  # the records' framework where no framework's names are seen
SQLITE_MAGIC = b"SQLite format 3\x00"
_SEQ = re.compile(r", seq = (\d+)")
_SIZES = re.compile(r", sizes = (\[(?:\[[^\]]*\](?:, )?)*\])")


def sniff(head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC)


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'pragma table_info("{table}")')}


def _need(path, table: str, have: set[str], cols: tuple[str, ...]) -> None:
    missing = [c for c in cols if c not in have]
    if missing:
        raise ParseError(path, f"table {table} lacks column(s) {', '.join(missing)}")


def read(path: str | os.PathLike, framework: str | None = None) -> pd.DataFrame:
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head.startswith(SQLITE_MAGIC):
        return _read_sqlite(path, path, framework)
    if head[:2] == GZIP_MAGIC or head[:6] == XZ_MAGIC:
        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / (path.name.removesuffix(".gz").removesuffix(".xz") or "trace.sqlite")
            decompressed_copy(path, head, plain)
            return read(plain, framework).assign(source_file=path.name).pipe(_restring)
    return _read_rep(path, framework)


def _restring(df: pd.DataFrame) -> pd.DataFrame:
    df["source_file"] = df["source_file"].astype(STRING)
    return df


def _read_rep(path: Path, framework: str | None) -> pd.DataFrame:
    nsys = shutil.which("nsys")
    if nsys is None:
        raise ParseError(path, "an .nsys-rep report needs `nsys export --type sqlite`; nsys is not on PATH "
                               "(export it where nsys is installed and pass the .sqlite)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "export.sqlite"
        proc = subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
                               "--output", str(out), str(path)], capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise ParseError(path, f"nsys export failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        return _read_sqlite(out, path, framework)


def _read_sqlite(db: Path, path: Path, framework: str | None) -> pd.DataFrame:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise ParseError(path, f"not a readable SQLite database: {exc}") from None
    try:
        return _read_tables(con, tables, path, framework, db)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:  # pandas wraps sqlite3's
        raise ParseError(path, f"SQLite error: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ParseError(path, f"a text value in the database is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    finally:
        con.close()


def _is_string_id(con, path, table: str, col: str, tables: set[str]) -> bool:
    """Whether a name column holds StringIds ids (declared INTEGER) rather than the text itself."""
    decl = {r[1]: (r[2] or "").upper() for r in con.execute(f'pragma table_info("{table}")')}
    if "INT" in decl.get(col, "INT"):
        if "StringIds" not in tables:
            raise ParseError(path, f"{table}.{col} refers to StringIds, which the export lacks")
        _need(path, "StringIds", _columns(con, "StringIds"), ("id", "value"))
        return True
    return False


def _strings(con, ids: pd.Series) -> pd.Series:
    """StringIds values of ``ids`` (NA where StringIds has none), as one shared str object per
    distinct name: a SQL join would hand every row its own copy (a kernel name per kernel)."""
    uniq = pd.unique(ids.dropna())
    if len(uniq) > 5000:  # many distinct ids (NVTX texts): one pass over the table
        table = dict(con.execute("SELECT id, value FROM StringIds"))
    else:
        table = {}
        for i in range(0, len(uniq), 500):
            part = [v.item() if hasattr(v, "item") else v for v in uniq[i:i + 500]]
            q = f"SELECT id, value FROM StringIds WHERE id IN ({', '.join('?' * len(part))})"
            table.update(con.execute(q, part))
    return ids.map(table).astype(object)


def _named(con, path, table: str, col: str, alias: str, tables: set[str], as_: str) -> str:
    """Select expression for a name column: its text, or its StringIds id as ``{as_}__id``."""
    suffix = "__id" if _is_string_id(con, path, table, col, tables) else ""
    return f'{alias}."{col}" AS {as_}{suffix}'


def _resolve(con, frame: pd.DataFrame) -> pd.DataFrame:
    """Replace each ``X__id`` column of ``frame`` by ``X``, its StringIds values."""
    for c in [c for c in frame.columns if c.endswith("__id")]:
        frame[c.removesuffix("__id")] = _strings(con, frame.pop(c))
    return frame


def _read_tables(con, tables: set[str], path: Path, framework: str | None, db: Path | None = None) -> pd.DataFrame:
    """The export's records: its CUDA activity, NVTX ranges and library calls read table by table
    (``_cuda_frames``, ``_nvtx_frame``, ``_library_frames``), then stacked in start order inside the
    capture window and labelled (``_records``)."""
    def sql(q: str) -> pd.DataFrame:
        return _query(con, db, q)

    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables and "NVTX_EVENTS" not in tables \
            and "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        raise ParseError(path, "no CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_RUNTIME or NVTX_EVENTS "
                               "table: not an nsys export with CUDA or NVTX trace")
    frames = _cuda_frames(con, tables, path, sql)
    nvtx, window, framework = _nvtx_frame(con, tables, path, sql, framework)
    frames += ([nvtx] if nvtx is not None else []) + _library_frames(con, tables, path, sql)
    del nvtx
    for f in frames:  # numbers per table (NULL AS gtid: NaN), not one object column after the concat
        if "gtid" in f:
            f["gtid"] = pd.to_numeric(f["gtid"], errors="coerce")
    kernels = frames[0] if frames and "kernel_name" in frames[0] else None
    bad = int(strings.isna(kernels["kernel_name"]).sum()) if kernels is not None else 0
    if bad:
        raise ParseError(path, f"{bad} kernels have a name id that StringIds does not hold")
    del kernels
    return _records(frames, window, framework, path)


def _cuda_frames(con, tables: set[str], path: Path, sql) -> list[pd.DataFrame]:
    """The kernels (first, where the export has them), memory copies and sets, and CUDA runtime calls."""
    frames = []
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if t in tables:
        have = _columns(con, t)
        _need(path, t, have, ("start", "end", "correlationId", "streamId"))
        name_col = "demangledName" if "demangledName" in have else "shortName" if "shortName" in have else None
        if name_col is None:
            raise ParseError(path, f"table {t} lacks column demangledName (and shortName)")
        name = _named(con, path, t, name_col, "k", tables, "kernel_name")
        grid = ", ".join(f'k."{c}" AS {c.lower()[:-1]}_{c[-1].lower()}' if c in have else f"NULL AS {c.lower()[:-1]}_{c[-1].lower()}"
                         for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"))
        gpid = 'k."globalPid"' if "globalPid" in have else "NULL"
        dev = 'k."deviceId"' if "deviceId" in have else "NULL"
        frames.append(_resolve(con, sql(
            f'SELECT \'kernel\' AS kind, k.start AS start_ns, k."end" - k.start AS dur_ns, k.correlationId AS correlation_id, '
            f'k.streamId AS stream, {grid}, {name}, {gpid} AS gpid, {dev} AS device_index, NULL AS gtid FROM {t} k')))
    for t, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if t in tables:
            have = _columns(con, t)
            _need(path, t, have, ("start", "end", "correlationId", "bytes"))
            stream = "streamId" if "streamId" in have else "NULL"
            dev = "deviceId" if "deviceId" in have else "NULL"
            # whose correlation ids they carry (a capture of several processes); no column of NULLs where none
            gpid = '"globalPid" AS gpid, ' if "globalPid" in have else ""
            frames.append(sql(
                f"SELECT '{kind}' AS kind, start AS start_ns, \"end\" - start AS dur_ns, correlationId AS correlation_id, "
                f"{stream} AS stream, bytes, {gpid}{dev} AS device_index, NULL AS gtid FROM {t}"))
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if t in tables:
        have = _columns(con, t)
        _need(path, t, have, ("start", "end", "correlationId", "nameId", "globalTid"))
        name = _named(con, path, t, "nameId", "r", tables, "op_name")
        frames.append(_resolve(con, sql(
            f"SELECT 'runtime' AS kind, r.start AS start_ns, r.\"end\" - r.start AS dur_ns, r.correlationId AS correlation_id, "
            f"{name}, r.globalTid AS gtid FROM {t} r")))
    return frames


def _nvtx_frame(con, tables: set[str], path: Path, sql, framework: str | None):
    """(the NVTX push/pop ranges as records or None, the capture window, the framework: as given, else
    as the ranges' texts tell it)."""
    t = "NVTX_EVENTS"
    if t not in tables:
        return None, None, framework
    have = _columns(con, t)
    _need(path, t, have, ("start", "end", "eventType", "globalTid"))
    text = 'n."text"' if "text" in have else "NULL"
    text_id = "n.textId" if "textId" in have and "StringIds" in tables else "NULL"
    nv = sql(
        f"SELECT n.start AS start_ns, n.\"end\" - n.start AS dur_ns, {text} AS text, {text_id} AS text_id, "
        f"n.globalTid AS gtid FROM {t} n WHERE n.eventType IN (59, 60) AND n.\"end\" IS NOT NULL")
    ids = nv.pop("text_id")
    if ids.notna().any():  # the text itself where the row has one, else its StringIds value
        nv["text"] = nv["text"].astype(object).where(nv["text"].notna(), _strings(con, ids))
    window, nv = _capture_window(nv, path)
    framework = framework or nvtx_framework(pd.unique(nv["text"].dropna()))
    return _nvtx(nv, framework), window, framework


def _library_frames(con, tables: set[str], path: Path, sql) -> list[pd.DataFrame]:
    """The cuDNN and cuBLAS calls nsys traced (``--trace cudnn,cublas``)."""
    frames = []
    for t, lib in (("CUDNN_EVENTS", "cuDNN"), ("CUBLAS_EVENTS", "cuBLAS")):
        if t in tables:
            have = _columns(con, t)
            _need(path, t, have, ("start", "end", "nameId", "globalTid"))
            name = _named(con, path, t, "nameId", "l", tables, "library_call")
            frames.append(_resolve(con, sql(
                f"SELECT 'library_call' AS kind, '{lib}' AS library, l.start AS start_ns, l.\"end\" - l.start AS dur_ns, "
                f"{name}, l.globalTid AS gtid FROM {t} l")))
    return frames


def _records(frames: list[pd.DataFrame], window, framework: str | None, path: Path) -> pd.DataFrame:
    """The tables' rows in start order, inside the capture window, as labelled records: each record
    column converted as it is stacked (one column's raw rows alive at a time, not a frame of them)."""
    df = _stacked(frames, window, lambda c, v: _record_column(c, v, path))
    del frames[:]  # the tables, the caller's list included: freed as the records are built
    gtid = pd.to_numeric(df.pop("gtid"), errors="coerce") if "gtid" in df else pd.Series(np.nan, index=df.index)
    gpid = pd.to_numeric(df.pop("gpid"), errors="coerce") if "gpid" in df else None
    dims = df.pop("dims").tolist() if "dims" in df else None
    names = df["op_name"] if "op_name" in df else pd.Series(pd.NA, index=df.index, dtype=STRING)
    if framework is None:
        framework = framework_of_names(strings.distinct(names)) or UNKNOWN
    del names
    cols = {c: df.pop(c) for c in _RECORD_COLUMNS if c in df}
    del df
    cols["tid"] = _record_column("tid", gtid % 0x1000000, path)
    pid = (gtid // 0x1000000) % 0x1000000
    del gtid
    if gpid is not None:
        pid = pid.fillna((gpid // 0x1000000) % 0x1000000)
    cols["pid"] = _record_column("pid", pid, path)
    del gpid, pid
    cols["framework"] = framework
    cols["device"] = "gpu"
    out = frame(cols, path, SOURCE)
    del cols  # the frame holds them
    if len(out):
        label_rows(out, dims, framework if framework != UNKNOWN else FALLBACK_FRAMEWORK)
    return finish(out, path, SOURCE)


def label_rows(out: pd.DataFrame, dims: list | None, framework: str) -> None:
    """Canonical op, direction, layer, phase, step and library of the export's rows, in place: as a Kineto
    trace's (``_trace.label``), torch.compile's wrapper ranges made annotations first and its generated
    kernels attributed to the ops they fuse after (``inductor``; without it 14% of a compiled step's
    kernel time had no op), a framework's run-time fused ops likewise (``fused_ops``)."""
    from . import fused_ops, inductor
    from .kineto import kernel_library

    inductor.mark_wrapper_rows(out)
    _trace.label(out, dims, framework, process=launch_processes(out))
    inductor.attribute(out)
    fused_ops.attribute(out, framework)  # a fused op (MXNet's _FusedOp) as the model op its kernel's name fuses
    kernel_library(out)


def launch_processes(out: pd.DataFrame) -> np.ndarray | None:
    """Per row, its process (a code; -1: none) where the capture's runtime calls come from several processes
    (one nsys capture of a case's every rank: each process counts its correlation ids from the same first one, so
    a kernel joins its launch within its own process: ``_trace.label``'s ``process``); None for one process."""
    if "pid" not in out:
        return None
    codes, _ = pd.factorize(out["pid"].astype("Int64"), use_na_sentinel=True)
    runtime = strings.eq(out["kind"], "runtime")
    return codes.astype("int64") if len(np.unique(codes[runtime & (codes >= 0)])) > 1 else None


_RECORD_COLUMNS = ("kind", "start_ns", "dur_ns", "correlation_id", "stream", "kernel_name", "op_name", "seq",
                   "shapes", "bytes", "library", "library_call", "grid_x", "grid_y", "grid_z", "block_x",
                   "block_y", "block_z", "device_index")


def _record_column(c: str, values, path):
    """A records column of the tables' values (``STRING`` or Int64; inside
    ``schema.compact_records`` a Categorical, or an integer column of ``NARROW_INTS`` in its
    narrowest type); the adapter's own columns (``gtid``, ``gpid``, ``dims``) as they are."""
    if c not in _RECORD_COLUMNS and c not in ("tid", "pid"):
        return values
    if schema.DTYPES[c] is STRING:
        return strings.string_array(values)
    arr = int64_array(values, path, c)
    return schema.narrow_int(arr) if schema.compacting() and c in schema.NARROW_INTS else arr


def _stacked(frames: list[pd.DataFrame], window: tuple[int, int] | None, convert=None) -> pd.DataFrame:
    """``pd.concat(frames)`` with the rows that start inside ``window`` (all where None), in start
    order (stable): built a column at a time, each table's column dropped once it is taken, so that
    the tables and the result are not both alive whole. The concat of each column is pandas' own
    (the tables that lack it: NA, and its dtype widened as the frame's concat widens it).
    ``convert(name, rows)``: each column as it is taken (the result holds what it returns)."""
    if not frames:
        return pd.DataFrame()
    start = pd.to_numeric(pd.concat([f["start_ns"] for f in frames], ignore_index=True))
    rows = np.arange(len(start)) if window is None else \
        np.flatnonzero(((start >= window[0]) & (start <= window[1])).to_numpy())
    order = rows[np.argsort(start.to_numpy()[rows], kind="stable")]
    del start, rows
    out = {}
    for c in dict.fromkeys(c for f in frames for c in f.columns):
        col = pd.concat([f[[c]] if c in f else f.iloc[:, :0] for f in frames], ignore_index=True)[c]
        for f in frames:
            if c in f:
                del f[c]
        taken = np.asarray(col)[order]
        del col
        out[c] = taken if convert is None else convert(c, taken)
        del taken
    return pd.DataFrame(out, index=pd.RangeIndex(len(order)), copy=False)


def _capture_window(nv: pd.DataFrame, path: Path) -> tuple[tuple[int, int] | None, pd.DataFrame]:
    """The ``kernelmap:capture`` range's [start, end] in ns, or None where the capture has none, and
    the NVTX rows without it. More than one such range is an error: which would bound the capture?"""
    cap = (nv["text"] == CAPTURE_RANGE).to_numpy()
    n = int(cap.sum())
    if n == 0:
        return None, nv
    if n > 1:
        raise ParseError(path, f"{n} NVTX ranges named {CAPTURE_RANGE!r}: a capture has one window")
    row = nv[cap].iloc[0]
    start = int(row["start_ns"])
    return (start, start + int(row["dur_ns"])), nv[~cap].reset_index(drop=True)


def _query(con, db: Path | None, q: str) -> pd.DataFrame:
    """``pd.read_sql_query(q, con)``: the same frame, read by the native helper where it can
    (integer, text and NULL columns as pandas gives them: int64, object str/None), else by pandas."""
    got = _native.query(str(db), q) if _native is not None and db is not None else None
    if got is None:
        return pd.read_sql_query(q, con)
    rows, got = got
    cols = {}
    for name, vals in got:
        if vals is None:  # only NULLs
            cols[name] = np.full(rows, None, dtype=object)
        elif isinstance(vals, tuple):
            codes, texts = vals
            cols[name] = np.array([*texts, None], dtype=object)[np.frombuffer(codes, dtype="int32")]
        else:
            cols[name] = np.frombuffer(vals, dtype="int64")
    return pd.DataFrame(cols, copy=False)


def nvtx_framework(texts) -> str | None:
    """The framework whose ranges these NVTX texts are: the first (in registry order) whose op-range
    fields one carries (PyTorch's emit_nvtx: ``, seq = ``/``, op_id = ``), else whose op names one is (an
    MXNet built with NVTX, profiler running); None where none is seen (``canonical.VOCABULARIES``)."""
    texts = [str(t) for t in texts]
    for name, v in VOCABULARIES.items():
        if v.nvtx_op_fields and any(f in t for t in texts for f in v.nvtx_op_fields):
            return name
    for name, v in VOCABULARIES.items():
        if not v.nvtx_op_fields and any(t in v.ops for t in texts):
            return name
    return None


def _nvtx_is_op(text: list[str], framework: str | None) -> list[bool]:
    """Which ranges are framework ops, by ``framework``'s rule (``Vocabulary.nvtx_op``: PyTorch's, the
    ranges with op fields; MXNet's, every range but the workload's (``kernelmap:*``, steps) and its C
    API's, MX*); where the framework is not known, the ranges with any vocabulary's op fields."""
    v = VOCABULARIES.get(framework)
    if v is not None:
        return [v.nvtx_op(t) for t in text]
    fields = tuple(f for w in VOCABULARIES.values() for f in w.nvtx_op_fields)
    return [any(f in t for f in fields) for t in text]


def _nvtx(nv: pd.DataFrame, framework: str | None = None) -> pd.DataFrame:
    """NVTX ranges -> op rows (emit_nvtx, MXNet operators) or annotation/step rows, fields parsed
    structurally (once per distinct text: ranges repeat their texts step after step)."""
    from .canonical import WEIGHT_ARG_OPS, step_number

    codes, uniq = strings.factorize(nv["text"])
    text = [*(str(t) for t in uniq), ""]  # code -1 (NA): ""
    is_op = _nvtx_is_op(text, framework)
    one: dict = {}  # one str object per distinct op name and sizes text
    name = [one.setdefault(n, n) for n in (t.split(", ", 1)[0] if o else t for t, o in zip(text, is_op, strict=True))]
    seq = [m.group(1) if (m := _SEQ.search(t)) else None for t in text]
    sizes = [one.setdefault(m.group(1), m.group(1)) if o and (m := _SIZES.search(t)) else None
             for t, o in zip(text, is_op, strict=True)]
    want = set(WEIGHT_ARG_OPS)
    dims = [None] * len(text)
    parsed: dict = {}  # per unique sizes text (rows share the list: it is only read)
    for i, (n, z) in enumerate(zip(name, sizes, strict=True)):
        if z is not None and n in want and is_op[i]:
            if z not in parsed:
                try:
                    parsed[z] = json.loads(z)
                except ValueError:
                    parsed[z] = None
            dims[i] = parsed[z]
    is_step = {n: step_number(n) is not None for n in set(name)}
    kind = ["op" if o else "step" if is_step[n] else "annotation" for n, o in zip(name, is_op, strict=True)]
    shapes = [None if z is None else one.setdefault(("compact", z), z.replace(" ", "")) for z in sizes]

    def rows(values: list) -> pd.Series:  # per distinct text -> per row
        return pd.Series(strings.object_array(values)[codes], index=nv.index, dtype=object)

    # seq per distinct text, then per row: pandas' numbers of the rows' texts (int64, or float64
    # where a row has none), without a string per row parsed
    seq_u = pd.to_numeric(pd.Series(seq[:-1], dtype=object), errors="coerce").to_numpy()
    if (codes < 0).any() and seq_u.dtype.kind != "f":  # rows without a text: NA, as pandas makes it
        seq_u = seq_u.astype("float64")
    seq_rows = np.append(seq_u, np.nan if seq_u.dtype.kind == "f" else 0)[codes]
    # the builder's own arrays, each a column (no consolidated copy of them)
    return pd.DataFrame({
        "kind": rows(kind), "start_ns": nv["start_ns"], "dur_ns": nv["dur_ns"], "op_name": rows(name),
        "seq": pd.Series(seq_rows, index=nv.index), "shapes": rows(shapes), "dims": rows(dims),
        "gtid": nv["gtid"],
    }, copy=False)


def base_ns(path: str | os.PathLike) -> int:
    """The session start of an nsys SQLite export (``TARGET_INFO_SESSION_START_TIME.utcEpochNs``; its
    timestamps count from it), gzip or xz looked through; ParseError where the file has none."""
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(16)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "n.sqlite"
        if not decompressed_copy(path, head, db):
            db = path
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = con.execute("select utcEpochNs from TARGET_INFO_SESSION_START_TIME").fetchone()
        except sqlite3.DatabaseError as exc:
            raise ParseError(path, f"no session start time (TARGET_INFO_SESSION_START_TIME): {exc}") from None
        finally:
            con.close()
    if not row or row[0] is None:
        raise ParseError(path, "TARGET_INFO_SESSION_START_TIME has no utcEpochNs")
    return int(row[0])
