"""The record schema: one typed table of events, versioned. docs/SCHEMA.md is its prose twin.

Every adapter returns a DataFrame with exactly ``COLUMNS`` (in order, with these dtypes).
``validate`` checks that on write and on read; Parquet files carry ``schema_version`` in their
key-value metadata, and a file of another version is refused.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import enum
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import SchemaError
from .strings import STRING

SCHEMA_VERSION = 3
# v3 (issue 36): the case's columns mode, math and devices beside framework, which holds the framework's
# name alone (v2 held the case's name there: pytorch-cuda-graph); read_parquet's ``upgrade`` reads a v2 file
CASE_COLUMNS = ("mode", "math", "devices")

# column -> pandas dtype. Nullable extension dtypes so that "unknown" is NA, never a magic value.
COLUMNS: dict[str, str] = {
    "run": "string",  # run id (run directory name, or the file stem for loose files)
    "framework": "string",  # a frameworks.REGISTRY name (pytorch | mxnet | jax) or unknown
    "mode": "string",  # the framework's execution mode (its descriptor's modes: eager | cuda-graph | ...)
    "math": "string",  # the case's math mode for the convs and matmuls (spec.Math: fp32 | tf32 | bf16 | fp16)
    "devices": "Int64",  # devices the case trained on (1 until multi-device cases)
    "device": "string",  # gpu | cpu
    "batch_size": "Int64",
    "source": "string",  # adapter: kineto | mxnet_profiler | nsys | cudnn_log | cublas_log | cublaslt_log | onednn_verbose | mkl_verbose
    "source_file": "string",
    "event_id": "Int64",  # unique within a source file; unique within a run after `normalise`
    "kind": "string",  # see KINDS
    "iteration": "Int64",  # training step index, where known
    "phase": "string",  # see PHASES
    "layer": "string",  # conv1 | conv2 | fc1 | fc2 | loss | ...
    "op_name": "string",  # the framework's own op name (aten::convolution, Convolution, ...)
    "canonical_op": "string",  # see CANONICAL_OPS
    "direction": "string",  # see DIRECTIONS
    "library": "string",  # see LIBRARIES
    "library_call": "string",  # cudnnBackendExecute, cublasSgemm_v2, cublasLtMatmul, convolution forward_training, ...
    "kernel_name": "string",  # demangled
    "start_ns": "Int64",  # absolute, in the source's clock
    "dur_ns": "Int64",
    "stream": "Int64",
    "grid_x": "Int64",
    "grid_y": "Int64",
    "grid_z": "Int64",
    "block_x": "Int64",
    "block_y": "Int64",
    "block_z": "Int64",
    "correlation_id": "Int64",  # CUDA runtime launch <-> kernel
    "op_event_id": "Int64",  # link: the op (kind=op) this event belongs to
    "call_event_id": "Int64",  # link: the library call (kind=library_call) this kernel belongs to
    "algo": "string",  # the library's algorithm id: cuDNN engine "eng28" / algo enum, cuBLASLt "algoId=55"
    "seq": "Int64",  # autograd sequence number (links a backward op to its forward op)
    "math_mode": "string",  # fp32 | tf32 | fp16 | bf16 | ...
    "shapes": "string",  # JSON list of input shapes, e.g. "[[64,1,28,28],[32,1,3,3]]"
    "flops": "Int64",  # where derivable from shapes
    "bytes": "Int64",  # memcpy/memset size
    "pid": "Int64",
    "tid": "Int64",
    "rank": "Int64",  # distributed rank, from the trace's metadata (Kineto distributedInfo.rank)
    "device_index": "Int64",  # the GPU's index, for device rows (Kineto: the device process id; nsys: deviceId)
    # what a library call (and each kernel it launched) computed in (issue 38): see MathRan, MathSource
    "math_ran": "string",  # fp32 | tf32 | bf16 | fp16 | fp64 | mixed: the multiply inputs' precision
    "math_dtypes": "string",  # the call's data types as its log gives them: "a=bf16 b=bf16 c=fp32 compute=fp32"
    "math_source": "string",  # log | hlo | name: where math_ran (and math_dtypes) come from
    "math_unit": "string",  # tensor | fma | none: the unit a kernel's products ran on, by its name (MathUnit); NA: unknown
}

# columns added at the end within v2; a v2 file without them reads with them NA
ADDED_COLUMNS = ("rank", "device_index")
# columns added at the end within v3 (issue 38); a v3 file without them reads with them NA
MATH_COLUMNS = ("math_ran", "math_dtypes", "math_source")
# added at the end within v3 after them (issue 38); a v3 file without it reads with it NA
UNIT_COLUMNS = ("math_unit",)


class Kind(enum.StrEnum):
    OP = "op"
    LIBRARY_CALL = "library_call"
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    RUNTIME = "runtime"
    STEP = "step"
    ANNOTATION = "annotation"


class Phase(enum.StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    DATA = "data"
    OTHER = "other"


class Direction(enum.StrEnum):
    FWD = "fwd"
    BWD_DATA = "bwd_data"
    BWD_WEIGHT = "bwd_weight"
    BWD_BIAS = "bwd_bias"
    BWD = "bwd"
    UPDATE = "update"
    NONE = "none"


class Library(enum.StrEnum):
    CUDNN = "cuDNN"
    CUBLAS = "cuBLAS"
    CUBLASLT = "cuBLASLt"
    ONEDNN = "oneDNN"
    BLAS = "BLAS"
    NCCL = "NCCL"  # collective kernels (NCCL, and AMD's RCCL, which keeps NCCL's kernel names)
    NATIVE = "native"
    CUSTOM = "custom"  # the user's own kernels: kernelmap's custom op (frameworks/pytorch/custom_op)


class MathRan(enum.StrEnum):
    """What a call's multiplications took as inputs (issue 38; docs/SCHEMA.md "Math each call ran")."""
    FP32 = "fp32"  # fp32 inputs, fp32 FMA (TF32 not permitted)
    TF32 = "tf32"  # fp32 inputs rounded to TF32 on tensor cores (permitted for this call, and not overridden)
    BF16 = "bf16"
    FP16 = "fp16"
    FP64 = "fp64"
    MIXED = "mixed"  # the operands differ in type (bf16 x fp32)


