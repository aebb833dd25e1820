"""XLA CPU thunks that complete asynchronously are timed to their completion (kernelmap/adapters/thunk_completion.py).

Fixture: tests/data/cpu_jax_async (README.md), a real JAX CPU run at batch 64 and 256. Its fc1 weight gradient is
a plain ``dot`` (``DotThunk``: Eigen's contraction on XLA's pool); its traced span is the dispatch only: 0.157 ms a
step at bs 64 and 0.016 ms at bs 256 (the default bench read 0.119 against 0.0176 ms: "layer time vs batch size"
failed). Every figure below is read again from the trace by the standard library alone (``stdlib_thunks``).
"""

from __future__ import annotations

import gzip
import json
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import report
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C
from kernelmap.reports.analyses.timed import outermost_ops

from kernelmap import adapters, cpusampler
from kernelmap.adapters import xla_trace
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_jax_async"
EXECUTE, END = "ThunkExecutor::Execute", "end: "


def _trace(bs: int) -> Path:
    return DATA / "jax" / f"bs{bs}" / "trace.json.gz"


def stdlib_thunks(path: Path) -> tuple[list[dict], dict[str, list[tuple[dict, dict]]]]:
    """The trace's complete events (``s``/``e``: exact ns) and, per thunk name, its executions paired with their
    ``end:`` events: the one on its thread whose span holds the event, else the one whose span had ended (several
    such: none of them)."""
    doc = json.loads(gzip.open(path).read(), parse_float=Decimal)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    for e in ev:
        e["s"] = int((Decimal(e["ts"]) * 1000).to_integral_value())
        e["e"] = e["s"] + int((Decimal(e.get("dur", 0)) * 1000).to_integral_value())
    waiting: dict[str, list] = {}
    pairs: dict[str, list] = {}
    for e in sorted(ev, key=lambda e: (e["s"], e["name"].startswith(END))):
        op = (e.get("args") or {}).get("hlo_op")
        if op is not None:
            waiting.setdefault(op, []).append(e)
            pairs.setdefault(op, [])
        elif e["name"].startswith(END):
            op = e["name"][len(END):]
            runs = waiting.get(op, [])
            hit = [r for r in runs if r["tid"] == e["tid"] and r["s"] <= e["s"] <= r["e"]] or [
                r for r in runs if r["e"] <= e["s"]]
            for r in hit:
                runs.remove(r)
            if len(hit) == 1:
                pairs[op].append((hit[0], e))
    return ev, pairs


def completion_ns(ev: list[dict], run: dict, end: dict) -> int:
    """When ``run`` completed: inside its span, its end; else the start of the executor span just before its
    ``end:`` event on that thread (nothing else starting between), else the ``end:`` event."""
    if end["s"] <= run["e"]:
        return run["e"]
    mine = [e for e in ev if e["tid"] == end["tid"] and e is not end]
    last = max((e for e in mine if e["e"] <= end["s"]), key=lambda e: (e["e"], e["e"] - e["s"]))
    between = [e for e in mine if last["e"] < e["s"] < end["s"]]
    done = last["s"] if last["name"] == EXECUTE and last["s"] >= run["s"] and not between else end["s"]
    return max(done, run["e"])


@pytest.fixture(scope="module", params=[64, 256])
def case(request):
    path = _trace(request.param)
    return request.param, xla_trace.read(path), *stdlib_thunks(path)


def test_the_weight_gradient_dot_is_timed_to_its_completion(case):
    bs, df, ev, pairs = case
    dots = df[df["kind"].eq("op") & df["op_name"].eq("dot")].sort_values("start_ns")
    assert set(zip(dots["layer"], dots["direction"], strict=True)) == {("fc1", "bwd_weight")}
    want = [completion_ns(ev, r, m) - r["s"] for r, m in pairs["dot"]]
    assert len(dots) == len(want) == 5  # one a step, 5 traced steps
    assert dots["dur_ns"].tolist() == want
    dispatch = [r["e"] - r["s"] for r, _ in pairs["dot"]]
    assert all(m["s"] > r["e"] for r, m in pairs["dot"])  # each completed after its span: asynchronously
    assert all(w > d for w, d in zip(want, dispatch, strict=True))  # the span alone was the dispatch
    # its end: event belongs to it and spans its pending time, from the dispatch's return to the event
    marks = df[df["op_name"].eq("end: dot")].sort_values("start_ns")
    assert marks["op_event_id"].tolist() == dots["event_id"].tolist()
    assert marks["start_ns"].tolist() == [r["e"] for r, _ in pairs["dot"]]
    assert (marks["start_ns"] + marks["dur_ns"]).tolist() == [m["e"] for _, m in pairs["dot"]]


