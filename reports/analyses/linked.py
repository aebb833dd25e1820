"""Library calls linked to framework ops (CPU: oneDNN, BLAS)."""

from __future__ import annotations

import pandas as pd

from kernelmap import schema

from .base import Run, case_of, field_at, passes_of
from .timed import direction_group, records_of

# --- library calls linked to ops (CPU: oneDNN, BLAS) -----------------------------------------
_SIG = ["canonical_op", "layer", "dgroup"]


def framework_rows(rec: pd.DataFrame, fw: str, bs: int | None) -> pd.DataFrame:
    return rec[(rec["case"] == fw) & (rec["batch_size"].fillna(-1) == (-1 if bs is None else bs))]


def log_steps(run: Run, fw: str, bs: int | None) -> tuple[int | None, str]:
    """Training steps the library-log (libs) pass ran with its logs on: its warm-up and timed
    steps (the logs are on from process start), from results.json."""
    for r in run.results:
        if case_of(r) == fw and field_at(r, "batch_size") == bs:
            p = passes_of(r).get("libs", {})
            n, w = field_at(p, "steps"), field_at(p, "warmup_steps")
            if isinstance(n, int) and isinstance(w, int):
                return n + w, f"libs pass: {n + w} logged steps ({w} warm-up + {n} timed)"
    return None, "results.json does not say how many steps the libs pass ran"


def libs_warmup(run: Run, fw: str, bs: int | None) -> int | None:
    """Warm-up steps of the libs pass (results.json), the first of its logged steps."""
    for r in run.results:
        if case_of(r) == fw and field_at(r, "batch_size") == bs:
            w = field_at(passes_of(r).get("libs", {}), "warmup_steps")
            return w if isinstance(w, int) else None
    return None


def linked_calls(run: Run, fw: str, bs: int | None) -> pd.DataFrame:
    """The library-log calls of one framework x batch size (any library), each with the
    signature of the framework op it is linked to (``op_canonical``, ``op_layer``, ``op_dgroup``:
    a oneDNN reorder takes the op of the primitive it feeds) and its own (``canonical_op``,
    ``layer``, ``dgroup``). Unlinked calls keep NA op columns."""
    rec = framework_rows(records_of(run), fw, bs)
    calls = rec[rec["kind"] == "library_call"].copy()
    calls["dgroup"] = calls["direction"].map(direction_group)
    ops = rec[rec["kind"] == "op"][["run", "event_id", "canonical_op", "layer", "direction"]].rename(
        columns={"event_id": "op_event_id", "canonical_op": "op_canonical", "layer": "op_layer",
                 "direction": "op_direction"}).drop_duplicates(["run", "op_event_id"])
    m = calls[["run", "op_event_id"]].merge(ops, on=["run", "op_event_id"], how="left")
    m.index = calls.index
    calls["op_canonical"], calls["op_layer"] = m["op_canonical"], m["op_layer"]
    calls["op_dgroup"] = m["op_direction"].map(direction_group).where(m["op_direction"].notna())
    return calls


def linked_libraries(run: Run, fw: str, bs: int | None) -> dict[tuple[str, str, str], dict[str, list[str]]]:
    """Per op signature (canonical op, layer or '-', direction group): the libraries and library
    calls linked to ops of that signature (CPU library logs: oneDNN, BLAS)."""
    calls = linked_calls(run, fw, bs)
    calls = calls[calls["op_canonical"].notna()]
    out: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for (op, layer, d), g in calls.groupby([calls["op_canonical"], calls["op_layer"].fillna(schema.UNKNOWN),
                                            calls["op_dgroup"].fillna("none")]):
        out[(str(op), str(layer), str(d))] = {"libraries": sorted(set(g["library"].dropna())),
                                              "library_calls": sorted(set(g["library_call"].dropna()))}
    return out


def op_signature(ev: pd.DataFrame) -> list[tuple[str, str, str]]:
    return list(zip(ev["canonical_op"].fillna(schema.UNATTRIBUTED), ev["layer"].fillna(schema.UNKNOWN),
                    ev["direction"].map(direction_group), strict=True))