class MathSource(enum.StrEnum):
    LOG = "log"  # the library's own API log (cuDNN, cuBLAS, cuBLASLt, oneDNN, MKL)
    HLO = "hlo"  # XLA's HLO text (the custom call's operand types and precision)
    NAME = "name"  # the kernel's name spells its MMA types (kernelmap/kernelmath.py NAME_RULES)
    OP = "op"  # a library kernel no call was linked to: the one math its op's logged calls ran (kernelmath OP_RULE)


class MathUnit(enum.StrEnum):
    """The unit a kernel's products ran on, from its name (kernelmap/kernelmath.py UNIT_RULES; docs/SCHEMA.md)."""
    TENSOR = "tensor"  # tensor-core MMA (HMMA/HGMMA: xmma bf16/f16/tf32, CUTLASS tensorop/wmma, nvjet)
    FMA = "fma"  # the CUDA cores' FMA (SIMT: sgemm, implicit_convolve_sgemm, *_engine_float*, xmma ..._ffma)
    NONE = "none"  # no product: layout transposes, split-K reductions, bias-gradient sums, memsets


KINDS = tuple(k.value for k in Kind)
MATHS_RAN = tuple(m.value for m in MathRan)
MATH_SOURCES = tuple(m.value for m in MathSource)
MATH_UNITS = tuple(m.value for m in MathUnit)
PHASES = tuple(p.value for p in Phase)
DIRECTIONS = tuple(d.value for d in Direction)
LIBRARIES = tuple(lib.value for lib in Library)
BACKWARD_DIRECTIONS = (Direction.BWD_DATA, Direction.BWD_WEIGHT, Direction.BWD_BIAS, Direction.BWD)
# "Unknown" in records is NA, always. Where a table must show it: an event with no canonical op is
# UNATTRIBUTED; any other unknown value (layer, library, call) is UNKNOWN.
UNATTRIBUTED = "unattributed"
UNKNOWN = "unknown"

# The one rule direction -> phase (used where no kernelmap region says the phase): forward for fwd,
# backward for every gradient direction, optimizer for update (and for zero_grad, whatever its direction).
_PHASE_OF_DIRECTION = {Direction.FWD.value: Phase.FORWARD.value,
                       **{d.value: Phase.BACKWARD.value for d in BACKWARD_DIRECTIONS},
                       Direction.UPDATE.value: Phase.OPTIMIZER.value}