def test_the_layer_figure_grows_with_the_batch_where_the_dispatch_fell():
    per_step = {}
    for bs in (64, 256):
        ev, pairs = stdlib_thunks(_trace(bs))
        df = xla_trace.read(_trace(bs))
        got = df[df["kind"].eq("op") & df["layer"].eq("fc1") & df["direction"].eq("bwd_weight")]
        per_step[bs] = (sum(r["e"] - r["s"] for r, _ in pairs["dot"]) / 5, int(got["dur_ns"].sum()) / 5)
        assert got["dur_ns"].sum() == sum(completion_ns(ev, r, m) - r["s"] for r, m in pairs["dot"])
    assert per_step[64] == (156685.8, 455172.6) and per_step[256] == (16322.2, 2367593.2)  # ns a step


def test_every_thunk_is_paired_and_the_summary_counts_them(case):
    bs, df, ev, pairs = case
    n_runs = sum(len(v) for v in pairs.values())
    n_ends = sum(1 for e in ev if e["name"].startswith(END))
    late = sum(1 for v in pairs.values() for r, m in v if m["s"] > r["e"])
    by_exec = sum(1 for v in pairs.values() for r, m in v if m["s"] > r["e"] and completion_ns(ev, r, m) < m["s"])
    got = df.attrs["thunk_completions"]
    assert (n_runs, n_ends) == (400, 400)  # 80 thunks a step, 5 steps
    assert (got["markers"], got["asynchronous"], got["from_continuation"]) == (n_ends, late, by_exec)
    assert (got["markers_unpaired"], got["ops_without_marker"]) == (0, 0)
    assert (late, by_exec) == {64: (45, 29), 256: (67, 34)}[bs]
    assert df[df["op_name"].str.startswith(END, na=False)]["op_event_id"].notna().all()


def test_thunks_run_while_one_is_pending_stay_outermost(case):
    bs, df, ev, pairs = case
    ops = df[df["kind"].eq("op")]
    assert len(outermost_ops(ops)) == len(ops) == 400  # no XLA thunk nests in another here
    spans_alone = outermost_ops(ops.assign(source="kineto"))  # the span rule would drop those run meanwhile
    assert len(spans_alone) < len(ops)


def test_a_pool_task_between_the_executor_and_the_end_event_leaves_the_end_event(tmp_path):
    """Doctored: a pool task's region marker right before the first dot's end: event: the executor span before
    it is then no continuation of the dot, whose completion is its end: event."""
    doc = json.loads(gzip.open(_trace(256)).read(), parse_float=Decimal)
    ev, pairs = stdlib_thunks(_trace(256))
    run, end = pairs["dot"][0]
    assert completion_ns(ev, run, end) < end["s"]  # a continuation ran before it
    doc["traceEvents"].append({"ph": "X", "pid": end["pid"], "tid": end["tid"], "name": "ThreadpoolListener::StartRegion",
                               "ts": Decimal(end["ts"]) - Decimal("0.001"), "dur": 0})
    path = tmp_path / "trace.json.gz"
    shutil.copy(_trace(256).parent / "jit__train_step.hlo.txt.gz", tmp_path)
    path.write_bytes(gzip.compress(json.dumps(doc, default=float).encode()))  # a Decimal's shortest float text
    df = adapters.read(path)
    first = df[df["kind"].eq("op") & df["op_name"].eq("dot")].sort_values("start_ns").iloc[0]
    assert first["dur_ns"] == end["s"] - run["s"]