def phase_of(direction, canonical_op=None) -> str | None:
    """The phase of one event by the direction rule; None where the rule says nothing."""
    if canonical_op == "zero_grad":
        return Phase.OPTIMIZER.value
    return _PHASE_OF_DIRECTION.get(direction) if isinstance(direction, str) else None


def phase_values(direction, canonical_op=None) -> np.ndarray:
    """``phase_of`` over columns or object arrays: an object array, None where the rule says nothing."""
    from . import strings

    codes, uniq = strings.factorize(direction)
    ph = np.array([_PHASE_OF_DIRECTION.get(d) for d in uniq] + [None], dtype=object)[codes]
    if canonical_op is not None:
        ph[strings.eq(canonical_op, "zero_grad")] = Phase.OPTIMIZER.value
    return ph


def phase_series(direction: pd.Series, canonical_op: pd.Series | None = None) -> pd.Series:
    """``phase_of`` over columns (string dtype, NA where the rule says nothing)."""
    from . import strings

    return pd.Series(strings.string_array(phase_values(direction, canonical_op)), index=direction.index)
CANONICAL_OPS = (
    "conv2d", "relu", "max_pool2d", "flatten", "linear", "log_softmax", "nll_loss",
    "softmax_cross_entropy", "pick", "mean", "sgd_update", "zero_grad", "copy", "fill",
    "add", "reorder", "sum", "mul", "batch_norm", "collective", "other",
    "loss_scale",  # mixed precision's loss scaling: the gradients' finite check and unscale, the scale's update
)

_ENUMS = {"kind": KINDS, "phase": PHASES, "direction": DIRECTIONS, "library": LIBRARIES,
          "canonical_op": CANONICAL_OPS, "math_ran": MATHS_RAN, "math_source": MATH_SOURCES,
          "math_unit": MATH_UNITS}


# the pandas dtype of each column: "string" is STRING (Python objects, not the Arrow storage that
# pandas 3 picks by default; strings.STRING says why)
DTYPES = {col: STRING if t == "string" else t for col, t in COLUMNS.items()}


# Columns that normalise holds in the narrowest nullable integer type of their values
# (``compact_records``): labelling reads them only as int64 numbers (threads, sequence numbers),
# and nothing in normalise sums, offsets or writes into them after they are built.
NARROW_INTS = ("batch_size", "stream", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
               "pid", "tid", "seq", "bytes", "flops", "rank", "device_index")
_COMPACT = contextvars.ContextVar("kernelmap_compact_records", default=False)


@contextlib.contextmanager
def compact_records():
    """Inside (this thread or task): records are held compact, in the schema's values but not its
    pandas dtypes: string columns as Categoricals (``strings.categorical_columns``) and the
    ``NARROW_INTS`` columns in the narrowest of Int8, Int16, Int32 and Int64 that holds their
    values (``narrow_ints``). ``normalise`` works so (issue 11: a million-row frame in ~90 MB, not
    ~320 MB); ``write_parquet`` writes such a frame as the schema's dtypes, byte for byte, and
    ``in_schema_dtypes`` gives the frame in them."""
    from .strings import categorical_columns

    token = _COMPACT.set(True)
    try:
        with categorical_columns():
            yield
    finally:
        _COMPACT.reset(token)


def compacting() -> bool:
    return _COMPACT.get()


def narrow_int(arr) -> pd.arrays.IntegerArray:
    """A nullable integer array in the narrowest of Int8, Int16, Int32 and Int64 that holds its
    values (NA kept; itself where that is its type already). The range is taken over the values
    stored under NA rows too (0 where the adapters make them): never narrower than the values need."""
    arr = pd.array(arr, dtype="Int64") if not isinstance(arr, pd.arrays.IntegerArray) else arr
    data, mask = arr._data, arr._mask
    if not len(data):
        want = np.dtype("int8")
    else:  # over every row, NA rows' (ignored) values too: one pass each, no copy of the valid rows
        lo, hi = int(data.min()), int(data.max())
        want = next(t for t in (np.dtype(x) for x in ("int8", "int16", "int32", "int64"))
                    if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)
    if data.dtype == want:
        return arr
    # the values fit; an NA row's value is no value (any, as in any IntegerArray)
    return pd.arrays.IntegerArray(data.astype(want), mask.copy())