def test_a_pending_thunk_takes_only_cpu_time_no_running_op_takes():
    s = cpusampler.Samples.read(DATA / "jax" / "bs256" / "cpu_samples.npy")
    t = s.mono_ns[[10, 20, 30, 40]]
    cpu = s.cpu_at(t)
    # A runs over [t0, t2]; B is pending over [t1, t3] (dispatched at t1 and returned at once)
    got = cpusampler.shared_cpu(s, np.array([t[0], t[1]]), np.array([t[2], t[3]]), np.array([t[2], t[1]]))
    assert got.tolist() == pytest.approx([cpu[2] - cpu[0], cpu[3] - cpu[2]], abs=1e-3)
    # without running ends both run to their end and share [t1, t2]
    both = cpusampler.shared_cpu(s, np.array([t[0], t[1]]), np.array([t[2], t[3]]))
    half = (cpu[2] - cpu[1]) / 2
    assert both.tolist() == pytest.approx([cpu[1] - cpu[0] + half, half + cpu[3] - cpu[2]], abs=1e-3)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("thunks") / "cpu_jax_async"
    shutil.copytree(DATA, d)
    normalise_run_dir(d)
    return d


def test_layer_time_vs_batch_size_passes_for_fc1(run_dir):
    """Both framework passes ran busy (two processes, each at its own time): the wall figures are not held
    (checkrows.BOTH_CONTENDED_RULE), the ops' own CPU time is where sampled apart, and passes; none fails."""
    c = C.self_checks([A.load_run(run_dir)])
    rows = c[(c["check"] == C.Check.LAYER_VS_BATCH) & c["subject"].str.startswith("fc1 ")].set_index("subject")
    w = rows.loc["fc1 bwd_weight, framework-op time: bs 64 -> 256"]
    assert (w["status"], w["expected"], w["measured"]) == (C.NOT_CHECKED, pytest.approx(0.4551726),
                                                           pytest.approx(2.3675932))
    wall = rows[rows.index.str.contains("framework-op time")]
    assert len(wall) == 4 and all(d.startswith(f"not held against each other: {C.BOTH_CONTENDED_RULE}")
                                  for d in wall["detail"])
    cpu = rows[rows.index.str.contains("CPU time of its ops")]["status"].to_dict()
    assert cpu == {"fc1 fwd, CPU time of its ops: bs 64 -> 256": C.PASS,
                   "fc1 bwd_data, CPU time of its ops: bs 64 -> 256": C.NOT_CHECKED,  # pool work not sampled apart
                   "fc1 bwd_weight, CPU time of its ops: bs 64 -> 256": C.NOT_CHECKED,
                   "fc1 bwd_bias, CPU time of its ops: bs 64 -> 256": C.PASS}


def test_the_dispatch_alone_fails_the_check(run_dir, tmp_path):
    """The same run with each dot's record cut back to its traced span (what the adapter read before): the check
    fails on fc1 bwd_weight, on its ops' own CPU time (its wall figures, both passes busy, are not held)."""
    from kernelmap import schema

    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    rec = schema.read_parquet(d / "records.parquet")
    for bs in (64, 256):
        _, pairs = stdlib_thunks(_trace(bs))
        dots = rec.index[rec["kind"].eq("op") & rec["op_name"].eq("dot") & rec["batch_size"].eq(bs)]
        order = rec.loc[dots].sort_values("start_ns").index
        rec.loc[order, "dur_ns"] = [r["e"] - r["s"] for r, _ in pairs["dot"]]
    schema.write_parquet(rec, d / "records.parquet")
    c = C.self_checks([A.load_run(d)])
    rows = c[c["check"] == C.Check.LAYER_VS_BATCH].set_index("subject")
    row = rows.loc["fc1 bwd_weight, framework-op time: bs 64 -> 256"]
    assert (row["status"], row["expected"], row["measured"]) == (
        C.NOT_CHECKED, pytest.approx(0.1566858), pytest.approx(0.0163222))
    row = rows.loc["fc1 bwd_weight, CPU time of its ops: bs 64 -> 256"]
    assert row["status"] == C.FAIL and row["measured"] < row["expected"] / 5


def test_the_page_says_what_an_xla_thunk_time_is(run_dir, tmp_path):
    assert report(str(run_dir), "-o", str(tmp_path / "rep")) == 0
    cells = pd.read_csv(tmp_path / "rep" / "tables" / "answer.csv")
    said = cells.loc[cells["jax.time_kind"].eq("framework-op time"), "jax.time_source"]
    assert len(said) > 0 and said.str.contains(xla_trace.OP_TIME_SAYS, regex=False).all()
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "CPU thunks: start to completion, an asynchronous one" in page  # the op-time figure's caption


def test_the_cpu_sampler_runs_a_pending_thunk_only_over_its_dispatch(run_dir):
    from kernelmap.reports.analyses.opcpu import running_ends
    from kernelmap.reports.analyses.timed import records_of, timed_events

    run = A.load_run(run_dir)
    t = next(x for x in timed_events(run) if x.batch_size == 256)
    ev = t.events.sort_values("start_ns")
    ends = pd.Series(running_ends(records_of(run), ev), index=ev.index)
    ev_stdlib, pairs = stdlib_thunks(_trace(256))
    dots = ev["op_name"].eq("dot")
    assert ends[dots].tolist() == [r["e"] for r, _ in pairs["dot"]]  # where each dispatch returned
    sync = ev["op_name"].eq("ynn_fusion.9")  # fc1 forward, YNNPACK: completes inside its span
    assert (ends[sync] == ev.loc[sync, "start_ns"] + ev.loc[sync, "dur_ns"]).all() and sync.sum() == 5
    # pending for a while: each thunk that completed after its dispatch returned
    pending = sum(1 for v in pairs.values() for r, m in v if completion_ns(ev_stdlib, r, m) > r["e"])
    assert int((ends < ev["start_ns"] + ev["dur_ns"]).sum()) == pending > 0


def _overlap(a0: int, a1: int, b0: int, b1: int) -> bool:
    return a0 < b1 and b0 < a1


def stdlib_pool(bs: int) -> tuple[dict, dict]:
    """From the trace alone (stdlib), per execution (thunk name, its start ns): whether its pending stretch (its
    dispatch's return to its completion) overlaps another execution (start to completion), and the names of the
    thunks whose pending stretch overlaps its own dispatch (start to its dispatch's return)."""
    ev, pairs = stdlib_thunks(_trace(bs))
    runs = [(op, r, min(r["e"], completion_ns(ev, r, m)), completion_ns(ev, r, m)) for op, v in pairs.items()
            for r, m in v]
    beside, shared = {}, {}
    for op, r, ran, done in runs:
        key = (op, r["s"])
        beside[key] = ran < done and any(_overlap(ran, done, o["s"], d) for _, o, _, d in runs if o is not r)
        shared[key] = sorted({o2 for o2, o, ran2, d in runs if o is not r and ran2 < d
                              and _overlap(r["s"], ran, ran2, d)})
    return beside, shared


def _op_cpu(run_dir: Path, bs: int):
    from kernelmap.reports.analyses import opcpu as OC

    return OC.op_cpu(A.load_run(run_dir))[("jax", bs)]