def narrow_ints(df: pd.DataFrame) -> None:
    """``df``'s ``NARROW_INTS`` columns (those it has) in their narrowest types, a column at a time."""
    for c in NARROW_INTS:
        if c in df and isinstance(df[c].array, pd.arrays.IntegerArray):
            df[c] = narrow_int(df[c].array)


def in_schema_dtypes(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (compact, ``compact_records``) in the schema's pandas dtypes: its Categorical string
    columns as ``STRING``, its narrow integer columns as Int64 (the other columns not copied)."""
    from .strings import plain

    out = plain(df)
    wide = {c: "Int64" for c in out.columns
            if isinstance(out[c].array, pd.arrays.IntegerArray) and out[c].dtype != "Int64"}
    return out.astype(wide) if wide else out


def empty() -> pd.DataFrame:
    """An empty records table with the right columns and dtypes."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in DTYPES.items()})


def conform(df: pd.DataFrame, copy: bool = True) -> pd.DataFrame:
    """Add missing columns as NA, order them, and cast to the schema's dtypes. ``copy=False``: a
    column that has its dtype already is taken as it is (for a frame the caller drops)."""
    from .strings import string_array

    def column(col, dtype):
        if col not in df:
            return pd.Series(pd.NA, index=df.index, dtype=dtype).array
        if dtype is STRING and (df[col].dtype == object or _COMPACT.get()
                                or isinstance(df[col].dtype, pd.CategoricalDtype)):
            return string_array(df[col])  # once per distinct value where rows share them
        if col in NARROW_INTS and _COMPACT.get():
            arr = df[col].array
            return narrow_int(arr if isinstance(arr, pd.arrays.IntegerArray) else df[col].astype("Int64").array)
        # pandas 3 copies lazily (copy-on-write) and deprecates astype's copy keyword
        return (df[col].astype(dtype) if _PANDAS_COW else df[col].astype(dtype, copy=copy)).array

    cols = {col: column(col, dtype) for col, dtype in DTYPES.items()}
    extra = set(df.columns) - set(COLUMNS)
    if extra:
        raise SchemaError(f"columns not in schema v{SCHEMA_VERSION}: {sorted(extra)}")
    return pd.DataFrame(cols, index=pd.RangeIndex(len(df)), copy=False)  # the arrays are astype's (copies unless copy=False)


def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``pd.concat(frames, ignore_index=True)`` of records frames (the schema's columns, in order),
    a column at a time: where a part is a Categorical (``strings.categorical_columns``), the
    column is one Categorical of the parts' united categories, where pandas would make an object
    column of them."""
    from pandas.api.types import union_categoricals

    from . import strings

    if len(frames) < 2:
        return frames[0] if frames else empty()
    cols = {}
    for c in frames[0].columns:
        parts = [f[c].array for f in frames]
        if any(isinstance(p, pd.Categorical) for p in parts):
            cols[c] = union_categoricals([strings.categorical(p) for p in parts])
        else:
            parts = [f[c] for f in frames if len(f)] or [frames[0][c]]  # an empty part's dtype says nothing
            cols[c] = pd.concat(parts, ignore_index=True).array
    return pd.DataFrame(cols, index=pd.RangeIndex(sum(map(len, frames))), copy=False)


def validate(df: pd.DataFrame, where: str = "records") -> pd.DataFrame:
    """Raise SchemaError unless ``df`` has exactly the schema's columns, dtypes and vocabularies
    (a string column may be a Categorical of strings: ``strings.categorical_columns``)."""
    if list(df.columns) != list(COLUMNS):
        missing = [c for c in COLUMNS if c not in df.columns]
        extra = [c for c in df.columns if c not in COLUMNS]
        raise SchemaError(f"{where}: columns differ from schema v{SCHEMA_VERSION} (missing {missing}, extra {extra})")
    from . import strings

    for col, dtype in COLUMNS.items():
        if DTYPES[col] is STRING and strings.is_string(df[col].dtype):
            continue
        if col in NARROW_INTS and str(df[col].dtype) in ("Int8", "Int16", "Int32"):
            continue
        if str(df[col].dtype) != dtype:
            raise SchemaError(f"{where}: column {col!r} has dtype {df[col].dtype}, schema says {dtype}")

    for col, allowed in _ENUMS.items():
        bad = set(strings.distinct(df[col])) - set(allowed)
        if bad:
            raise SchemaError(f"{where}: column {col!r} has values outside the vocabulary: {sorted(bad)[:5]}")
    if strings.isna(df["kind"]).any():
        raise SchemaError(f"{where}: {int(df['kind'].isna().sum())} rows have no kind")
    dur = df["dur_ns"].array
    neg = (dur._data < 0) & ~dur._mask  # Int64: values and NA mask
    if neg.any():
        raise SchemaError(f"{where}: {int(neg.sum())} rows have a negative duration")
    return df


def write_parquet(df: pd.DataFrame, path: str | os.PathLike, extra_meta: dict | None = None,
                  validated: bool = False, footer_meta: dict | None = None) -> None:
    """Validate and write atomically, with ``schema_version`` in the Parquet metadata.
    ``validated``: ``df`` is what ``validate`` has just returned, unchanged since (not checked again).
    ``extra_meta`` is stored under ``kernelmap.meta`` (``read_meta``) in the Arrow schema's
    metadata; ``footer_meta`` instead in the file's footer, after the row groups (where pyarrow
    can add footer entries; else as ``extra_meta``): a dict, or a function that gives it, called
    once the row groups are written (normalise's summary, made in another thread meanwhile)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .atomic import atomic_path

    if not validated:
        validate(df, str(path))
    late_meta = hasattr(pq.ParquetWriter, "add_key_value_metadata")  # footer entries after the row groups
    if footer_meta is not None and not late_meta:  # an older pyarrow: in the schema's metadata
        extra_meta, footer_meta = footer_meta() if callable(footer_meta) else footer_meta, None
    # the schema (pandas metadata included) as pyarrow gives it for this frame; the columns are
    # converted a row group at a time, so that only a group or two of Arrow copies are alive beside
    # df, and a group is encoded (pyarrow, without the GIL) while the next one is converted
    arrow_schema = pa.Table.from_pandas(in_schema_dtypes(df.iloc[:0]), preserve_index=False).schema
    meta = dict(arrow_schema.metadata or {})
    meta[b"kernelmap.schema_version"] = str(SCHEMA_VERSION).encode()
    if extra_meta:
        meta[b"kernelmap.meta"] = json.dumps(extra_meta).encode()
    arrow_schema = arrow_schema.with_metadata(meta)

    # the system allocator, not pyarrow's default pool, which keeps what the row groups freed
    pool = pa.system_memory_pool()

    # string columns whose rows share a few objects: each distinct value converted once, for all
    # groups. Where the footer can be written after the row groups (late_meta), these columns go to
    # the writer as dictionary arrays (codes into those values): Parquet stores a string column as
    # dictionary pages either way, and this way neither the rows' strings are built nor hashed
    # again. The file's Arrow schema (ARROW:schema, which readers restore) is then written by hand:
    # the same entry, byte for byte, that pyarrow writes for the string-typed schema.
    coded = {c: _coded_strings(df[c], arrow_schema.field(c).type, pool) for c in df.columns}
    as_dictionary = late_meta and any(v is not None for v in coded.values())
    # each dictionary's indices in the codes' own type (int8 for up to 128 values): Parquet stores
    # its own indices, the same whatever the Arrow type; no int32 copy of each group's codes
    write_schema = pa.schema([pa.field(f.name, pa.dictionary(pa.from_numpy_dtype(coded[f.name][1]), f.type))
                              if as_dictionary and coded[f.name] is not None else f for f in arrow_schema],
                             metadata=arrow_schema.metadata)

    def groups():
        for lo in range(0, max(len(df), 1), ROW_GROUP):
            part = df.iloc[lo:lo + ROW_GROUP]
            yield pa.Table.from_arrays([_arrow(part[c], arrow_schema.field(c).type, pool, coded[c], lo, as_dictionary)
                                        for c in df.columns], schema=write_schema)

    # dictionary pages for the string columns (few distinct values: names, kinds) and min/max
    # statistics for the others; string statistics (min/max of long kernel names) and dictionary
    # attempts on timestamps cost a third of the write and nothing reads them
    # (pandas 3's "string" columns are Arrow large_string: text all the same)
    strs = [f.name for f in arrow_schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    nums = [f.name for f in arrow_schema if f.name not in strs]
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, write_schema, memory_pool=pool, use_dictionary=strs,
                                                    write_statistics=nums, store_schema=not as_dictionary) as writer:
        _pipelined(groups(), lambda table: writer.write_table(table, row_group_size=ROW_GROUP))
        footer = {}
        if as_dictionary:  # the string-typed schema and its metadata, as store_schema writes them
            footer["ARROW:schema"] = base64.b64encode(arrow_schema.serialize().to_pybytes()).decode()
            footer.update((k.decode(), v.decode()) for k, v in arrow_schema.metadata.items())
        if callable(footer_meta):
            footer_meta = footer_meta()
        if footer_meta is not None:
            footer["kernelmap.meta"] = json.dumps(footer_meta)
        if footer:
            writer.add_key_value_metadata(footer)


_PANDAS_COW = int(pd.__version__.split(".")[0]) >= 3  # copy-on-write always on
ROW_GROUP = 1 << 18  # rows per Parquet row group


def _pipelined(items, consume) -> None:
    """``consume(item)`` of each item in order, in a second thread, while this one makes the next
    item: two items alive at most (the one consumed, the one made); the first exception of either
    thread is raised here, and then no further item is made."""
    with ThreadPoolExecutor(1, thread_name_prefix="kernelmap-parquet") as worker:
        consumed = None
        for item in items:
            if consumed is not None:
                consumed.result()  # the previous item's consumer: done (or its exception raised)
            consumed = worker.submit(consume, item)
            del item
        if consumed is not None:
            consumed.result()


def _coded_strings(col: pd.Series, type_, pool=None):
    """(codes of rows ``lo:hi`` as a function of (lo, hi), their dtype, the distinct values as
    Arrow) of a string column whose rows share a few objects (``strings.factorize``), else None.
    A Categorical's codes are renumbered a row group at a time (``strings.category_ranks``), not
    kept renumbered for the whole write."""
    import pyarrow as pa

    from . import strings

    if not strings.is_string(col.dtype):
        return None
    ranked = strings.category_ranks(col, small=True)
    if ranked is not None:
        rank, uniques = ranked
        codes = col.array.codes
        return (lambda lo, hi: rank[codes[lo:hi]]), rank.dtype, pa.array(uniques, type=type_, memory_pool=pool)
    # kept for the whole write, one array per column: in the smallest signed type (-1: NA)
    coded = strings.factorize(col, most=len(col) // 4, small=True)
    if coded is None:
        return None
    codes, uniques = coded
    codes = codes.astype(strings.code_type(len(uniques)), copy=False)
    return (lambda lo, hi: codes[lo:hi]), codes.dtype, pa.array(uniques, type=type_, memory_pool=pool)


def _arrow(col: pd.Series, type_, pool=None, coded=None, lo: int = 0, as_dictionary: bool = False):
    """One column (rows ``lo``.. of the whole column) as Arrow. Strings: where ``coded`` (the whole
    column's ``_coded_strings``), the rows taken from the distinct values (``as_dictionary``: a
    dictionary array of their codes instead), else pyarrow's own
    conversion of the object array (NA -> null), without the copy a ``string`` array first makes of
    itself. Other columns by pyarrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .strings import is_string

    arr = col.array
    if isinstance(arr, pd.arrays.IntegerArray) and pa.types.is_int64(type_):
        # the values as int64 (a view where they are; a narrow column widened), the mask as nulls;
        # a column of only NA as nulls outright (pyarrow's cast of those is slow)
        mask = arr._mask
        if len(mask) and mask.all():
            return pa.nulls(len(arr), type=type_, memory_pool=pool)
        return pa.array(arr._data.astype(np.int64, copy=False), mask=mask if mask.any() else None, type=type_,
                        memory_pool=pool)
    if not is_string(col.dtype):
        return pa.array(arr, type=type_, memory_pool=pool)
    if coded is None:
        return pa.array(np.asarray(col.array), type=type_, from_pandas=True, memory_pool=pool)
    rows_codes, _, uniques = coded
    codes = rows_codes(lo, lo + len(col))
    if as_dictionary:  # the codes themselves, null where -1
        return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0, memory_pool=pool), uniques)
    rows = pa.array(codes.astype("int32"), mask=codes < 0, memory_pool=pool)
    return pc.take(uniques, rows, memory_pool=pool)  # null row: null


def read_parquet(path: str | os.PathLike, upgrade=None) -> pd.DataFrame:
    """Read records, refusing files without or with another ``schema_version``; a v2 file (written before the
    case's columns) is read through ``upgrade``: a function of a v2 ``framework`` value (the case's name then)
    to the v3 values of framework, mode, math and devices (``frameworks.case.legacy_columns``; the run loader
    gives it the run's math, ``kernelmap.rundir.RunDir.read_records``; read alone, the math is unknown)."""
    from .frameworks.case import legacy_columns

    upgrade = upgrade or legacy_columns
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise SchemaError(f"{path}: no such file") from None
    except Exception as exc:  # pyarrow raises several types for a non-Parquet file
        raise SchemaError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    meta = table.schema.metadata or {}
    raw = meta.get(b"kernelmap.schema_version")
    if raw is None:
        raise SchemaError(f"{path}: no kernelmap.schema_version in the Parquet metadata; not a kernelmap records file")
    try:
        version = int(raw)
    except ValueError:
        raise SchemaError(f"{path}: schema_version {raw!r} is not a number") from None
    if version not in (SCHEMA_VERSION, SCHEMA_VERSION - 1):
        newer = "newer than" if version > SCHEMA_VERSION else "older than"
        fix = ": read it with the kernelmap that wrote it" if version > SCHEMA_VERSION else (
            ": re-normalise its run (`kernelmap normalise RUN_DIR`) to write it anew")
        raise SchemaError(f"{path}: schema_version {version} is {newer} this kernelmap's {SCHEMA_VERSION}{fix}")
    try:
        df = table.to_pandas()
    except Exception as exc:  # pandas metadata that disagrees with the columns (pyarrow and pandas errors)
        raise SchemaError(f"{path}: columns do not match their pandas metadata ({type(exc).__name__}: {exc})") from None
    if version < SCHEMA_VERSION:
        df = _upgrade_v2(df, upgrade)
    else:  # a v3 file from before the math columns, or from before math_unit
        for added in ((*MATH_COLUMNS, *UNIT_COLUMNS), UNIT_COLUMNS):
            if list(df.columns) == list(COLUMNS)[:-len(added)]:
                for c in added:
                    df[c] = pd.array([pd.NA] * len(df), dtype=STRING)
    try:
        df = df.astype(DTYPES) if list(df.columns) == list(COLUMNS) else df
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"{path}: {exc}") from None
    return validate(df, str(path))


def _upgrade_v2(df: pd.DataFrame, upgrade) -> pd.DataFrame:
    """A v2 frame in v3's columns: rank and device_index NA where the file is older than them; the case's
    columns from ``upgrade`` of each distinct ``framework`` value (once per value, not per row)."""
    v2 = [c for c in COLUMNS if c not in (*CASE_COLUMNS, *MATH_COLUMNS, *UNIT_COLUMNS)]
    if list(df.columns) == v2[:-len(ADDED_COLUMNS)]:  # a file from before rank/device_index
        for c in ADDED_COLUMNS:
            df[c] = pd.array([pd.NA] * len(df), dtype="Int64")
    if list(df.columns) != v2:
        return df  # validate names what differs
    for c in (*MATH_COLUMNS, *UNIT_COLUMNS):
        df[c] = pd.array([pd.NA] * len(df), dtype=STRING)
    codes, names = pd.factorize(df["framework"].astype(object), use_na_sentinel=True)
    values = [upgrade(n) for n in names]
    for col in ("framework", *CASE_COLUMNS):
        table = np.array([v[col] for v in values] + [None], dtype=object)  # code -1 (NA) -> None
        df[col] = pd.array(table[codes], dtype=COLUMNS[col])
    return df[list(COLUMNS)]


def read_meta(path: str | os.PathLike) -> dict:
    """The ``extra_meta`` dict stored by ``write_parquet`` (summary, attribution), or {}."""
    import pyarrow.parquet as pq

    # the file's key-value metadata: the Arrow schema's own entries, and kernelmap.meta where it was
    # added after the row groups (write_parquet's footer_meta)
    meta = pq.read_metadata(path).metadata or {}
    raw = meta.get(b"kernelmap.meta")
    return json.loads(raw) if raw else {}