@pytest.mark.parametrize("bs", [64, 256])
def test_a_thunk_whose_work_ran_on_the_pool_beside_other_ops_has_no_sampled_cpu(run_dir, bs):
    """cpusampler.POOL_RULE: the fc1 weight-gradient dot read its dispatch's CPU time (0.157 ms a step at bs 64, 1.22
    at bs 256: 7.8x for 4x the work), its pool work credited to the ops beside it; now no figure, and why."""
    oc = _op_cpu(run_dir, bs)
    ev = oc.events
    beside, shared = stdlib_pool(bs)
    hlo = ev["op_name"].astype(str).str.split(" [", regex=False).str[0]  # the report's name adds the ops it fuses
    assert len(ev) == len(beside) == 400
    got_beside = {(o, s): w == cpusampler.POOL_WHY for o, s, w in zip(hlo, ev["start_ns"], ev["cpu_why"], strict=True)}
    assert got_beside == beside and sum(beside.values()) == {64: 34, 256: 48}[bs]
    held = ev["cpu_why"].eq(cpusampler.BESIDE_POOL_WHY)
    got_shared = {(o, s): sorted({n.split(" [")[0] for n in w}) if h else [] for o, s, w, h in zip(
        hlo, ev["start_ns"], ev["pool_with"], held, strict=True) if not beside[(o, s)]}
    assert got_shared == {k: v for k, v in shared.items() if not beside[k]}
    assert held.sum() == sum(1 for k, v in shared.items() if v and not beside[k]) == {64: 91, 256: 88}[bs]
    dots = ev[ev["op_name"].eq("dot")]
    assert len(dots) == 5 and dots["cpu_ns"].isna().all() and dots["cpu_why"].eq(cpusampler.POOL_WHY).all()
    conv1 = ev[ev["op_name"].eq("ynn_fusion.13")]  # conv1 forward: copy.26 pending beside it (4 of 5 steps at bs 256)
    assert conv1["cpu_ns"].isna().all() and sum("copy.26" in w for w in conv1["pool_with"]) == {64: 5, 256: 4}[bs]
    # nothing withheld has a figure, everything else keeps its share; the ops' sum is the process's as before
    assert ev["cpu_ns"].isna().tolist() == ev["cpu_why"].notna().tolist()
    kept = ev["cpu_why"].isna()
    assert (ev.loc[kept, "cpu_ns"] == ev.loc[kept, "shared_cpu_ns"]).all()
    assert oc.ops_ms_per_step == pytest.approx(float(ev["shared_cpu_ns"].sum()) / 5 / 1e6)


WITHHELD_ROWS = {("conv1", "fwd"), ("conv1", "bwd_weight"), ("conv2", "bwd_weight"), ("conv2", "bwd_bias"),
                 ("fc1", "bwd_data"), ("fc1", "bwd_weight")}


def test_the_cpu_table_withholds_those_layers_and_says_why(run_dir, tmp_path):
    from kernelmap.reports import answer as ANS
    from kernelmap.reports.analyses import basis as B
    from kernelmap.reports.analyses import opcpu as OC

    run = A.load_run(run_dir)
    cpu, _ = ANS.cpu_table(A.layer_table([run]), B.cpu_states([run]), B.traced_op_ms([run]), OC.op_cpu_of([run]))
    rows = cpu[cpu["layer"] != ANS.WHOLE_STEP].set_index(["batch_size", "layer", "direction"])
    held = rows["jax.method"].eq(ANS.WITHHELD)
    assert {k[1:] for k in rows.index[held]} == WITHHELD_ROWS and held.sum() == 2 * len(WITHHELD_ROWS)
    assert rows.loc[held, "jax.cpu_ms"].isna().all()  # no figure, not even the share estimate
    w = rows.loc[(64, "fc1", "bwd_weight")]
    assert w["jax.not_sampled"] == f"5 of its 5 traced ops not sampled apart: 5 x {cpusampler.POOL_WHY}"
    assert cpusampler.BESIDE_POOL_WHY in rows.loc[(256, "conv1", "fwd"), "jax.not_sampled"]
    assert (rows.loc[~held, "jax.method"] == ANS.SAMPLED).all()
    # the page: the cell says not sampled, the heading counts the withheld cells apart from the figures
    assert report(str(run_dir), "-o", str(tmp_path / "rep")) == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    assert page.count('<td class="withheld" title="') == 2 * len(WITHHELD_ROWS)
    # one CPU-time table for the run, its two batch sizes one above the other (issue 42's first screen)
    assert page.count(f"{2 * len(WITHHELD_ROWS)} cells withheld, no figure (not sampled: hover the cell)") == 1


def test_the_time_within_step_check_says_how_thunks_were_timed(run_dir):
    att = json.loads((run_dir / "attribution.json").read_text())
    for bs in (64, 256):
        ev, pairs = stdlib_thunks(_trace(bs))
        late = sum(1 for v in pairs.values() for r, m in v if m["s"] > r["e"])
        files = att["runs"][f"jax/bs{bs}"]["files"]
        assert [f["thunk_completions"]["asynchronous"] for f in files if "thunk_completions" in f] == [late]
    c = C.self_checks([A.load_run(run_dir)])
    rows = c[c["check"].eq(C.Check.TIME_WITHIN_STEP)].set_index("batch_size")
    assert "XLA thunks: 45 of 400 'end:' events after their thunk's dispatch" in rows.loc[64, "detail"]
    assert "XLA thunks: 67 of 400 'end:' events" in rows.loc[256, "detail"]
    assert "pending together on several devices" not in rows.loc[64, "detail"]


def test_thunks_of_several_devices_pending_together_are_said(run_dir, tmp_path):
    """Doctored: the bs 64 trace with each dot's thunk and 'end:' event repeated on a second executor thread, as one
    program on two devices runs it: the two dispatches have returned when the first 'end: dot' comes, so the trace
    does not say which ended (PAIR_RULE). attribution.json and the check say so."""
    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    path = d / "jax" / "bs64" / "trace.json.gz"
    doc = json.loads(gzip.open(path).read(), parse_float=Decimal)
    _, pairs = stdlib_thunks(_trace(64))
    for r, m in pairs["dot"]:
        twin, twin_end = dict(r, tid=987654), dict(m, tid=987654)
        twin["ts"], twin_end["ts"] = Decimal(r["ts"]) + Decimal("0.001"), Decimal(m["ts"]) + Decimal("0.002")
        for e in (twin, twin_end):
            e.pop("s"), e.pop("e")
        doc["traceEvents"] += [twin, twin_end]
    path.write_bytes(gzip.compress(json.dumps(doc, default=float).encode()))
    normalise_run_dir(d)
    att = json.loads((d / "attribution.json").read_text())
    got = next(f["thunk_completions"] for f in att["runs"]["jax/bs64"]["files"] if "thunk_completions" in f)
    assert (got["ops_ambiguous"], got["markers_ambiguous"]) == (10, 10)  # 2 executions, 2 'end:' events a step
    c = C.self_checks([A.load_run(d)])
    row = c[c["check"].eq(C.Check.TIME_WITHIN_STEP) & c["batch_size"].eq(64)].iloc[0]
    assert ("10 executions of one op pending together on several devices (10 'end:' events): the trace does not say "
            "which ended when") in row["detail"]


def test_a_thunk_whose_owner_is_not_passed_in_stays_outermost(case):
    """A thunk inside a control-flow thunk that names no canonical op: its owner is not among the rows passed
    (timed.timed_events passes those with a canonical op), so it is outermost; with its owner passed, it is not."""
    bs, df, ev, pairs = case
    ops = df[df["kind"].eq("op")].sort_values("start_ns")
    owner, inner = ops.index[0], ops.index[1]
    nested = ops.copy()
    nested.loc[inner, "op_event_id"] = nested.loc[owner, "event_id"]
    assert inner not in outermost_ops(nested).index  # its owner among the rows: nested
    alone = outermost_ops(nested.drop(index=owner))
    assert inner in alone.index and len(alone) == len(ops) - 1


def test_a_thunk_whose_grandparent_is_passed_in_is_not_counted_twice(case):
    """Owner chain: grandparent (passed) -> a control-flow thunk (no canonical op: left out) -> inner. Without
    the chain the inner thunk looked outermost beside its grandparent, and both were counted; with the records
    as the chain it is the grandparent's."""
    bs, df, ev, pairs = case
    ops = df[df["kind"].eq("op")].sort_values("start_ns")
    grand, middle, inner = ops.index[0], ops.index[1], ops.index[2]
    chained = ops.copy()
    chained.loc[middle, "op_event_id"] = chained.loc[grand, "event_id"]
    chained.loc[inner, "op_event_id"] = chained.loc[middle, "event_id"]
    passed = chained.drop(index=middle)  # the middle names no canonical op: callers leave it out
    assert inner in outermost_ops(passed).index  # the chain broken: both counted (the old behaviour)
    outer = outermost_ops(passed, chained)
    assert grand in outer.index and inner not in outer.index and len(outer) == len(passed) - 1
    unowned = chained.copy()
    unowned.loc[middle, "op_event_id"] = pd.NA  # the middle in no op: inner outermost again
    assert inner in outermost_ops(passed, unowned).index
